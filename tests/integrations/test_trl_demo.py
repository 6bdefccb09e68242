"""`python -m sera_opt.integrations.trl_demo` reads as a report: a header that explains its
columns, one line per step and a summary; `--json` keeps the raw lines."""

from __future__ import annotations

import json

import pytest

from tests.markers import requires_trl

pytestmark = [requires_trl, pytest.mark.trl]


def test_the_demo_prints_a_header_a_line_per_step_and_a_summary(capsys):
    from sera_opt.integrations import trl_demo

    assert trl_demo.main(["--steps", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(
        "Rollout allocation (sera-fair, alpha 1) + MaxRL advantages inside TRL")
    for term in ("min_factor", "alignment", "mean_scale", "loss"):
        assert any(line.startswith(term) for line in lines), f"{term} is not explained"
    assert "not a measure of progress" in out.lower()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("step  reward"))
    steps = [line.split() for line in lines[header + 1:header + 3]]
    assert [row[0] for row in steps] == ["1", "2"] and all(len(row) >= 7 for row in steps)
    assert lines[-1].startswith("Summary: 2 steps, 32 completions; every step generated exactly "
                                "the allocated counts"), lines[-1]
    assert not any(line.startswith("{") for line in lines)


def test_the_demo_keeps_its_raw_lines_under_json(capsys):
    from sera_opt.integrations import trl_demo

    assert trl_demo.main(["--steps", "1", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 1


@pytest.mark.parametrize("args", [["--seed", "-1"], ["--max-rollouts", "1"],
                                  ["--learning-rate", "0"], ["--learning-rate", "nan"]])
def test_the_demo_refuses_bad_numbers_before_any_work(args, capsys):
    from sera_opt.integrations import trl_demo

    assert trl_demo.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and args[0] in err, err
