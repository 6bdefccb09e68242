"""SERA as its authors run it (docs/theory.md, "SERA as its authors run it"): the active
set, their rounding and the ``sera-paper`` preset, against a slow reference written
from the description alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import SeraOptError, get_policy
from sera_opt.result import ACTIVE, SWITCHED_OFF, TOO_EASY, TOO_HARD


# ------------------------------------------------------------------ the slow reference
def ref_mixed(p: float, n: int) -> float:
    if n == 0:
        return 0.0
    value = 1.0 - (1.0 - p) ** n - p ** n
    return min(max(value, 0.0), 1.0)


def ref_waterline_rounding(p: list[float], budget: int, lo: int, hi: int, c: int):
    """Bisect log(level) 100 times keeping the feasible end, floor, then refill by least
    growth of the squared distance to the level's factor (ties: lower index)."""
    rates = [-math.log1p(-q) for q in p]
    k = len(p)
    if budget == k * lo:
        return [lo] * k
    low = math.log(min((lo - c) * a for a in rates)) if lo > c else math.log(5e-324)
    high = math.log(max((hi - c) * a for a in rates))

    def total(level):
        # np.sum, so that the sum is the one the library compares with the budget
        return float(np.sum(np.array([min(max(c + level / a, lo), hi) for a in rates])))

    for _ in range(100):
        mid = 0.5 * (low + high)
        if total(math.exp(mid)) > budget:
            high = mid
        else:
            low = mid
    level = math.exp(low)
    counts = [min(max(math.floor(min(max(c + level / a, lo), hi)), lo), hi) for a in rates]
    left = budget - sum(counts)
    target = -math.expm1(-level)
    growth = []
    for i in range(k):
        if counts[i] < hi:
            now = -math.expm1(math.log1p(-p[i]) * (counts[i] - c))
            after = -math.expm1(math.log1p(-p[i]) * (counts[i] + 1 - c))
            growth.append(((after - target) ** 2 - (now - target) ** 2, i))
    growth.sort()
    for _, i in growth[:left]:
        counts[i] += 1
    assert sum(counts) == budget
    return counts


def ref_active_set(p: list[float], budget: int, lo: int, hi: int, c: int, tau: float,
                   rounding):
    """The authors' rule: returns (counts, forced_flag)."""
    m = len(p)
    u = [ref_mixed(q, hi) for q in p]
    ranked = sorted(range(m), key=lambda i: (-u[i], i))
    eligible = sum(1 for x in u if x >= tau)
    required = -(-budget // hi)

    def allocate(k):
        active = sorted(ranked[:k])
        sub = rounding([p[i] for i in active], budget, lo, hi, c)
        counts = [0] * m
        for i, n in zip(active, sub):
            counts[i] = n
        useful = all(ref_mixed(p[i], counts[i]) >= tau - 1e-12 for i in active)
        return counts, useful

    chosen = required
    if eligible >= required:
        low, high = required, min(eligible, budget // lo)
        while low <= high:
            mid = (low + high) // 2
            if allocate(mid)[1]:
                chosen, low = mid, mid + 1
            else:
                high = mid - 1
    counts, useful = allocate(chosen)
    return counts, not useful


def exact_rounding(p, budget, lo, hi, c):
    return sera_opt.allocate(np.array(p), budget, min_rollouts=lo, max_rollouts=hi, offset=c,
                             solver="greedy").counts.tolist()


# ------------------------------------------------------------------ instances
@st.composite
def batches(draw, max_prompts=24):
    m = draw(st.integers(1, max_prompts))
    n0 = draw(st.integers(2, 8))
    interior = st.floats(1e-6, 1 - 1e-6)
    near_edges = st.sampled_from([1e-9, 1e-4, 0.003, 0.02, 0.5, 0.97, 0.99, 0.9999, 1 - 1e-9])
    ties = st.sampled_from([0.2, 0.5, 0.8])
    p = draw(st.lists(st.one_of(interior, near_edges, ties), min_size=m, max_size=m))
    return np.array(p), m * n0, 2, 4 * n0


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches())
def test_the_preset_reproduces_the_reference_bit_for_bit(case):
    p, budget, lo, hi = case
    alloc = get_policy("sera-paper").allocate(p, budget)
    counts, forced = ref_active_set(p.tolist(), budget, lo, hi, 1, 0.05, ref_waterline_rounding)
    np.testing.assert_array_equal(alloc.counts, counts)
    assert int(alloc.counts.sum()) == budget
    on = alloc.counts > 0
    assert np.all(alloc.counts[on] >= lo) and np.all(alloc.counts <= hi)
    assert (alloc.active_set.forced > 0) == forced
    np.testing.assert_array_equal(alloc.active, on)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches(max_prompts=12), threshold=st.sampled_from([0.0, 0.05, 0.3, 0.9]))
def test_the_exact_rounding_on_the_active_set_is_the_lexicographic_optimum(case, threshold):
    p, budget, lo, hi = case
    alloc = get_policy("sera", offset=1, min_rollouts=lo, max_rollouts=hi,
                       active_threshold=threshold).allocate(p, budget)
    counts, _ = ref_active_set(p.tolist(), budget, lo, hi, 1, threshold, exact_rounding)
    np.testing.assert_array_equal(alloc.counts, counts)
    inner = alloc.active_set.inner
    sub = inner.problem
    milp = sera_opt.allocate(sub.success_probs, budget, min_rollouts=lo, max_rollouts=hi,
                             offset=1, solver="milp")
    np.testing.assert_allclose(np.sort(inner.levels), np.sort(milp.levels), rtol=1e-9,
                               atol=1e-12)


def test_the_issue_example_switches_the_solved_prompt_off():
    p = np.array([0.999, 0.5, 0.05, 0.001])
    every = get_policy("sera", offset=1, min_rollouts=2, max_rollouts=64).allocate(p, 32)
    assert every.counts.tolist() == [2, 2, 2, 26]
    some = get_policy("sera", offset=1, min_rollouts=0, max_rollouts=64).allocate(p, 32)
    assert some.counts[0] == 0 and some.counts.sum() == 32
    assert some.active_set.reasons[0] == TOO_EASY
    assert some.active_set.threshold == 0.05
    same = get_policy("sera", offset=1, active_threshold=0.05, max_rollouts=64).allocate(p, 32)
    np.testing.assert_array_equal(some.counts, same.counts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(successes=st.lists(st.integers(0, 16), min_size=2, max_size=12),
       per_prompt=st.integers(2, 64))
def test_a_first_visit_of_16_rollouts_cannot_switch_a_prompt_off(successes, per_prompt):
    # docs/theory.md, "The active set": from the prior Beta(1/2, 1/2), 16 rollouts leave every
    # estimate in [0.5/17, 16.5/17], where a group of 2 or more mixes with chance above 0.05.
    planner = sera_opt.RolloutPlanner.paper_sera()
    ids = np.arange(len(successes))
    rewards = np.concatenate([np.r_[np.ones(k), np.zeros(16 - k)] for k in successes])
    planner.observe(np.repeat(ids, 16), rewards)
    planner.end_epoch()
    assert planner.tracker.estimate(ids).max() <= 16.5 / 17
    alloc = planner.plan(ids, per_prompt * len(ids))
    assert alloc.active_set.reasons.tolist() == [ACTIVE] * len(ids)
    assert alloc.active_set.forced == 0


def test_more_evidence_than_a_first_visit_switches_a_solved_prompt_off():
    # The other side of the claim: the threshold does act once the estimate is high enough.
    def first_reason(successes):
        planner = sera_opt.RolloutPlanner.paper_sera()
        ids = np.arange(8)
        planner.observe(np.zeros(successes, dtype=int), np.ones(successes))
        planner.observe(np.repeat(ids[1:], 16), np.tile(np.r_[np.ones(4), np.zeros(12)], 7))
        planner.end_epoch()
        return planner.plan(ids, 16 * 8).active_set.reasons[0]

    assert first_reason(16) == ACTIVE
    assert first_reason(32) == TOO_EASY


def test_forced_activation_spends_the_budget():
    # Every prompt nearly solved: none is eligible, the fewest that absorb the budget run.
    p = np.full(8, 0.9999)
    alloc = get_policy("sera-paper").allocate(p, 8 * 4)
    assert alloc.counts.sum() == 32
    assert alloc.num_active == 2  # ceil(32 / 16)
    assert alloc.active_set.forced == 2
    assert alloc.active_set.summary()["forced"] == 2


def test_reasons_name_easy_hard_and_the_callers_choice():
    p = np.array([0.9999, 0.5, 1e-6, 0.4, 0.6])
    alloc = get_policy("sera", offset=1, active_threshold=0.05).allocate(
        p, 5 * 4, max_rollouts=np.array([16, 16, 16, 0, 16]))
    reasons = alloc.active_set.reasons
    assert reasons[3] == SWITCHED_OFF and alloc.counts[3] == 0
    assert reasons[1] == ACTIVE and reasons[4] == ACTIVE
    assert reasons[0] == TOO_EASY and reasons[2] == TOO_HARD
    assert alloc.active_set.reason_names()[3] == "switched off by the caller"
    assert alloc.factors[0] == 0 and alloc.factors[2] == 0


@pytest.mark.parametrize("policy", ["sera", "sera-fair", "uniform", "knapsack", "hora"])
def test_an_explicit_active_set_works_through_every_policy(policy):
    p = np.array([0.3, 0.6, 0.1, 0.8])
    hi = np.array([8, 0, 8, 8])
    alloc = get_policy(policy, offset=1, min_rollouts=2).allocate(p, 12, max_rollouts=hi)
    assert alloc.counts[1] == 0 and alloc.counts.sum() == 12
    assert alloc.active_set.reasons.tolist() == [ACTIVE, SWITCHED_OFF, ACTIVE, ACTIVE]
    direct = get_policy(policy, offset=1, min_rollouts=2).allocate(p[[0, 2, 3]], 12,
                                                                   max_rollouts=8)
    np.testing.assert_array_equal(alloc.counts[[0, 2, 3]], direct.counts)


def test_allocate_takes_min_rollouts_zero():
    p = np.array([0.999, 0.5, 0.05, 0.001])
    alloc = sera_opt.allocate(p, 32, min_rollouts=0, max_rollouts=64, offset=1)
    assert alloc.counts[0] == 0 and alloc.active_set is not None


def test_policies_without_an_active_set_refuse_min_rollouts_zero():
    with pytest.raises(SeraOptError, match="cannot switch prompts off"):
        get_policy("uniform", min_rollouts=0)
    with pytest.raises(SeraOptError, match="active_threshold"):
        get_policy("knapsack", active_threshold=0.05)
    with pytest.raises(SeraOptError, match="at most 1"):
        get_policy("sera", active_threshold=1.5)
    with pytest.raises(SeraOptError, match="rounding must be one of"):
        get_policy("sera", rounding="nearest")


def test_the_preset_reads_as_the_authors_configuration():
    policy = get_policy("sera-paper")
    assert policy.offset == 1
    assert policy.min_rollouts == 2
    assert policy.max_ratio == 4.0
    assert policy.active_threshold == 0.05
    assert policy.rounding == "paper"
    assert not policy.exact
    rebuilt = sera_opt.policy_from_config(policy.config())
    assert rebuilt.config() == policy.config()
    # bounds 2 and 4 N0: N0 = 16 gives a cap of 64
    rng = np.random.default_rng(3)
    alloc = policy.allocate(rng.uniform(0.001, 0.999, 256), 256 * 16)
    assert alloc.counts.max() <= 64 and alloc.counts[alloc.counts > 0].min() >= 2


def test_the_paper_rounding_differs_from_the_exact_one_only_as_documented():
    """On the section-3 example the floor-and-refill rule and the lexicographic max-min
    disagree; both spend the budget."""
    p = np.array([0.669, 0.201, 0.576, 0.600, 0.953])
    paper = get_policy("sera", rounding="paper", min_rollouts=1, max_rollouts=9).allocate(p, 12)
    exact = get_policy("sera", min_rollouts=1, max_rollouts=9).allocate(p, 12)
    assert paper.counts.sum() == exact.counts.sum() == 12
    assert exact.min_factor >= paper.min_factor
    assert exact.counts.tolist() == [2, 5, 2, 2, 1]


def test_paper_rounding_handles_the_edges_as_the_continuous_formula_does():
    p = np.array([0.0, 1.0, 0.3, 0.9])
    alloc = get_policy("sera", rounding="paper", offset=1, min_rollouts=2,
                       max_rollouts=8).allocate(p, 20)
    assert alloc.counts[0] == 8 and alloc.counts[1] == 2 and alloc.counts.sum() == 20
    with pytest.raises(SeraOptError, match="p = 0 their cap"):
        get_policy("sera", rounding="paper", offset=1, min_rollouts=2,
                   max_rollouts=8).allocate(np.array([0.0, 0.0, 0.5]), 7)


# ------------------------------------------------------------------ the estimator
def test_the_estimator_weighs_active_prompts_by_n0_over_n():
    torch = pytest.importorskip("torch")
    p = np.array([0.999, 0.5, 0.05, 0.001, 0.3])
    alloc = get_policy("sera", offset=1, min_rollouts=0, max_rollouts=64).allocate(p, 40)
    assert (alloc.counts == 0).any()
    counts = torch.tensor(alloc.counts)
    index = torch.repeat_interleave(torch.arange(5), counts)
    rewards = torch.bernoulli(torch.full((40,), 0.4, dtype=torch.float64), generator=torch.Generator().manual_seed(1))
    got = sera_opt.maxrl_advantages(rewards, index, allocation=alloc)
    n0 = 40 / 5
    for i in np.flatnonzero(alloc.counts):
        rows = index == int(i)
        r = rewards[rows].double()
        rbar = r.mean()
        want = torch.zeros_like(r) if rbar == 0 else (r - rbar) / rbar * n0 / float(r.numel())
        torch.testing.assert_close(got[rows].double(), want, rtol=1e-12, atol=1e-12)
    # explicit nbar gives the same; without the plan, nbar is over the prompts with rows
    same = sera_opt.maxrl_advantages(rewards, index, mean_count=n0)
    torch.testing.assert_close(same, got, rtol=0, atol=0)
    own = sera_opt.maxrl_advantages(rewards, index)
    active = int((alloc.counts > 0).sum())
    torch.testing.assert_close(own, got * (40 / active) / n0, rtol=1e-12, atol=1e-12)
    diagnostics = sera_opt.advantage_diagnostics(rewards, index, allocation=alloc)
    assert diagnostics["num_prompts"] == active
    assert diagnostics["max_correction"] == pytest.approx(n0 / alloc.counts[alloc.counts > 0].min())
    with pytest.raises(SeraOptError, match="mean_count"):
        sera_opt.maxrl_advantages(rewards, index, mean_count=0)


# ------------------------------------------------------------------ rounds
@pytest.mark.parametrize("rounds", [1, 3])
def test_a_round_session_never_hands_a_switched_off_prompt_a_round(rounds):
    p = np.array([0.999, 0.5, 0.05, 0.001, 0.3])
    policy = get_policy("sera", offset=1, min_rollouts=0, max_rollouts=64)
    static = policy.allocate(p, 40)
    off = static.counts == 0
    assert off.any()
    session = policy.start_rounds(p, 40, rounds=rounds,
                                  **({"first_round": 2} if rounds > 1 else {}))
    rng = np.random.default_rng(0)
    for counts in session:
        assert np.all(counts[off] == 0)
        session.record(rng.random(int(counts.sum())) < 0.4)
    result = session.result()
    assert np.all(result.counts[off] == 0) and int(result.counts.sum()) == 40
    if rounds == 1:
        np.testing.assert_array_equal(result.counts, static.counts)


def test_rounds_keep_the_callers_switched_off_prompts_at_zero():
    p = np.array([0.3, 0.5, 0.05, 0.001, 0.3])
    policy = get_policy("sera", offset=1, min_rollouts=2, max_rollouts=64)
    session = policy.start_rounds(p, 40, rounds=3, first_round=2,
                                  max_rollouts=np.array([64, 0, 64, 64, 64]))
    rng = np.random.default_rng(1)
    for counts in session:
        assert counts[1] == 0
        session.record(rng.random(int(counts.sum())) < 0.4)
    assert session.result().counts[1] == 0


# ------------------------------------------------------------------ the planner
def _observe_epoch(planner, ids, p, rng, budget):
    plan = planner.plan(ids, budget)
    rows = np.repeat(np.asarray(ids), plan.counts)
    planner.observe(rows, rng.random(rows.shape[0]) < np.repeat(p, plan.counts))
    return plan


def test_the_preset_planner_is_the_authors_configuration():
    planner = sera_opt.RolloutPlanner.paper_sera()
    assert planner.policy.name == "sera-paper"
    assert type(planner.tracker).__name__ == "EpochTracker"
    assert planner.tracker.prior_params() == (0.5, 0.5)
    assert planner.tracker.config()["discount"] == 0.75
    assert planner.tracker.cold_start == "batch"
    same = sera_opt.RolloutPlanner("sera-paper")
    assert same.config() == planner.config()
    assert same.tracker.config() == planner.tracker.config()


def test_the_first_epoch_is_plain_maxrl_and_estimates_freeze_within_an_epoch():
    rng = np.random.default_rng(0)
    ids = list(range(16))
    p = rng.uniform(0.0, 1.0, 16)
    planner = sera_opt.RolloutPlanner.paper_sera()
    first = _observe_epoch(planner, ids, p, rng, 16 * 8)
    assert first.counts.tolist() == [8] * 16 and first.status == "cold start"
    # still epoch 0: nothing is known, the batch stays uniform
    assert _observe_epoch(planner, ids, p, rng, 16 * 8).counts.tolist() == [8] * 16
    planner.end_epoch()
    plan = planner.plan(ids, 16 * 8)
    assert plan.status != "cold start" and plan.solver == "sera-paper (paper rounding)"
    # outcomes of the running epoch do not move the plan
    _observe_epoch(planner, ids, p, rng, 16 * 8)
    np.testing.assert_array_equal(planner.plan(ids, 16 * 8).counts, plan.counts)
    # a batch with an unseen prompt is uniform again
    assert planner.plan(ids[:15] + [99], 16 * 8).counts.tolist() == [8] * 16


def test_per_prompt_cold_start_plans_unseen_prompts_from_the_prior():
    planner = sera_opt.RolloutPlanner.paper_sera(cold_start="prior")
    plan = planner.plan(list(range(8)), 64)
    assert plan.status != "cold start"
    assert plan.counts.sum() == 64


def test_end_epoch_does_nothing_for_a_continuous_tracker():
    planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)
    planner.observe([1, 1, 2], [1, 0, 0])
    before = planner.state_dict()["tracker"]
    planner.end_epoch()
    after = planner.state_dict()["tracker"]
    np.testing.assert_array_equal(before["successes"], after["successes"])


def test_the_preset_planner_round_trips_its_state():
    rng = np.random.default_rng(2)
    ids = [f"q{i}" for i in range(12)]
    p = rng.uniform(0.0, 1.0, 12)
    planner = sera_opt.RolloutPlanner.paper_sera()
    for _ in range(3):
        _observe_epoch(planner, ids, p, rng, 12 * 4)
        planner.end_epoch()
    _observe_epoch(planner, ids, p, rng, 12 * 4)  # pending evidence of a running epoch
    restored = sera_opt.RolloutPlanner.paper_sera().load_state_dict(planner.state_dict())
    np.testing.assert_array_equal(restored.plan(ids, 48).counts, planner.plan(ids, 48).counts)
    planner.end_epoch()
    restored.end_epoch()
    np.testing.assert_array_equal(restored.plan(ids, 48).counts, planner.plan(ids, 48).counts)


# ------------------------------------------------------------------ the compiled bisection
@st.composite
def waterline_rows(draw, max_prompts=700):
    """Rates, float bounds (scalar or per prompt), offset, a budget between the bounds'
    sums (the bounds themselves included) and the bisection's starting bracket."""
    m = draw(st.integers(1, max_prompts))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["uniform", "edges", "ties"]))
    if kind == "uniform":
        p = rng.uniform(1e-6, 1 - 1e-6, m)
    elif kind == "edges":
        p = rng.choice([1e-12, 1e-9, 1e-4, 0.5, 0.9999, 1 - 1e-9, 1 - 1e-12], m)
    else:
        p = rng.choice([0.2, 0.5, 0.8], m)
    c = draw(st.sampled_from([0, 1]))
    if draw(st.booleans()):
        lo = np.full(m, float(draw(st.integers(c + 1, 4))))
        hi = lo + float(draw(st.integers(0, 40)))
    else:
        lo = rng.integers(c + 1, 5, m).astype(np.float64)
        hi = lo + rng.integers(0, 40, m)
    where = draw(st.sampled_from([0.0, 1.0, None]))
    fraction = rng.uniform() if where is None else where
    budget = float(np.floor(lo.sum() + fraction * (hi.sum() - lo.sum())))
    rates = -np.log1p(-p)
    floor = float(np.min((lo - c) * rates))
    log_low = float(np.log(floor)) if floor > 0.0 else float(np.log(np.nextafter(0.0, 1.0)))
    log_high = float(np.log(float(np.max((hi - c) * rates))))
    return rates, lo, hi, float(c), budget, log_low, log_high


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=waterline_rows(), level=st.floats(1e-6, 1e3))
def test_the_compiled_total_is_numpys_sum_bit_for_bit(row, level):
    from sera_opt import _jit

    rates, lo, hi, c, _, _, _ = row
    kernel = _jit.kernels("sera_opt.kernels.active").pairwise_total
    expected = float(np.sum(np.clip(c + level / rates, lo, hi)))
    got = kernel(rates, lo, hi, False, c, level, 0, rates.size)
    assert got == expected, (got, expected, rates.size)
    if np.all(lo == lo[0]) and np.all(hi == hi[0]):
        assert kernel(rates, lo[:1], hi[:1], True, c, level, 0, rates.size) == expected


@pytest.mark.parametrize("size", [1, 7, 8, 9, 127, 128, 129, 135, 136, 1000, 8192, 8193,
                                  100_003])
def test_the_compiled_total_follows_numpys_pairwise_tree_at_every_size(size):
    from sera_opt import _jit

    rng = np.random.default_rng(size)
    rates = rng.uniform(1e-3, 10.0, size)
    lo, hi = np.full(size, 2.0), np.full(size, 1e9)
    level = float(rng.uniform(0.5, 3.0))
    expected = float(np.sum(np.clip(1.0 + level / rates, lo, hi)))
    got = _jit.kernels("sera_opt.kernels.active").pairwise_total(
        rates, lo, hi, False, 1.0, level, 0, size)
    assert got == expected, (got, expected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=waterline_rows())
def test_the_compiled_bisection_ends_where_numpys_does(row):
    from sera_opt.policies import active

    rates, lo, hi, c, budget, log_low, log_high = row
    expected = active._bisect_python(rates, lo, hi, c, budget, log_low, log_high)
    got = active._bisect_log_level(rates, lo, hi, c, budget, log_low, log_high)
    assert got == expected, (got, expected)


def test_a_level_that_differs_from_numpys_exp_is_checked_and_corrected(monkeypatch):
    """A kernel whose exp is off (here by a relative 1e-3, which flips many of its steps)
    still gives numpy's bisection: each step whose level differs from ``np.exp`` is
    summed again at numpy's level, and the search goes on from the first flipped one."""
    from sera_opt import _jit
    from sera_opt.policies import active

    kernels = _jit.kernels("sera_opt.kernels.active")
    calls = []

    def wrong_exp_bisect(rates, lo, hi, uniform, offset, budget, first, log_low, log_high,
                         lows, highs, mids, levels, above):
        calls.append(first)
        for step in range(first, mids.size):
            lows[step], highs[step] = log_low, log_high
            mid = 0.5 * (log_low + log_high)
            level = float(np.exp(mid)) * (1.0 + 1e-3)
            mids[step], levels[step] = mid, level
            above[step] = float(np.sum(np.clip(offset + level / rates, lo, hi))) > budget
            log_low, log_high = (log_low, mid) if above[step] else (mid, log_high)
        return log_low, mids.size

    class Patched:
        bisect = staticmethod(wrong_exp_bisect)
        pairwise_total = kernels.pairwise_total

    monkeypatch.setattr(_jit, "kernels", lambda name: Patched)
    rng = np.random.default_rng(5)
    for size in (3, 200, 5000):
        rates = -np.log1p(-rng.uniform(1e-3, 1 - 1e-3, size))
        lo, hi = np.full(size, 2.0), np.full(size, 32.0)
        budget = float(8 * size)
        log_low = float(np.log(np.min(rates)))
        log_high = float(np.log(np.max(31.0 * rates)))
        expected = active._bisect_python(rates, lo, hi, 1.0, budget, log_low, log_high)
        calls.clear()
        assert active._bisect_log_level(rates, lo, hi, 1.0, budget, log_low, log_high) == expected
        assert len(calls) > 1, "the wrong levels flipped no step: the test checks nothing"


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.sampled_from([-1.0, -0.0, 0.0, 0.25, 1.0, 3.0]) | st.floats(-5, 5),
                       min_size=1, max_size=60), data=st.data())
def test_the_least_growth_picks_are_the_sorted_ones(values, data):
    from sera_opt.policies import active

    growth = np.array(values)
    count = data.draw(st.integers(1, growth.size))
    expected = np.lexsort((np.arange(growth.size), growth))[:count]
    got = active._least(growth, count)
    np.testing.assert_array_equal(np.sort(got), np.sort(expected))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches(max_prompts=300), rounding=st.sampled_from(["paper", "exact"]),
       threshold=st.sampled_from([0.0, 0.05, 0.3]), bounds=st.sampled_from(["scalar", "per"]))
def test_the_search_gives_the_counts_of_probing_every_prefix(case, rounding, threshold,
                                                             bounds):
    """The active set without shortcuts: every probe solved by the policy's own solver,
    on the top-k prompts in batch order, for larger batches than the slow reference takes."""
    from sera_opt.policies.active import mixed_group_chance

    p, budget, lo, hi = case
    m = p.size
    hi_all = np.full(m, hi) if bounds == "scalar" else np.random.default_rng(m).integers(
        lo, hi + 1, m)
    policy = get_policy("sera", offset=1, min_rollouts=lo, max_rollouts=hi_all,
                        active_threshold=threshold, rounding=rounding)
    alloc = policy.allocate(p, budget)
    plain = get_policy("sera", offset=1, rounding=rounding)
    u = mixed_group_chance(p, hi_all)
    ranked = np.argsort(-u, kind="stable")
    caps = np.cumsum(hi_all[ranked])
    required = int(np.searchsorted(caps, budget, side="left")) + 1
    eligible = int(np.count_nonzero(u >= threshold))

    def allocate(k):
        index = np.sort(ranked[:k])
        counts = plain.allocate(p[index], budget, min_rollouts=lo,
                                max_rollouts=hi_all[index]).counts
        chance = mixed_group_chance(p[index], counts)
        return index, counts, bool(np.all(chance >= threshold - 1e-12))

    chosen = required
    if eligible >= required:
        low, high = required, min(eligible, budget // lo)
        while low <= high:
            middle = (low + high) // 2
            if allocate(middle)[2]:
                chosen, low = middle, middle + 1
            else:
                high = middle - 1
    index, counts, useful = allocate(chosen)
    expected = np.zeros(m, dtype=np.int64)
    expected[index] = counts
    np.testing.assert_array_equal(alloc.counts, expected)
    np.testing.assert_array_equal(alloc.active_set.index, index)
    forced = 0 if useful else int(np.count_nonzero(
        mixed_group_chance(p[index], counts) < threshold - 1e-12))
    assert alloc.active_set.forced == forced
