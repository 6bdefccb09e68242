"""The trl-rounds benchmark: it runs small, counts the generation calls it claims, and
refuses settings without its baseline. Its timings are read in docs/benchmarks.md, never here."""

import json

import pytest

from tests.markers import requires_trl


@requires_trl
@pytest.mark.trl
def test_the_benchmark_times_each_setting_and_counts_its_generation_calls(tmp_path):
    from sera_opt.benchmarks import trl_rounds

    argv = ["--quick", "--steps", "2", "--completion-length", "4", "--rounds", "1,2",
            "--out", str(tmp_path), "--no-progress"]
    assert trl_rounds.main(argv) == 0
    payload = json.loads((tmp_path / "trl_rounds.json").read_text())
    rows = {row["setting"]: row for row in payload["rows"]}
    assert list(rows) == ["rounds=1", "rounds=2", trl_rounds.PLAIN]
    # One backend call per round (both rounds of 64 completions have a budget), one for trl.
    assert [rows[s]["generate_calls_per_step"] for s in rows] == [1, 2, 1]
    for row in rows.values():
        assert row["steps_measured"] == 1  # two steps, the first a warm-up
        assert 0 < row["generate_s"] < row["step_s"]
        assert row["step_vs_rounds_1"] == pytest.approx(
            row["step_s"] / rows["rounds=1"]["step_s"])
    assert rows["rounds=1"]["step_vs_rounds_1"] == 1.0
    # The breakdown counts the calls it times: one generate and one reward call per round,
    # one log-probability pass (the loss's; no reference model, one iteration); the
    # adapter's part only where the adapter runs.
    for setting, calls in [("rounds=1", 1), ("rounds=2", 2), (trl_rounds.PLAIN, 1)]:
        parts = rows[setting]["breakdown"]
        assert parts["model generate"]["calls"] == parts["trl per-call setup"]["calls"] == calls
        assert parts["reward functions"]["calls"] == calls
        assert parts["log-prob passes"]["calls"] == 1
        assert parts["sera_opt"]["calls"] == (0 if setting == trl_rounds.PLAIN else 1)
        assert parts["model generate"]["ms"] > 0 and parts[trl_rounds.REST]["ms"] > 0
        assert sum(p["ms"] for p in parts.values()) == pytest.approx(
            1e3 * rows[setting]["step_s"])  # one measured step: the parts add up to it
    assert payload["setup"]["completions_per_step"] == 64 and payload["sort_1e6_s"] > 0
    assert "flags" in payload["machine"]["cpu"]


@pytest.mark.parametrize("argv", [["--rounds", "2,4"], ["--rounds", "0,1"], ["--rounds", "a"],
                                  ["--completion-length", "49"], ["--steps", "1"]])
def test_bad_settings_are_refused(argv, tmp_path):
    # --rounds needs 1 (the ratios' baseline); completions must fit the tiny model's
    # 64 positions; one step would be the warm-up alone.
    from sera_opt.benchmarks import trl_rounds

    with pytest.raises(SystemExit) as raised:
        trl_rounds.main([*argv, "--out", str(tmp_path)])
    assert raised.value.code == 2
