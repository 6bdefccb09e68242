"""The import layers of sera_opt hold: no module imports one above its own layer,
and no modules import each other in a circle.

The layers are the list in docs/architecture.md (section "Layers"), read from there
so that the page and the check cannot drift apart. Every import statement counts,
including those inside functions; ``from package import name`` counts as an import
of the submodule ``package.name`` when that is a module; and so does a call of
``import_module`` (``importlib.import_module``) or ``__import__`` whose module name is a
string in the source (for an f-string, its leading constant part up to the last dot).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "sera_opt"
ARCHITECTURE = REPO / "docs" / "architecture.md"
#: The subpackages installed from integrations/ and benchmarks/ (pyproject.toml's package-dir):
#: above every layer, never imported by sera_opt itself.
ADAPTERS = ("sera_opt.integrations", "sera_opt.benchmarks")


def read_layers(text: str) -> list[tuple[str, list[str]]]:
    """``[(layer name, [module or package names])]``, bottom first, from the fenced
    block that follows the heading ``## Layers``."""
    match = re.search(r"^## Layers\n.*?^```text\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise AssertionError("docs/architecture.md has no ```text block under '## Layers'")
    layers = []
    for line in match.group(1).splitlines():
        fields = line.split()
        if not fields:
            continue
        name, members = fields[0], [f.rstrip(",") for f in fields[1:]]
        assert members, f"layer {name!r} lists no module"
        layers.append((name, members))
    return layers


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package directory, by dotted name (packages by their
    ``__init__``); symbolic links are not followed."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = ("sera_opt",) + path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The sera_opt modules that the module ``name`` (at ``path``) imports anywhere
    in its source."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                       for alias in node.names]
        elif isinstance(node, ast.Call) and _is_import_call(node):
            targets = [_called_module(node.args[0], here)] if node.args else []
            targets = [t for t in targets if t]
        else:
            continue
        for target in targets:
            if target.startswith(ADAPTERS):
                # the folders outside sera_opt/ that install as its subpackages: kept by
                # their package name, which no layer lists
                found.add(".".join(target.split(".")[:2]))
            elif target == "sera_opt" or target.startswith("sera_opt."):
                # an import of a name inside a module counts as the module
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    found.add(target)
    return found


def _is_import_call(node: ast.Call) -> bool:
    """``import_module(...)``, ``importlib.import_module(...)`` or ``__import__(...)``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__", "_import_module")


def _called_module(arg: ast.expr, here: list[str]) -> str | None:
    """The module an import call names in its source: a string, or an f-string's leading
    constant part cut at its last dot (``f"sera_opt.benchmarks.{name}"`` names
    ``sera_opt.benchmarks``); a relative name (``".estimator"``) is taken from ``here``."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        text = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        text = str(arg.values[0].value).rsplit(".", 1)[0]
    else:
        return None
    if text.startswith("."):
        dots = len(text) - len(text.lstrip("."))
        base = here[:len(here) - (dots - 1)]
        text = ".".join(base + ([text[dots:]] if text[dots:] else []))
    return text


def covers(member: str, module: str) -> bool:
    """A listed name covers its module and, for a package, every module below it; the
    bare package name ``sera_opt`` covers its ``__init__`` only."""
    return module == member or (member != "sera_opt" and module.startswith(member + "."))


def layer_of(module: str, layers) -> int | None:
    best, best_len = None, -1
    for index, (_, members) in enumerate(layers):
        for member in members:
            if covers(member, module) and len(member) > best_len:
                best, best_len = index, len(member)
    return best


def graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def upward_imports(edges, layers) -> list[str]:
    problems = []
    for module, targets in sorted(edges.items()):
        own = layer_of(module, layers)
        for target in sorted(targets):
            other = layer_of(target, layers)
            if own is not None and other is not None and other > own:
                problems.append(f"{module} ({layers[own][0]}) imports {target} ({layers[other][0]})")
    return problems


def circles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def layers():
    return read_layers(ARCHITECTURE.read_text())


@pytest.fixture(scope="module")
def edges():
    return graph()


def test_every_module_has_exactly_one_layer(layers, edges):
    unplaced = [m for m in edges if layer_of(m, layers) is None]
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"
    listed = [member for _, members in layers for member in members]
    assert len(listed) == len(set(listed)), "a module is listed in two layers"
    missing = [member for member in listed if not any(covers(member, m) for m in edges)]
    assert not missing, f"docs/architecture.md lists modules that do not exist: {missing}"


def test_no_module_imports_upward(layers, edges):
    problems = upward_imports(edges, layers)
    assert not problems, "imports against the layers:\n  " + "\n  ".join(problems)


def test_no_import_circles(edges):
    found = circles(edges)
    assert not found, "modules that import each other in a circle:\n  " + "\n  ".join(
        " <-> ".join(c) for c in found)


def adapter_imports(edges) -> list[str]:
    return sorted(f"{m} imports {t}" for m, targets in edges.items() for t in targets
                  if t.startswith(ADAPTERS))


def test_the_package_never_imports_its_adapters(edges):
    outside = adapter_imports(edges)
    assert not outside, outside


# --- the check itself: it sees what it must ---------------------------------------


def test_the_check_finds_a_function_level_upward_import(tmp_path, layers):
    (tmp_path / "low.py").write_text("def f():\n    from .high import g\n    return g\n")
    (tmp_path / "high.py").write_text("from . import low\n\ndef g():\n    return low\n")
    (tmp_path / "__init__.py").write_text("")
    modules = module_files(tmp_path)
    edges = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert edges["sera_opt.low"] == {"sera_opt.high"}
    assert edges["sera_opt.high"] == {"sera_opt.low"}
    toy = [("bottom", ["sera_opt.low"]), ("top", ["sera_opt.high", "sera_opt"])]
    assert upward_imports(edges, toy) == ["sera_opt.low (bottom) imports sera_opt.high (top)"]
    assert circles(edges) == [["sera_opt.high", "sera_opt.low"]]


def test_the_check_resolves_relative_imports_in_packages(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .a import x\n")
    (tmp_path / "pkg" / "a.py").write_text("from ..base import y\nfrom . import b\nx = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("import sera_opt.base\n")
    (tmp_path / "base.py").write_text("y = 1\n")
    modules = module_files(tmp_path)
    edges = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert edges["sera_opt.pkg"] == {"sera_opt.pkg.a"}
    assert edges["sera_opt.pkg.a"] == {"sera_opt.base", "sera_opt.pkg.b"}
    assert edges["sera_opt.pkg.b"] == {"sera_opt.base"}


def test_the_check_sees_an_import_by_name(tmp_path):
    """``import_module`` and ``__import__`` with the module named in the source are imports."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "low.py").write_text(
        "from importlib import import_module\n\n"
        "def run(name):\n"
        "    return import_module(f'sera_opt.benchmarks.{name}')\n\n"
        "def other():\n"
        "    return __import__('sera_opt.high')\n")
    (tmp_path / "high.py").write_text("x = 1\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    modules = module_files(tmp_path)
    edges = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert edges["sera_opt.low"] == {"sera_opt.benchmarks", "sera_opt.high"}
    toy = [("bottom", ["sera_opt.low"]), ("top", ["sera_opt.high", "sera_opt.benchmarks",
                                                  "sera_opt"])]
    assert upward_imports(edges, toy) == [
        "sera_opt.low (bottom) imports sera_opt.benchmarks (top)",
        "sera_opt.low (bottom) imports sera_opt.high (top)"]


def test_the_command_line_reaches_every_benchmark_through_its_entry_points():
    """The seam the layers leave the CLI: one entry point per benchmark, and the commands."""
    from importlib.metadata import entry_points

    from sera_opt.cli.catalog import BENCHMARK_GROUP, BENCHMARKS, COMMAND_GROUP

    benchmarks = {entry.name: entry.value for entry in entry_points(group=BENCHMARK_GROUP)}
    assert set(benchmarks) == set(BENCHMARKS), "pyproject.toml's entry points and the catalog differ"
    assert all(value.startswith("sera_opt.benchmarks.") for value in benchmarks.values())
    commands = {entry.name for entry in entry_points(group=COMMAND_GROUP)}
    assert commands == {"demo", "replay"}


def test_the_check_fails_on_a_planted_import_of_a_benchmark(tmp_path):
    """A copy of the real package with one core module that loads a benchmark by name:
    the adapters check names it, although no import statement does."""
    import shutil

    copy = tmp_path / "sera_opt"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    planted = copy / "problem.py"
    planted.write_text(planted.read_text() + "\n\ndef _planted():\n"
                       "    import importlib\n\n"
                       "    return importlib.import_module('sera_opt.benchmarks.solvers')\n")
    modules = module_files(copy)
    edges = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert adapter_imports(edges) == ["sera_opt.problem imports sera_opt.benchmarks"]
    assert adapter_imports(graph()) == []  # the real package, unplanted
