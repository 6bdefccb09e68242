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
