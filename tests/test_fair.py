"""The alpha-fair family (docs/theory.md section 8): exact for its own objective, SERA as its limit.

The objective is written out here again in plain numpy (and the marginal gains in 60-digit
arithmetic with mpmath), independent of the engine's kernels.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import SeraOptError, get_policy
from sera_opt.separable import AlphaFairUtility

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
ALPHAS = (0.0, 0.5, 1.0, 2.0, 8.0)
GRID = (0.0, 1e-3, 0.01, 0.05, 0.2, 0.5, 0.8, 0.95, 0.999, 1.0)


def fair_utility(p, n, alpha, offset):
    """U_alpha(w_c(p, n)) per prompt, straight from the definition."""
    p = np.asarray(p, dtype=np.float64)
    m = np.asarray(n, dtype=np.float64) - offset
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(m > 0, 1.0 - (1.0 - p) ** np.maximum(m, 0), 0.0)
        if alpha == 1.0:
            return np.log(w)
        return w ** (1.0 - alpha) / (1.0 - alpha)


def feasible(lo, hi, budget):
    for counts in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
        if sum(counts) == budget:
            yield np.array(counts)


@st.composite
def tiny(draw, offset=None):
    c = draw(st.sampled_from((0, 1))) if offset is None else offset
    m = draw(st.integers(1, 4))
    lo = np.array(draw(st.lists(st.integers(1 + c, 3 + c), min_size=m, max_size=m)))
    hi = lo + np.array(draw(st.lists(st.integers(0, 4), min_size=m, max_size=m)))
    budget = draw(st.integers(int(lo.sum()), int(hi.sum())))
    p = np.array(draw(st.lists(st.one_of(st.sampled_from(GRID), st.floats(1e-3, 1 - 1e-3)),
                               min_size=m, max_size=m)))
    return p, lo, hi, budget, c


def allocate(p, lo, hi, budget, c, alpha):
    return get_policy("sera-fair", alpha=alpha, offset=c).allocate(
        p, budget, min_rollouts=lo, max_rollouts=hi)


# ------------------------------------------------------------------ optimality
@pytest.mark.parametrize("alpha", ALPHAS)
@SETTINGS
@given(case=tiny())
def test_brute_force_optimum_of_its_own_objective(alpha, case):
    p, lo, hi, budget, c = case
    counts = allocate(p, lo, hi, budget, c, alpha).counts
    # Prompts with p = 0 or p = 1 gain nothing from any rollout (section 8): the objective
    # that ranks allocations is the sum over the others, and the edge prompts keep their
    # minimum unless every other prompt is full.
    inner = (p > 0) & (p < 1)
    best = max(fair_utility(p, n, alpha, c)[inner].sum() for n in feasible(lo, hi, budget))
    got = fair_utility(p, counts, alpha, c)[inner].sum()
    assert got >= best - 1e-9 * (1 + abs(best)), (p, lo, hi, budget, counts, got, best)
    edge = ~inner
    if edge.any() and np.any(counts[inner] < hi[inner]):
        np.testing.assert_array_equal(counts[edge], lo[edge],
                                      err_msg="an edge prompt took a rollout another could use")


@pytest.mark.parametrize(("alpha", "expected"), [(0.0, [2, 1]), (0.5, [2, 1]), (1.0, [1, 2]),
                                                  (2.0, [1, 2])])
def test_a_case_by_hand(alpha, expected):
    # One spare rollout; p = 0.5 and p = 0.01 at one rollout each. The easy prompt's factor
    # goes 0.5 -> 0.75, the hard one's 0.01 -> 0.0199. alpha = 0: +0.25 against +0.0099;
    # alpha = 0.5 (U = 2 sqrt w): +0.318 against +0.082; alpha = 1 (log w): log 1.5 = 0.405
    # against log 1.99 = 0.688; alpha = 2 (U = -1/w): +0.667 against +49.7.
    counts = allocate(np.array([0.5, 0.01]), 1, 5, 3, 0, alpha).counts
    assert counts.tolist() == expected


# ------------------------------------------------------------------ monotone facts
@SETTINGS
@given(case=tiny(), alpha=st.sampled_from(ALPHAS))
def test_optimum_beats_every_other_member_and_uniform_on_its_objective(case, alpha):
    p, lo, hi, budget, c = case
    inner = (p > 0) & (p < 1)
    mine = fair_utility(p, allocate(p, lo, hi, budget, c, alpha).counts, alpha, c)[inner].sum()
    others = [allocate(p, lo, hi, budget, c, a).counts for a in (*ALPHAS, math.inf)]
    others.append(get_policy("uniform", offset=c).allocate(p, budget, min_rollouts=lo,
                                                           max_rollouts=hi).counts)
    for n in others:
        theirs = fair_utility(p, n, alpha, c)[inner].sum()
        assert mine >= theirs - 1e-9 * (1 + abs(theirs))


@SETTINGS
@given(case=tiny())
def test_alpha_zero_has_the_largest_sum_and_alpha_inf_the_largest_minimum(case):
    p, lo, hi, budget, c = case
    factors = {a: sera_opt.attenuation(p, allocate(p, lo, hi, budget, c, a).counts, c)
               for a in (*ALPHAS, math.inf)}
    inner = (p > 0) & (p < 1)
    for w in factors.values():
        assert factors[0.0][inner].sum() >= w[inner].sum() - 1e-12
        assert factors[math.inf].min() >= w.min() - 1e-12 or not inner.all()


@SETTINGS
@given(case=tiny(), alpha=st.sampled_from(ALPHAS))
def test_optimum_grows_with_the_budget(case, alpha):
    p, lo, hi, budget, c = case
    assume(budget < hi.sum())
    inner = (p > 0) & (p < 1)
    now = fair_utility(p, allocate(p, lo, hi, budget, c, alpha).counts, alpha, c)[inner].sum()
    more = fair_utility(p, allocate(p, lo, hi, budget + 1, c, alpha).counts, alpha, c)[inner]
    assert more.sum() >= now - 1e-9 * (1 + abs(now))


# ------------------------------------------------------------------ the limit
def test_alpha_inf_is_exactly_sera():
    rng = np.random.default_rng(3)
    for _ in range(30):
        m = int(rng.integers(1, 60))
        p = rng.choice([rng.uniform(0, 1), 0.0, 1.0, 0.5], size=m, p=[0.7, 0.1, 0.1, 0.1])
        p = np.where(rng.random(m) < 0.7, rng.random(m), p)
        c = int(rng.integers(0, 2))
        budget = int(m * rng.integers(1 + c, 9))
        fair = get_policy("sera-fair", alpha=math.inf, offset=c).allocate(p, budget)
        sera = get_policy("sera", offset=c).allocate(p, budget)
        np.testing.assert_array_equal(fair.counts, sera.counts)


@SETTINGS
@given(case=tiny(), data=st.data())
def test_large_alpha_gives_seras_lexicographic_optimum(case, data):
    p, lo, hi, budget, c = case
    p = np.array([data.draw(st.sampled_from((0.02, 0.1, 0.3, 0.55, 0.8, 0.9))) for _ in p])
    sera = sera_opt.allocate(p, budget, min_rollouts=lo, max_rollouts=hi, offset=c)
    fair = allocate(p, lo, hi, budget, c, 1e6)
    # Equal probabilities make equal levels; the sorted level vector is what is unique.
    levels = -np.log1p(-p) * (fair.counts - c)
    np.testing.assert_allclose(np.sort(levels), np.sort(sera.levels), rtol=1e-12)


# ------------------------------------------------------------------ numerics
def reference_log_gain(p, m, alpha):
    """The kernel's log gain in arbitrary precision (60 digits beyond what q^m needs)."""
    # Enough digits to resolve 1 - q^(m+1) against 1 - q^m when q = 1 - p is tiny.
    digits = 60 + int((m + 1) * max(0.0, -math.log10(1.0 - p)))
    with mpmath.workdps(digits):
        p = mpmath.mpf(p)
        q = 1 - p

        def u(w):
            if alpha == 1:
                return mpmath.log(w)
            return w ** (1 - mpmath.mpf(alpha)) / (1 - mpmath.mpf(alpha))

        w0, w1 = 1 - q**m, 1 - q ** (m + 1)
        if alpha == 1:
            # The kernel orders alpha = 1 steps by log r, r = (w1 - w0) / w0, a strictly
            # increasing function of the gain log(w1 / w0) = log1p(r).
            return float(mpmath.log((w1 - w0) / w0))
        return float(mpmath.log(u(w1) - u(w0)))


@pytest.mark.parametrize("alpha", (0.0, 0.5, 1.0, 1.5, 2.0, 8.0, 200.0))
@pytest.mark.parametrize("p", (1e-12, 1e-6, 0.01, 0.3, 0.7, 0.999, 1 - 1e-9))
@pytest.mark.parametrize("m", (1, 2, 7, 40, 300))
def test_log_gains_match_high_precision(alpha, p, m):
    from sera_opt.kernels import gains, kinds

    expected = reference_log_gain(p, m, alpha)
    got = gains.gain(kinds.ALPHA_FAIR, -math.log1p(-p), math.log(p), alpha, 0, m)
    assert got == pytest.approx(expected, rel=1e-11, abs=1e-11), (alpha, p, m)


@pytest.mark.parametrize("alpha", (0.0, 1.0, 2.0, 50.0, 1e4, 1e12))
def test_no_nan_or_overflow_at_the_edges(alpha):
    p = np.array([0.0, 1e-300, 1e-12, 0.5, 1 - 1e-12, 1.0, 5e-324])
    for budget in (len(p) * 2, len(p) * 1000, 10**9):
        alloc = get_policy("sera-fair", alpha=alpha, offset=1, max_ratio=None).allocate(
            p, budget)
        assert int(alloc.counts.sum()) == budget
        assert np.all(np.isfinite(alloc.factors))
        assert not math.isnan(alloc.objective_value)
        # p = 0 and p = 1 gain nothing: they keep the minimum while others can take more.
        assert alloc.counts[0] == 2 and alloc.counts[5] == 2
        if budget > 2 * len(p) and alpha == 1:
            # At alpha = 1 every unsolved prompt gains about log((n + 1 - c) / (n - c))
            # whatever its p, so all three hopeless prompts share the spare rollouts
            # (at alpha = 2 the gain grows like 1 / p and p = 5e-324 takes nearly all).
            assert alloc.counts[[1, 2, 6]].min() > 2


def test_distinct_gains_are_not_tied_at_large_alpha():
    # With alpha = 1e4 the linear gains of these prompts underflow to 0 and would tie;
    # in log space the harder prompt still comes first.
    p = np.array([0.6, 0.5])
    counts = get_policy("sera-fair", alpha=1e4).allocate(p, 3, max_rollouts=5).counts
    assert counts.tolist() == [1, 2]


def test_alpha_is_an_attribute_and_validated_when_built():
    assert get_policy("sera-fair", alpha=2).alpha == 2.0
    assert get_policy("sera-fair").alpha == 1.0
    for bad in (-1, float("nan"), "x", True, None):
        with pytest.raises(SeraOptError, match="alpha"):
            get_policy("sera-fair", alpha=bad)


def test_max_ratio_caps_like_the_other_sera_policies():
    p = np.array([0.9, 0.5, 1e-6, 1e-6])
    alloc = get_policy("sera-fair", alpha=2).allocate(p, 40)
    assert alloc.counts.max() <= 40  # 4 x the mean of 10
    assert get_policy("sera-fair", alpha=2, max_ratio=1.5).allocate(p, 40).counts.max() <= 15
    wide = get_policy("sera-fair", alpha=2, max_ratio=None).allocate(p, 40)
    assert wide.counts.max() > 15


def test_objective_field_is_the_maximized_sum():
    p = np.array([0.2, 0.7, 0.05])
    alloc = get_policy("sera-fair", alpha=0.5, offset=1).allocate(p, 12)
    assert alloc.objective_value == pytest.approx(fair_utility(p, alloc.counts, 0.5, 1).sum())


def test_objective_class_refuses_alpha_inf():
    with pytest.raises(SeraOptError, match="max-min"):
        AlphaFairUtility([0.5], alpha=math.inf)


def test_the_docs_picture_of_counts_against_alpha(tmp_path):
    pytest.importorskip("matplotlib")
    import json

    from sera_opt.benchmarks import alpha_counts

    assert alpha_counts.main(["--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "alpha_counts.json").read_text())
    assert (tmp_path / "alpha_counts.png").stat().st_size > 10_000
    hardest = [result["counts"][k][0] for k in ("0", "0.5", "1", "2", "4", "inf")]
    assert hardest == sorted(hardest) and hardest[0] < hardest[-1], hardest
    sums = result["sum_of_factors"]
    assert sums["0"] == max(v for k, v in sums.items() if k != "uniform")
    mins = result["min_factor"]
    assert mins["inf"] == max(mins.values())
