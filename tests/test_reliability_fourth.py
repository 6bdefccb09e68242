"""Options that did nothing or failed late, and inputs that gave a traceback or an unclear
error: each is now refused in one clear line, or taken as the number it is."""

from __future__ import annotations

import numpy as np
import pytest

import sera_opt
from sera_opt.exceptions import SeraOptError
from sera_opt.rounds import ReinforceAda, rule_scale

torch = pytest.importorskip("torch")


def _two_rollouts(round_, total, successes, first_successes):
    return 2 if round_ == 0 else 0


# ------------------------------------------------------------ options that did nothing


@pytest.mark.parametrize("option", [{"first_round": 2}, {"later_budgets": [4]}])
def test_one_named_round_refuses_the_options_of_several(option):
    policy = sera_opt.get_policy("sera", offset=1, min_rollouts=2)
    with pytest.raises(SeraOptError, match="rounds=1 is the static plan in one round"):
        policy.start_rounds([0.2, 0.5, 0.7, 0.9], 16, rounds=1, **option)
    # Without rounds named the default (one round) refuses them as before.
    with pytest.raises(SeraOptError, match="none were named"):
        policy.start_rounds([0.2, 0.5, 0.7, 0.9], 16, **option)


def test_reinforce_ada_refuses_a_keep_it_can_never_reach():
    with pytest.raises(SeraOptError, match=r"keep=100 .* per_round \* max_rounds = 8 \* 4 = 32"):
        ReinforceAda(keep=100)
    assert ReinforceAda(keep=32).keep == 32  # the most a prompt can draw


def test_reinforce_ada_refuses_a_prompt_count_that_contradicts_the_probabilities():
    rule = ReinforceAda()
    with pytest.raises(SeraOptError, match="num_prompts=5 but success_probs holds 3"):
        rule.start_rounds([0.1, 0.5, 0.9], num_prompts=5)
    assert rule.start_rounds([0.1, 0.5, 0.9], num_prompts=np.int64(3)).num_prompts == 3


def test_rule_scale_refuses_a_bool_and_takes_numpy_floats():
    with pytest.raises(SeraOptError, match="not a bool"):
        rule_scale(True, _two_rollouts, rounds=1)
    with pytest.raises(SeraOptError, match="probability"):
        rule_scale(np.bool_(False), _two_rollouts, rounds=1)
    exact = rule_scale(0.5, _two_rollouts, rounds=1)
    assert rule_scale(np.float32(0.5), _two_rollouts, rounds=1) == exact
    assert rule_scale(np.float64(0.5), _two_rollouts, rounds=1) == exact


@pytest.mark.parametrize("rewards", [[1 + 5j, 0, 1, 0], np.array([1, 0, 1, 0], dtype=complex)])
def test_a_round_refuses_complex_rewards(rewards):
    session = sera_opt.get_policy("uniform").start_rounds([0.5, 0.5], 4)
    session.next_round()
    with pytest.raises(SeraOptError, match="complex"):
        session.record(rewards)


@pytest.mark.parametrize("reward", [1 + 5j, np.complex64(1), torch.tensor([1 + 0j])])
def test_one_complex_reward_is_named_as_complex_not_as_a_shape(reward):
    session = sera_opt.get_policy("uniform").start_rounds([0.5], 1)
    session.next_round()
    with pytest.raises(SeraOptError, match="got complex numbers"):
        session.record(reward)


@pytest.mark.parametrize("planner", ["sera", sera_opt.get_policy("sera", offset=1, min_rollouts=2)])
def test_the_plain_loop_refuses_a_planner_that_is_not_one(planner):
    """A name or a policy in place of a planner: the library's error naming the fix, before
    any rollout is drawn, instead of an AttributeError."""
    from sera_opt.integrations import torch_loop

    drawn = []

    def rollout_fn(plan):
        drawn.append(plan)
        return torch.zeros(plan.budget), torch.zeros(plan.budget)

    fix = r"planner must be a sera_opt.RolloutPlanner.*RolloutPlanner\('sera'"
    with pytest.raises(SeraOptError, match=fix):
        torch_loop.plan_rollouts(planner, [0, 1], 8)
    with pytest.raises(SeraOptError, match=fix):
        torch_loop.maxrl_step(planner, [0, 1], 8, rollout_fn)
    with pytest.raises(SeraOptError, match=fix):
        torch_loop.maxrl_round_step(planner, [0, 1], 8, rollout_fn, rounds=2)
    with pytest.raises(SeraOptError, match=fix):
        torch_loop.reinforce_ada_step(ReinforceAda(), [0, 1], rollout_fn, planner=planner)
    plan = torch_loop.plan_rollouts(sera_opt.RolloutPlanner("uniform"), [0, 1], 8)
    with pytest.raises(SeraOptError, match=fix):
        torch_loop.observe(planner, plan, torch.zeros(8))
    assert drawn == []


def test_the_plain_loop_refuses_a_rule_or_plan_of_the_wrong_kind():
    from sera_opt.integrations import torch_loop

    with pytest.raises(SeraOptError, match=r"rule must be a sera_opt.rounds.ReinforceAda"):
        torch_loop.reinforce_ada_step("reinforce-ada", [0, 1], lambda plan: None)
    with pytest.raises(SeraOptError, match=r"plan must be the RolloutPlan"):
        torch_loop.observe(sera_opt.RolloutPlanner("uniform"), [0, 1], torch.zeros(2))
    with pytest.raises(SeraOptError, match=r"rule must be a sera_opt.rounds.ReinforceAda"):
        sera_opt.rounds.reinforce_ada_scale(0.5, rule="reinforce-ada")


# ------------------------------------------------------------ tracebacks and unclear errors


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_an_unsigned_round_index_is_read_as_the_rounds_it_holds(dtype):
    rewards, index = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 1])
    want = sera_opt.maxrl_advantages(rewards, index, round_index=torch.tensor([0, 1, 1, 0]))
    got = sera_opt.maxrl_advantages(
        rewards, index, round_index=torch.tensor([0, 1, 1, 0], dtype=getattr(torch, dtype)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("estimator", ["maxrl", "grpo"])
def test_an_unsigned_prompt_index_groups_as_its_ids(dtype, estimator):
    advantages = getattr(sera_opt, f"{estimator}_advantages")
    rewards, index = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]), torch.tensor([3, 3, 7, 7, 7])
    want = advantages(rewards, index)
    got = advantages(rewards, index.to(getattr(torch, dtype)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # With num_prompts the ids are checked against it as for any integer dtype.
    with pytest.raises(SeraOptError, match=r"\[0, num_prompts\) = \[0, 4\)"):
        advantages(rewards, index.to(getattr(torch, dtype)), num_prompts=4)


def test_a_uint64_prompt_id_beyond_int64_is_refused_not_wrapped():
    index = torch.tensor([2**63 + 5, 2**63 + 5, 3], dtype=torch.uint64)
    with pytest.raises(SeraOptError, match=r"uint64 ids of 2\*\*63 or more"):
        sera_opt.group_statistics(torch.tensor([1.0, 0.0, 1.0]), index)


def test_meta_tensors_are_refused_in_the_librarys_words():
    with pytest.raises(SeraOptError, match="meta tensor"):
        sera_opt.maxrl_advantages(torch.tensor([1.0, 0.0]).to("meta"), torch.tensor([0, 0]))


def test_meta_log_probs_are_named_as_the_meta_tensor():
    from sera_opt.integrations.torch_loop import maxrl_loss

    with pytest.raises(SeraOptError, match="log_probs is a meta tensor"):
        maxrl_loss(torch.zeros(4, device="meta"), [1, 0, 1, 0], [0, 0, 1, 1])


def test_boolean_success_probs_are_refused_as_outcomes_not_as_a_shape():
    rewards, index = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1])
    with pytest.raises(SeraOptError, match="booleans are outcomes, not probabilities"):
        sera_opt.advantage_diagnostics(rewards, index,
                                       success_probs=torch.tensor([True, False, True, False]))
    with pytest.raises(SeraOptError, match=r"one entry per rollout, shape \(4,\), got \(2,\)"):
        sera_opt.advantage_diagnostics(rewards, index, success_probs=torch.tensor([0.5, 0.5]))
    taken = sera_opt.advantage_diagnostics(rewards, index,
                                           success_probs=np.full(4, 0.5, dtype=np.float32))
    assert taken == sera_opt.advantage_diagnostics(rewards, index, success_probs=[0.5] * 4)


def test_too_few_log_prob_rows_are_named_as_such():
    from sera_opt.integrations.torch_loop import maxrl_loss

    with pytest.raises(SeraOptError, match="log_probs has 3 rows but there are 4 rewards"):
        maxrl_loss(torch.zeros(3), [1, 0, 1, 0], [0, 0, 1, 1])
    with pytest.raises(SeraOptError, match="one reward per rollout row"):
        maxrl_loss(torch.zeros(4), [1, 0, 1], [0, 0, 1, 1])


# ------------------------------------------------------------ one offset for one estimator


def test_a_named_policy_takes_the_default_estimators_offset():
    planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0)
    assert (planner.policy.offset, planner.policy.min_rollouts) == (1, 2)
    budget = 4 * 8
    planner.observe(np.repeat(np.arange(4), 4), np.tile([1.0, 0.0, 0.0, 0.0], 4))
    plan = planner.plan(np.arange(4), budget)
    # The allocation's factors are the default estimator's: maxrl_advantages accepts it.
    rewards = torch.zeros(budget)
    rewards[::3] = 1.0
    index = torch.as_tensor(np.repeat(np.arange(4), plan.counts))
    sera_opt.maxrl_advantages(rewards, index, allocation=plan)
    with pytest.raises(SeraOptError, match="offset"):
        sera_opt.RolloutPlanner("sera-fair", alpha=1.0, round_policy=sera_opt.get_policy(
            "uniform", offset=0))
