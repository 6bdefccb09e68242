"""README.md's Quick start runs as written and shows what it says it shows.

Every ```python block under "## Quick start" is executed; a line written as
``expression  # value: comment`` (the value a repr such as ``array([ 2,  6, 16])``) is
checked against the expression's repr. Every ``sera-opt allocate`` line of its ```bash block
(and the lines before it that make its input files) runs in a scratch folder and must exit 0.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_REPR = re.compile(r"^(?P<expr>[^#]+?)\s+#\s+(?P<value>(array\(.*?\)|\[.*?\]|-?[\d.]+))(:|$)")


def quick_start_blocks(language: str) -> list[str]:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def test_the_quick_start_has_code_to_run():
    assert quick_start_blocks("python") and quick_start_blocks("bash")


def test_the_python_quick_start_runs_and_shows_what_it_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    checked = 0
    for block in quick_start_blocks("python"):
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 (the README is ours)
        for line in block.splitlines():
            match = _REPR.match(line.strip())
            if match:
                got = repr(eval(match["expr"], namespace))  # noqa: S307
                want = match["value"]
                assert " ".join(got.split()) == " ".join(want.split()), (line, got)
                checked += 1
    assert checked >= 1, "the Quick start states no value that could be checked"


def test_the_command_line_quick_start_runs(tmp_path):
    lines = [ln for block in quick_start_blocks("bash") for ln in block.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    allocate = [ln for ln in lines if "sera-opt allocate" in ln]
    assert allocate, "no sera-opt allocate line in the Quick start"
    bindir = Path(sys.executable).parent
    env = {"PATH": f"{bindir}:/usr/bin:/bin"}
    for line in lines:
        if "sera-opt bench" in line:
            continue  # benchmarks have their own tests
        out = subprocess.run(["bash", "-c", line.split("  #")[0]], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (line, out.stderr)
        if "sera-opt allocate" in line:
            body = out.stdout.strip()
            assert body, line
            if "--format json" in line:
                import json

                counts = json.loads(body)["counts"]
            else:
                counts = [int(v) for v in body.splitlines()[1:]]
            assert counts and all(c >= 1 for c in counts), (line, body)


@pytest.mark.parametrize("claim", ["allocate(p, B)", "get_policy"])
def test_the_readme_names_the_defaults_it_uses(claim):
    # The README states the default cap of allocate() and the sera policy and why.
    text = README.read_text()
    assert "4" in text and "max_ratio" in text, "README must state the default cap"
    assert claim.split("(")[0] in text


def test_the_first_counts_in_the_readme_are_the_solvers():
    import sera_opt

    counts = sera_opt.allocate(np.array([0.9, 0.5, 0.05]), 24, max_rollouts=16).counts.tolist()
    assert counts == \
        [2, 6, 16]


def test_the_first_screen_answers_a_newcomers_questions():
    """What it is, whether to use it (the default and the evidence), how to get it (clone,
    then the two commands) and a runnable example, in README's first 40 lines."""
    import sera_opt

    lines = README.read_text().splitlines()
    first = "\n".join(lines[:40])
    assert "git clone" in first, "README must say to clone before installing"
    assert "RolloutPlanner()" in first and sera_opt.planner.DEFAULT_POLICY == "uniform"
    assert f'DEFAULT_POLICY = "{sera_opt.planner.DEFAULT_POLICY}"' in first, "README must name the default"
    assert "paper_sera()" in first, "the first screen must say what the next runs are"
    assert "same number of rollouts" in first, "the default must be stated on the first screen"
    assert "## Quick start" in first and "sera-opt demo" in first and "python -m pytest" in first
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README.read_text()), "no commit hash in README"
