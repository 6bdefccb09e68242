"""Every name that README.md and the user documentation show under ``sera_opt``
imports and resolves: a move of a module cannot silently break a documented path.

The trainer adapters and the benchmarks (``sera_opt.integrations``,
``sera_opt.benchmarks``) have their own tests and are not collected here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# docs/architecture.md is the maintainers' page: its module names are checked by test_layers.py.
PAGES = [REPO / "README.md",
         *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "architecture.md")]
ADAPTERS = ("sera_opt.integrations", "sera_opt.benchmarks")

# A name in quotes is a string (a logger's name, ``getLogger("sera_opt.notices")``), not a path.
_DOTTED = re.compile(r"(?<![\w/.$\"'])sera_opt(?:\.[A-Za-z_]\w*)+")
_FROM = re.compile(r"^\s*from\s+(sera_opt(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]+)", re.MULTILINE)


def documented_names(text: str) -> set[str]:
    """Dotted ``sera_opt.x.y`` references and ``from sera_opt.x import a, b`` statements."""
    names = set(_DOTTED.findall(text))
    for module, imported in _FROM.findall(text):
        for item in imported.strip("()").replace("\n", " ").split(","):
            item = item.split(" as ")[0].strip()
            if item and item != "*":
                names.add(f"{module}.{item}")
    return {n for n in names if not n.startswith(ADAPTERS)}


def resolve(dotted: str):
    """The object at ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


NAMES = sorted({name for page in PAGES for name in documented_names(page.read_text())})


def test_the_pages_show_names():
    assert len(NAMES) > 30, NAMES
    assert "sera_opt.allocate" in NAMES and "sera_opt.separable.PointLevels" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_documented_name_resolves(name):
    resolve(name)


def test_the_collector_reads_both_forms():
    text = ("Call `sera_opt.allocate(p, 8)`; see site-packages/sera_opt/x.\n"
            "```python\nfrom sera_opt.solvers.separable import (PointLevels,\n    BetaLevels)\n"
            "from sera_opt import Allocation as A, Solver  # two\n```\n"
            "sera_opt.integrations.trl is elsewhere. logging.getLogger(\"sera_opt.notices\").")
    assert documented_names(text) == {
        "sera_opt.allocate", "sera_opt.solvers.separable", "sera_opt.solvers.separable.PointLevels",
        "sera_opt.solvers.separable.BetaLevels", "sera_opt.Allocation", "sera_opt.Solver"}
    with pytest.raises(AttributeError):
        resolve("sera_opt.no_such_name")
