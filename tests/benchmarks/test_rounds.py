"""The rounds benchmark: its three parts run small and say what they claim."""

import numpy as np
import pytest

from sera_opt.benchmarks import rounds


def test_speed_rows_compare_rounds_with_static_in_the_same_run():
    rows = rounds.run_speed((64,), repeats=2, seed=0)
    assert {r["policy"] for r in rows} == set(rounds.POLICIES)
    for r in rows:
        assert r["rounds_s"] > 0 and r["static_s"] > 0 and r["sort_s"] > 0
        assert r["rounds_vs_static"] == pytest.approx(r["rounds_s"] / r["static_s"])


def test_scales_agree_with_the_realized_scales_and_rounds_raise_them():
    rows = rounds.run_scales(seeds=4, seed=1, m=256)
    by = {(r["offset"], r["arm"]): r for r in rows}
    for r in rows:
        if r["realized_hit_fraction"] is not None:
            # the session's expected scales against an unbiased estimate from the rewards
            assert abs(r["mean_scale"] - r["realized_hit_fraction"]) < 0.05, r
        assert r["rollouts"] <= 8 * 256 + 1e-9
    for c in (0, 1):
        assert by[(c, "uniform:rounds=4")]["mean_scale"] > by[(c, "uniform")]["mean_scale"]


def test_baselines_measure_the_exact_scales():
    rows = rounds.run_baselines(episodes=3000, seed=2)
    assert len(rows) == 2 * 4 * 3
    for r in rows:
        assert abs(r["scale_mc"] - r["scale_exact"]) < 4 * r["scale_mc_se"] + 1e-9, r
        assert np.isfinite(r["noise_per_signal"]) and r["noise_per_signal"] >= 0


def _maze_payload(shift_by_arm, seeds=6, seed=0):
    """A maze-shaped result in which each arm's pass@k is the baseline's plus a shift
    and a little per-seed noise."""
    rng = np.random.default_rng(seed)
    runs = []
    for s in range(seeds):
        base = np.linspace(0.3, 0.8, 64) + rng.normal(0, 0.01)
        for arm, shift in shift_by_arm.items():
            curves = {"rounds": [{"rounds": 2.0, "mean_scale": 0.9, "min_scale": 0.3,
                                  "round_0_budget": 8.0, "round_0_active": 0.2,
                                  "round_1_budget": 8.0, "round_1_active": 0.1}]} \
                if "rounds" in arm else {}
            runs.append({"arm": arm, "seed": s, "cpu_time": 1.0, "curves": curves,
                         "pass_at_k": (base + shift + rng.normal(0, 0.002, 64)).tolist()})
    return {"benchmark": "maze", "runs": runs}


def test_the_rounds_rule_needs_every_configuration_and_a_significant_gain():
    from sera_opt.benchmarks import rounds_decision as rd

    good = {"sera-fair:alpha=1": 0.0, "sera-fair:alpha=1:rounds=4": 0.03,
            "uniform:rounds=4": -0.05}
    summaries = {name: rd.summarize(_maze_payload(good, seed=i))
                 for i, name in enumerate(rd.CONFIGURATIONS)}
    rule = rd.verdict(summaries)
    assert rule["choice"] == "sera-fair:alpha=1:rounds=4"
    assert rule["candidates"]["uniform:rounds=4"]["never_below"] is False
    # one configuration missing: nobody wins
    del summaries["arithmetic"]
    assert rd.verdict(summaries)["choice"] is None
    # level everywhere: not significantly above anywhere
    level = {"sera-fair:alpha=1": 0.0, "sera-fair:alpha=1:rounds=4": 0.0,
             "uniform:rounds=4": 0.0}
    flat = {name: rd.summarize(_maze_payload(level, seed=i))
            for i, name in enumerate(rd.CONFIGURATIONS)}
    assert rd.verdict(flat)["choice"] is None
    assert flat["maze default"]["rounds"]["uniform:rounds=4"]["active"] == pytest.approx([0.2, 0.1])


def test_round_summary_pads_rules_that_stop_early():
    from sera_opt.benchmarks import rounds_decision as rd

    # a rule with exits: one step used 2 rounds, the other 3; no expected scales
    steps = [{"rounds": 2.0, "round_0_budget": 8.0, "round_0_active": 0.5,
              "round_1_budget": 4.0, "round_1_active": 0.0},
             {"rounds": 3.0, "round_0_budget": 8.0, "round_0_active": 0.75,
              "round_1_budget": 6.0, "round_1_active": 0.5,
              "round_2_budget": 4.0, "round_2_active": 0.25}]
    out = rd._round_summary([steps])
    assert out["budgets"] == pytest.approx([8.0, 5.0, 2.0])
    assert out["active"] == pytest.approx([0.625, 0.25, 0.125])
    assert out["rollouts_per_step"] == pytest.approx(15.0)
    assert "mean_scale" not in out
    # arithmetic's record has the lists themselves
    lists = [{"round_budgets": [8, 4], "active_fraction": [0.5, 0.0]}]
    assert rd._round_summary([lists])["rollouts_per_step"] == 12


# --------------------------------------------------------------------------- the rule's files


def _rule_file(tmp_path, name="maze.json", *, preset="default", seeds=16, edit=None):
    """A maze result of ``preset`` with the rule's seeds, as a file; ``edit(payload)`` first."""
    import json

    from sera_opt.benchmarks import _results

    arms = {"sera-fair:alpha=1": 0.0, "sera-fair:alpha=1:rounds=4": 0.0,
            "uniform:rounds=4": 0.0}
    payload = _maze_payload(arms, seeds=seeds)
    config = json.loads(json.dumps(_results.presets("maze")[preset], default=list))
    payload.update(config={**config, "arms": list(arms), "seeds": seeds}, summary={})
    if edit is not None:
        edit(payload)
    path = tmp_path / name
    path.write_text(json.dumps(payload))
    return str(path)


def _refused(argv, capsys, match):
    import re

    from sera_opt.benchmarks import rounds_decision as rd

    assert rd.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1, captured
    assert re.search(match, captured.err), captured.err


def test_the_rounds_rule_reads_its_files(tmp_path, capsys):
    from sera_opt.benchmarks import rounds_decision as rd

    out = tmp_path / "summary.json"
    assert rd.main(["--maze", _rule_file(tmp_path), "--maze-hard",
                    _rule_file(tmp_path, "hard.json", preset="hard"), "--out", str(out)]) == 0
    assert "not run: arithmetic" in capsys.readouterr().out and out.is_file()


def test_the_rounds_rule_refuses_what_it_cannot_judge(tmp_path, capsys):
    maze = _rule_file(tmp_path)
    _refused(["--maze", maze, "--maze-hard", maze], capsys, "the same file")
    _refused(["--maze-hard", maze], capsys, "is a run of the 'default' preset")
    _refused(["--maze", _rule_file(tmp_path, "quick.json", preset="quick")], capsys,
             "is a run of the 'quick' preset")
    _refused(["--maze", _rule_file(tmp_path, "few.json", seeds=6)], capsys,
             r"ran 6 seed\(s\); the rule judges maze default on 16")
    _refused(["--arithmetic", maze], capsys, "is the result of the 'maze' benchmark")
    _refused(["--maze", maze, "--out", str(tmp_path / "maze.json" / "s.json")], capsys,
             "is a file, not a folder")

    def nan(payload):
        payload["runs"][4]["pass_at_k"] = [None] * 64

    _refused(["--maze", _rule_file(tmp_path, "nan.json", edit=nan)], capsys, "NaN")

    def unpaired(payload):
        del payload["runs"][0]

    _refused(["--maze", _rule_file(tmp_path, "unpaired.json", edit=unpaired)], capsys,
             "paired by seed")
    truncated = tmp_path / "cut.json"
    truncated.write_text(open(maze).read()[:200])
    _refused(["--maze", str(truncated)], capsys, "truncated")
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    _refused(["--maze", str(listed)], capsys, "holds a JSON list")
