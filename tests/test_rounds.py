"""Allocation in rounds within a step (docs/theory.md section 9): the sessions, their
per-round allocation, their expected scales, and the exact scale reference."""

import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt.rounds import (
    RoundSession,
    balanced_rule,
    first_success_rule,
    fixed_rule,
    round_budgets,
    rule_scale,
)

POLICY_INPUTS = {"gvm": lambda m: {"gradient_norms": np.linspace(0.5, 2.0, m)}}


def policy_inputs(name, m):
    return POLICY_INPUTS.get(name, lambda m: {})(m)


def run(session, p, rng):
    """Draw every round of ``session`` with success probabilities ``p``."""
    while not session.done:
        counts = session.next_round()
        session.record(rng.random(int(counts.sum())) < np.repeat(p, counts))
    return session.result()


# ---------------------------------------------------------------- the reference
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("n", [2, 3, 7])
@pytest.mark.parametrize("p", [0.0, 0.05, 0.4, 0.9, 1.0])
def test_a_fixed_count_has_the_static_factor(p, n, offset):
    got = rule_scale(p, fixed_rule(n), rounds=1, offset=offset)
    assert got.scale == pytest.approx(float(sera_opt.attenuation([p], [n], offset)[0]),
                                      abs=1e-12)
    assert got.rollouts == pytest.approx(n)
    # Two rounds of fixed counts are one static plan.
    split = rule_scale(p, fixed_rule(n - 1, 1), rounds=2, offset=offset, baseline="pooled")
    assert split.scale == pytest.approx(got.scale, abs=1e-12)


@pytest.mark.parametrize("p", [0.03, 0.3, 0.7])
def test_stopping_at_the_first_success_keeps_the_factor_of_the_cap(p):
    cap = 12
    got = rule_scale(p, first_success_rule(2, 1, cap), rounds=cap - 1)
    assert got.scale == pytest.approx(1 - (1 - p) ** cap, abs=1e-12)
    # ... at the expected cost 2 + sum_{t >= 2} P(no success in t) over the later draws
    assert got.rollouts == pytest.approx(2 + sum((1 - p) ** t for t in range(2, cap)))


@pytest.mark.parametrize("n0", [2, 4])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_first_round_baseline_has_its_closed_form_scale(p, n0):
    rule = first_success_rule(n0, 2, 14)
    hit = rule_scale(p, rule, rounds=6, offset=0).scale
    got = rule_scale(p, rule, rounds=6, offset=1, baseline="first_round").scale
    assert got == pytest.approx(hit - p * (1 - p) ** (n0 - 1), abs=1e-12)


def test_the_pooled_baseline_is_mis_scaled_under_the_balanced_rule():
    # docs/theory.md section 9: 1.19 at p = 0.8 and 1.33 at p = 0.95.
    rule = balanced_rule(8, 2, 2)
    assert rule_scale(0.8, rule, rounds=4, offset=1, baseline="pooled").scale == \
        pytest.approx(1.19, abs=0.005)
    assert rule_scale(0.95, rule, rounds=4, offset=1, baseline="pooled").scale == \
        pytest.approx(1.33, abs=0.005)


def test_a_rule_must_return_a_count():
    with pytest.raises(sera_opt.SeraOptError, match="int >= 0"):
        rule_scale(0.5, lambda r, t, k, k1: 1.5, rounds=1)
    with pytest.raises(sera_opt.SeraOptError, match="probability"):
        rule_scale(1.5, fixed_rule(2), rounds=1)
    with pytest.raises(sera_opt.SeraOptError, match="baseline"):
        rule_scale(0.5, fixed_rule(2), rounds=1, offset=1, baseline="mean")


# ---------------------------------------------------------------- the estimator
def _softmax_prompt(seed, vocab=6):
    """A softmax policy over ``vocab`` answers, the first two correct: its scores and
    the exact likelihood gradient of ``log p``."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=vocab)
    pi = np.exp(theta - theta.max())
    pi /= pi.sum()
    p = pi[:2].sum()
    scores = np.eye(vocab) - pi  # grad log pi(y) for each answer y
    grad_log_p = (pi[:2, None] * scores[:2]).sum(0) / p
    return pi, p, scores, grad_log_p


def _simulate(rule, rounds, pi, episodes, rng):
    """Run a per-prompt rule on ``episodes`` independent copies of one prompt: the
    answers, rewards, prompt (episode) and round of every rollout."""
    answers, rewards, prompt, round_of = [], [], [], []
    for e in range(episodes):
        total = successes = first = 0
        for r in range(rounds):
            m = rule(r, total, successes, first)
            if not m:
                continue
            y = rng.choice(pi.shape[0], size=m, p=pi)
            wins = int((y < 2).sum())
            if r == 0:
                first = wins
            total += m
            successes += wins
            answers.append(y)
            rewards.append((y < 2).astype(float))
            prompt.append(np.full(m, e))
            round_of.append(np.full(m, r))
    return (np.concatenate(answers), np.concatenate(rewards), np.concatenate(prompt),
            np.concatenate(round_of))


RULES = {
    "first-success": (first_success_rule(2, 1, 10), 9),
    "balanced": (balanced_rule(8, 2, 2), 4),
    "two-then-batch": (first_success_rule(3, 4, 15), 4),
}


@pytest.mark.parametrize("baseline", ["first_round", "pooled", None])
@pytest.mark.parametrize("rule_name", sorted(RULES))
def test_the_estimator_has_the_enumerated_scale_at_score_level(rule_name, baseline):
    """E[g] = kappa grad log p, with kappa from exact enumeration (Monte Carlo, softmax
    policy, within 3 standard errors): along grad log p, and nothing across it."""
    torch = pytest.importorskip("torch")
    rule, rounds = RULES[rule_name]
    pi, p, scores, grad = _softmax_prompt(3)
    rng = np.random.default_rng(11)
    episodes = 6000
    y, r, prompt, rnd = _simulate(rule, rounds, pi, episodes, rng)
    estimator = "success_average" if baseline is None else "mean_centred"
    kwargs = {"round_index": torch.as_tensor(rnd)} if baseline == "first_round" else {}
    adv = sera_opt.maxrl_advantages(torch.as_tensor(r), torch.as_tensor(prompt),
                                    estimator=estimator, multiplicity_correction=False,
                                    **kwargs).numpy()
    # sum_j A_j S_j = n g per episode (no multiplicity correction).
    n = np.bincount(prompt, minlength=episodes)
    g = np.zeros((episodes, scores.shape[1]))
    np.add.at(g, prompt, adv[:, None] * scores[y] / n[prompt][:, None])
    offset = 0 if baseline is None else 1
    kappa = rule_scale(p, rule, rounds=rounds, offset=offset,
                       baseline=baseline or "first_round").scale
    unit = grad / np.linalg.norm(grad)
    along = g @ unit
    assert abs(along.mean() - kappa * np.linalg.norm(grad)) < 3 * along.std() / math.sqrt(episodes)
    across = g - np.outer(along, unit)
    other = np.linalg.svd(across, full_matrices=False)[2][0]  # the largest spread across
    proj = across @ other
    assert abs(proj.mean()) < 3 * proj.std() / math.sqrt(episodes)


def test_round_index_all_zero_is_the_usual_estimator():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    r = torch.as_tensor(rng.random(200) < 0.4, dtype=torch.float64)
    idx = torch.as_tensor(rng.integers(0, 30, 200))
    for mc in (True, False):
        usual = sera_opt.maxrl_advantages(r, idx, multiplicity_correction=mc)
        rounds = sera_opt.maxrl_advantages(r, idx, multiplicity_correction=mc,
                                           round_index=torch.zeros(200, dtype=torch.long))
        torch.testing.assert_close(rounds, usual, rtol=1e-12, atol=1e-12)
        # success_average ignores the rounds: its scale is P(K >= 1) under any rule.
        torch.testing.assert_close(
            sera_opt.maxrl_advantages(r, idx, estimator="success_average",
                                      multiplicity_correction=mc,
                                      round_index=torch.as_tensor(rng.integers(0, 3, 200))),
            sera_opt.maxrl_advantages(r, idx, estimator="success_average",
                                      multiplicity_correction=mc))


def test_round_index_gives_the_first_round_baseline_by_hand():
    torch = pytest.importorskip("torch")
    r = torch.tensor([1.0, 0, 1, 0, 0, 1, 1, 0])
    idx = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    rnd = torch.tensor([0, 0, 1, 0, 0, 1, 0, 1])
    nbar = 8 / 3
    # prompt 0: n0 = 2, K1 = 1, K = 2; prompt 1: K1 = 0; prompt 2: n0 = 1, K1 = K = 1
    want = [nbar * (1 / 2 - 1 / 2), -nbar / 2, nbar / 2, 0, 0, nbar, nbar * (1 - 1), 0]
    got = sera_opt.maxrl_advantages(r, idx, round_index=rnd)
    torch.testing.assert_close(got, torch.tensor(want))
    assert not torch.signbit(got).logical_and(got == 0).any()  # no -0.0


def test_round_index_is_checked():
    torch = pytest.importorskip("torch")
    r, idx = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    for bad, match in [(torch.tensor([0]), "shape"), (torch.tensor([0.0, 1.0]), "integer"),
                       (torch.tensor([0, -1]), ">= 0")]:
        with pytest.raises(sera_opt.SeraOptError, match=match):
            sera_opt.maxrl_advantages(r, idx, round_index=bad)


# ---------------------------------------------------------------- sessions
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sera_opt.available_policies()), st.integers(1, 12),
       st.integers(0, 2**32 - 1), st.integers(1, 6), st.sampled_from([0, 1]))
def test_one_round_is_the_static_plan_bit_for_bit(name, m, seed, per, offset):
    rng = np.random.default_rng(seed)
    p = rng.choice([0.0, 0.02, 0.3, 0.5, 0.97, 1.0], m) if seed % 3 == 0 else rng.random(m)
    policy = sera_opt.get_policy(name, offset=offset)
    budget = m * (per + int(policy.min_rollouts))
    inputs = policy_inputs(name, m)
    try:
        static = policy.allocate(p, budget, **inputs)
    except sera_opt.SeraOptError as refused:
        # The authors' rounding refuses exact p = 0 or 1 where their edge rule cannot spend
        # the budget: one round refuses it in the same words.
        assert policy.name == "sera-paper", refused
        with pytest.raises(sera_opt.SeraOptError, match="authors' rounding"):
            policy.start_rounds(p, budget, rounds=1, **inputs)
        return
    session = policy.start_rounds(p, budget, rounds=1, **inputs)
    counts = session.next_round()
    assert counts.dtype == np.int64
    assert np.array_equal(counts, static.counts)
    session.record(np.zeros(int(counts.sum())))
    out = session.result()
    assert np.array_equal(out.counts, static.counts)
    assert np.array_equal(out.round_index, np.zeros(budget, dtype=np.int64))
    np.testing.assert_allclose(out.factors, sera_opt.attenuation(p, static.counts, offset),
                               rtol=1e-12, atol=1e-15)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 10), st.integers(0, 2**32 - 1), st.sampled_from([0, 1]))
def test_one_round_through_the_planner_is_plan(m, seed, offset):
    rng = np.random.default_rng(seed)
    ids = rng.choice(1000, m, replace=False)
    for name in ("sera-fair", "sera-bayes", "uniform"):
        planner = sera_opt.RolloutPlanner(name, offset=offset)
        planner.observe(np.repeat(ids, 3), rng.random(3 * m) < 0.5)
        budget = (3 + offset) * m
        session = planner.start_rounds(ids, budget, rounds=1)
        assert np.array_equal(session.next_round(), planner.plan(ids, budget).counts)


@pytest.mark.parametrize("name", sera_opt.available_policies())
@pytest.mark.parametrize("offset", [0, 1])
def test_every_policy_spends_the_budget_exactly_in_rounds(name, offset):
    rng = np.random.default_rng(5)
    m = 40
    p = rng.beta(0.6, 1.2, m)
    policy = sera_opt.get_policy(name, offset=offset, max_rollouts=24)
    budget = 8 * m
    first = max(2, int(policy.min_rollouts))
    session = policy.start_rounds(p, budget, rounds=4, first_round=2, **policy_inputs(name, m))
    out = run(session, p, rng)
    assert out.counts.sum() == budget
    assert out.round_counts.sum(0).tolist() == out.counts.tolist()
    assert list(out.round_counts.sum(1)) == list(out.round_budgets)
    # A policy with an active set switches some prompts off before the first round.
    on = out.round_counts[0] > 0 if policy.active_threshold is not None else np.ones(m, bool)
    assert out.round_budgets[0] == first * int(on.sum())
    assert (out.counts[on] >= policy.min_rollouts).all() and (out.counts <= 24).all()
    assert (out.counts[~on] == 0).all()
    assert (out.round_counts[0][on] == first).all()
    # Realized order: round by round, grouped by prompt within a round.
    assert np.all(np.diff(out.round_index) >= 0)
    for r in range(out.rounds):
        rows = out.prompt_index[out.round_index == r]
        assert np.all(np.diff(rows) >= 0)
        assert np.bincount(rows, minlength=m).tolist() == out.round_counts[r].tolist()
    assert ((out.factors >= -1e-12) & (out.factors <= 1 + 1e-12)).all()


def test_a_prompt_with_a_success_gets_nothing_more_while_others_can_take_it():
    p = np.array([0.5, 0.5, 0.5, 0.5])
    policy = sera_opt.get_policy("sera-fair", max_rollouts=10)
    session = policy.start_rounds(p, 16, rounds=2, first_round=2)
    first = session.next_round()
    assert first.tolist() == [2, 2, 2, 2]
    session.record([1, 0, 0, 0, 0, 1, 0, 0])  # prompts 0 and 2 succeed
    second = session.next_round()
    assert second.tolist() == [0, 4, 0, 4]
    session.record(np.zeros(8))
    # all saturated: the next round's budget spills to the lowest totals
    session = policy.start_rounds(p, 16, rounds=2, first_round=2)
    session.next_round()
    session.record(np.ones(8))
    assert session.next_round().tolist() == [2, 2, 2, 2]


def brute_round(p, room, budget, alpha):
    """The alpha-fair optimum of the round's expected scales 1 - (1-p)^m by enumeration
    (alpha = inf: lexicographic max-min)."""
    best, best_key = None, None
    for m in itertools.product(*(range(r + 1) for r in room)):
        if sum(m) != budget:
            continue
        w = 1 - (1 - p) ** np.array(m)
        if math.isinf(alpha):
            key = tuple(sorted(w))
        elif alpha == 1:
            key = (np.sum(np.log(np.maximum(w, 1e-300))),)
        else:
            key = (np.sum(w ** (1 - alpha) / (1 - alpha)),)
        if best_key is None or key > tuple(k + 1e-12 for k in best_key):
            best, best_key = m, key
    return best, best_key


@pytest.mark.parametrize("alpha", [1.0, math.inf])
@pytest.mark.parametrize("seed", range(6))
def test_a_round_is_the_exact_optimum_of_the_expected_scales(seed, alpha):
    rng = np.random.default_rng(seed)
    m = 4
    p = rng.uniform(0.05, 0.6, m)
    policy = sera_opt.get_policy("sera-fair", alpha=alpha, max_rollouts=6)
    session = policy.start_rounds(p, 4 + 7, rounds=2, first_round=1)
    session.next_round()
    session.record(np.zeros(4))
    counts = session.next_round()
    best, best_key = brute_round(p, [5] * m, 7, alpha)
    w = 1 - (1 - p) ** counts
    key = (tuple(sorted(w)) if math.isinf(alpha) else (np.sum(np.log(w)),))
    assert np.allclose(key, best_key, rtol=1e-9), (counts, best)


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("p", [0.1, 0.35, 0.8])
def test_a_single_prompt_session_reports_the_exact_scale_of_its_rule(p, offset):
    # One prompt: the session is the per-prompt rule "n0, then each round's budget
    # until the first success", and its factor is that rule's exact scale.
    rng = np.random.default_rng(1)
    policy = sera_opt.get_policy("uniform", offset=offset, max_rollouts=20)
    budgets = [3, 2, 4]
    kappa = rule_scale(p, _schedule_rule(2, budgets, 20),
                       rounds=4, offset=offset).scale
    for _ in range(10):
        session = policy.start_rounds([p], 11, rounds=4, first_round=2, later_budgets=budgets)
        out = run(session, np.array([p]), rng)
        assert out.factors[0] == pytest.approx(kappa, abs=1e-12)


def _schedule_rule(first, later, cap):
    def rule(r, total, successes, k1):
        if r == 0:
            return first
        return 0 if successes else min(later[r - 1], cap - total)
    return rule


def test_factors_of_prompts_that_never_succeed_are_those_of_their_counts():
    rng = np.random.default_rng(2)
    p = rng.uniform(0.0, 0.2, 30)
    policy = sera_opt.get_policy("sera-fair", offset=0, max_rollouts=20)
    out = run(policy.start_rounds(p, 240, rounds=3, first_round=2), p, rng)
    never = np.bincount(out.prompt_index, weights=out.rewards, minlength=30) == 0
    assert never.any()
    np.testing.assert_allclose(out.factors[never], 1 - (1 - p[never]) ** out.counts[never])
    # A prompt that succeeded would have drawn at least its realized count on the path
    # where it never does.
    np.testing.assert_array_less(1 - (1 - p[~never]) ** out.counts[~never] - 1e-12,
                                 out.factors[~never])



def _ghost_counts_reference(session, ghosts, total, objective, lo, taken, spill):
    """The ghosts' counts of a round the obvious way: every ghost's gain at every step,
    through ``gains`` on all the objective's rows, kept while it beats the round's
    weakest step of the same rank (the slow reference of the session's walk)."""
    room = session._hi[ghosts] - total
    need = int(room.max())
    weakest = [-np.inf] * spill
    if objective is not None and spill < need:
        taken_steps = [objective.gains(np.maximum(lo + taken - j, lo))[taken >= j]
                       for j in range(1, int(taken.max()) + 1)]
        all_gains = np.sort(np.concatenate(taken_steps)) if taken_steps else np.zeros(0)
        weakest += list(all_gains[:need - spill])
    ghost_obj, ghost_lo = session._round_objective(ghosts, total)
    out = np.zeros(ghosts.shape[0], dtype=np.int64)
    alive = room > 0
    for k in range(min(need, len(weakest))):
        alive &= (ghost_obj.gains(ghost_lo + k) > weakest[k]) & (room > k)
        out += alive
    return out


@pytest.mark.parametrize("name", sera_opt.available_policies())
@pytest.mark.parametrize("offset", [0, 1])
def test_expected_scales_equal_the_obvious_replay_bit_for_bit(name, offset):
    # The session evaluates only the rows it still needs (each ghost until its first
    # losing step, each taken row back to the round's weakest steps); the reference
    # evaluates every row at every step, on every row of the objective.
    for seed in range(4):
        rng = np.random.default_rng([seed, offset])
        m = 60
        p = rng.beta(0.6, 1.2, m)
        if seed % 2:
            p[:6] = [0.0, 0.0, 1.0, 1.0, 1e-9, 1 - 1e-9]
        policy = sera_opt.get_policy(name, offset=offset, max_rollouts=int(rng.integers(10, 30)))
        session = policy.start_rounds(p, 9 * m, rounds=4, **policy_inputs(name, m))
        out = run(session, p, rng)
        session._ghost_counts = lambda *args, s=session: _ghost_counts_reference(s, *args)
        assert np.array_equal(session.factors(), out.factors, equal_nan=True), (name, seed)


@pytest.mark.parametrize("name", sera_opt.available_policies())
def test_row_gains_are_the_objective_gains_of_those_rows(name):
    from sera_opt.problem import AllocationProblem


    rng = np.random.default_rng(4)
    m = 50
    p = rng.beta(0.6, 1.2, m)
    p[:4] = [0.0, 1.0, 1e-12, 1 - 1e-12]
    policy = sera_opt.get_policy(name, offset=1)
    problem = AllocationProblem(p, 8 * m, min_rollouts=2, max_rollouts=40, offset=1)
    inputs = policy_inputs(name, m)
    if "posterior" in policy.extra_inputs:
        inputs["posterior"] = (rng.uniform(0.1, 3.0, m), rng.uniform(0.1, 9.0, m))
    objective = policy.round_objective(problem, **inputs)
    for _ in range(5):
        rows = np.flatnonzero(rng.random(m) < 0.4)
        counts = rng.integers(2, 41, m)
        expected = objective.gains(counts)[rows]
        assert np.array_equal(objective.row_gains(rows, counts), expected,
                              equal_nan=True), name


def assert_same_objective(fast, slow, offset):
    """Two objectives hold the same fields and give the same gains and solve."""
    assert type(fast) is type(slow)
    assert fast.__dict__.keys() == slow.__dict__.keys()
    for key, value in slow.__dict__.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(fast.__dict__[key], value, equal_nan=True), key
        elif isinstance(value, float) and math.isnan(value):
            assert math.isnan(fast.__dict__[key]), key
        else:
            assert fast.__dict__[key] == value, key
    m = slow.num_prompts
    counts = np.full(m, 4 + offset)
    assert np.array_equal(fast.gains(counts), slow.gains(counts), equal_nan=True)
    assert np.array_equal(fast.solve(8 * m, 1 + offset, 32), slow.solve(8 * m, 1 + offset, 32))


def _problem(offset, m=40):
    from sera_opt.problem import AllocationProblem

    p = np.random.default_rng(7).beta(0.6, 1.2, m)
    p[:3] = [0.0, 1.0, 0.5]
    return AllocationProblem(p, 8 * m, min_rollouts=1 + offset, max_rollouts=32, offset=offset)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0, 3.0, math.inf])
@pytest.mark.parametrize("offset", [0, 1])
def test_a_round_objective_of_sera_fair_is_its_objective(alpha, offset):
    # Rounds build the utility without checking alpha again; everything the engine
    # reads must be what the static objective holds.
    policy = sera_opt.get_policy("sera-fair", alpha=alpha, offset=offset)
    problem = _problem(offset)
    assert_same_objective(policy.round_objective(problem), policy.objective(problem), offset)


@pytest.mark.parametrize("offset", [0, 1])
def test_a_round_objective_of_sera_bayes_is_its_objective(offset):
    # Rounds build the levels on the session's posterior without checking it again.
    rng = np.random.default_rng(8)
    policy = sera_opt.get_policy("sera-bayes", offset=offset)
    problem = _problem(offset)
    a, b = rng.uniform(0.0, 4.0, 40), rng.uniform(0.0, 12.0, 40)
    a[:2], b[2:4] = 0.0, 0.0
    for posterior in ((a, b + 3.0), None, policy.pseudo_posterior(problem.success_probs)):
        assert_same_objective(policy.round_objective(problem, posterior=posterior),
                              policy.objective(problem, posterior=posterior), offset)

def test_the_planner_session_updates_the_tracker_once_with_every_round():
    rng = np.random.default_rng(3)
    ids = [f"q{i}" for i in range(20)]
    p = rng.uniform(0.1, 0.9, 20)
    planner = sera_opt.RolloutPlanner(max_rollouts=24)
    session = planner.start_rounds(ids, 160, rounds=3)
    rounds_seen = []
    while not session.done:
        counts = session.next_round()
        rounds_seen.append(planner.tracker.step)
        session.record(rng.random(int(counts.sum())) < np.repeat(p, counts))
    out = session.result()
    assert rounds_seen == [0, 0, 0] and planner.tracker.step == 1
    s, f = planner.tracker.evidence(ids)
    wins = np.bincount(out.prompt_index, weights=out.rewards, minlength=20)
    np.testing.assert_allclose(s, wins)
    np.testing.assert_allclose(s + f, out.counts)
    assert list(out.prompt_ids) == ids


def _run_session(planner, ids, budget, p, seed, **options):
    """Every round's counts of one planner session, on outcomes drawn from ``p``."""
    rng = np.random.default_rng(seed)
    session = planner.start_rounds(ids, budget, **options)
    counts = []
    while not session.done:
        c = session.next_round()
        counts.append(c)
        session.record(rng.random(int(c.sum())) < np.repeat(p, c))
    return np.array(counts), session.result()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 24), st.integers(2, 12), st.integers(0, 2**32 - 1), st.booleans())
def test_the_default_planner_in_rounds_is_the_winning_arm(m, per, seed, capped):
    # The rounds decision chose uniform:rounds=4 within the experiment's bounds (2..4x the
    # average count, offset 1): the default planner's session is that arm's, round by round
    # (uniform allocation has no ratio cap: uncapped, both are uncapped).
    rng = np.random.default_rng(seed)
    ids = rng.choice(10_000, m, replace=False)
    p = rng.beta(0.6, 1.2, m)
    budget = per * m
    cap = 4 * per
    seen = (np.repeat(ids, 2), rng.random(2 * m) < 0.3)
    default = sera_opt.RolloutPlanner(**({"max_rollouts": cap} if capped else {}))
    arm = sera_opt.RolloutPlanner("uniform", offset=1, min_rollouts=2,
                                  max_rollouts=cap if capped else None)
    for planner in (default, arm):
        planner.observe(*seen)
    # Rounds are opt-in: the arm's 4 rounds are asked for (and a warning names the
    # rounds a small budget leaves empty, which is not what is tested here).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sera_opt.SeraOptWarning)
        got, result = _run_session(default, ids, budget, p, seed, rounds=4)
        want, _ = _run_session(arm, ids, budget, p, seed, rounds=4)
    # The 4 rounds less those the budget leaves empty (dropped when the session starts).
    assert got.shape[0] == len(result.round_budgets) <= 4
    assert (got.sum(1) > 0).all()
    np.testing.assert_array_equal(got, want)
    assert result.counts.sum() == budget and (result.counts.max() <= cap or not capped)
    # The first round is half the average count (at least the minimum of 2).
    np.testing.assert_array_equal(got[0], np.full(m, max(per // 2, 2)))
    # One round is the static default plan.
    assert np.array_equal(default.start_rounds(ids, budget, rounds=1).next_round(),
                          default.plan(ids, budget).counts)


def test_the_default_planner_has_a_round_policy_and_a_named_one_does_not():
    default = sera_opt.RolloutPlanner(max_rollouts=24)
    assert default.policy.name == sera_opt.planner.DEFAULT_POLICY == "uniform"
    assert default.round_policy.name == sera_opt.planner.DEFAULT_ROUND_POLICY == "uniform"
    assert (default.round_policy.offset, default.round_policy.min_rollouts,
            default.round_policy.max_rollouts) == (1, 2, 24)
    assert "round_policy=UniformPolicy" in repr(default)
    assert default.round_policy is not default.policy  # built for the rounds, with the cap
    named = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)
    # The repr shows the round policy whichever it is.
    assert named.round_policy is named.policy
    assert "round_policy=SERAFairPolicy" in repr(named)
    # The named policy allocates its rounds: a session of sera-fair, not of uniform.
    p = np.array([0.9, 0.5, 0.05, 0.01])
    named.observe(np.repeat(np.arange(4), 40), np.repeat(p, 40) > np.tile(
        np.linspace(0, 1, 40, endpoint=False), 4))
    session = named.start_rounds(np.arange(4), 32, rounds=4, first_round=2)
    session.next_round()
    session.record(np.zeros(8))
    policy_counts = session.next_round()
    assert policy_counts.sum() == 8
    assert not np.array_equal(policy_counts, np.full(4, 2))


def test_the_round_policy_survives_the_state_and_old_states_keep_theirs():
    default = sera_opt.RolloutPlanner(max_rollouts=24)
    state = default.state_dict()
    assert state["format"] == "sera_opt.RolloutPlanner/3"
    assert state["round_policy"] == {"name": "uniform",
                                     "options": {"min_rollouts": 2, "max_rollouts": 24, "offset": 1}}
    restored = sera_opt.RolloutPlanner("sera", offset=1).load_state_dict(state,
                                                                    replace_config=True)
    assert restored.policy.config() == default.policy.config()
    assert restored.round_policy.config() == default.round_policy.config()
    assert restored.round_policy is not restored.policy
    named = sera_opt.RolloutPlanner("sera-fair", offset=1)
    assert named.state_dict()["round_policy"] is None
    assert (default.load_state_dict(named.state_dict(), replace_config=True).round_policy
            is default.policy)
    # A state of format /2 has no round policy: its rounds use its policy, as they did.
    old = {**state, "format": "sera_opt.RolloutPlanner/2"}
    del old["round_policy"]
    loaded = sera_opt.RolloutPlanner("sera-fair", offset=1).load_state_dict(old,
                                                                       replace_config=True)
    assert loaded.round_policy is loaded.policy and loaded.policy.name == "uniform"
    broken = dict(state)
    del broken["round_policy"]
    before = default.round_policy
    with pytest.raises(sera_opt.SeraOptError, match="missing 'round_policy'"):
        default.load_state_dict(broken)
    assert default.round_policy is before


def _one_prompt_fails(planner):
    session = planner.start_rounds(np.arange(8), 64, rounds=4, first_round=4)
    assert session.round_budgets == (32, 11, 11, 10)
    session.next_round()
    session.record(np.r_[np.zeros(4), np.ones(28)])  # only prompt 0 fails
    while not session.done:
        session.record(np.zeros(int(session.next_round().sum())))
    counts = session.result().counts
    assert counts.sum() == 64
    return counts


def test_a_round_policy_by_name_keeps_the_planner_cap():
    # sera-fair caps a prompt at ceil(4 x the average count) when no max_rollouts is
    # given; rounds by a round policy named for it keep that cap, so a hopeless prompt
    # cannot take the later rounds' whole budget.
    fair = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2,
                                   round_policy="uniform")
    assert _one_prompt_fails(fair)[0] == 32 == math.ceil(4 * 64 / 8)
    # The default planner allocates uniformly, which has no ratio cap: max_rollouts is
    # its cap (the trainers' default planners set one), else the prompt takes all.
    assert _one_prompt_fails(sera_opt.RolloutPlanner(max_rollouts=20))[0] == 20
    assert _one_prompt_fails(sera_opt.RolloutPlanner())[0] == 4 + 32


def test_a_policy_without_an_objective_says_how_to_plan_without_rounds():
    class Fixed(sera_opt.AllocationPolicy):
        name = "fixed-for-this-test"

        def _allocate(self, problem, **inputs):
            return sera_opt.get_policy("uniform")._allocate(problem)

    policy = Fixed()
    assert Fixed.round_mode is None
    assert policy.start_rounds(np.full(3, 0.5), 12, rounds=1).next_round().tolist() == [4, 4, 4]
    # The default is one round, which such a policy runs too.
    assert policy.start_rounds(np.full(3, 0.5), 12).next_round().tolist() == [4, 4, 4]
    # Rounds asked for are refused when the session starts, before a round is drawn.
    with pytest.raises(sera_opt.SeraOptError,
                       match=r"round_mode is None.*implement round_objective.*rounds=1, the "
                             r"default"):
        policy.start_rounds(np.full(3, 0.5), 12, rounds=4)


def test_policy_sessions_take_the_default_rounds_the_static_plan():
    # Rounds are opt-in: the default is one round, allocate()'s counts bit for bit.
    assert sera_opt.rounds.DEFAULT_ROUNDS == 1
    policy = sera_opt.get_policy("sera-fair", offset=1, min_rollouts=2)
    p = np.array([0.05, 0.3, 0.6, 0.9, 0.2])
    session = policy.start_rounds(p, 40)
    assert session.rounds == 1 and session.round_budgets == (40,)
    np.testing.assert_array_equal(session.next_round(), policy.allocate(p, 40).counts)
    explicit = sera_opt.get_policy("uniform", offset=1).start_rounds(np.full(5, 0.3), 40, rounds=4)
    assert explicit.rounds == 4 and explicit.round_budgets == (20, 7, 7, 6)


@pytest.mark.parametrize("option", [{"first_round": 2}, {"later_budgets": [10, 10]}])
def test_a_round_option_without_rounds_is_refused_not_ignored(option):
    # The default is one round, which has no first round to size nor later rounds to
    # split: an option that asks for rounds says so rather than running the static plan.
    policy = sera_opt.get_policy("uniform", offset=1)
    with pytest.raises(sera_opt.SeraOptError,
                       match=rf"{next(iter(option))} asks for rounds.*one round.*rounds=4"):
        policy.start_rounds(np.full(4, 0.3), 32, **option)
    with pytest.raises(sera_opt.SeraOptError, match="asks for rounds"):
        sera_opt.RolloutPlanner().start_rounds(range(4), 32, **option)


def test_the_planner_session_leaves_the_tracker_to_the_caller_when_asked():
    planner = sera_opt.RolloutPlanner(max_rollouts=24)
    session = planner.start_rounds(range(6), 36, rounds=3, observe=False)
    while not session.done:
        counts = session.next_round()
        session.record(np.ones(int(counts.sum())))
    assert session.result().counts.sum() == 36
    assert planner.tracker.step == 0 and planner.tracker.evidence(range(6))[0].sum() == 0
    with pytest.raises(sera_opt.SeraOptError, match="observe must be True or False"):
        planner.start_rounds(range(6), 36, rounds=3, observe=1)


def test_the_planner_rounds_use_the_posterior_updated_within_the_step():
    planner = sera_opt.RolloutPlanner("sera-fair", offset=0, max_rollouts=12)
    ids = [0, 1, 2]
    session = planner.start_rounds(ids, 3 * 2 + 6, rounds=2, first_round=2)
    session.next_round()
    # prompt 0 fails twice, prompts 1 and 2 succeed: the rest goes to prompt 0
    session.record([0, 0, 1, 0, 0, 1])
    assert session.next_round().tolist() == [6, 0, 0]


def test_stop_ends_early_and_says_so():
    planner = sera_opt.RolloutPlanner()
    session = planner.start_rounds(range(5), 40, rounds=4)
    counts = session.next_round()
    session.record(np.ones(int(counts.sum())))
    session.stop()
    out = session.result()
    assert session.done and out.stopped_early and out.counts.sum() == counts.sum() < 40
    assert planner.tracker.step == 1


def test_session_misuse_has_clear_errors():
    policy = sera_opt.get_policy("uniform")
    session = policy.start_rounds([0.5, 0.5], 8, rounds=2, first_round=2)
    with pytest.raises(sera_opt.SeraOptError, match="next_round"):
        session.record([1, 0])
    with pytest.raises(sera_opt.SeraOptError, match="round"):
        session.result()
    counts = session.next_round()
    with pytest.raises(sera_opt.SeraOptError, match="record"):
        session.next_round()
    with pytest.raises(sera_opt.SeraOptError, match="4 in all"):
        session.record([1, 0])
    with pytest.raises(sera_opt.SeraOptError, match="binary"):
        session.record([1, 0, 0.5, 0])
    session.record(np.zeros(int(counts.sum())))
    session.record(np.zeros(int(session.next_round().sum())))
    with pytest.raises(sera_opt.SeraOptError, match="done"):
        session.next_round()
    with pytest.raises(sera_opt.SeraOptError, match="first round needs"):
        policy.start_rounds([0.5, 0.5], 3, rounds=2, first_round=2)
    with pytest.raises(sera_opt.SeraOptError, match="max_rollouts"):
        sera_opt.get_policy("uniform", max_rollouts=3).start_rounds([0.5, 0.5], 6, rounds=2,
                                                                     first_round=4)
    with pytest.raises(sera_opt.SeraOptError, match="later_budgets"):
        policy.start_rounds([0.5, 0.5], 8, rounds=3, first_round=2, later_budgets=[1, 2])
    with pytest.raises(sera_opt.SeraOptError, match="rounds"):
        policy.start_rounds([0.5, 0.5], 8, rounds=0)


def test_round_budgets_split_evenly_earliest_first():
    assert round_budgets(20, 6, 4) == [6, 5, 5, 4]
    assert round_budgets(20, 6, 1) == [20]
    assert round_budgets(20, 6, 3, [10, 4]) == [6, 10, 4]


def test_the_default_first_round_is_half_the_average_count():
    session = sera_opt.get_policy("uniform").start_rounds(np.full(10, 0.5), 80, rounds=3)
    assert session.next_round().tolist() == [4] * 10
    assert session.round_budgets == (40, 20, 20)
    assert isinstance(session, RoundSession)


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("name", ["uniform", "sera-fair", "sera"])
def test_the_expected_scales_match_the_realized_ones_on_average(name, offset):
    """Over many sessions, each prompt's mean factor agrees with the mean of its realized
    scale C1 - p / (1 - p) C0 (an unbiased estimate of kappa from the rewards)."""
    rng = np.random.default_rng(7)
    p = np.array([0.05, 0.15, 0.3, 0.6, 0.02, 0.1])
    policy = sera_opt.get_policy(name, offset=offset, max_rollouts=16)
    factors, realized = [], []
    for _ in range(1500):
        out = run(policy.start_rounds(p, 30, rounds=4, first_round=1 + offset), p, rng)
        wins = np.bincount(out.prompt_index, weights=out.rewards, minlength=6)
        scale = (wins > 0).astype(float)
        if offset:
            first = out.round_index == 0
            n0 = np.bincount(out.prompt_index[first], minlength=6)
            k1 = np.bincount(out.prompt_index[first], weights=out.rewards[first], minlength=6)
            gate = k1 > 0
            scale = scale - np.where(gate, k1 / n0, 0) + p / (1 - p) * np.where(
                gate, (n0 - k1) / n0, 0)
        factors.append(out.factors)
        realized.append(scale)
    factors, realized = np.array(factors), np.array(realized)
    se = realized.std(0) / math.sqrt(len(realized))
    assert (np.abs(factors.mean(0) - realized.mean(0)) < 4 * se + 0.005).all()


# ---------------------------------------------------------------- Reinforce-Ada
def test_reinforce_ada_weighs_grad_p_symmetrically_in_p():
    from sera_opt.rounds import ReinforceAda, reinforce_ada_scale

    for exit_rule in ("balanced",):
        rule = ReinforceAda(exit_rule)
        for p in (0.1, 0.3, 0.45):
            low, high = reinforce_ada_scale(p, rule), reinforce_ada_scale(1 - p, rule)
            assert low.scale / p == pytest.approx(high.scale / (1 - p), rel=1e-9)
            assert low.rollouts == pytest.approx(high.rollouts, rel=1e-9)
    # its scale exceeds MaxRL's bound of 1 for easy prompts: not the MaxRL objective
    assert reinforce_ada_scale(0.9).scale > 10


@pytest.mark.parametrize("exit_rule", ["balanced", "positive"])
def test_reinforce_ada_update_has_the_enumerated_scale_at_score_level(exit_rule):
    from sera_opt.rounds import ReinforceAda, reinforce_ada_scale

    rule = ReinforceAda(exit_rule)
    pi, p, scores, grad = _softmax_prompt(3)
    rng = np.random.default_rng(4)
    episodes = 4000  # one prompt per episode: the rule is per prompt under its own budget
    session = rule.start_rounds(num_prompts=episodes)
    answers = []
    while not session.done:
        counts = session.next_round()
        y = rng.choice(pi.shape[0], size=int(counts.sum()), p=pi)
        answers.append(y)
        session.record(y < 2)
    y = np.concatenate(answers)
    out = session.result()
    kept, adv = session.advantages()
    per = np.bincount(out.prompt_index, weights=kept, minlength=episodes)
    assert per.max() <= 4 and out.counts.max() <= 32
    g = np.zeros((episodes, scores.shape[1]))
    np.add.at(g, out.prompt_index, adv[:, None] * scores[y])
    unit = grad / np.linalg.norm(grad)
    along = g @ unit
    kappa = reinforce_ada_scale(p, rule).scale
    assert abs(along.mean() - kappa * np.linalg.norm(grad)) < 3 * along.std() / math.sqrt(episodes)
    assert out.counts.mean() == pytest.approx(reinforce_ada_scale(p, rule).rollouts, rel=0.05)


def test_reinforce_ada_keeps_half_and_half_and_can_match_a_budget():
    from sera_opt.rounds import ReinforceAda

    rule = ReinforceAda("balanced")
    session = rule.start_rounds([0.5, 0.5, 0.5])
    first = session.next_round()
    assert first.tolist() == [8, 8, 8]
    # prompt 0: 2 wins 6 losses (exits); prompt 1: 8 losses; prompt 2: 1 win
    session.record([1, 1, 0, 0, 0, 0, 0, 0] + [0] * 8 + [1] + [0] * 7)
    assert session.next_round().tolist() == [0, 8, 8]
    session.record([0] * 8 + [1] + [0] * 7)  # prompt 2 exits; prompt 1 runs out of rounds
    while not session.done:
        assert session.next_round().tolist() == [0, 8, 0]
        session.record(np.zeros(8))
    kept, adv = session.advantages()
    out = session.result()
    rows0 = out.prompt_index == 0
    assert kept[rows0].tolist() == [True, True, True, True, False, False, False, False]
    np.testing.assert_allclose(adv[rows0][:4], [0.75, 0.75, -0.25, -0.25])
    assert out.counts.tolist() == [8, 32, 16] and kept[out.prompt_index == 1].sum() == 4
    # matched budget: never more than the budget, shared evenly when short
    capped = rule.start_rounds(num_prompts=3, budget=30)
    assert capped.next_round().tolist() == [8, 8, 8]
    capped.record(np.zeros(24))
    assert capped.next_round().tolist() == [2, 2, 2]
    capped.record(np.zeros(6))
    assert capped.done and capped.result().counts.sum() == 30
    with pytest.raises(sera_opt.SeraOptError, match="exit"):
        ReinforceAda("greedy")
