"""Every integer solver against brute force, against each other, and the numba kernels
against pure-Python references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import AllocationProblem
from sera_opt.solvers import SOLVERS
from sera_opt.solvers.greedy import greedy_counts

# Every registered solver that claims exactness is proven exact here, by the flag.
EXACT_SOLVERS = [n for n in sera_opt.available_solvers() if SOLVERS.lookup(n).exact]


def level_key(rate: float, m: int) -> tuple[float, int]:
    """Order key of a prompt's level ``rate * m`` with the limit order at p = 0 and p = 1
    (docs/theory.md section 3): p = 0 ranks below every positive level and
    p = 1 above every finite one; within each, by the effective count m."""
    if rate == 0.0:
        return (0.0, m)
    if math.isinf(rate):
        return (math.inf, m)
    return (rate * m, 0)


def sorted_level_keys(problem: AllocationProblem, counts) -> list:
    return sorted(
        level_key(float(a), int(n) - problem.offset) for a, n in zip(problem.rates, counts)
    )


def brute_force(problem: AllocationProblem):
    """All feasible integer allocations; returns the lexicographically best sorted level keys."""
    ranges = [range(lo, hi + 1) for lo, hi in zip(problem.min_rollouts, problem.max_rollouts)]
    best = None
    for counts in itertools.product(*ranges):
        if sum(counts) != problem.budget:
            continue
        key = sorted_level_keys(problem, counts)
        if best is None or key > best:
            best = key
    return best


def assert_lex_optimal(problem, counts, reference_keys, label):
    got = sorted_level_keys(problem, counts)
    assert got == reference_keys, (
        f"{label}: sorted levels {got} differ from the lexicographic optimum {reference_keys} "
        f"for p={problem.success_probs.tolist()}, budget={problem.budget}, "
        f"bounds={problem.min_rollouts.tolist()}..{problem.max_rollouts.tolist()}, "
        f"offset={problem.offset}, counts={list(counts)}"
    )


# Probabilities on a coarse grid produce many exact ties; 0 and 1 exercise the edges.
prob = st.one_of(
    st.sampled_from([0.0, 1.0, 0.5, 0.25, 0.75, 0.1, 0.9]),
    st.floats(0.0, 1.0, allow_nan=False),
)


# The MILP compares levels within its solver's feasibility tolerance (about 1e-9),
# so it can only certify problems whose levels differ by more than that.
milp_prob = st.one_of(
    st.sampled_from([0.0, 1.0, 0.5, 0.25, 0.75, 0.1, 0.9]),
    st.floats(1e-4, 1 - 1e-4),
)


@st.composite
def tiny_problems(draw, max_prompts=4, max_hi=6, probs=prob):
    m = draw(st.integers(1, max_prompts))
    offset = draw(st.sampled_from([0, 1]))
    p = draw(st.lists(probs, min_size=m, max_size=m))
    lo = [draw(st.integers(1 + offset, 2 + offset)) for _ in range(m)]
    hi = [draw(st.integers(l_, l_ + max_hi - 2)) for l_ in lo]
    budget = draw(st.integers(sum(lo), sum(hi)))
    return AllocationProblem(np.array(p), budget, min_rollouts=np.array(lo),
                             max_rollouts=np.array(hi), offset=offset)


THEORY_EXAMPLE = dict(success_probs=[0.669, 0.201, 0.576, 0.600, 0.953], budget=12,
                      min_rollouts=1, max_rollouts=9, offset=0)


@pytest.mark.parametrize("solver", EXACT_SOLVERS)
def test_theory_counterexample(solver):
    # docs/theory.md section 3: floor-then-fill gives (1,6,2,2,1); the optimum is (2,5,2,2,1).
    alloc = sera_opt.allocate(**THEORY_EXAMPLE, solver=solver)
    assert alloc.counts.tolist() == [2, 5, 2, 2, 1]
    assert alloc.min_factor == pytest.approx(1 - (1 - 0.201) ** 5, rel=1e-12)
    floor_then_fill = np.array([1, 6, 2, 2, 1])
    worse = sera_opt.attenuation(THEORY_EXAMPLE["success_probs"], floor_then_fill).min()
    assert alloc.min_factor > worse + 5e-3


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_problems())
def test_waterline_and_greedy_match_brute_force(problem):
    best = brute_force(problem)
    for solver in ("waterline", "greedy"):
        alloc = sera_opt.get_solver(solver).solve(problem)
        assert_lex_optimal(problem, alloc.counts, best, solver)


@pytest.mark.parametrize("solver", EXACT_SOLVERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_problems(probs=milp_prob))
def test_every_exact_solver_matches_brute_force(solver, problem):
    best = brute_force(problem)
    alloc = sera_opt.get_solver(solver).solve(problem)
    assert_lex_optimal(problem, alloc.counts, best, solver)


@pytest.mark.parametrize("p, budget", [([0.5, 0.5, 0.5], 6), ([0.9999, 0.3, 1e-4, 0.6], 9)])
def test_a_milp_stage_that_stops_below_its_maximum_is_solved_again(monkeypatch, p, budget):
    # A MILP solver may stop at a point its tolerances accept but that is not the stage's
    # maximum (every prompt at its level could still be lifted). The solver then raises
    # those prompts' bounds and solves the stage again; the answer stays exact.
    pytest.importorskip("cvxpy")
    from sera_opt.solvers import milp

    original = milp._StageModel.solve
    calls = []

    def first_answer_poor(self, lower, upper, free, solver):
        calls.append(1)
        if len(calls) > 1:
            return original(self, lower, upper, free, solver)
        x = lower.copy()  # all the spare budget on the first free prompts that take it
        left = self.problem.constraints[1].args[1].value - int(x.sum())
        for i in np.flatnonzero(free):
            add = min(int(upper[i] - x[i]), left)
            x[i] += add
            left -= add
        return x

    monkeypatch.setattr(milp._StageModel, "solve", first_answer_poor)
    problem = AllocationProblem(np.array(p), budget, min_rollouts=1, max_rollouts=6)
    alloc = sera_opt.get_solver("milp").solve(problem)  # raised SolverError before
    assert calls
    assert_lex_optimal(problem, alloc.counts, brute_force(problem), "milp")


def test_the_exact_solvers_are_the_expected_ones():
    # A solver losing its flag would silently drop out of the optimality test above.
    assert {"waterline", "greedy", "milp"} <= set(EXACT_SOLVERS)


@st.composite
def larger_problems(draw):
    m = draw(st.integers(5, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["uniform", "beta", "grid", "edges"]))
    if kind == "uniform":
        p = rng.uniform(0, 1, m)
    elif kind == "beta":
        p = rng.beta(0.3, 0.6, m)
    elif kind == "grid":
        p = rng.choice([0.1, 0.2, 0.5, 0.8], m)
    else:
        p = rng.choice([0.0, 1.0, 0.3, 0.7], m)
    offset = draw(st.sampled_from([0, 1]))
    lo = 1 + offset
    hi = draw(st.integers(lo, lo + 20))
    budget = draw(st.integers(m * lo, m * hi))
    return AllocationProblem(p, budget, min_rollouts=lo, max_rollouts=hi, offset=offset)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(larger_problems())
def test_solvers_agree_on_larger_problems(problem):
    reference = greedy_counts(problem)
    ref_keys = sorted_level_keys(problem, reference)
    for solver in ("waterline", "milp"):
        alloc = sera_opt.get_solver(solver).solve(problem)
        assert_lex_optimal(problem, alloc.counts, ref_keys, solver)
    # Same tie-breaking rule, so the fast path reproduces the greedy's counts exactly.
    np.testing.assert_array_equal(
        sera_opt.get_solver("waterline").solve(problem).counts, reference
    )


def test_waterline_equals_greedy_on_many_random_problems():
    rng = np.random.default_rng(7)
    for trial in range(200):
        m = int(rng.integers(1, 300))
        p = rng.beta(0.4, 0.8, m)
        if trial % 4 == 0:
            p = np.round(p, 1)  # ties
        offset = int(trial % 2)
        lo = rng.integers(1 + offset, 3 + offset, m)
        hi = lo + rng.integers(0, 30, m)
        budget = int(rng.integers(lo.sum(), hi.sum() + 1))
        problem = AllocationProblem(p, budget, min_rollouts=lo, max_rollouts=hi, offset=offset)
        fast = sera_opt.get_solver("waterline").solve(problem).counts
        np.testing.assert_array_equal(fast, greedy_counts(problem), err_msg=f"trial {trial}")


# ----------------------------------------------------------------------------
# numba kernels against pure-Python references
# ----------------------------------------------------------------------------

def python_count_below(rates, m_lo, cap, level):
    return [sum(1 for k in range(c) if a * (m + k) < level) for a, m, c in zip(rates, m_lo, cap)]


def count_below(rates, m_lo, cap, level, out):
    """Per prompt, the waterline kernels' count of pre-levels strictly below ``level``
    (their per-prompt kernel, one prompt at a time); returns the total."""
    from sera_opt.kernels.waterline_counts import count_one

    for i in range(rates.shape[0]):
        out[i] = count_one(rates[i], m_lo[i], cap[i], level)
    return int(out.sum())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(1e-3, 20.0), st.integers(1, 5), st.integers(0, 12)),
             min_size=1, max_size=8),
    st.floats(0.0, 300.0),
)
def test_count_below_matches_python(items, level):
    rates = np.array([a for a, _, _ in items], dtype=np.float64)
    m_lo = np.array([m for _, m, _ in items], dtype=np.int64)
    cap = np.array([c for _, _, c in items], dtype=np.int64)
    out = np.empty(len(items), dtype=np.int64)
    total = count_below(rates, m_lo, cap, level, out)
    expected = python_count_below(rates.tolist(), m_lo.tolist(), cap.tolist(), level)
    assert out.tolist() == expected
    assert total == sum(expected)


def test_count_below_at_exact_products():
    # A level equal to a pre-level is not counted: strictly below only.
    rates = np.array([0.1, 0.3, 1 / 3])
    m_lo = np.array([1, 1, 3], dtype=np.int64)
    cap = np.array([50, 50, 50], dtype=np.int64)
    out = np.empty(3, dtype=np.int64)
    for level in (rates[0] * 7, rates[1] * 3, rates[2] * 9, 1.0):
        count_below(rates, m_lo, cap, level, out)
        assert out.tolist() == python_count_below(rates.tolist(), m_lo.tolist(), cap.tolist(), level)


def _block_count_cases():
    """Levels at, just off and far from pre-levels, quotients beyond 2**50 (the block
    is then recounted one prompt at a time) and caps of 0."""
    rates = np.array([0.1, 0.3, 1 / 3, 1e-16, 2.0**-60, 7.5])
    m_lo = np.array([1, 1, 3, 1, 1, 2], dtype=np.int64)
    for cap in ([50, 50, 50, 50, 50, 50], [0, 3, 50, 2**52, 2**53 - 2, 1]):
        for level in (rates[0] * 7, rates[1] * 3, rates[2] * 9, np.nextafter(rates[2] * 9, 0),
                      np.nextafter(rates[0] * 7, np.inf), 1.0, 1e-3, 30.0):
            yield rates, m_lo, np.array(cap, dtype=np.int64), float(level)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(1e-3, 20.0), st.integers(1, 5), st.integers(0, 12)),
             min_size=1, max_size=600),
    st.floats(0.0, 300.0),
    st.booleans(),
)
def test_block_counts_match_python(items, level, at_pre_level):
    # The vectorized counts (one division, one settling step each way) against the
    # definition, over several blocks, with scalar and per-prompt bounds.
    from sera_opt.kernels.waterline_counts import total_below

    rates = np.array([a for a, _, _ in items], dtype=np.float64)
    m_lo = np.array([m for _, m, _ in items], dtype=np.int64)
    cap = np.array([c for _, _, c in items], dtype=np.int64)
    if at_pre_level:  # a level that is exactly one prompt's pre-level
        level = float(rates[0] * (m_lo[0] + cap[0] // 2))
    expected = sum(python_count_below(rates.tolist(), m_lo.tolist(), cap.tolist(), level))
    assert total_below(rates, m_lo, m_lo + cap, False, 0, level) == expected
    one = python_count_below(rates.tolist(), [int(m_lo[0])] * len(items),
                             [int(cap[0])] * len(items), level)
    assert total_below(rates, m_lo[:1], m_lo[:1] + cap[:1], True, 0, level) == sum(one)


def test_block_counts_at_exact_products_and_huge_quotients():
    from sera_opt.kernels.waterline_counts import total_below

    for rates, m_lo, cap, level in _block_count_cases():
        out = np.empty(rates.shape[0], dtype=np.int64)
        expected = count_below(rates, m_lo, cap, level, out)
        if cap.max() <= 50:  # the definition itself is cheap to evaluate here
            assert out.tolist() == python_count_below(rates.tolist(), m_lo.tolist(),
                                                      cap.tolist(), level)
        assert total_below(rates, m_lo, m_lo + cap, False, 0, level) == expected, (cap, level)


def _kernel_problem(rng, m, kind, uniform):
    """Probabilities, their rates and bounds as the waterline kernels take them."""
    from sera_opt.kernels.rates import rates_from_probs

    p = {"uniform": lambda: rng.uniform(1e-6, 1 - 1e-6, m),
         "tied": lambda: rng.choice([0.1, 0.5, 0.9], m),
         "equal": lambda: np.full(m, rng.uniform(0.05, 0.95)),
         "skewed": lambda: np.clip(rng.beta(0.2, 3.0, m), 1e-9, 1 - 1e-9)}[kind]()
    rates = np.empty(m)
    rates_from_probs(p, rates)
    if uniform:
        lo = np.array([int(rng.integers(1, 4))])
        hi = lo + int(rng.integers(1, 70))
        total = int(hi[0] - lo[0]) * m
    else:
        lo = rng.integers(1, 4, m)
        hi = lo + rng.integers(0, 30, m)
        total = int((hi - lo).sum())
    return p, rates, lo, hi, int(rng.integers(1, max(total, 2)))


@pytest.mark.parametrize("kind", ["uniform", "tied", "equal", "skewed"])
def test_a_guessed_bracket_gives_the_counts_of_the_search(kind):
    # The integer solve guesses its first bracket from the relaxation; whether the guess
    # holds, misses (a wrong level, slope or active count), or is not tried (no hint),
    # the counts are the greedy's. Both routes are taken over these problems.
    from sera_opt.kernels.waterline import linear_relax, linear_solve

    rng = np.random.default_rng(11)
    held = []
    for trial in range(60):
        m = int(rng.choice([3, 40, 700, 3000]))
        uniform = bool(trial % 2)
        p, rates, lo, hi, extra = _kernel_problem(rng, m, kind, uniform)
        c = int(rng.integers(0, min(2, int(lo.min()))))
        relaxed = np.empty(m)
        level, slope, active = linear_relax(rates, lo, hi, uniform, c, float(extra), relaxed)
        reference = np.empty(m, dtype=np.int64)
        assert not linear_solve(rates, lo, hi, uniform, c, extra, math.nan, 0.0, 0, reference)
        for hint, hint_slope, hint_active in ((level, slope, active),
                                              (level, slope, 40 * active + 1000),
                                              (level * 0.9, slope, active),
                                              (level, slope * 7, max(active // 9, 1))):
            counts = np.empty(m, dtype=np.int64)
            held.append(linear_solve(rates, lo, hi, uniform, c, extra, hint, hint_slope,
                                     hint_active, counts))
            np.testing.assert_array_equal(counts, reference, err_msg=f"trial {trial}")
        if m <= 40:
            problem = AllocationProblem(p, int(np.broadcast_to(lo, m).sum()) + extra,
                                        min_rollouts=np.broadcast_to(lo, m),
                                        max_rollouts=np.broadcast_to(hi, m), offset=c)
            np.testing.assert_array_equal(problem.rates, rates)
            np.testing.assert_array_equal(reference, greedy_counts(problem))
    assert any(held) and not all(held), sum(held)


_RATE_CASES = st.one_of(
    st.floats(0.0, 1.0),
    st.floats(0.0, 1e-12),
    st.floats(1 - 1e-6, 1.0),
    st.floats(0.25, 0.35),  # 1 - p about 1/sqrt(2), where the log's mantissa range splits
    st.sampled_from([0.0, 1.0, 5e-324, 2.0**-53, 2.0**-54, 0.5, 1 - 2.0**-53]),
)


def _exact_rate(p: float):
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        # Digits enough to keep 1 - p exact, and 40 more for its log.
        ctx.prec = 40 + max(0, -math.frexp(p)[1]) if p > 0 else 40
        return -(Decimal(1) - Decimal(p)).ln()


@settings(max_examples=500, deadline=None)
@given(st.lists(_RATE_CASES, min_size=1, max_size=600))
def test_rates_are_within_two_ulp_of_the_exact_value(probs):
    # -log(1 - p) through the blocked kernel (its own log) against 50-digit arithmetic;
    # p = 0 and p = 1 are counted, and the extremes and sum 1/a are those of the output.
    from decimal import Decimal

    from sera_opt.kernels.rates import rates_pass

    p = np.array(probs, dtype=np.float64)
    out = np.empty_like(p)
    zeros, infs, bad, a_min, a_max, inv_sum = rates_pass(p, out, True)
    assert (zeros, infs, bad) == (int(np.sum(p == 0)), int(np.sum(p == 1)), 0)
    for x, a in zip(p.tolist(), out.tolist()):
        if x == 0.0:
            assert a == 0.0
        elif x == 1.0:
            assert a == math.inf
        else:
            exact = _exact_rate(x)
            assert abs(Decimal(a) - exact) <= 2 * Decimal(math.ulp(float(exact))), x
    assert (a_min, a_max) == (out.min(), out.max())
    parts = [sum((1.0 / out[i] for i in range(j, p.shape[0], 4)), 0.0) for j in range(4)]
    assert inv_sum == (parts[0] + parts[1]) + (parts[2] + parts[3]) or not np.all(out > 0)


def test_rates_of_values_that_are_not_probabilities_are_counted():
    from sera_opt.kernels.rates import rates_from_probs

    p = np.array([0.5, np.nan, -0.0, -1e-300, np.nextafter(1.0, 2.0), np.inf, 0.25] * 50)
    out = np.empty_like(p)
    assert rates_from_probs(p, out) == (50, 0, 200)  # -0.0 is p = 0
    np.testing.assert_array_equal(out[::7], np.full(50, -math.log1p(-0.5)))


def test_the_block_log_is_within_an_ulp_of_the_exact_log():
    from decimal import Decimal, localcontext

    from sera_opt.kernels.rates import block_logs

    rng = np.random.default_rng(4)
    x = np.concatenate([rng.uniform(2.0**-54, 1.0, 3000), 10.0 ** rng.uniform(-16, 0, 3000),
                        np.sqrt(0.5) * (1 + rng.uniform(-1e-12, 1e-12, 500)),
                        np.nextafter(1.0, 0) - rng.integers(0, 1000, 500) * 2.0**-53])
    mant, exp = np.frexp(x)  # x = mant 2^exp with mant in [0.5, 1)
    vals = mant * 2.0
    block_logs(vals, (exp - 1).astype(np.float64), x.shape[0])
    with localcontext() as ctx:
        ctx.prec = 50
        for v, xi in zip(vals.tolist(), x.tolist()):
            exact = Decimal(xi).ln()
            assert abs(Decimal(v) - exact) <= Decimal(math.ulp(float(exact))), xi


def reference_waterline(problem: AllocationProblem):
    """Exact continuous waterline by sorting breakpoints (finite positive rates only)."""
    a = problem.rates
    c = problem.offset
    lo, hi = problem.min_rollouts.astype(float), problem.max_rollouts.astype(float)
    points = np.sort(np.concatenate([a * (lo - c), a * (hi - c)]))

    def total(level):
        return np.clip(c + level / a, lo, hi).sum()

    budget = problem.budget
    # The root lies between two consecutive breakpoints where total crosses the budget.
    values = np.array([total(x) for x in points])
    j = int(np.searchsorted(values, budget, side="left"))
    if j == 0:
        return np.clip(c + points[0] / a, lo, hi), points[0]
    x0, x1, v0, v1 = points[j - 1], points[j], values[j - 1], values[j]
    level = x0 + (budget - v0) * (x1 - x0) / (v1 - v0) if v1 > v0 else x0
    return np.clip(c + level / a, lo, hi), level


@settings(max_examples=150, deadline=None)
@given(larger_problems())
def test_continuous_waterline_matches_sorted_breakpoints(problem):
    assume(np.all((problem.rates > 0) & np.isfinite(problem.rates)))
    counts, level = sera_opt.waterline(
        problem.success_probs, problem.budget, min_rollouts=problem.min_rollouts,
        max_rollouts=problem.max_rollouts, offset=problem.offset, return_level=True,
    )
    ref_counts, _ = reference_waterline(problem)
    assert counts.sum() == pytest.approx(problem.budget, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(counts, ref_counts, rtol=1e-7, atol=1e-7)
    assert np.all(counts >= problem.min_rollouts - 1e-9)
    assert np.all(counts <= problem.max_rollouts + 1e-9)


def test_continuous_waterline_closed_form_when_all_active():
    p = np.array([0.1, 0.2, 0.4])
    a = -np.log1p(-p)
    budget = 30
    counts, level = sera_opt.waterline(p, budget, return_level=True)
    expected_level = budget / np.sum(1 / a)  # c = 0, nobody at a bound
    assert level == pytest.approx(expected_level, rel=1e-12)
    np.testing.assert_allclose(counts, expected_level / a, rtol=1e-12)
    # Equal levels means equal factors.
    w = sera_opt.attenuation(p, counts)
    np.testing.assert_allclose(w, w[0], rtol=1e-12)


def test_relaxation_bounds_the_integer_optimum():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.01, 0.99, 500)
    alloc = sera_opt.allocate(p, 4000, max_rollouts=64)
    # The relaxation's level is an upper bound on the integer optimum's minimum level,
    # and the integer minimum comes within one rollout's level step of it.
    assert alloc.levels.min() <= alloc.waterline * (1 + 1e-12)
    assert alloc.levels.min() >= alloc.waterline - alloc.levels.max()
    assert alloc.continuous.sum() == pytest.approx(4000)


# ----------------------------------------------------------------------------
# edges
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("solver", EXACT_SOLVERS)
class TestEdges:
    def test_zero_probability_is_pinned_at_max(self, solver):
        alloc = sera_opt.allocate([0.0, 0.5, 0.9], 20, max_rollouts=8, solver=solver)
        assert alloc.counts[0] == 8
        assert alloc.factors[0] == 0.0
        assert alloc.counts.sum() == 20

    def test_certain_prompt_keeps_its_minimum(self, solver):
        alloc = sera_opt.allocate([1.0, 0.5, 0.2], 20, min_rollouts=2, max_rollouts=12,
                                  solver=solver)
        assert alloc.counts[0] == 2
        assert alloc.factors[0] == 1.0
        assert not np.isnan(alloc.levels).any()

    def test_certain_prompts_take_what_nobody_else_can(self, solver):
        alloc = sera_opt.allocate([1.0, 1.0, 0.5], 14, min_rollouts=1, max_rollouts=6,
                                  solver=solver)
        assert alloc.counts.tolist() == [4, 4, 6]

    def test_all_equal_probabilities_are_uniform(self, solver):
        alloc = sera_opt.allocate(np.full(7, 0.3), 7 * 5 + 3, max_rollouts=10, solver=solver)
        assert sorted(alloc.counts.tolist()) == [5] * 4 + [6] * 3
        assert alloc.counts.tolist() == [6, 6, 6, 5, 5, 5, 5]  # remainder by index

    def test_single_prompt_takes_the_budget(self, solver):
        alloc = sera_opt.allocate([0.4], 9, solver=solver)
        assert alloc.counts.tolist() == [9]

    def test_budget_at_lower_bound(self, solver):
        alloc = sera_opt.allocate([0.1, 0.5, 0.9], 6, min_rollouts=2, max_rollouts=5,
                                  offset=1, solver=solver)
        assert alloc.counts.tolist() == [2, 2, 2]

    def test_budget_at_upper_bound(self, solver):
        alloc = sera_opt.allocate([0.1, 0.5, 0.9], 15, min_rollouts=2, max_rollouts=5,
                                  solver=solver)
        assert alloc.counts.tolist() == [5, 5, 5]

    def test_per_prompt_bounds(self, solver):
        lo = np.array([1, 3, 2, 1])
        hi = np.array([2, 9, 2, 8])
        p = np.array([0.05, 0.05, 0.05, 0.05])
        alloc = sera_opt.allocate(p, 16, min_rollouts=lo, max_rollouts=hi, solver=solver)
        assert np.all(alloc.counts >= lo) and np.all(alloc.counts <= hi)
        assert alloc.counts.tolist() == [2, 6, 2, 6]

    def test_tiny_probabilities_keep_precision(self, solver):
        p = np.array([1e-12, 2e-12, 0.5])
        alloc = sera_opt.allocate(p, 31, max_rollouts=30, solver=solver)
        # a ~ p: the 1e-12 prompt needs about twice the rollouts of the 2e-12 one.
        assert alloc.counts.tolist() == [20, 10, 1]
        assert alloc.min_factor > 0


def test_continuous_with_edges():
    counts, level = sera_opt.waterline([0.0, 0.5, 1.0], 12, max_rollouts=6, return_level=True)
    assert counts[0] == 6 and counts[2] == 1
    assert counts.sum() == pytest.approx(12)
    counts, level = sera_opt.waterline([0.0, 0.0, 0.5], 5, max_rollouts=6, return_level=True)
    assert level == 0.0
    np.testing.assert_allclose(counts, [2, 2, 1])


# ----------------------------------------------------------------------------
# what a user sees
# ----------------------------------------------------------------------------

def _run(code: str, env=None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, check=True)


def test_the_milp_solver_prints_no_banner_into_the_callers_output():
    pytest.importorskip("highspy")
    out = _run("import sera_opt\n"
               "a = sera_opt.allocate([0.9, 0.5, 0.05], 24, max_rollouts=16, solver='milp')\n"
               "print(a.counts.tolist())")
    assert out.stdout == "[2, 6, 16]\n", out.stdout


@pytest.mark.parametrize("code", [
    "import sera_opt\nsera_opt.allocate([0.5, 0.2], 6)\nsera_opt.allocate([0.1], 3)\n",
    # string ids: the kernels for integer ids are never called, so never announced
    "import sera_opt\nt = sera_opt.SuccessTracker()\nt.update(['a', 'b'], [1, 0])\n"
    "t.estimate(['a', 'c'])\n",
], ids=["allocate", "tracker"])
def test_a_first_compilation_is_announced_once_and_a_cached_run_is_quiet(tmp_path, code):
    from sera_opt._jit import MESSAGE

    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"), "SERA_OPT_CACHE_DIR": ""}
    first = _run(code, env)
    assert first.stderr.count(MESSAGE) == 1, first.stderr
    second = _run(code, env)
    assert MESSAGE not in second.stderr, second.stderr


@pytest.mark.slow
def test_a_later_compile_is_announced_again(tmp_path):
    """Another policy takes another solver kernel (the general engine's, alpha = 0.5):
    when it compiles after the first notice's minute (here made 0 s), it is announced
    again; a call that compiles nothing new is quiet."""
    from sera_opt._jit import MESSAGE

    code = ("import numpy as np, sera_opt, sera_opt._jit as jit\n"
            "policy = sera_opt.get_policy('sera-fair', alpha=1.0)\n"
            "policy.allocate(np.full(64, 0.5), 512, min_rollouts=2)\n"
            "jit.REPEAT_AFTER_S = 0.0\n"
            "import sys; print('--', file=sys.stderr, flush=True)\n"
            "p = np.linspace(0.05, 0.95, 300)\n"
            "other = sera_opt.get_policy('sera-fair', alpha=0.5)\n"
            "other.allocate(p, 8 * 300, min_rollouts=2)\n"
            "print('--', file=sys.stderr, flush=True)\n"
            "other.allocate(p, 8 * 300, min_rollouts=2)\n")
    out = _run(code, {"SERA_OPT_CACHE_DIR": str(tmp_path)})
    small, larger, again = out.stderr.split("--\n")
    assert small.count(MESSAGE) == 1, out.stderr
    assert larger.count(MESSAGE) == 1, out.stderr
    assert MESSAGE not in again, out.stderr


# ----------------------------------------------------------------------------
# SERA's batch path (one compiled call) against the general path
# ----------------------------------------------------------------------------

def _same_allocation(fast, general):
    np.testing.assert_array_equal(fast.counts, general.counts)
    assert fast.counts.dtype == np.int64 and not fast.counts.flags.writeable
    assert (fast.continuous is None) == (general.continuous is None)
    if general.continuous is not None:
        np.testing.assert_array_equal(fast.continuous, general.continuous)
        assert fast.waterline == general.waterline
    assert fast.solver == general.solver == "waterline"
    a, b = fast.problem, general.problem
    assert (a.budget, a.offset, a.capped, a.spare_budget) == (b.budget, b.offset, b.capped,
                                                              b.spare_budget)
    np.testing.assert_array_equal(a.min_rollouts, b.min_rollouts)
    np.testing.assert_array_equal(a.max_rollouts, b.max_rollouts)
    np.testing.assert_array_equal(a.rates, b.rates)
    assert not a.success_probs.flags.writeable and not a.has_edges
    np.testing.assert_array_equal(fast.factors, general.factors)
    np.testing.assert_array_equal(fast.levels, general.levels)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 700), st.integers(0, 2**32 - 1), st.sampled_from([0, 1]),
       st.booleans(), st.booleans(), st.booleans())
def test_the_batch_path_gives_the_general_paths_allocation(m, seed, offset, capped,
                                                           continuous, tied):
    rng = np.random.default_rng(seed)
    p = rng.uniform(1e-6, 1 - 1e-6, m)
    if tied:  # posterior means of a tracker tie in large groups
        p = np.round(p * 7) / 8 + 1 / 16
    lo = 1 + offset + int(rng.integers(0, 3))
    hi = lo + int(rng.integers(0, 40)) if capped else None
    budget = int(rng.integers(lo * m, (hi if capped else 4 * lo) * m + 1))
    policy = sera_opt.get_policy("sera", max_ratio=None, offset=offset, continuous=continuous)
    fast = policy.allocate(p, budget, min_rollouts=lo, max_rollouts=hi)
    problem = AllocationProblem(p, budget, min_rollouts=lo, max_rollouts=hi, offset=offset)
    general = sera_opt.get_solver("waterline").solve(problem, continuous=continuous)
    _same_allocation(fast, general)
    if m <= 40 and budget - lo * m <= 200:
        np.testing.assert_array_equal(fast.counts, greedy_counts(problem))


def test_the_batch_path_is_taken_for_a_plain_batch_and_only_then(monkeypatch):
    from sera_opt.policies import core

    taken = []

    def spy(*args):
        out = core_batch(*args)
        taken.append(out is not None)
        return out

    core_batch = core.allocate_batch
    monkeypatch.setattr(core, "allocate_batch", spy)
    p = np.random.default_rng(0).uniform(0.05, 0.95, 64)
    policy = sera_opt.get_policy("sera")
    policy.allocate(p, 512)  # the default cap, ceil(4 * 512 / 64)
    policy.allocate(p, 512, max_rollouts=20)
    assert taken == [True, True]
    # Not a plain float64 array, edges, or another solver: the general path.
    policy.allocate(p.tolist(), 512)
    policy.allocate(p.astype(np.float32), 512)
    policy.allocate(p[::2], 256)
    sera_opt.get_policy("sera", solver="greedy").allocate(p, 512)
    assert taken == [True, True]
    edged = p.copy()
    edged[:2] = (0.0, 1.0)
    out = policy.allocate(edged, 512)
    assert taken[-1] is False and out.counts[0] == 32 and out.counts[1] == 1


@pytest.mark.parametrize("bad, match", [
    (np.nan, "non-finite"), (np.inf, "non-finite"), (-0.25, r"must lie in \[0, 1\]"),
    (1.5, r"must lie in \[0, 1\]")])
def test_the_batch_path_reports_bad_probabilities_as_the_general_path_does(bad, match):
    p = np.full(16, 0.5)
    p[3] = bad
    with pytest.raises(sera_opt.SeraOptError, match=match) as fast:
        sera_opt.get_policy("sera").allocate(p, 64)
    with pytest.raises(sera_opt.SeraOptError) as general:
        AllocationProblem(p, 64, max_rollouts=16)
    assert str(fast.value) == str(general.value)


@pytest.mark.parametrize("lo, hi, budget, match", [
    (0, 8, 40, "at least 1"), (2, 1, 40, "max_rollouts must be >="),
    (1, 8, 7, "infeasible"), (1, 8, 200, "infeasible"), (1, 2**53 + 1, 40, "2\\*\\*53"),
    (True, 8, 40, "an integer or an array")])
def test_the_batch_path_reports_bad_bounds_as_the_general_path_does(lo, hi, budget, match):
    p = np.full(10, 0.5)
    with pytest.raises(sera_opt.SeraOptError, match=match):
        sera_opt.get_policy("sera").allocate(p, budget, min_rollouts=lo, max_rollouts=hi)
