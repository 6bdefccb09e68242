"""The peers' policies and sera-bayes: each solves its own objective exactly.

The objectives are written out here again from docs/theory.md section 7 (plain
numpy, independent of the engine's kernels) and checked by brute force on tiny
problems and by the exchange certificate of separable concave problems on
larger ones.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import SeraOptError, get_policy
from sera_opt.policies.bayes import expected_factors
from sera_opt.policies.peers import gvm_weights

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- objectives
def knapsack_value(p, n):
    p = np.asarray(p, dtype=float)
    return (1 - p**n - (1 - p) ** n) * p * (1 - p) ** 2


def vip_cost(p, n, gamma=7e-4):
    p = np.asarray(p, dtype=float)
    with np.errstate(divide="ignore"):
        return p * (1 - p) / (n - 1.0) + gamma * np.log(p) * n


def beta_moment(alpha, beta, m):
    """E[(1 - p)^m] for p ~ Beta(alpha, beta), as the product of ratios, per prompt."""
    out = []
    for a, b, k in zip(np.broadcast_to(alpha, np.shape(m)), np.broadcast_to(beta, np.shape(m)),
                       np.asarray(m)):
        out.append(float(np.prod([(b + j) / (a + b + j) for j in range(int(k))])))
    return np.array(out)


def hora_utility(alpha, beta, n):
    return 1 - beta_moment(alpha, beta, n)


def gvm_cost(p, n, g=None, alpha=1e-3, beta=2.0):
    g = np.ones(len(p)) if g is None else np.asarray(g, float)
    w = g / np.sqrt(np.asarray(p) + alpha / np.asarray(p) ** (beta - 1))
    return w**2 / n


def feasible(lo, hi, budget):
    for counts in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
        if sum(counts) == budget:
            yield np.array(counts)


def best_sum(func, lo, hi, budget, maximize):
    values = [func(c).sum() for c in feasible(lo, hi, budget)]
    return max(values) if maximize else min(values)


@st.composite
def tiny(draw, lo_min=1):
    m = draw(st.integers(1, 4))
    lo = np.array(draw(st.lists(st.integers(lo_min, lo_min + 2), min_size=m, max_size=m)))
    hi = lo + np.array(draw(st.lists(st.integers(0, 4), min_size=m, max_size=m)))
    budget = draw(st.integers(int(lo.sum()), int(hi.sum())))
    p = np.array(draw(st.lists(st.floats(0.01, 0.99), min_size=m, max_size=m)))
    return p, lo, hi, budget


# ---------------------------------------------------------------- brute force
@SETTINGS
@given(tiny(lo_min=2), st.sampled_from([0.0, 1.0, None]))
def test_knapsack_is_optimal(case, edge):
    p, lo, hi, budget = case
    if edge is not None:
        p[0] = edge
    counts = get_policy("knapsack").allocate(p, budget, min_rollouts=lo, max_rollouts=hi).counts
    best = best_sum(lambda n: knapsack_value(p, n), lo, hi, budget, True)
    assert knapsack_value(p, counts).sum() == pytest.approx(best, rel=1e-12, abs=1e-15)


@SETTINGS
@given(tiny(lo_min=2), st.sampled_from([7e-4, 0.05]))
def test_vip_is_optimal(case, gamma):
    p, lo, hi, budget = case
    policy = get_policy("vip", gamma=gamma)
    alloc = policy.allocate(p, budget, min_rollouts=lo, max_rollouts=hi)
    best = best_sum(lambda n: vip_cost(p, n, gamma), lo, hi, budget, False)
    assert vip_cost(p, alloc.counts, gamma).sum() == pytest.approx(best, rel=1e-12, abs=1e-15)
    assert alloc.objective_value == pytest.approx(best, rel=1e-12, abs=1e-15)


@SETTINGS
@given(tiny(), st.data())
def test_hora_is_optimal_under_its_posterior(case, data):
    p, lo, hi, budget = case
    m = len(p)
    strength = np.array(data.draw(st.lists(st.floats(0.3, 40.0), min_size=m, max_size=m)))
    alpha, beta = p * strength, (1 - p) * strength
    alloc = get_policy("hora").allocate(None, budget, min_rollouts=lo, max_rollouts=hi,
                                        posterior=(alpha, beta))
    best = best_sum(lambda n: hora_utility(alpha, beta, n), lo, hi, budget, True)
    assert hora_utility(alpha, beta, alloc.counts).sum() == pytest.approx(best, rel=1e-10)
    assert alloc.objective_value == pytest.approx(best, rel=1e-10)


@SETTINGS
@given(tiny(), st.data())
def test_gvm_is_optimal_for_its_variance_bound(case, data):
    p, lo, hi, budget = case
    g = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.0]), min_size=len(p),
                                    max_size=len(p))))
    alloc = get_policy("gvm").allocate(p, budget, min_rollouts=lo, max_rollouts=hi,
                                       gradient_norms=g)
    best = best_sum(lambda n: gvm_cost(p, n, g), lo, hi, budget, False)
    assert gvm_cost(p, alloc.counts, g).sum() == pytest.approx(best, rel=1e-12, abs=1e-15)


@SETTINGS
@given(tiny(), st.data(), st.sampled_from([0, 1]))
def test_sera_bayes_is_lexicographically_optimal_for_expected_factors(case, data, offset):
    p, lo, hi, budget = case
    m = len(p)
    lo, hi, budget = lo + offset, hi + offset, budget + offset * m
    strength = np.array(data.draw(st.lists(st.floats(0.3, 40.0), min_size=m, max_size=m)))
    alpha, beta = p * strength, (1 - p) * strength
    policy = get_policy("sera-bayes", offset=offset)
    alloc = policy.allocate(None, budget, min_rollouts=lo, max_rollouts=hi,
                            posterior=(alpha, beta))

    def sorted_factors(n):
        return np.sort(1 - beta_moment(alpha, beta, n - offset))

    mine = sorted_factors(alloc.counts)
    for counts in feasible(lo, hi, budget):
        assert not lex_better(sorted_factors(counts), mine), (
            f"{counts} beats {alloc.counts}: {sorted_factors(counts)} > {mine}"
        )
    np.testing.assert_allclose(np.sort(alloc.factors), mine, rtol=1e-12, atol=1e-15)


def lex_better(x, y, rtol=1e-9, atol=1e-14):
    """x is lexicographically larger than y, with values equal to rounding counted equal
    (levels that agree in exact arithmetic rarely agree in floating point)."""
    for a, b in zip(x, y):
        if abs(a - b) <= rtol * max(abs(a), abs(b)) + atol:
            continue
        return a > b
    return False


# ---------------------------------------------------------------- certificates
def exchange_certificate(value, counts, lo, hi, maximize=True):
    """For a separable concave sum: no single move of one rollout between two
    prompts improves it (min gain of a last rollout >= max gain of a next one)."""
    sign = 1.0 if maximize else -1.0
    last = sign * (value(counts) - value(counts - 1))
    nxt = sign * (value(counts + 1) - value(counts))
    can_give = counts > lo
    can_take = counts < hi
    if can_give.any() and can_take.any():
        worst_kept = last[can_give].min()
        best_left = nxt[can_take].max()
        assert worst_kept >= best_left - 1e-12 * max(1.0, abs(best_left)), (
            f"moving one rollout would improve the objective: {worst_kept} < {best_left}"
        )


def test_peers_pass_the_exchange_certificate_at_scale():
    rng = np.random.default_rng(3)
    m = 5000
    p = rng.uniform(0.01, 0.99, m)
    budget = 12 * m
    alloc = get_policy("knapsack").allocate(p, budget)
    exchange_certificate(lambda n: knapsack_value(p, n), alloc.counts, 2, 128)
    alloc = get_policy("vip").allocate(p, budget, max_rollouts=32)
    exchange_certificate(lambda n: vip_cost(p, n), alloc.counts, 4, 32, maximize=False)
    alloc = get_policy("gvm").allocate(p, budget, max_rollouts=64)
    exchange_certificate(lambda n: gvm_cost(p, n), alloc.counts, 1, 64, maximize=False)
    alloc = get_policy("hora", prior_strength=np.inf).allocate(p, budget, max_rollouts=64)
    exchange_certificate(lambda n: 1 - (1 - p) ** n, alloc.counts, 1, 64)


# ---------------------------------------------------------------- rules and edges
def test_paper_defaults():
    assert get_policy("knapsack").allocate(np.full(4, 0.5), 8).counts.tolist() == [2, 2, 2, 2]
    assert get_policy("knapsack").allocate(np.full(4, 0.5), 512).counts.tolist() == [128] * 4
    vip = get_policy("vip")
    assert vip.gamma == 7e-4
    assert vip.allocate(np.full(3, 0.5), 12).counts.tolist() == [4, 4, 4]
    assert vip.allocate(np.full(3, 0.5), 96).counts.tolist() == [32, 32, 32]
    gvm = get_policy("gvm")
    assert (gvm.alpha, gvm.beta) == (1e-3, 2.0)


def test_knapsack_edges_keep_the_minimum_and_leftovers_go_to_p_zero_first():
    p = np.array([0.0, 1.0, 0.5, 0.0])
    assert get_policy("knapsack").allocate(p, 14, max_rollouts=8).counts.tolist() == [2, 2, 8, 2]
    # Once the p = 0.5 prompt is full, the rest goes to the p = 0 prompts, evenly
    # (ties: fewer rollouts first, then the lower index), and only then to p = 1.
    assert get_policy("knapsack").allocate(p, 16, max_rollouts=8).counts.tolist() == [3, 2, 8, 3]
    assert get_policy("knapsack").allocate(p, 18, max_rollouts=8).counts.tolist() == [4, 2, 8, 4]
    assert get_policy("knapsack").allocate(p, 19, max_rollouts=8).counts.tolist() == [5, 2, 8, 4]
    assert get_policy("knapsack").allocate(p, 28, max_rollouts=8).counts.tolist() == [8, 4, 8, 8]


def test_vip_edges():
    # p = 1: cost 0, keeps the minimum; p -> 0 limit: log p = -inf takes rollouts first.
    alloc = get_policy("vip").allocate(np.array([1.0, 0.5, 0.0]), 40)
    assert alloc.counts.tolist() == [4, 4, 32]
    assert alloc.objective_value == -np.inf
    # n = 1 has infinite RLOO variance: every prompt with 0 < p < 1 gets two first.
    alloc = get_policy("vip").allocate(np.array([0.3, 0.6, 0.9]), 6, min_rollouts=1)
    assert alloc.counts.tolist() == [2, 2, 2]


def test_gvm_follows_its_proportional_rule():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.05, 0.95, 200)
    g = rng.uniform(0.5, 2.0, 200)
    budget = 200 * 40
    counts = get_policy("gvm").allocate(p, budget, gradient_norms=g).counts
    w = gvm_weights(p, g)
    target = budget * w / w.sum()
    # Exact integer minimizer of sum w^2 / n sits next to the continuous optimum.
    assert np.all(np.abs(counts - target) < 1.0)
    # Zero gradient norm, or p = 0 under beta = 2, gives weight 0: the minimum.
    counts = get_policy("gvm").allocate([0.0, 0.5, 0.5], 12, gradient_norms=[1, 0, 1]).counts
    assert counts.tolist() == [1, 1, 10]
    with pytest.raises(SeraOptError, match="gradient_norms"):
        get_policy("gvm").allocate([0.2, 0.5], 6, gradient_norms=[1.0])
    with pytest.raises(SeraOptError, match="gradient_norms"):
        get_policy("gvm").allocate([0.2, 0.5], 6, gradient_norms=[1.0, -1.0])
    # Constructor default norms are used when the call gives none.
    policy = get_policy("gvm", gradient_norms=[0.0, 1.0])
    assert policy.allocate([0.5, 0.5], 10).counts.tolist() == [1, 9]


def test_sera_bayes_with_exact_probabilities_is_sera():
    rng = np.random.default_rng(4)
    for _ in range(10):
        m = int(rng.integers(1, 40))
        p = np.round(rng.uniform(0, 1, m), 2)
        budget = int(rng.integers(2 * m, 12 * m))
        want = sera_opt.allocate(p, budget, min_rollouts=2, max_rollouts=12).counts
        got = get_policy("sera-bayes", prior_strength=np.inf).allocate(
            p, budget, min_rollouts=2, max_rollouts=12)
        np.testing.assert_array_equal(got.counts, want)


def test_sera_bayes_gives_uncertain_prompts_more():
    p = np.array([0.3, 0.3])
    alpha = np.array([0.6, 60.0])
    beta = np.array([1.4, 140.0])
    counts = get_policy("sera-bayes").allocate(p, 20, posterior=(alpha, beta)).counts
    assert counts[0] > counts[1]
    # And SERA itself, blind to uncertainty, splits evenly.
    assert sera_opt.allocate(p, 20).counts.tolist() == [10, 10]


def test_pseudo_count_and_posterior_agree():
    p = np.array([0.1, 0.4, 0.8])
    for name in ("sera-bayes", "hora"):
        plain = get_policy(name, prior_strength=5.0).allocate(p, 18)
        explicit = get_policy(name).allocate(p, 18, posterior=(5 * p, 5 * (1 - p)))
        np.testing.assert_array_equal(plain.counts, explicit.counts)
        np.testing.assert_allclose(plain.factors, explicit.factors)


def test_posterior_checks():
    policy = get_policy("hora")
    with pytest.raises(SeraOptError, match="posterior means"):
        policy.allocate([0.5, 0.5], 6, posterior=([1.0, 1.0], [3.0, 1.0]))
    with pytest.raises(SeraOptError, match="pair"):
        policy.allocate(None, 6, posterior=np.ones(3))
    with pytest.raises(SeraOptError, match="both 0"):
        policy.allocate(None, 6, posterior=([0.0, 1.0], [0.0, 1.0]))
    with pytest.raises(SeraOptError, match="success_probs"):
        policy.allocate(None, 6)
    with pytest.raises(SeraOptError, match="prior_strength"):
        get_policy("sera-bayes", prior_strength=0)


def test_expected_factors_match_monte_carlo():
    rng = np.random.default_rng(0)
    alpha, beta, n, draws = 1.5, 3.0, 5, 200_000
    samples = rng.beta(alpha, beta, draws)
    for offset in (0, 1):
        values = 1 - (1 - samples) ** (n - offset)
        mc = values.mean()
        tol = 5 * values.std() / np.sqrt(draws)
        exact = expected_factors([alpha], [beta], [n], offset)[0]
        assert abs(exact - mc) < tol


def test_reported_factors_and_dtype():
    p = np.array([0.2, 0.7, 0.0, 1.0], dtype=np.float32)
    for name in ("knapsack", "vip", "hora", "gvm", "sera-bayes"):
        alloc = get_policy(name).allocate(p, 24, min_rollouts=2, max_rollouts=10)
        assert alloc.factors.dtype == np.float32
        assert np.all((alloc.factors >= 0) & (alloc.factors <= 1))
        assert not np.signbit(alloc.factors).any(), f"{name}: negative zero factor"
    alloc = get_policy("sera-bayes").allocate(p, 24, min_rollouts=2, max_rollouts=10)
    np.testing.assert_allclose(alloc.factors, -np.expm1(-alloc.levels), rtol=1e-6)
