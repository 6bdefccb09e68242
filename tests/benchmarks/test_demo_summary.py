"""`sera-opt demo` ends with a one-line verdict computed from its own results, and with
--out draws a plot of them."""

from __future__ import annotations

from sera_opt.benchmarks.alignment import command
from sera_opt.benchmarks.alignment.config import DEMO_PEER
from sera_opt.benchmarks.alignment.summary import demo_plot, demo_verdict

PEER = f"{DEMO_PEER}/tracker/corrected"


def _payload(curves: dict[str, list[float]], budgets=(2, 4, 8)) -> dict:
    results = [{"method": f"{method} c={c}", "budget_per_prompt": b, "expected_cosine": v,
                "offset": c}
               for method, values in curves.items() for c in (0, 1)
               for b, v in zip(budgets, values, strict=True)]
    return {"config": {"offsets": [0, 1], "budgets": list(budgets)}, "results": results}


def test_the_verdict_counts_the_settings_and_the_doubled_budgets():
    payload = _payload({"uniform": [0.5, 0.6, 0.7], PEER: [0.6, 0.6, 0.65],
                        "sera/tracker/corrected": [0.4, 0.4, 0.4]})
    line = demo_verdict(payload, DEMO_PEER)
    assert "\n" not in line and line.startswith("Verdict: sera-fair:alpha=1(tracker)")
    assert line.endswith("the planner's default stays uniform, which no allocation beat through "
                         "TRL at equal CPU time (README, 'Should you use it?').")
    assert "better than uniform in 2 of 6 settings (worse in 2, tied in 2)" in line
    assert "+0.017 cosine on average" in line
    assert "at 2 of 4 budgets it did at least as well as uniform with twice the rollouts" in line
    # without the peer in the run, the verdict is about SERA on the tracker's estimates
    alone = demo_verdict(payload, None)
    assert "SERA(tracker)" in alone and "in 0 of 6 settings (worse in 6" in alone


def test_the_demo_ends_with_the_verdict_and_writes_a_plot(tmp_path, capsys):
    argv = ["--budgets", "2", "4", "--batch-size", "32", "--batches", "1", "--draws", "1",
            "--no-progress", "--out", str(tmp_path)]
    assert command.demo(argv) == 0
    last = capsys.readouterr().out.rstrip("\n").splitlines()[-1]
    assert last.startswith("Verdict: sera-fair:alpha=1(tracker)") and "settings" in last, last
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_the_plot_draws_one_panel_per_estimator():
    payload = _payload({"uniform": [0.5, 0.6, 0.7], PEER: [0.6, 0.6, 0.65],
                        "sera/tracker/corrected": [0.4, 0.4, 0.4]})
    figure = demo_plot(payload, DEMO_PEER)
    panels = [ax for ax in figure.axes if ax.get_lines()]
    assert len(panels) == 2 and all(len(ax.get_lines()) == 3 for ax in panels)
