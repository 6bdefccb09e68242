"""RolloutPlanner: tracker estimates in, counts out, rewards back, checkpoints."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import sera_opt
from sera_opt import RolloutPlanner, SeraOptError, SuccessTracker, get_policy


def warmed_tracker(seed=0, prompts=40):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.95, prompts)
    ids = np.repeat(np.arange(prompts), 4)
    tracker = SuccessTracker()
    tracker.update(ids, (rng.random(ids.size) < p[ids]).astype(int))
    return tracker


@pytest.mark.parametrize("name", ["sera", "uniform", "knapsack", "vip", "gvm"])
def test_plan_feeds_the_tracker_estimates_to_the_policy(name):
    tracker = warmed_tracker()
    planner = RolloutPlanner(name, tracker=tracker, max_rollouts=32)
    ids = np.arange(35, 45)  # five seen prompts, five new ones
    alloc = planner.plan(ids, budget=120)
    # A policy named without an offset takes the default estimator's (mean-centred: 1).
    assert planner.policy.offset == 1
    want = get_policy(name, max_rollouts=32, offset=1).allocate(tracker.estimate(ids), 120)
    np.testing.assert_array_equal(alloc.counts, want.counts)
    assert alloc.counts.sum() == 120


@pytest.mark.parametrize("name", ["sera-bayes", "hora"])
def test_posterior_policies_receive_the_posterior(name):
    tracker = warmed_tracker(1)
    planner = RolloutPlanner(name, tracker=tracker)
    assert planner.uses_posterior
    ids = np.arange(30, 50)
    alloc = planner.plan(ids, budget=160)
    want = get_policy(name, offset=1).allocate(None, 160, posterior=tracker.posterior(ids))
    np.testing.assert_array_equal(alloc.counts, want.counts)
    # ... which is not the same as reading the means with the default pseudo-count.
    plain = get_policy(name, offset=1).allocate(tracker.estimate(ids), 160)
    assert not np.allclose(alloc.factors, plain.factors)


def test_observe_updates_the_tracker_and_changes_the_plan():
    planner = RolloutPlanner("sera", max_rollouts=64)
    ids = ["easy", "hard"]
    first = planner.plan(ids, 20)
    assert first.counts.tolist() == [10, 10]  # both unseen: the prior mean
    planner.observe(["easy"] * 10 + ["hard"] * 10, [1] * 9 + [0] + [0] * 9 + [1])
    second = planner.plan(ids, 20)
    assert second.counts[1] > second.counts[0]
    assert planner.tracker.step == 1


def test_a_short_training_loop_learns_the_success_rates():
    rng = np.random.default_rng(5)
    p = rng.uniform(0.05, 0.95, 30)
    planner = RolloutPlanner("sera", tracker=SuccessTracker(prior=(1.0, 1.0)), max_rollouts=16)
    for _ in range(30):
        batch = rng.choice(30, 10, replace=False)
        counts = planner.plan(batch, 80).counts
        rollout_ids = np.repeat(batch, counts)
        planner.observe(rollout_ids, (rng.random(rollout_ids.size) < p[rollout_ids]).astype(int))
    est = planner.tracker.estimate(np.arange(30))
    alpha, beta = planner.tracker.posterior(np.arange(30))
    sd = np.sqrt(alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1)))
    assert np.all(np.abs(est - p) < 4 * sd + 0.02)


def test_state_dict_round_trip_restores_tracker_and_policy():
    planner = RolloutPlanner("sera-bayes", tracker=warmed_tracker(2), max_rollouts=16,
                             offset=1, prior_strength=4.0)
    state = pickle.loads(pickle.dumps(planner.state_dict()))
    restored = RolloutPlanner().load_state_dict(state, replace_config=True)
    assert restored.policy.name == "sera-bayes"
    assert restored.policy.offset == 1 and restored.policy.prior_strength == 4.0
    ids = np.arange(10, 30)
    np.testing.assert_array_equal(restored.plan(ids, 100).counts, planner.plan(ids, 100).counts)
    # The lead's SERA policy round-trips its solver options too.
    sera = RolloutPlanner("sera", solver="waterline", continuous=False, max_rollouts=8)
    back = RolloutPlanner("uniform").load_state_dict(sera.state_dict(), replace_config=True)
    assert back.plan([1, 2, 3], 12).continuous is None


def test_allocate_options_are_forwarded_or_rejected():
    planner = RolloutPlanner("gvm", tracker=warmed_tracker(3))
    alloc = planner.plan([0, 1, 2], 12, gradient_norms=[0.0, 1.0, 1.0])
    assert alloc.counts[0] == 2  # the minimum of the mean-centred estimator's offset
    with pytest.raises(SeraOptError, match="does not take"):
        RolloutPlanner("sera").plan([0, 1], 4, gradient_norms=[1, 1])
    with pytest.raises(SeraOptError, match="posterior"):
        RolloutPlanner("hora").plan([0, 1], 4, posterior=([1, 1], [1, 1]))


def test_bad_construction_and_state():
    with pytest.raises(SeraOptError, match="SuccessTracker"):
        RolloutPlanner("sera", tracker={"not": "a tracker"})
    with pytest.raises(SeraOptError, match="unknown policy"):
        RolloutPlanner("nope")
    with pytest.raises(SeraOptError, match="RolloutPlanner state"):
        RolloutPlanner().load_state_dict({"tracker": {}})


def test_exported_from_the_package():
    assert sera_opt.RolloutPlanner is RolloutPlanner
    assert sera_opt.SuccessTracker is SuccessTracker


def test_a_planner_on_a_users_solver_round_trips():
    def hardest_first(problem):
        counts = problem.min_rollouts.copy()
        order = np.argsort(problem.success_probs, kind="stable")
        spare = problem.spare_budget
        for i in order:
            take = min(spare, int(problem.max_rollouts[i] - counts[i]))
            counts[i] += take
            spare -= take
        return counts

    planner = RolloutPlanner(sera_opt.SERAPolicy(solver=hardest_first, max_rollouts=9),
                             tracker=warmed_tracker(4))
    state = pickle.loads(pickle.dumps(planner.state_dict()))
    assert state["policy"]["options"]["solver"] == {"object": "solver", "name": "hardest_first"}
    ids = np.arange(5, 15)
    want = planner.plan(ids, 40).counts
    # Built the same way, the planner finds the solver it already holds.
    same = RolloutPlanner(sera_opt.SERAPolicy(solver=hardest_first, max_rollouts=9))
    np.testing.assert_array_equal(same.load_state_dict(state).plan(ids, 40).counts, want)
    # Built otherwise, it is told to pass the solver again, and then restores.
    other = RolloutPlanner("uniform")
    with pytest.raises(SeraOptError, match="pass it again"):
        other.load_state_dict(state, replace_config=True)
    assert other.policy.name == "uniform", "a rejected state must leave the planner as it was"
    other.load_state_dict(state, solver=same.policy.solver, replace_config=True)
    np.testing.assert_array_equal(other.plan(ids, 40).counts, want)


def _corruptions(state):
    """Ways to break a real planner state, each a function of a deep copy."""
    import copy

    def edit(path, value):
        def apply(s):
            s = copy.deepcopy(s)
            target = s
            for key in path[:-1]:
                target = target[key]
            if value is KeyError:
                del target[path[-1]]
            else:
                target[path[-1]] = value
            return s
        return apply

    return {
        "format": edit(("format",), "sera_opt.RolloutPlanner/9"),
        "no-policy": edit(("policy",), KeyError),
        "policy-name": edit(("policy", "name"), "no-such-policy"),
        "policy-option": edit(("policy", "options", "alpha"), -3.0),
        "unknown-option": edit(("policy", "options", "gamma"), 1.0),
        "policy-not-mapping": edit(("policy",), ["sera-fair"]),
        "tracker-format": edit(("tracker", "format"), "x"),
        "tracker-nan": edit(("tracker", "successes"), np.array([np.nan] * 40)),
        "tracker-step": edit(("tracker", "step"), -1),
        "no-tracker": edit(("tracker",), KeyError),
    }


@pytest.mark.parametrize("kind", sorted(_corruptions({})))
def test_a_rejected_state_leaves_the_planner_exactly_as_it_was(kind):
    source = RolloutPlanner("sera-fair", tracker=warmed_tracker(5), alpha=2.0, offset=1)
    state = source.state_dict()
    broken = _corruptions(state)[kind](state)
    planner = RolloutPlanner("hora", tracker=warmed_tracker(6), prior_strength=3.0)
    before_policy, before_tracker = planner.policy, planner.tracker
    before = pickle.dumps(planner.state_dict())
    with pytest.raises(SeraOptError):
        planner.load_state_dict(broken)
    assert planner.policy is before_policy and planner.tracker is before_tracker
    assert pickle.dumps(planner.state_dict()) == before
    planner.plan([1, 2, 3], 12)  # still usable


def test_a_good_state_replaces_both_parts():
    source = RolloutPlanner("sera-fair", tracker=warmed_tracker(5), alpha=2.0, offset=1)
    planner = RolloutPlanner("hora").load_state_dict(source.state_dict(), replace_config=True)
    assert planner.policy.name == "sera-fair" and planner.policy.alpha == 2.0
    assert planner.tracker.state_dict()["step"] == source.tracker.state_dict()["step"]


def test_the_default_policy_is_the_one_the_cost_rule_chose():
    # docs/benchmarks.md, "A default chosen on cost": the rule written before its runs
    # (docs/results/cost_runs.json holds the verdict) chose static uniform allocation.
    import json
    from pathlib import Path

    decision = json.loads((Path(__file__).resolve().parents[1] / "docs" / "results"
                           / "cost_runs.json").read_text())
    assert decision["rule"]["choice"] == "static uniform"
    planner = RolloutPlanner()
    assert planner.policy.name == sera_opt.planner.DEFAULT_POLICY == "uniform"
    assert (planner.policy.offset, planner.policy.min_rollouts) == (1, 2)
    # Options given to the planner still win over the default's; a policy is one name away.
    assert RolloutPlanner(min_rollouts=3).policy.min_rollouts == 3
    assert RolloutPlanner("sera-fair", alpha=2.0).policy.alpha == 2.0
    with pytest.raises(SeraOptError, match="alpha"):
        RolloutPlanner(alpha=2.0)  # uniform allocation has no alpha


def test_observe_refuses_the_plan_with_the_call_that_fits():
    planner = RolloutPlanner()
    plan = planner.plan([3, 4], 6)
    with pytest.raises(SeraOptError, match=r"np.repeat\(prompt_ids, plan.counts\)"):
        planner.observe(plan, np.zeros(6))
    planner.observe(np.repeat([3, 4], plan.counts), np.zeros(6))
    assert planner.tracker.step == 1


def test_a_named_policy_pairs_with_the_default_estimator_unless_told():
    assert RolloutPlanner("sera-fair", alpha=1.0).policy.offset == 1
    assert RolloutPlanner("sera-fair", alpha=1.0).policy.min_rollouts == 2
    assert RolloutPlanner("vip").policy.min_rollouts == 4  # its own, larger minimum stays
    assert RolloutPlanner("sera", offset=0).policy.offset == 0
    own = get_policy("sera")  # an instance keeps its own offset
    assert RolloutPlanner(own).policy.offset == 0


def test_a_round_policy_for_another_estimator_is_refused():
    with pytest.raises(SeraOptError, match="offset=0 but the planner's policy"):
        RolloutPlanner("sera", offset=1, round_policy=get_policy("uniform", offset=0))
    # named, it takes the planner's offset
    assert RolloutPlanner("sera", round_policy="uniform").round_policy.offset == 1


def test_a_state_of_another_configuration_is_refused_unless_replacing():
    source = RolloutPlanner("sera-fair", alpha=1.0)
    source.observe([1, 2], [1, 0])
    planner = RolloutPlanner()
    with pytest.raises(SeraOptError, match="another planner configuration.*replace_config=True"):
        planner.load_state_dict(source.state_dict())
    assert planner.policy.name == "uniform", "a rejected state leaves the planner as it was"
    planner.load_state_dict(source.state_dict(), replace_config=True)
    assert planner.policy.name == "sera-fair"
    # A tracker of another prior is another configuration too.
    fixed = RolloutPlanner("sera-fair", alpha=1.0, tracker=SuccessTracker(prior=(1.0, 1.0)))
    with pytest.raises(SeraOptError, match="tracker"):
        fixed.load_state_dict(source.state_dict())
    paper = RolloutPlanner.paper_sera()
    with pytest.raises(SeraOptError, match="EpochTracker"):
        RolloutPlanner.paper_sera(cold_start="prior").load_state_dict(paper.state_dict())
