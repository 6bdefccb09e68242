"""The estimator benchmark's summary: judged ratio of medians and the paired ratio of each round."""

from __future__ import annotations

import numpy as np

from sera_opt.benchmarks import estimator


def test_summary_pairs_each_round_with_its_baseline():
    # The machine halves its speed for the second half of the rounds: both members of a
    # round move together, so every round's own ratio is exactly 4.
    speed = np.r_[np.ones(20), 2 * np.ones(21)]
    base = list(1e-3 * speed)
    case = list(4e-3 * speed)
    times = {"base": base, "case": case}
    faults = {"base": [0] * 41, "case": [3] * 41}
    rows = estimator._summarise(times, times, faults, "base")
    row = rows["case"]
    assert row["cpu_paired_ratio"] == row["wall_paired_ratio"] == 4.0
    assert row["cpu_paired_ratio_ci95"] == [4.0, 4.0]
    assert row["cpu_ratio"] == np.median(case) / np.median(base) == 4.0
    assert row["page_faults_per_call"] == 3 and rows["base"]["cpu_paired_ratio"] == 1.0
    # An outlier round moves the paired median little, the interval brackets it.
    case[0] = 1.0
    row = estimator._summarise(times, times, faults, "base")["case"]
    low, high = row["cpu_paired_ratio_ci95"]
    assert row["cpu_paired_ratio"] == 4.0 and low <= 4.0 <= high
