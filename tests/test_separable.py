"""The separable engine against brute force and against an exhaustive sort of all gains."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import InfeasibleBudgetError, SeraOptError
from sera_opt.separable import (
    AlphaFairUtility,
    BetaLevels,
    HitUtility,
    InverseCountCost,
    KnapsackValue,
    PointHitUtility,
    PointLevels,
    RLOOVariance,
    SeparableObjective,
    solve_separable,
)

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def brute_force(objective: SeparableObjective, budget, lo, hi):
    """Best objective over every feasible allocation: the sorted level vector for
    max-min (lexicographic), the sum otherwise."""
    best = None
    for counts in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
        if sum(counts) != budget:
            continue
        terms = objective.terms(np.array(counts))
        if objective.sense == "max-min":
            key = tuple(np.sort(terms))
        elif objective.sense == "max-sum":
            key = (terms.sum(),)
        else:
            key = (-terms.sum(),)
        if best is None or key > best:
            best = key
    return best


def key_of(objective, counts):
    terms = objective.terms(counts)
    if objective.sense == "max-min":
        return tuple(np.sort(terms))
    return (terms.sum(),) if objective.sense == "max-sum" else (-terms.sum(),)


def assert_matches(objective, counts, best, budget=None, lo=None, hi=None):
    mine = key_of(objective, counts)
    assert len(mine) == len(best)
    if objective.sense == "max-min":
        # Lexicographic: no feasible allocation may beat ours, counting levels
        # equal to rounding as equal.
        for other in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
            if sum(other) == budget:
                theirs = key_of(objective, np.array(other))
                assert not lex_better(theirs, mine), (
                    f"{type(objective).__name__}: {other} beats {counts}: {theirs} > {mine}"
                )
        return
    for got, want in zip(mine, best):
        assert got == want or np.isclose(got, want, rtol=1e-9, atol=1e-12), (
            f"{type(objective).__name__}: {mine} is worse than the brute-force optimum {best}"
        )


def lex_better(x, y, rtol=1e-9, atol=1e-14):
    for a, b in zip(x, y):
        if a == b or abs(a - b) <= rtol * max(abs(a), abs(b)) + atol:
            continue
        return a > b
    return False


@st.composite
def small_problem(draw, *, max_prompts=4):
    m = draw(st.integers(1, max_prompts))
    lo = np.array(draw(st.lists(st.integers(1, 3), min_size=m, max_size=m)))
    hi = lo + np.array(draw(st.lists(st.integers(0, 4), min_size=m, max_size=m)))
    budget = draw(st.integers(int(lo.sum()), int(hi.sum())))
    return m, lo, hi, budget


probs_open = st.floats(1e-3, 1 - 1e-3)
probs_any = st.one_of(probs_open, st.sampled_from([0.0, 1.0, 0.5, 0.25]))
beta_param = st.one_of(st.floats(0.05, 30.0), st.sampled_from([1.0, 2.0]))


@SETTINGS
@given(small_problem(), st.data())
def test_sum_objectives_equal_brute_force(problem, data):
    m, lo, hi, budget = problem
    p = np.array(data.draw(st.lists(probs_any, min_size=m, max_size=m)))
    p_open = np.array(data.draw(st.lists(probs_open, min_size=m, max_size=m)))
    alpha = np.array(data.draw(st.lists(beta_param, min_size=m, max_size=m)))
    beta = np.array(data.draw(st.lists(beta_param, min_size=m, max_size=m)))
    weights = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5, 7.0]),
                                          min_size=m, max_size=m)))
    for objective in (KnapsackValue(p), HitUtility(alpha, beta), PointHitUtility(p),
                      RLOOVariance(p_open), RLOOVariance(p_open, gamma=0.05),
                      InverseCountCost(weights)):
        counts = solve_separable(objective, budget, lo, hi)
        assert counts.sum() == budget and np.all(counts >= lo) and np.all(counts <= hi)
        assert_matches(objective, counts, brute_force(objective, budget, lo, hi))


@SETTINGS
@given(small_problem(), st.data(), st.sampled_from([0, 1]))
def test_max_min_objectives_are_lexicographically_optimal(problem, data, offset):
    m, lo, hi, budget = problem
    lo = lo + offset
    hi = hi + offset
    budget += offset * m
    p = np.array(data.draw(st.lists(st.one_of(probs_open, st.just(1.0)), min_size=m,
                                    max_size=m)))
    alpha = np.array(data.draw(st.lists(beta_param, min_size=m, max_size=m)))
    beta = np.array(data.draw(st.lists(st.one_of(beta_param, st.just(0.0)), min_size=m,
                                       max_size=m)))
    for objective in (PointLevels(p, offset), BetaLevels(alpha, beta, offset)):
        counts = solve_separable(objective, budget, lo, hi)
        assert_matches(objective, counts, brute_force(objective, budget, lo, hi), budget, lo, hi)


def test_certain_failure_is_pinned_at_the_maximum_like_sera():
    # Level 0 whatever n: as in SERA's convention (docs/theory.md section 3) such a
    # prompt takes spare rollouts first; two of them share evenly.
    for objective in (PointLevels([0.0, 0.3, 0.0]), BetaLevels([0.0, 1.0, 0.0], [2.0, 2.0, 5.0])):
        counts = solve_separable(objective, 14, 2, 6)
        assert counts.tolist() == [6, 2, 6]
        counts = solve_separable(objective, 9, 2, 6)
        assert counts.tolist() == [4, 2, 3]


def all_gains(objective, lo, hi):
    """Every step's gain (and, for max-min, the next step's) through the public gains()."""
    rows = []
    for j in range(int((hi - lo).max()) + 1):
        k = lo + j
        g = objective.gains(k)
        nxt = objective.gains(k + 1) if objective.sense == "max-min" else np.zeros(len(k))
        for i in np.flatnonzero(k < hi):
            rows.append((g[i], nxt[i], k[i], i))
    return np.array(rows)


def sorted_reference(objective, budget, lo, hi):
    """Sort every marginal gain by the documented order and take the best ones."""
    table = all_gains(objective, lo, hi)
    order = np.lexsort((table[:, 3], table[:, 2], table[:, 1], -table[:, 0]))
    counts = lo.copy()
    np.add.at(counts, table[order[: budget - lo.sum()], 3].astype(np.int64), 1)
    return counts


def objectives_for(rng, m, *, ties: bool):
    p = rng.beta(0.5, 0.5, m)
    alpha = rng.uniform(0.05, 20, m)
    beta = rng.uniform(0.05, 20, m)
    weights = rng.uniform(0, 3, m)
    if ties:  # repeated values, and the edges p = 0 and p = 1
        p = np.round(p, 1)
        # Repeated posteriors (exact ties). Rounded parameters would also make
        # different posteriors' levels coincide in exact arithmetic, which the
        # engine treats as ties within 1e-10 and a float sort does not.
        pick = rng.integers(0, 20, m)
        alpha = alpha[:20][pick]
        beta = beta[:20][pick]
        beta[pick == 0] = 0.0  # p = 1 for sure
        weights = np.round(weights, 1)
    return [PointLevels(p), BetaLevels(alpha, beta, offset=1), KnapsackValue(p),
            HitUtility(alpha, beta), PointHitUtility(p), RLOOVariance(p),
            InverseCountCost(weights)] + [AlphaFairUtility(p, a, offset=1)
                                          for a in (0.0, 1.0, 2.0, 0.5, 8.0)]


@pytest.mark.parametrize("m, ties", [(300, False), (300, True), (3000, False), (3000, True)])
def test_fast_path_equals_exhaustive_sort_including_ties(m, ties):
    from sera_opt.kernels.closed import CLOSED_SUBSAMPLE_FROM

    rng = np.random.default_rng(m + ties)
    lo = rng.integers(2, 4, m)
    hi = lo + rng.integers(0, 9, m)
    budget = int(rng.integers(lo.sum(), hi.sum() + 1))
    for objective in objectives_for(rng, m, ties=ties):
        stats = np.zeros(4, dtype=np.int64)
        counts = solve_separable(objective, budget, lo, hi, stats=stats)
        if isinstance(objective, (PointHitUtility, KnapsackValue, RLOOVariance,
                                  InverseCountCost)) or (
                isinstance(objective, AlphaFairUtility) and objective.alpha in (0.0, 1.0, 2.0)):
            # closed-form crossings (the hit utility, Knapsack, VIP's and GVM's costs,
            # alpha = 0, 1, 2): from CLOSED_SUBSAMPLE_FROM rows on their search opens
            # from a subsample
            assert (stats[3] >= 1) == (m >= CLOSED_SUBSAMPLE_FROM), stats
        np.testing.assert_array_equal(counts, sorted_reference(objective, budget, lo, hi),
                                      err_msg=type(objective).__name__)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), distinct=st.integers(1, 6), m=st.integers(512, 1400))
def test_closed_form_passes_on_repeated_rows_equal_exhaustive_sort(seed, distinct, m):
    """Training batches repeat estimates: rows with equal parameters, whose crossings sit
    exactly on a step at the tied threshold, are settled once per pass (a memo keyed on
    the parameters and the bounds). Rows with equal parameters but other bounds, and
    rows whose memo entries collide, must still get their own counts."""
    rng = np.random.default_rng(seed)
    values = np.round(rng.uniform(0.02, 0.98, distinct), int(rng.integers(1, 4)))
    p = values[rng.integers(0, distinct, m)]
    lo = rng.integers(1, 4, m)
    hi = lo + rng.integers(0, 12, m)
    budget = int(rng.integers(lo.sum(), hi.sum() + 1))
    for objective in [PointHitUtility(p), KnapsackValue(p), RLOOVariance(p),
                      InverseCountCost(np.round(rng.uniform(0, 3, m), 1))] + [
            AlphaFairUtility(p, a, offset=int(rng.integers(0, 2))) for a in (0.0, 1.0, 2.0)]:
        if (lo <= objective.offset).any():
            continue
        counts = solve_separable(objective, budget, lo, hi)
        np.testing.assert_array_equal(counts, sorted_reference(objective, budget, lo, hi),
                                      err_msg=type(objective).__name__)


def first_at_or_below(gains, kind, x, lam, floor, ceil):
    """The definition of a row's count at ``lam``: the first ``k`` in ``[floor, ceil)``
    whose evaluated gain is at or below ``lam``, else ``ceil``."""
    for k in range(floor, ceil):
        if gains.gain(kind, x[0], x[1], x[2], 0, k) <= lam:
            return k
    return ceil


@settings(max_examples=200, deadline=None)
@given(p=st.one_of(st.floats(1e-300, 1.0, exclude_max=True),
                   st.sampled_from([0.0, 1.0, 0.5, 0.5 - 2**-53, 0.5 + 2**-52, 1e-3, 1 - 1e-9])),
       floor=st.integers(0, 40), width=st.integers(0, 90), pick=st.integers(0, 130),
       shift=st.sampled_from([-2, -1, 0, 1, 2, None]))
def test_knapsack_counts_certified_by_bounds_equal_the_evaluated_crossing(p, floor, width, pick,
                                                                         shift):
    """A Knapsack row's count is settled from bounds on its gain, without evaluating one,
    except within a margin of a step. Wherever it is settled it must be the count that
    evaluating the gains gives, also at values equal to a gain or one float beside it."""
    from sera_opt.kernels import crossing, gains, kinds

    objective = KnapsackValue(np.array([p]))
    x = tuple(row[0] for row in objective.kernel_params())
    ceil = floor + width
    lam = gains.gain(kinds.KNAPSACK, *x, 0, pick)
    if shift is None:
        lam *= 0.7  # between steps
    elif shift:
        for _ in range(abs(shift)):
            lam = np.nextafter(lam, np.inf if shift > 0 else -np.inf)
    log_lam = np.log(lam) if lam > 0 else np.nan
    k = gains.knapsack_count(*x, log_lam, floor, ceil)
    assert k == -1 or k == first_at_or_below(gains, kinds.KNAPSACK, x, lam, floor, ceil)
    # The engine's count, settled or searched, is the definition too.
    k, settled = crossing.settled_start(kinds.KNAPSACK, *x, 0, lam,
                                        gains.pass_constant(kinds.KNAPSACK, lam), floor,
                                        ceil)
    if not settled:
        k, _, _ = crossing.row_crossing(kinds.KNAPSACK, *x, 0, lam, floor, ceil, k, np.nan,
                                    np.nan)
    assert k == first_at_or_below(gains, kinds.KNAPSACK, x, lam, floor, ceil)


@settings(max_examples=30, deadline=None)
@given(vip=st.booleans(),
       a=st.one_of(st.floats(1e-300, 1e300), st.sampled_from([0.0, 0.25, 1e-17, 1.0, 3.0])),
       b=st.one_of(st.floats(0.0, 1e300), st.sampled_from([0.0, 7e-4, 1.0, 1e10])),
       floor=st.integers(0, 40), width=st.integers(0, 90), pick=st.integers(0, 130),
       shift=st.sampled_from([-2, -1, 0, 1, 2, None]))
def test_quadratic_roots_settle_vip_and_gvm_counts_as_the_gains_do(vip, a, b, floor, width,
                                                                     pick, shift):
    """VIP's gain ``a / ((k - 1) k) + b`` and GVM's ``W / (k (k + 1))`` cross a value at the
    root of a quadratic, which settles a count without evaluating a gain except within a
    margin of a step, or (VIP) where ``lam - b`` is the small difference of two large
    numbers. Wherever it is settled it must be the count that evaluating the gains gives,
    also at values equal to a gain, a float or two beside it, and between steps."""
    from sera_opt.kernels import crossing, gains, kinds

    kind = kinds.RLOO_VARIANCE if vip else kinds.INVERSE_COUNT
    x = (a, b, b) if vip else (a, a, a)
    ceil = floor + width
    lam = gains.gain(kind, *x, 0, pick)
    if shift is None:
        lam = (lam + gains.gain(kind, *x, 0, pick + 1)) / 2 if np.isfinite(lam) else lam
    elif shift:
        for _ in range(abs(shift)):
            lam = np.nextafter(lam, np.inf if shift > 0 else -np.inf)
    k, settled = crossing.settled_start(kind, *x, 0, lam, gains.pass_constant(kind, lam),
                                        floor, ceil)
    if not settled:
        k, _, _ = crossing.row_crossing(kind, *x, 0, lam, floor, ceil, k, np.nan, np.nan)
    assert k == first_at_or_below(gains, kind, x, lam, floor, ceil), settled


@settings(max_examples=30, deadline=None)
@given(alpha=st.one_of(st.floats(1e-300, 1e300), st.sampled_from([1.0, 0.5, 1e-30, 1e30])),
       beta=st.one_of(st.floats(1e-300, 1e300), st.sampled_from([1.0, 2.5, 1e-30, 1e30])),
       k=st.integers(1, 64), below=st.integers(1, 64), width=st.integers(1, 80),
       pick=st.integers(0, 72), shift=st.sampled_from([-1, 0, 1, None]))
def test_hit_utility_walk_reads_gains_bit_for_bit(alpha, beta, k, below, width, pick, shift):
    """The count pass walks one product of ratios up from its guess and reads the hit
    utility's gains on the way: they must be exactly :func:`gain`'s (or rows equal in
    value would not tie, and counts would depend on the route taken), and the step it
    settles on must be the first at or below the value."""
    from sera_opt.kernels import gains, kinds

    kind = kinds.HIT_UTILITY
    objective = HitUtility(np.array([alpha]), np.array([beta]))
    x = tuple(row[0] for row in objective.kernel_params())
    floor = max(k - below, 0)
    ceil = k + width

    def g(step):
        return gains.gain(kind, *x, 0, step)

    lam = g(pick)
    if shift is None:
        lam = (lam + g(pick + 1)) / 2 if np.isfinite(lam) else lam
    elif shift:
        lam = np.nextafter(lam, np.inf if shift > 0 else -np.inf)
    # The walk's precondition, as a count pass gives it: every step below floor is above lam.
    floor = min(floor, first_at_or_below(gains, kind, x, lam, 0, k))
    g_below = g(floor - 1) if floor > 0 else np.inf
    g_ceil = g(ceil)
    step, nxt, lst, state = gains.hit_walk(x[0], x[1], lam, k, floor, ceil, g_below, g_ceil)
    if state == 1:
        assert step == k - 2 and step >= floor and nxt == g(step) and nxt <= lam
        assert np.isnan(lst)
        return
    assert lst == (g_below if step == floor else g(step - 1)) and lst > lam
    if state == 0:
        assert step == first_at_or_below(gains, kind, x, lam, floor, ceil)
        assert nxt == (g_ceil if step == ceil else g(step))
    else:
        assert state == 2 and k - 1 < step < ceil and np.isnan(nxt)


def test_knapsack_counts_are_mostly_settled_without_evaluating_a_gain():
    """The bounds settle all rows but those near a step or with p near 1/2 (where both of
    the gain's terms matter): for uniform probabilities at a threshold of 8 rollouts a
    prompt, all but a few in a hundred."""
    from sera_opt.kernels import gains

    rng = np.random.default_rng(3)
    p = rng.uniform(0.0, 1.0, 20_000)
    objective = KnapsackValue(p)
    counts = solve_separable(objective, 8 * p.size, np.ones(p.size, np.int64),
                             np.full(p.size, 64, np.int64))
    lam = float(np.median(objective.gains(counts)))
    settled = [gains.knapsack_count(objective._p0[i], objective._p1[i], objective._p2[i],
                                       np.log(lam), 1, 64) >= 0 for i in range(p.size)]
    assert np.mean(settled) > 0.97


@pytest.mark.parametrize("m", [100, 600, 5000])
def test_a_plateau_of_zero_gains_is_handed_out_in_full(m):
    """Gains of exactly 0 everywhere (Knapsack's p = 0 prompts; the hit utility's first
    step of a p = 1 prompt). The opening bracket's lower end lies just below the smallest
    gain: below 0 that is -5e-324, not -0.0, which equals 0 (with -0.0 the search on the
    subsample handed out nothing, or stopped with an error)."""
    rng = np.random.default_rng(m)
    lo = rng.integers(0, 3, m)
    for objective, hi in ((KnapsackValue(np.zeros(m)), lo + rng.integers(0, 6, m)),
                          (PointHitUtility(np.ones(m)), np.minimum(lo, 0) + 1)):
        lo_ = np.minimum(lo, hi)
        for share in (0.2, 0.5, 0.9):
            budget = int(lo_.sum() + share * (hi - lo_).sum())
            counts = solve_separable(objective, budget, lo_, hi)
            assert counts.sum() == budget
            np.testing.assert_array_equal(counts, sorted_reference(objective, budget, lo_, hi),
                                          err_msg=type(objective).__name__)


@pytest.mark.parametrize("m", [600, 5000])
def test_a_tied_plateau_beyond_the_collection_limit_follows_the_tie_rule(m):
    """Every prompt with the same estimate: the closed-form search closes on one tied gain
    value holding more steps than it collects (2,048), and hands them out by the tie rule
    (fewer rollouts first, then the lower index) without collecting them."""
    from sera_opt.kernels.bracket import COLLECT_MIN

    rng = np.random.default_rng(m)
    p = np.full(m, 0.37)
    lo = rng.integers(1, 4, m)
    hi = lo + rng.integers(0, 10, m)
    plateaus = 0
    for objective in (PointHitUtility(p), AlphaFairUtility(p, 1.0), AlphaFairUtility(p, 0.0)):
        for share in (0.3, 0.5, 0.9):
            budget = int(lo.sum() + share * (hi - lo).sum())
            stats = np.zeros(4, dtype=np.int64)
            counts = solve_separable(objective, budget, lo, hi, stats=stats)
            np.testing.assert_array_equal(counts, sorted_reference(objective, budget, lo, hi),
                                          err_msg=type(objective).__name__)
            # A plateau larger than the limit is water-filled, not collected.
            assert stats[1] <= COLLECT_MIN, stats
            plateaus += stats[1] == 0
    if m > COLLECT_MIN:
        assert plateaus > 0


@pytest.mark.slow
def test_subsample_path_equals_exhaustive_sort():
    # M >= 32768 takes the subsample-seeded path.
    m = 40_000
    rng = np.random.default_rng(5)
    lo = rng.integers(2, 4, m)
    hi = lo + rng.integers(0, 8, m)  # more gains than one collection takes
    budget = int(rng.integers(lo.sum(), hi.sum() + 1))
    objectives = objectives_for(rng, m, ties=True)[:4] + objectives_for(rng, m, ties=False)[7:]
    for objective in objectives:
        stats = np.zeros(4, dtype=np.int64)
        counts = solve_separable(objective, budget, lo, hi, stats=stats)
        if objective.kernel_kind is not None:  # PointLevels runs on the waterline kernels
            assert stats[3] >= 1, "the subsample path was not taken"
        np.testing.assert_array_equal(counts, sorted_reference(objective, budget, lo, hi),
                                      err_msg=type(objective).__name__)


@pytest.mark.parametrize("m", [3000, 40_000])
def test_beta_objectives_solve_alike_with_the_guess_row_and_the_exact_one(m):
    """A solve whose bounds keep every gain within the product of ratios reads the
    log-gamma row only through its guess, so it gets a cheaper approximation of it; the
    counts must be those of the exact row, and larger bounds must prepare the exact row."""
    rng = np.random.default_rng(m)
    lo = rng.integers(1, 3, m)
    hi = lo + rng.integers(0, 12, m)
    budget = int(rng.integers(lo.sum(), hi.sum() + 1))
    for ties in (False, True):
        objectives = objectives_for(rng, m, ties=ties)
        for make in (lambda o: BetaLevels(o._p0, o._p1, offset=1), lambda o: HitUtility(o._p0, o._p1)):
            source = next(o for o in objectives if isinstance(o, HitUtility))
            cheap, exact = make(source), make(source)
            exact.kernel_params()  # prepares the exact row, which every later solve reads
            counts = solve_separable(cheap, budget, lo, hi)
            assert cheap._p2 is None and cheap._p2_guess is not None
            np.testing.assert_array_equal(counts, solve_separable(exact, budget, lo, hi),
                                          err_msg=type(cheap).__name__)
            far = hi + 60  # beyond the product of ratios: the exact row
            solve_separable(cheap, int(lo.sum() + 0.5 * (far - lo).sum()), lo, far)
            assert cheap._p2 is not None
    for empty in (BetaLevels(np.zeros(0), np.zeros(0)), HitUtility(np.zeros(0), np.zeros(0))):
        none = np.zeros(0, dtype=np.int64)
        assert solve_separable(empty, 0, none, none).shape == (0,)


def in_guess_blocks(func, x):
    """``func`` applied in place to ``x`` block by block, as the kernels call it."""
    from sera_opt.kernels import betamath

    out = x.copy()
    block = betamath.LOG_BLOCK
    for start in range(0, x.size, block):
        chunk = out[start:start + block].copy()
        func(chunk, chunk.size, np.empty(block))
        out[start:start + block] = chunk
    return out


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(-700.0, 700.0),
                                 st.sampled_from([0.0, -700.0, 700.0, 1e-300, -0.5, 0.5])),
                       min_size=1, max_size=600))
def test_guess_exponentials_are_within_1e_10_of_exp(values):
    """The hit utility's guesses take their exponential from a series and the float's
    exponent bits (so that the first pass's block loops vectorize): within 1e-10
    (relative) of ``exp`` over the whole range the pass clips to, in blocks of any fill."""
    from sera_opt.kernels import betamath

    x = np.array(values)
    out = in_guess_blocks(betamath.approx_exps, x)
    assert np.max(np.abs(out / np.exp(x) - 1.0)) <= 1e-10


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(2.2250738585072014e-308, 1.7976931348623157e308),
                                 st.sampled_from([1.0, 2.0, 0.5, 1.4142135623730951,
                                                  1.4142135623730950, 2.2250738585072014e-308,
                                                  1.7976931348623157e308])),
                       min_size=1, max_size=600))
def test_guess_logs_are_within_1e_9_of_log(values):
    """The guess row's logs come from the float's bits and a short series (so that its
    loops vectorize): within 1e-9 of the log for every positive normal float, in blocks
    of any fill."""
    from sera_opt.kernels import betamath

    x = np.array(values)
    out = in_guess_blocks(betamath.approx_logs, x)
    assert np.max(np.abs(out - np.log(x))) <= 1e-9


@pytest.mark.slow
def test_state_in_numpy_memory_gives_the_same_counts(monkeypatch):
    """From 65,536 prompts the kernels keep their per-row state and write the counts in
    memory that numpy allocates (huge pages). The counts must be those of the kernels'
    own allocations, bit for bit, and must not be a view of that state."""
    from sera_opt.separable import objective as separable

    m = separable._NUMPY_STATE_FROM + 1000
    rng = np.random.default_rng(11)
    lo = rng.integers(1, 3, m)
    hi = lo + rng.integers(0, 10, m)
    budget = int(rng.integers(lo.sum(), hi.sum() + 1))
    for ties in (False, True):
        for objective in objectives_for(rng, m, ties=ties):
            if objective.kernel_kind is None or isinstance(objective, PointLevels):
                continue
            counts = solve_separable(objective, budget, lo, hi)
            assert counts.sum() == budget and counts.base is None
            with monkeypatch.context() as patch:
                patch.setattr(separable, "_NUMPY_STATE_FROM", 2 * m)
                own = solve_separable(objective, budget, lo, hi)
            np.testing.assert_array_equal(counts, own, err_msg=type(objective).__name__)


@pytest.mark.parametrize("edges", [False, True])
def test_point_levels_reproduce_the_sera_waterline_solver(edges):
    rng = np.random.default_rng(7 + edges)
    for _ in range(20):
        m = int(rng.integers(1, 60))
        p = rng.uniform(0, 1, m)
        if edges:
            p[rng.integers(0, m, 3)] = rng.choice([0.0, 1.0], 3)
            p = np.round(p, 1)
        offset = int(rng.integers(0, 2))
        lo = 1 + offset + int(rng.integers(0, 2))
        hi = lo + int(rng.integers(0, 10))
        budget = int(rng.integers(lo * m, hi * m + 1))
        want = sera_opt.allocate(p, budget, min_rollouts=lo, max_rollouts=hi, offset=offset,
                                 solver="waterline").counts
        got = solve_separable(PointLevels(p, offset), budget, lo, hi)
        np.testing.assert_array_equal(got, want)


def test_unbounded_and_extreme_budgets():
    p = np.array([0.2, 0.5, 0.9])
    objective = KnapsackValue(p)
    assert solve_separable(objective, 6, 2, 100).tolist() == [2, 2, 2]
    assert solve_separable(objective, 300, 2, 100).tolist() == [100, 100, 100]
    # A very large per-prompt cap: counts far beyond any table still come out exact.
    objective = InverseCountCost([1.0, 4.0, 9.0])
    counts = solve_separable(objective, 6_000_000, 1, 10**9)
    assert counts.tolist() == [1_000_000, 2_000_000, 3_000_000]


def test_bad_inputs_raise_the_library_error():
    with pytest.raises(InfeasibleBudgetError):
        solve_separable(KnapsackValue([0.2, 0.4]), 3, 2, 5)
    with pytest.raises(InfeasibleBudgetError):
        solve_separable(KnapsackValue([0.2, 0.4]), 11, 2, 5)
    with pytest.raises(SeraOptError, match="shape"):
        solve_separable(KnapsackValue([0.2, 0.4]), 6, [1, 2, 3], 5)
    with pytest.raises(SeraOptError, match="whole numbers"):
        solve_separable(KnapsackValue([0.2, 0.4]), 6, 1.5, 5)
    with pytest.raises(SeraOptError, match="SeparableObjective"):
        solve_separable("knapsack", 6, 1, 5)
    with pytest.raises(SeraOptError, match="both 0"):
        BetaLevels([0.0], [0.0])
    with pytest.raises(SeraOptError, match=">= 0"):
        HitUtility([1.0], [-1.0])
    with pytest.raises(SeraOptError, match="NaN"):
        KnapsackValue([np.nan])
    with pytest.raises(SeraOptError, match="weights"):
        InverseCountCost([-1.0])
    with pytest.raises(SeraOptError, match="gamma"):
        RLOOVariance([0.5], gamma=-1)


def test_terms_are_the_documented_formulas():
    p = np.array([0.0, 0.3, 1.0])
    n = np.array([3, 4, 5])
    np.testing.assert_allclose(KnapsackValue(p).terms(n),
                               (1 - p**n - (1 - p) ** n) * p * (1 - p) ** 2, atol=1e-15)
    np.testing.assert_allclose(PointHitUtility(p).terms(n), 1 - (1 - p) ** n)
    q = np.array([0.2, 0.5])
    np.testing.assert_allclose(RLOOVariance(q, gamma=0.01).terms(np.array([3, 5])),
                               q * (1 - q) / np.array([2, 4]) + 0.01 * np.log(q) * [3, 5])
    np.testing.assert_allclose(InverseCountCost([2.0, 3.0]).terms(np.array([4, 6])), [0.5, 0.5])
    # E[(1 - p)^m] under Beta(a, b) is a product of ratios.
    a, b, m = 2.5, 4.0, 6
    product = np.prod([(b + j) / (a + b + j) for j in range(m)])
    assert HitUtility([a], [b]).terms(np.array([m]))[0] == pytest.approx(1 - product, rel=1e-12)
    level = BetaLevels([a], [b], offset=1).terms(np.array([m + 1]))[0]
    assert level == pytest.approx(-np.log(product), rel=1e-12)


class NumpyOnly(SeparableObjective):
    """A built-in objective seen only through its public gains() and terms(): the engine
    then runs its numpy path, which must agree with the numba kernels exactly."""

    def __init__(self, inner):
        self.sense = inner.sense
        super().__init__(inner.num_prompts, inner.offset)
        self.inner = inner

    def gains(self, counts):
        return self.inner.gains(counts)

    def terms(self, counts):
        return self.inner.terms(counts)

    def edges(self):
        return self.inner.edges()


@pytest.mark.parametrize("m, ties", [(200, False), (200, True)])
def test_numpy_engine_equals_the_kernels_including_ties(m, ties):
    rng = np.random.default_rng(100 + m + ties)
    lo = rng.integers(2, 4, m)
    hi = lo + rng.integers(0, 9, m)
    budget = int(rng.integers(lo.sum(), hi.sum() + 1))
    for objective in objectives_for(rng, m, ties=ties):
        if objective._tie_rtol:
            continue  # the kernels widen ties by a tolerance the numpy path does not use
        want = solve_separable(objective, budget, lo, hi)
        got = solve_separable(NumpyOnly(objective), budget, lo, hi)
        np.testing.assert_array_equal(got, want, err_msg=type(objective).__name__)


def test_numpy_engine_spreads_a_plateau_evenly_and_takes_unbounded_counts():
    class Flat(SeparableObjective):
        sense = "max-sum"

        def gains(self, counts):
            return np.ones(self.num_prompts)

        def terms(self, counts):
            return np.asarray(counts, dtype=float)

    counts = solve_separable(Flat(4), 3 * 10**12 + 2, 1, 10**13)
    assert counts.tolist() == [750_000_000_001, 750_000_000_001, 750_000_000_000,
                               750_000_000_000]


def test_an_objective_without_a_sense_or_gains_is_refused():
    class NoSense(SeparableObjective):
        pass

    with pytest.raises(SeraOptError, match="sense"):
        NoSense(2)

    class NoGains(SeparableObjective):
        sense = "max-sum"

    with pytest.raises(NotImplementedError, match="gains"):
        solve_separable(NoGains(2), 5, 1, 4)


def test_the_python_list_of_closed_form_kinds_is_the_kernels_own():
    """The entry kernel is chosen in Python (solve_closed compiles the closed-form engine
    alone), so the Python set must name exactly the kinds the kernels' test sends there."""
    from sera_opt.kernels import gains, kinds

    numbers = [v for name, v in vars(kinds).items() if name.isupper() and isinstance(v, int)
               and name in ("BETA_LEVELS", "KNAPSACK", "HIT_UTILITY", "RLOO_VARIANCE",
                            "INVERSE_COUNT", "POINT_HIT", "ALPHA_FAIR", "FAIR_SUM", "FAIR_LOG",
                            "FAIR_INVERSE")]
    assert len(numbers) == 10
    assert {kind for kind in numbers if gains.closed_form(kind)} == kinds.CLOSED_FORM_KINDS


CLOSED_ENTRIES = ("stepwise_counts", "bracket_solve", "collect_solve", "closed_solve",
                  "closed_counts_sampled_exact")


def closed_entry_counts(name, objective, budget, lo, hi):
    """Counts from one entry kernel of the closed-form kinds, called directly (whichever
    entry :func:`~sera_opt.kernels.kinds.closed_entry` would choose for the problem)."""
    from sera_opt.kernels import closed

    spare = budget - int(lo.sum())
    p0, p1, p2 = (np.ascontiguousarray(x) for x in objective._solve_params(hi))
    return getattr(closed, name)(objective.kernel_kind, p0, p1, p2, objective.offset, lo, hi, spare,
                                 np.zeros(4, dtype=np.int64), np.empty((4, 0), dtype=np.int64),
                                 np.empty(0, dtype=np.int64))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(20, 700), ties=st.booleans(),
       share=st.floats(0.001, 0.999))
def test_every_closed_form_entry_equals_exhaustive_sort(seed, m, ties, share):
    """The closed-form kinds have two entries (``closed_solve`` for every batch below
    SUBSAMPLE_FROM rows, which calls the one-at-a-time kernel for a small spare and the
    bracket search otherwise, which opens its bracket from the rows' extremes or from a
    subsample by their number; and one whose subsample is solved exactly): each entry and
    each kernel is checked here by itself, on sizes from 20 rows (the subsample entry
    takes one row in sixteen), against the sort of all gains."""
    from sera_opt.kernels.kinds import CLOSED_FORM_KINDS

    rng = np.random.default_rng(seed)
    lo = rng.integers(2, 4, m)  # offset 1 needs two rollouts for a positive factor
    hi = lo + rng.integers(0, 12, m)
    total = int((hi - lo).sum())
    if total < 2:
        return
    budget = int(lo.sum()) + min(max(1, int(share * total)), total - 1)
    for objective in objectives_for(rng, m, ties=ties):
        if objective.kernel_kind not in CLOSED_FORM_KINDS:
            continue
        reference = sorted_reference(objective, budget, lo, hi)
        for name in CLOSED_ENTRIES:
            np.testing.assert_array_equal(
                closed_entry_counts(name, objective, budget, lo, hi), reference,
                err_msg=f"{type(objective).__name__} through {name}")


def test_the_solver_takes_the_entry_the_size_calls_for(monkeypatch):
    """``closed_entry`` picks the entry by the rows alone (one entry for every batch
    below SUBSAMPLE_FROM rows, whatever its spare rollouts; it picks its kernel by the
    spare), and the solver calls the entry it names."""
    from sera_opt.kernels import kinds

    assert kinds.closed_entry(64) == "closed_solve"
    assert kinds.closed_entry(kinds.CLOSED_SUBSAMPLE_FROM) == "closed_solve"
    assert kinds.closed_entry(kinds.SUBSAMPLE_FROM - 1) == "closed_solve"
    assert kinds.closed_entry(kinds.SUBSAMPLE_FROM) == "closed_counts_sampled_exact"
    import sera_opt.separable.objective as objective_module

    called = []
    real = objective_module.closed_entry

    def spy(rows):
        called.append(real(rows))
        return called[-1]

    monkeypatch.setattr(objective_module, "closed_entry", spy)
    for m, per in ((64, 4), (300, 8), (600, 8)):
        p = np.random.default_rng(m).uniform(0.05, 0.95, m)
        counts = solve_separable(AlphaFairUtility(p, 1.0, offset=1), per * m, 2, 32)
        assert counts.sum() == per * m
    assert called == ["closed_solve"] * 3
