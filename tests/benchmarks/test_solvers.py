"""The solver benchmark's measuring code runs and reports what it claims (tiny sizes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sera_opt import SeraOptError
from sera_opt.benchmarks import _harness, solvers


def test_time_allocators_reports_every_solver_policy_and_family_member(tmp_path):
    import sera_opt

    rows = solvers.time_allocators((256,), max_seconds=5.0, repeats=1,
                                   rng=np.random.default_rng(0), show=False)
    timed = {(r["kind"], r["name"]) for r in rows if "median_s" in r}
    assert {("solver", n) for n in sera_opt.available_solvers()} <= timed
    assert {("policy", n) for n in sera_opt.available_policies()} <= timed
    assert {("policy", label) for _, _, label in solvers.FAMILY} <= timed
    assert ("solver", "waterline:continuous=False") in timed
    for r in (r for r in rows if "median_s" in r):
        assert r["sort_median_s"] > 0 and r["log1p_median_s"] > 0
        assert r["clock"] == ("wall" if r["name"] in solvers.MULTITHREADED else "thread_cpu")
    sera_rows = [r for r in rows if r.get("name") in ("waterline", "milp", "greedy")]
    assert len({round(r["min_factor"], 12) for r in sera_rows}) == 1, "exact solvers disagree"
    png = solvers.plot(rows, tmp_path)
    assert png.exists() and png.stat().st_size > 0
    path = _harness.write_json(tmp_path, "solvers", {"results": rows})
    body = json.loads(path.read_text())
    assert body["machine"]["cpu_count"] >= 1 and body["results"]


def test_targets_are_judged_from_the_rows():
    def row(kind, name, m, t, sort, log1p):
        return {"kind": kind, "name": name, "prompts": m, "median_s": t, "sort_median_s": sort,
                "ratio_to_sort": t / sort, "log1p_median_s": log1p, "ratio_to_log1p": t / log1p}

    rows = [row("solver", "waterline", 10**6, 0.040, 0.010, 0.005),   # 4x sort, 8x log1p
            row("policy", "sera", 1024, 60e-6, 1e-5, 1e-5),           # 60 us at 1024
            row("policy", "hora", 10**6, 0.2, 0.010, 0.005),          # 20x sort
            row("policy", "vip", 10**6, 0.05, 0.010, 0.005),
            row("policy", "sera-fair", 10**6, 0.05, 0.010, 0.005),
            row("policy", "sera-fair:alpha=2", 10**6, 0.12, 0.010, 0.005),
            row("policy", "sera-bayes", 10**6, 0.2, 0.010, 0.005)]
    met = solvers.targets(rows)
    assert met["sera_vs_sort"] == {"value": 4.0, "met": True}
    assert met["sera_vs_log1p"]["met"] is True and met["sera_vs_log1p"]["value"] == 8.0
    assert met["sera_1024_s"]["met"] is False
    assert met["hora_vs_sort"]["met"] is False and met["vip_vs_sort"]["met"] is True
    assert "uniform_vs_sort" not in met
    # sera-fair and its family arms have the peers' target; sera-bayes has none.
    assert met["sera-fair_vs_sort"]["met"] is True and met["sera-fair:alpha=2_vs_sort"]["met"] is False
    assert "sera-bayes_vs_sort" not in met and "sera_vs_sort" in met
    text = solvers._summary(rows, met, {"avx2": True})
    assert "NOT met" in text and "M = 1,000,000" in text and "(goal 50 us)" in text


def test_cpu_info_reads_the_flags():
    info = solvers.cpu_info()
    assert isinstance(info["flags"], list)
    if info["flags"]:  # Linux
        assert info["avx2"] == ("avx2" in info["flags"])
    assert "numpy_cpu_features" in info and info["numpy_cpu_features"]


def test_pass_at_k_matches_the_combinatorial_formula():
    from math import comb

    for n, c, k in [(10, 3, 1), (10, 3, 5), (64, 1, 64), (5, 0, 2), (64, 10, 7), (3, 3, 2)]:
        expected = 1 - comb(n - c, k) / comb(n, k)
        assert abs(float(_harness.pass_at_k(n, c, k)) - expected) < 1e-12, (n, c, k)


def test_median_time_counts_repeats():
    calls = []
    out = _harness.median_time(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and out["repeats"] == 4 and out["median"] >= 0


def test_median_interval_takes_the_binomial_order_statistics():
    from scipy.stats import binom

    for n in (6, 7, 20, 41, 101):
        x = np.arange(n, dtype=float)[::-1]  # any order: the interval sorts
        out = _harness.median_interval(x)
        low, high = int(out["ci_low"]), int(out["ci_high"])
        k = low + 1  # the k-th smallest
        assert high == n - k and out["median"] == np.median(x)
        # k reaches 95 % coverage and k + 1 would not.
        assert 1 - 2 * binom.cdf(k - 1, n, 0.5) >= 0.95 > 1 - 2 * binom.cdf(k, n, 0.5)
        assert out["coverage"] == 1 - 2 * binom.cdf(k - 1, n, 0.5)
    at_41 = _harness.median_interval(np.arange(41.0))
    assert (at_41["ci_low"], at_41["ci_high"]) == (13.0, 27.0)  # the 14th and the 28th of 41


def test_median_interval_covers_the_median_and_says_when_it_cannot():
    rng = np.random.default_rng(0)
    draws = rng.exponential(size=(2000, 41))  # median log 2
    covered = [(o["ci_low"] <= np.log(2) <= o["ci_high"])
               for o in map(_harness.median_interval, draws)]
    assert np.mean(covered) >= 0.94  # nominal coverage 0.956 at n = 41
    small = _harness.median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert small["median"] == 3.0 and np.isnan(small["ci_low"]) and "too few" in small["note"]
    with pytest.raises(SeraOptError):
        _harness.median_interval([])


def test_the_compile_timing_is_announced_before_it_starts(monkeypatch, capsys, tmp_path):
    # bench solvers --quick spent its first 15 s timing the compile without a line.
    class Stop(Exception):
        pass

    def compile_times():
        raise Stop(capsys.readouterr().err)

    monkeypatch.setattr(solvers, "compile_times", compile_times)
    with pytest.raises(Stop) as before:
        solvers.main(["--quick", "--out", str(tmp_path)])
    assert "timing the numba compile" in str(before.value)
    with pytest.raises(Stop) as quiet:
        solvers.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    assert str(quiet.value) == ""
