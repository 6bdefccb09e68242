"""The solver benchmark's measuring code runs and reports what it claims (tiny sizes)."""

from __future__ import annotations

import json

import numpy as np

from sera_opt.benchmarks import _harness, solvers


def test_time_allocators_reports_every_solver_and_policy(tmp_path):
    import sera_opt

    rows = solvers.time_allocators((64,), max_seconds=5.0, repeats=1,
                                   rng=np.random.default_rng(0), show=False)
    timed = {(r["kind"], r["name"]) for r in rows if "median_s" in r}
    assert {("solver", n) for n in sera_opt.available_solvers()} <= timed
    for r in rows:
        if "median_s" in r:
            assert r["median_s"] > 0 and r["sort_median_s"] > 0
            assert r["ratio_to_sort"] == r["median_s"] / r["sort_median_s"]
    sera_rows = [r for r in rows if r.get("name") in ("waterline", "milp", "greedy")]
    assert len({round(r["min_factor"], 12) for r in sera_rows}) == 1, "exact solvers disagree"
    png = solvers.plot(rows, tmp_path)
    assert png.exists() and png.stat().st_size > 0
    path = _harness.write_json(tmp_path, "solvers", {"results": rows})
    body = json.loads(path.read_text())
    assert body["machine"]["cpu_count"] >= 1 and body["results"]


def test_pass_at_k_matches_the_combinatorial_formula():
    from math import comb

    for n, c, k in [(10, 3, 1), (10, 3, 5), (64, 1, 64), (5, 0, 2), (64, 10, 7), (3, 3, 2)]:
        expected = 1 - comb(n - c, k) / comb(n, k)
        assert abs(float(_harness.pass_at_k(n, c, k)) - expected) < 1e-12, (n, c, k)


def test_median_time_counts_repeats():
    calls = []
    out = _harness.median_time(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and out["repeats"] == 4 and out["median"] >= 0
