"""The default path's fast paths against the paths they replace.

Speed is measured by ``sera-opt bench default-path`` (docs/benchmarks.md), never here;
these tests hold what a faster path must keep: the same counts, and the same checks.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import api
from sera_opt.policies.core import SERAPolicy
from sera_opt.separable import AlphaFairUtility
from sera_opt.solvers.base import SOLVERS

from .test_separable import closed_entry_counts, objectives_for, sorted_reference


class _Counting(SERAPolicy):
    built = 0

    def __init__(self, *args, **kwargs):
        type(self).built += 1
        super().__init__(*args, **kwargs)


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.setattr(api, "SERAPolicy", _Counting)
    monkeypatch.setattr(api, "_POLICIES", {})
    _Counting.built = 0
    return _Counting


def test_allocate_checks_a_configuration_once(counting):
    p = np.random.default_rng(0).uniform(0, 1, 50)
    first = sera_opt.allocate(p, 400, min_rollouts=1, max_rollouts=64)
    second = sera_opt.allocate(p, 400, min_rollouts=1, max_rollouts=64)
    assert counting.built == 1, "a repeated configuration built its policy again"
    assert np.array_equal(first.counts, second.counts)
    sera_opt.allocate(p, 400, min_rollouts=2, max_rollouts=64)
    assert counting.built == 2, "another configuration reused the first one's policy"


@pytest.mark.parametrize("options", [
    {"min_rollouts": True}, {"min_rollouts": 1.0}, {"max_rollouts": np.int64(64)},
    {"max_rollouts": [64] * 50}, {"continuous": False},
])
def test_allocate_keeps_no_policy_of_other_configurations(counting, options):
    p = np.random.default_rng(1).uniform(0, 1, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            try:
                sera_opt.allocate(p, 400, **options)
            except sera_opt.SeraOptError:
                pass
    assert counting.built == 2, f"{options}: a configuration not keyed by value was reused"
    assert not api._POLICIES


def test_allocate_errors_are_raised_every_call(counting):
    p = np.random.default_rng(2).uniform(0, 1, 10)
    for _ in range(2):
        with pytest.raises(sera_opt.SeraOptError):
            sera_opt.allocate(p, 80, min_rollouts=1, offset=1)
    assert not api._POLICIES, "a rejected configuration was kept"


def test_allocate_follows_a_solver_registered_again(counting, monkeypatch):
    p = np.random.default_rng(3).uniform(0, 1, 20)
    sera_opt.allocate(p, 160, max_rollouts=32)
    original = SOLVERS.lookup("waterline")

    class Replacement(original):
        pass

    monkeypatch.setitem(SOLVERS._entries, "waterline", Replacement)
    alloc = sera_opt.allocate(p, 160, max_rollouts=32)
    assert counting.built == 2, "a cached policy outlived the solver registered under its name"
    assert alloc.counts.sum() == 160


@pytest.mark.parametrize("m", [1, 7, 300, 1024])
def test_allocate_equals_policy_allocate(m):
    p = np.random.default_rng(m).uniform(0, 1, m)
    policy = sera_opt.get_policy("sera", min_rollouts=1, max_rollouts=64)
    for _ in range(2):
        assert np.array_equal(sera_opt.allocate(p, 8 * m, min_rollouts=1, max_rollouts=64).counts,
                              policy.allocate(p, 8 * m).counts)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(400, 2500), ties=st.booleans(),
       identical=st.booleans(), share=st.floats(0.01, 0.99))
def test_the_training_batch_kernel_equals_exhaustive_sort(seed, m, ties, identical, share):
    """``closed_solve`` (the entry of every batch below SUBSAMPLE_FROM rows), against
    the sort of all gains, on the sizes where it opens its bracket from the rows'
    extremes and from a subsample, with spare budgets beyond the one-at-a-time kernel's
    (so that the bracket and its heap hand the rollouts out), ties, and batches of
    identical prompts (a first plan: every estimate is the prior's mean, one plateau of
    tied gains)."""
    from sera_opt.kernels.kinds import CLOSED_FORM_KINDS, STEPWISE_MAX_SPARE

    rng = np.random.default_rng(seed)
    lo = rng.integers(2, 4, m)
    hi = lo + rng.integers(0, 12, m)
    total = int((hi - lo).sum())
    spare = min(max(STEPWISE_MAX_SPARE + 1, int(share * total)), total - 1)
    if spare <= STEPWISE_MAX_SPARE:
        return
    budget = int(lo.sum()) + spare
    if identical:
        objectives = [AlphaFairUtility(np.full(m, 0.3), alpha, offset=1) for alpha in (0, 1, 2)]
    else:
        objectives = [o for o in objectives_for(rng, m, ties=ties)
                      if o.kernel_kind in CLOSED_FORM_KINDS]
    for objective in objectives:
        np.testing.assert_array_equal(
            closed_entry_counts("closed_solve", objective, budget, lo, hi),
            sorted_reference(objective, budget, lo, hi),
            err_msg=f"{type(objective).__name__}, {m} rows, spare {spare}")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(20, 700), share=st.floats(0.001, 0.3))
def test_the_bracket_search_is_exact_at_small_spares_too(seed, m, share):
    """``bracket_solve`` and ``collect_solve``, which ``closed_solve`` calls only beyond
    STEPWISE_MAX_SPARE spare rollouts, are exact at any spare: called directly with the
    small ones that ``closed_solve`` hands out one at a time, they give the counts of the
    exhaustive sort."""
    from sera_opt.kernels.kinds import CLOSED_FORM_KINDS

    rng = np.random.default_rng(seed)
    lo = rng.integers(2, 4, m)
    hi = lo + rng.integers(0, 12, m)
    total = int((hi - lo).sum())
    if total < 2:
        return
    budget = int(lo.sum()) + min(max(1, int(share * total)), total - 1)
    for objective in objectives_for(rng, m, ties=False):
        if objective.kernel_kind in CLOSED_FORM_KINDS:
            want = sorted_reference(objective, budget, lo, hi)
            for name in ("bracket_solve", "collect_solve"):
                np.testing.assert_array_equal(
                    closed_entry_counts(name, objective, budget, lo, hi), want,
                    err_msg=f"{type(objective).__name__} through {name}, {m} rows")


def test_closed_solve_enters_one_kernel_by_the_spare(monkeypatch):
    """``closed_solve`` calls the one-at-a-time kernel up to STEPWISE_MAX_SPARE spare
    rollouts and the search beyond (Knapsack's collecting one, the heap's for the
    others), each alone: a first call with a small spare compiles only the small
    kernel."""
    from sera_opt.kernels import closed
    from sera_opt.kernels.kinds import STEPWISE_MAX_SPARE
    from sera_opt.separable import KnapsackValue

    entered = []
    for name in ("stepwise_counts", "bracket_solve", "collect_solve"):
        real = getattr(closed, name)
        monkeypatch.setattr(closed, name,
                            lambda *args, _name=name, _real=real: entered.append(_name)
                            or _real(*args))
    m = 400
    lo, hi = np.full(m, 2), np.full(m, 10)
    objective = AlphaFairUtility(np.linspace(0.05, 0.95, m), 1.0, offset=1)
    for spare in (1, STEPWISE_MAX_SPARE, STEPWISE_MAX_SPARE + 1, 3000):
        counts = closed_entry_counts("closed_solve", objective, int(lo.sum()) + spare, lo, hi)
        np.testing.assert_array_equal(counts, sorted_reference(objective, int(lo.sum()) + spare,
                                                               lo, hi))
    assert entered == ["stepwise_counts"] * 2 + ["bracket_solve"] * 2, entered
    entered.clear()
    knapsack = KnapsackValue(np.linspace(0.05, 0.95, m))
    for spare in (STEPWISE_MAX_SPARE, 3000):
        counts = closed_entry_counts("closed_solve", knapsack, int(lo.sum()) + spare, lo, hi)
        np.testing.assert_array_equal(counts, sorted_reference(knapsack, int(lo.sum()) + spare,
                                                               lo, hi))
    assert entered == ["stepwise_counts", "collect_solve"], entered


def test_the_planner_reads_a_batch_of_string_ids_once(monkeypatch):
    """plan() hands one reading of the ids to the tracker's lookup and to the check for
    repeated ids (reading a thousand string ids costs about as much as the solve); the
    counts and the warning about repeated ids are those of separate readings."""
    from sera_opt.tracking import index

    ids = [f"prompt-{i}" for i in range(40)]
    planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)
    planner.observe(np.repeat(ids, 3), np.tile([1.0, 0.0, 0.0], 40))
    expected = planner.plan(ids, 320).counts
    reads = []
    real = index._strings_from_list
    monkeypatch.setattr(index, "_strings_from_list", lambda items: reads.append(1) or real(items))
    np.testing.assert_array_equal(planner.plan(ids, 320).counts, expected)
    assert len(reads) == 1, f"the ids were read {len(reads)} times"
    with pytest.warns(sera_opt.SeraOptWarning, match="repeats 1 prompt id"):
        planner.plan(ids + ["prompt-0"], 328)


@pytest.mark.parametrize("kind", ["str", "int"])
def test_known_ids_are_checked_for_repeats_on_their_slots(monkeypatch, kind):
    """A batch whose ids the tracker knows is checked for repeated ids on the slots of
    the estimate's own lookup, with no scratch index; a repeated id, known or not, still
    gives the warning that names it, and the counts are those of the separate check."""
    from sera_opt.tracking import SuccessTracker

    ids = [f"p{i}" if kind == "str" else 10 * i for i in range(50)]
    planner = sera_opt.RolloutPlanner(max_rollouts=64)
    planner.observe(np.repeat(ids, 2), np.tile([1.0, 0.0], 50))
    real = SuccessTracker.repeated_ids
    calls = []
    monkeypatch.setattr(SuccessTracker, "repeated_ids",
                        staticmethod(lambda parsed: calls.append(1) or real(parsed)))
    counts = planner.plan(ids, 403).counts
    assert calls == [], "a batch of known ids was hashed again"
    np.testing.assert_array_equal(counts, sera_opt.get_policy("uniform", offset=1,
                                  min_rollouts=2, max_rollouts=64).allocate(
                                      np.full(50, 0.5), 403).counts)
    for extra in (ids[7], "new" if kind == "str" else 12345):
        with pytest.warns(sera_opt.SeraOptWarning) as caught:
            planner.plan(ids + [extra, extra], 416)
        assert "repeats 1 prompt id" in str(caught[0].message)
        assert repr(extra) in str(caught[0].message)


def one_at_a_time(start, cap, extra):
    """The water-fill by its definition: each rollout to the row with the lowest
    ``start + increment`` that can still take one, ties to the lower index."""
    inc = [0] * len(start)
    for _ in range(extra):
        open_rows = [i for i in range(len(start)) if inc[i] < cap[i]]
        if not open_rows:
            break
        inc[min(open_rows, key=lambda i: (start[i] + inc[i], i))] += 1
    return np.array(inc, dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(m=st.integers(1, 40), lo=st.integers(0, 9), room=st.integers(0, 12),
       extra=st.integers(0, 600), equal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_even_increments_equal_the_one_at_a_time_water_fill(m, lo, room, extra, equal, seed):
    """Equal starts and caps take the even split without the search; both ways give the
    counts of handing the rollouts out one at a time (also past the rows' room)."""
    from sera_opt.separable.tiers import even_increments

    rng = np.random.default_rng(seed)
    start = np.full(m, lo) if equal else lo + rng.integers(0, 4, m)
    cap = np.full(m, room) if equal else rng.integers(0, room + 1, m)
    np.testing.assert_array_equal(even_increments(start, cap, extra),
                                  one_at_a_time(start, cap, extra))


@settings(max_examples=100, deadline=None)
@given(m=st.integers(1, 60), lo=st.integers(1, 9), room=st.integers(0, 20),
       share=st.floats(0.0, 1.0), offset=st.integers(0, 1))
def test_uniform_counts_with_equal_bounds_equal_the_water_fill(m, lo, room, share, offset):
    """Uniform allocation with equal bounds (the split read off the problem's bounds,
    without looking at them) hands out the rollouts as one at a time would."""
    from sera_opt.policies.core import uniform_counts

    lo = max(lo, 1 + offset)
    budget = m * lo + int(round(share * m * room))
    problem = sera_opt.AllocationProblem(np.full(m, 0.5), budget, lo, lo + room, offset)
    assert problem.uniform_bounds
    want = lo + one_at_a_time([lo] * m, [room] * m, budget - m * lo)
    np.testing.assert_array_equal(uniform_counts(problem), want)


def test_the_alpha_2_crossing_keeps_its_digits_at_the_first_steps():
    """A prompt's largest alpha = 2 gain (its first step, a large value): the closed-form
    crossing of that very value lies on the step, so a count pass there must find no gain
    above it. The crossing once lost its digits to cancellation there (``log u`` with
    ``u`` near 1) and counted one step too many, and a solve that opened its bracket on
    the extremes handed out one rollout more than the budget."""
    from sera_opt.kernels import closed, gains

    objective = AlphaFairUtility(np.array([3.8756548307058604e-08, 0.3, 0.999]), 2.0, offset=1)
    kind = objective.kernel_kind
    p0, p1, p2 = objective.kernel_params()
    for row in range(3):
        for lo in (2, 3, 5):
            top = gains.gain(kind, p0[row], p1[row], p2[row], 1, lo)
            aux = gains.pass_constant(kind, top)
            crossing = gains.fair_inverse_crossing(p0[row], p1[row], 1, top, aux)
            assert abs(crossing - lo) < 1e-12 * lo, (row, lo, crossing)
            assert closed._closed_crossing(kind, p0[row], p1[row], p2[row], 1, top, aux, lo,
                                           12) == lo


@pytest.mark.parametrize("seed, m", [(284995, 232)])
def test_the_largest_problems_kernel_on_a_case_that_once_overspent(seed, m):
    """The hypothesis case that found the crossing above: every closed-form entry, the
    largest problems' one included, spends exactly the budget, as the exhaustive sort."""
    from sera_opt.kernels.kinds import CLOSED_FORM_KINDS

    rng = np.random.default_rng(seed)
    lo = rng.integers(2, 4, m)
    hi = lo + rng.integers(0, 12, m)
    budget = int(lo.sum()) + int(0.5 * (hi - lo).sum())
    for objective in objectives_for(rng, m, ties=False):
        if objective.kernel_kind in CLOSED_FORM_KINDS:
            reference = sorted_reference(objective, budget, lo, hi)
            for name in ("closed_solve", "closed_counts_sampled_exact"):
                np.testing.assert_array_equal(
                    closed_entry_counts(name, objective, budget, lo, hi), reference,
                    err_msg=f"{type(objective).__name__} through {name}")


def test_the_planner_measurement_times_the_default_planner_beside_sera_fair():
    """``bench default-path`` times the library's default planner (uniform allocation) and
    the sera-fair planner on the same ids, in the same rounds."""
    from sera_opt.benchmarks import default_path

    out = default_path.measure_planner(1, False)
    medians = out["medians_s"]
    for case in ("plan int ids", "plan str ids", "default plan int ids", "default plan str ids",
                 "4-round session planning", "sera-fair kernel, bracket search",
                 "sera-fair kernel, one at a time"):
        assert medians[case] > 0, case


def test_the_summary_reports_first_use_both_ways():
    """The first-use lines name the way (background or in-process), the time until every
    kernel was ready, and the ratio of the two batch sizes for each way."""
    from sera_opt.benchmarks import default_path

    first = [{"prompts": m, "mode": mode, "step_s": step, "ready_s": ready, "runs": []}
             for m, mode, step, ready in ((64, "background", 5.0, 5.0),
                                          (64, "in-process", 5.0, 5.0),
                                          (1024, "background", 6.0, 12.0),
                                          (1024, "in-process", 15.0, 15.0))]
    payload = {"setup": {"sizes": []}, "kernels": [], "first_use": first,
               "planner": {"prompts": 1024, "medians_s": {}, "allocate_vs_policy": 1.0}}
    text = default_path.summary(payload)
    assert ("first use, empty cache, M = 1,024 (background): 6.0 s; every kernel ready after "
            "12.0 s") in text
    assert "first use (background), M = 1,024 / M = 64: 1.20" in text
    assert "first use (in-process), M = 1,024 / M = 64: 3.00" in text
