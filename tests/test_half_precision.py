"""bfloat16 and float16 rewards and log-probabilities, on the CPU, at every public entry that
takes them: they work as float32 does (the estimator computes in float64 or float32 and
rounds once into the caller's dtype), or the loss would be wrong where they do not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sera_opt
from sera_opt.integrations.torch_loop import (
    maxrl_loss,
    maxrl_round_step,
    maxrl_step,
    observe,
    plan_rollouts,
    reinforce_ada_step,
)
from sera_opt.rounds import ReinforceAda

HALF = [torch.bfloat16, torch.float16]
REWARDS = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
IDS = [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("dtype", HALF)
def test_the_estimator_takes_half_rewards_and_rounds_float64_once(dtype):
    rewards, ids = torch.tensor(REWARDS), torch.tensor(IDS)
    exact = sera_opt.maxrl_advantages(rewards.double(), ids)
    half = sera_opt.maxrl_advantages(rewards.to(dtype), ids)
    assert half.dtype == dtype and torch.equal(half, exact.to(dtype))
    stats = sera_opt.group_statistics(rewards.to(dtype), ids)
    assert stats.successes.tolist() == [1, 2, 0, 1]
    diagnostics = sera_opt.advantage_diagnostics(rewards.to(dtype), ids)
    assert diagnostics == pytest.approx(sera_opt.advantage_diagnostics(rewards.double(), ids))
    graded = sera_opt.maxrl_advantages((rewards * 0.6 + 0.2).to(dtype), ids, success_threshold=0.5)
    assert torch.equal(graded, half)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", sera_opt.LOSS_MODES)
def test_the_loss_of_half_logprobs_is_float32_arithmetic_rounded_once(dtype, mode):
    g = torch.Generator().manual_seed(3)
    logp = (-torch.rand(6, 5, generator=g) * 3).to(dtype)
    old = (logp.float() + torch.randn(6, 5, generator=g) * 0.01).to(dtype)
    advantages = torch.randn(6, generator=g)  # float32, as maxrl_advantages gives them
    mask = torch.rand(6, 5, generator=g) > 0.3
    for kwargs in ({}, {"old_token_logprobs": old}):
        leaf = logp.clone().requires_grad_(True)
        loss = sera_opt.policy_gradient_loss(leaf, advantages, mask, mode, **kwargs)
        assert loss.dtype == dtype
        loss.backward()
        assert leaf.grad.dtype == dtype and torch.isfinite(leaf.grad).all()
        wide = {k: v.float() for k, v in kwargs.items()}
        reference = sera_opt.policy_gradient_loss(logp.float(), advantages, mask, mode, **wide)
        assert loss == reference.to(dtype), (mode, kwargs.keys(), float(loss), float(reference))
    aggregated = sera_opt.aggregate_loss(logp, mask, mode)
    assert aggregated.dtype == dtype
    assert aggregated == sera_opt.aggregate_loss(logp.float(), mask, mode).to(dtype)


def test_a_float16_batch_whose_token_sum_overflows_has_a_finite_mean_loss():
    # 8,192 tokens of loss 10: the sum (81,920) is beyond float16's 65,504, the mean is 10.
    logp = torch.full((8, 1024), -10.0, dtype=torch.float16, requires_grad=True)
    loss = sera_opt.policy_gradient_loss(logp, torch.ones(8), mode="token-mean")
    assert loss.dtype == torch.float16 and loss.item() == 10.0
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    per_sequence = sera_opt.aggregate_loss(-logp.detach(), mode="seq-mean-token-sum")
    assert per_sequence.item() == 10240.0


def _rollout(dtype, tokens=False, seed=0):
    probs = np.linspace(0.1, 0.9, 6)
    rng = np.random.default_rng(seed)
    logits = torch.zeros(6, requires_grad=True)

    def rollout(plan):
        rows = torch.as_tensor(plan.row_prompt_ids)
        logp = torch.nn.functional.logsigmoid(logits[rows] + 0.1 * torch.arange(plan.budget))
        rewards = torch.as_tensor(rng.random(plan.budget) < probs[plan.row_prompt_ids])
        if tokens:
            return (logp[:, None].expand(-1, 3).to(dtype), rewards.to(dtype),
                    torch.ones(plan.budget, 3, dtype=dtype))
        return logp.to(dtype), rewards.to(dtype)

    return rollout, logits


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tokens", [False, True], ids=["sequence", "token"])
def test_maxrl_step_takes_half_rewards_and_logprobs(dtype, tokens):
    rollout, logits = _rollout(dtype, tokens)
    planner = sera_opt.RolloutPlanner()
    out = maxrl_step(planner, np.arange(6), 24, rollout)
    assert out.loss.dtype == dtype and out.advantages.dtype == dtype
    assert out.rewards.dtype == dtype
    out.loss.backward()
    assert torch.isfinite(logits.grad).all()
    s, f = planner.tracker.evidence(np.arange(6))
    assert (s + f).sum() == 24 and s.sum() == out.rewards.float().sum()
    reference, _ = _rollout(torch.float32, tokens)
    wide = maxrl_step(sera_opt.RolloutPlanner(), np.arange(6), 24, reference)
    assert torch.equal(out.rewards.float(), wide.rewards)


@pytest.mark.parametrize("dtype", HALF)
def test_maxrl_loss_and_observe_take_half_tensors(dtype):
    planner = sera_opt.RolloutPlanner()
    plan = plan_rollouts(planner, np.arange(3), 6)
    rewards = torch.tensor([1, 0, 1, 1, 0, 0], dtype=dtype)[: plan.budget]
    logp = torch.linspace(-2, -0.5, plan.budget).to(dtype).requires_grad_(True)
    result = maxrl_loss(logp, rewards, plan.prompt_index)
    assert result.loss.dtype == dtype
    observe(planner, plan, rewards)
    s, f = planner.tracker.evidence(np.arange(3))
    assert (s + f).sum() == plan.budget and s.sum() == float(rewards.float().sum())


@pytest.mark.parametrize("dtype", HALF)
def test_the_round_steps_take_half_rewards_and_logprobs(dtype):
    rollout, logits = _rollout(dtype)
    out = maxrl_round_step(sera_opt.RolloutPlanner(), np.arange(6), 48, rollout)
    assert out.loss.dtype == dtype and out.counts.sum() == 48
    out.loss.backward()
    assert torch.isfinite(logits.grad).all()
    rollout, logits = _rollout(dtype, seed=1)
    ada = reinforce_ada_step(ReinforceAda(), np.arange(6), rollout,
                             planner=sera_opt.RolloutPlanner())
    assert ada.loss.dtype == dtype and ada.advantages.dtype == dtype
    ada.loss.backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("dtype", HALF)
def test_the_tracker_and_the_planner_take_half_reward_tensors(dtype):
    tracker = sera_opt.SuccessTracker()
    tracker.update([0, 0, 1], torch.tensor([1.0, 0.0, 1.0], dtype=dtype))
    assert [v.tolist() for v in tracker.evidence([0, 1])] == [[1.0, 1.0], [1.0, 0.0]]
    graded = sera_opt.SuccessTracker(success_threshold=0.5)
    graded.update([0, 0], torch.tensor([0.75, 0.25], dtype=dtype))
    assert graded.evidence([0])[0].tolist() == [1.0]
    planner = sera_opt.RolloutPlanner()
    planner.observe([0, 1], torch.tensor([1.0, 0.0], dtype=dtype))
    assert planner.tracker.evidence([0, 1])[0].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("dtype", HALF)
def test_allocation_takes_half_success_probabilities(dtype):
    # Probabilities that a model estimates come in its dtype: the allocation of a half
    # tensor is that of the same values widened, and the factors agree.
    p = torch.tensor([0.9, 0.5, 0.05, 0.25], dtype=dtype)
    wide = p.double().numpy()
    got = sera_opt.allocate(p, 24, max_rollouts=16)
    want = sera_opt.allocate(wide, 24, max_rollouts=16)
    np.testing.assert_array_equal(got.counts, want.counts)
    policy = sera_opt.get_policy("sera-fair", alpha=1.0, offset=1, min_rollouts=2, max_rollouts=16)
    np.testing.assert_array_equal(policy.allocate(p, 24).counts, policy.allocate(wide, 24).counts)
    # Factors keep the input's precision, as for a numpy array: bfloat16 reads as float32.
    host = p.float().numpy() if dtype == torch.bfloat16 else p.numpy()
    np.testing.assert_array_equal(sera_opt.attenuation(p, got.counts),
                                  sera_opt.attenuation(host, got.counts))
