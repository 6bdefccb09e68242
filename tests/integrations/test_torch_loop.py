"""The plain PyTorch loop helper: planning, the MaxRL loss, feeding rewards back."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt.exceptions import SeraOptError, SeraOptWarning
from sera_opt.integrations.torch_loop import (
    LOSS_MODES,
    RolloutPlan,
    check_planner_offset,
    maxrl_loss,
    maxrl_step,
    observe,
    plan_rollouts,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_loop_example.py"


# ----------------------------------------------------------------- slow references


def reference_advantages(
    rewards, prompt_index, estimator="mean_centred", multiplicity_correction=True
):
    """docs/theory.md sections 2 and 4, one rollout at a time."""
    rewards = [float(r) for r in rewards]
    prompt_index = [int(i) for i in prompt_index]
    prompts = sorted(set(prompt_index))
    counts = {i: prompt_index.count(i) for i in prompts}
    successes = {
        i: sum(r for r, j in zip(rewards, prompt_index, strict=True) if j == i) for i in prompts
    }
    mean_count = len(rewards) / len(prompts)
    advantages = []
    for reward, i in zip(rewards, prompt_index, strict=True):
        if successes[i] == 0:
            advantages.append(0.0)
            continue
        rate = successes[i] / counts[i]
        value = (reward - rate) / rate if estimator == "mean_centred" else reward / rate
        if multiplicity_correction:
            value *= mean_count / counts[i]
        advantages.append(value)
    return advantages


def reference_aggregate(per_token_loss, mask, mode):
    rows = [
        [(loss, weight) for loss, weight in zip(loss_row, mask_row, strict=True)]
        for loss_row, mask_row in zip(per_token_loss, mask, strict=True)
    ]
    sums = [sum(loss * weight for loss, weight in row) for row in rows]
    lengths = [sum(weight for _, weight in row) for row in rows]
    nonempty = sum(1 for length in lengths if length > 0)
    if mode == "token-sum":
        return sum(sums)
    if mode == "token-mean":
        return sum(sums) / sum(lengths)
    if mode == "seq-mean-token-sum":
        return sum(sums) / nonempty
    return sum(s / length for s, length in zip(sums, lengths, strict=True) if length > 0) / nonempty


class _FixedPlanner:
    """Returns given counts; records what it observed."""

    def __init__(self, counts):
        self.counts = np.asarray(counts)
        self.observed = []

    def plan(self, prompt_ids, budget):
        return SimpleNamespace(counts=self.counts.copy())

    def observe(self, prompt_ids, rewards):
        self.observed.append((list(prompt_ids), np.asarray(rewards).tolist()))


# ----------------------------------------------------------------------------- planning


def test_plan_rollouts_lays_out_rows_by_prompt():
    planner = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
    planner.observe([10] * 6 + [20] * 6 + [30] * 6, [0] * 6 + [1, 0, 0, 0, 0, 0] + [1] * 5 + [0])
    plan = plan_rollouts(planner, [10, 20, 30], budget=15)
    assert plan.budget == 15 and plan.num_prompts == 3
    assert plan.counts.sum() == 15 and plan.counts.dtype == np.int64
    np.testing.assert_array_equal(plan.prompt_index, np.repeat(np.arange(3), plan.counts))
    np.testing.assert_array_equal(plan.row_prompt_ids, np.repeat([10, 20, 30], plan.counts))
    assert plan.prompt_index_tensor().dtype == torch.long
    # The prompt that never succeeded is the hardest: it gets the most rollouts.
    assert plan.counts[0] == plan.counts.max() and plan.counts[0] > plan.counts[2]
    assert plan.allocation is not None


def test_plan_rollouts_rejects_bad_input():
    planner = sera_opt.RolloutPlanner("uniform", min_rollouts=1, offset=0)
    with pytest.raises(SeraOptError, match="distinct"):
        plan_rollouts(planner, [1, 2, 1], budget=6)
    with pytest.raises(SeraOptError, match="budget"):
        plan_rollouts(planner, [1, 2], budget=0)
    with pytest.raises(SeraOptError, match="budget"):
        plan_rollouts(planner, [1, 2], budget=4.0)
    with pytest.raises(SeraOptError, match="empty"):
        plan_rollouts(planner, [], budget=4)
    with pytest.raises(SeraOptError, match="summing to the budget"):
        plan_rollouts(_FixedPlanner([1, 2]), [1, 2], budget=4)


def test_plan_from_counts_validates():
    plan = RolloutPlan.from_counts(["a", "b"], [3, 1])
    assert plan.row_prompt_ids.tolist() == ["a", "a", "a", "b"]
    with pytest.raises(SeraOptError, match="at least 1 rollout"):
        RolloutPlan.from_counts(["a", "b"], [3, 0])
    with pytest.raises(SeraOptError, match="whole numbers"):
        RolloutPlan.from_counts(["a", "b"], [True, True])
    with pytest.raises(SeraOptError, match="whole numbers"):
        RolloutPlan.from_counts(["a", "b"], [1.5, 2])
    with pytest.raises(SeraOptError, match="one entry per prompt"):
        RolloutPlan.from_counts(["a", "b"], [1, 2, 3])


# ------------------------------------------------------------------------------- the loss


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    data=st.data(),
    mode=st.sampled_from(LOSS_MODES),
    estimator=st.sampled_from(["mean_centred", "success_average"]),
    correction=st.booleans(),
)
def test_maxrl_loss_matches_slow_reference(counts, data, mode, estimator, correction):
    num_rows = sum(counts)
    prompt_index = np.repeat(np.arange(len(counts)), counts)
    rewards = data.draw(st.lists(st.integers(0, 1), min_size=num_rows, max_size=num_rows))
    lengths = data.draw(st.lists(st.integers(1, 4), min_size=num_rows, max_size=num_rows))
    generator = torch.Generator().manual_seed(len(rewards))
    token_logps = -torch.rand(num_rows, 4, generator=generator, dtype=torch.float64)
    mask = (torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]).double()
    result = maxrl_loss(
        token_logps,
        rewards,
        prompt_index,
        mask=mask,
        mode=mode,
        estimator=estimator,
        multiplicity_correction=correction,
    )
    expected_advantages = reference_advantages(rewards, prompt_index, estimator, correction)
    np.testing.assert_allclose(
        result.advantages.numpy(), expected_advantages, rtol=1e-12, atol=1e-12
    )
    per_token = [
        [-a * lp for lp in row]
        for a, row in zip(expected_advantages, token_logps.tolist(), strict=True)
    ]
    expected_loss = reference_aggregate(per_token, mask.tolist(), mode)
    assert float(result.loss) == pytest.approx(expected_loss, rel=1e-10, abs=1e-12)


def test_sequence_log_probs_give_the_mean_over_rollouts():
    logps = torch.tensor([-1.0, -2.0, -0.5, -0.1], requires_grad=True)
    rewards = [1, 0, 0, 1]
    index = [0, 0, 1, 1]
    result = maxrl_loss(logps, rewards, index)
    advantages = torch.tensor(reference_advantages(rewards, index))
    torch.testing.assert_close(result.loss, -(advantages * logps).mean())
    result.loss.backward()
    torch.testing.assert_close(logps.grad, -advantages / 4)


def test_maxrl_loss_rejects_bad_input():
    logps = torch.zeros(4, 3)
    with pytest.raises(SeraOptError, match="mask"):
        maxrl_loss(torch.zeros(4), [0, 1, 0, 1], [0, 0, 1, 1], mask=torch.ones(4, 1))
    with pytest.raises(SeraOptError, match="shape"):
        maxrl_loss(logps, [0, 1, 0, 1], [0, 0, 1, 1], mask=torch.ones(4, 2))
    with pytest.raises(SeraOptError, match="one reward per rollout"):
        maxrl_loss(logps, [0, 1, 0], [0, 0, 1, 1])
    with pytest.raises(SeraOptError, match="one prompt index"):
        maxrl_loss(logps, [0, 1, 0, 1], [0, 0, 1])
    with pytest.raises(SeraOptError, match="mode"):
        maxrl_loss(logps, [0, 1, 0, 1], [0, 0, 1, 1], mode="mean")
    with pytest.raises(SeraOptError, match="torch.Tensor"):
        maxrl_loss(np.zeros(4), [0, 1, 0, 1], [0, 0, 1, 1])
    with pytest.raises(SeraOptError, match="integers"):
        maxrl_loss(logps, [0, 1, 0, 1], [0.0, 0.5, 1.0, 1.0])
    with pytest.raises(SeraOptError, match="binary"):
        maxrl_loss(logps, [0, 0.5, 0, 1], [0, 0, 1, 1])


def test_expected_gradient_is_the_attenuated_likelihood_gradient():
    """Monte Carlo: E[-grad loss] = (1/M) sum_i w_1(p_i, n_i) grad log p_i under unequal counts.

    A tabular softmax policy: prompt i has logits theta_i over 3 answers, answer 0
    succeeds, so p_i = softmax(theta_i)[0] and grad log p_i = e_0 - softmax(theta_i)
    in prompt i's block.
    """
    theta = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.5], [-1.0, 0.5, 0.0]], dtype=torch.float64)
    counts = np.array([2, 3, 7])
    probs = torch.softmax(theta, dim=1)
    success = probs[:, 0].numpy()
    factors = sera_opt.attenuation(success, counts, offset=1)
    exact = torch.zeros_like(theta)
    exact[:, 0] = 1.0
    exact = (exact - probs) * torch.as_tensor(factors)[:, None] / len(counts)

    plan = RolloutPlan.from_counts([0, 1, 2], counts)
    num_prompts, budget = len(counts), plan.budget
    draws = 20000
    # Every draw is its own batch with its own copy of the parameters, all in one
    # maxrl_loss call: draw d's prompts get ids d * M + i, so the groups (and the
    # correction nbar / n_i) are per draw, and the gradient with respect to draw d's
    # copy, times the number of draws, is that batch's gradient.
    parameters = theta.repeat(draws, 1, 1).requires_grad_(True)
    draw_of_row = torch.arange(draws).repeat_interleave(budget)
    prompt_of_row = torch.as_tensor(plan.prompt_index).repeat(draws)
    log_probs = torch.log_softmax(parameters, dim=2)[draw_of_row, prompt_of_row]
    generator = torch.Generator().manual_seed(1234)
    answers = torch.multinomial(log_probs.detach().exp(), 1, generator=generator).squeeze(1)
    rewards = (answers == 0).double()
    result = maxrl_loss(
        log_probs.gather(1, answers[:, None]).squeeze(1),
        rewards,
        draw_of_row * num_prompts + prompt_of_row,
        mode="seq-mean-token-sum",
    )
    (gradient,) = torch.autograd.grad(-result.loss, parameters)
    samples = gradient * draws
    mean = samples.mean(dim=0)
    standard_error = samples.std(dim=0) / draws**0.5
    # 5 standard errors per coordinate: a false alarm has probability below 1e-5 per test run.
    assert torch.all((mean - exact).abs() <= 5 * standard_error + 1e-12), (
        mean,
        exact,
        standard_error,
    )
    # ... and not the uncorrected expectation, which weights prompt i by n_i / nbar.
    uncorrected = exact * torch.as_tensor(counts / counts.mean())[:, None]
    assert torch.any((mean - uncorrected).abs() > 5 * standard_error)


# --------------------------------------------------------------------- observe and step


def test_observe_feeds_one_reward_per_row():
    planner = _FixedPlanner([2, 1])
    plan = plan_rollouts(planner, ["x", "y"], budget=3)
    observe(planner, plan, torch.tensor([1.0, 0.0, 1.0]))
    assert planner.observed == [(["x", "x", "y"], [1.0, 0.0, 1.0])]
    with pytest.raises(SeraOptError, match="one reward per rollout"):
        observe(planner, plan, [1.0, 0.0])


def test_observe_feeds_the_outcomes_the_estimator_uses():
    planner = _FixedPlanner([2, 1])
    plan = plan_rollouts(planner, ["x", "y"], budget=3)
    observe(planner, plan, [0.2, 0.9, 0.5], success_threshold=0.5)
    observe(planner, plan, torch.tensor([True, False, True]))
    assert [rewards for _, rewards in planner.observed] == [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]
    # Graded rewards without a threshold, and NaN, are refused as maxrl_loss refuses them:
    # a NaN compared with a threshold would otherwise be fed as a silent failure.
    with pytest.raises(SeraOptError, match="binary"):
        observe(planner, plan, [0.2, 0.9, 0.5])
    with pytest.raises(SeraOptError, match="NaN"):
        observe(planner, plan, [1.0, float("nan"), 0.0], success_threshold=0.5)
    assert len(planner.observed) == 2


def test_observe_moves_the_planners_estimates():
    planner = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
    before = np.asarray(planner.tracker.estimate([1, 2]), dtype=float)
    plan = RolloutPlan.from_counts([1, 2], [4, 4])
    observe(planner, plan, [1, 1, 1, 1, 0, 0, 0, 0])
    after = np.asarray(planner.tracker.estimate([1, 2]), dtype=float)
    assert after[0] > before[0] and after[1] < before[1]


def _rollout_fn(kind):
    def rollout(plan):
        logps = torch.full((plan.budget, 2), -0.5, requires_grad=True)
        rewards = torch.tensor([1.0 if r % 2 == 0 else 0.0 for r in range(plan.budget)])
        mask = torch.ones(plan.budget, 2)
        if kind == "tuple2":
            return logps, rewards
        if kind == "tuple3":
            return logps, rewards, mask
        return {"log_probs": logps, "rewards": rewards, "mask": mask}

    return rollout


@pytest.mark.parametrize("kind", ["tuple2", "tuple3", "mapping"])
def test_maxrl_step_runs_the_whole_step(kind):
    planner = _FixedPlanner([3, 2, 3])
    out = maxrl_step(planner, [7, 8, 9], 8, _rollout_fn(kind))
    expected = reference_advantages(out.rewards.tolist(), out.plan.prompt_index)
    np.testing.assert_allclose(out.advantages.numpy(), expected, rtol=1e-6)
    assert out.loss.requires_grad
    assert out.diagnostics["num_rollouts"] == 8 and out.diagnostics["num_prompts"] == 3
    assert planner.observed == [([7, 7, 7, 8, 8, 9, 9, 9], out.rewards.tolist())]


def test_maxrl_step_warns_when_the_planner_offset_does_not_match_the_estimator():
    planner = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=0)
    with pytest.warns(SeraOptWarning, match="offset=1") as caught:
        maxrl_step(planner, [1, 2], 4, _rollout_fn("tuple2"))
    assert caught[0].filename == __file__, "the warning must point at the caller"
    # Matching offsets, or a policy without one to match, stay silent.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        maxrl_step(planner, [1, 2], 4, _rollout_fn("tuple2"), estimator="success_average")
        check_planner_offset(sera_opt.RolloutPlanner("uniform", min_rollouts=2), "mean_centred")


def _declared_planner(name, offset_sensitive):
    return SimpleNamespace(
        policy=SimpleNamespace(name=name, offset=0, offset_sensitive=offset_sensitive)
    )


def test_offset_check_follows_the_policys_declaration_not_its_name():
    # Declared sensitive under any name: checked. Declared insensitive, even if named "sera...": not.
    with pytest.warns(SeraOptWarning, match="offset=1"):
        check_planner_offset(_declared_planner("my-equalizer", True), "mean_centred")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_planner_offset(_declared_planner("sera-like", False), "mean_centred")
        check_planner_offset(_declared_planner("my-equalizer", True), "success_average")


@pytest.mark.parametrize("name", sera_opt.available_policies())
def test_offset_check_warns_for_every_offset_sensitive_registered_policy(name):
    policy = sera_opt.get_policy(name)
    planner = SimpleNamespace(policy=policy)
    mismatched = next(e for e, c in sera_opt.ESTIMATOR_OFFSETS.items() if c != policy.offset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_planner_offset(planner, mismatched)
    assert bool(caught) == policy.offset_sensitive, (name, [str(w.message) for w in caught])


def test_maxrl_step_can_leave_the_planner_alone():
    planner = _FixedPlanner([1, 1])
    maxrl_step(planner, [1, 2], 2, _rollout_fn("tuple2"), update_planner=False)
    assert planner.observed == []


def test_maxrl_step_rejects_a_bad_rollout_function():
    planner = _FixedPlanner([1, 1])
    with pytest.raises(SeraOptError, match="rollout function"):
        maxrl_step(planner, [1, 2], 2, lambda plan: torch.zeros(2))
    with pytest.raises(SeraOptError, match="log_probs"):
        maxrl_step(planner, [1, 2], 2, lambda plan: {"rewards": [0, 1]})


# --------------------------------------------------------------------------------- example


def test_example_trains_the_tiny_policy_with_one_plan_per_step():
    spec = importlib.util.spec_from_file_location("torch_loop_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    history = example.train(steps=30, verbose=False, rounds=1)
    assert len(history) == 30
    assert all(sum(record["counts"]) == 64 for record in history)
    assert any(len(set(record["counts"])) > 1 for record in history), (
        "SERA never moved off uniform counts"
    )
    first = np.mean([r["batch_success_rate"] for r in history[:5]])
    last = np.mean([r["batch_success_rate"] for r in history[-5:]])
    assert last > first + 0.2, (first, last)
    assert history[-1]["greedy_accuracy"] > history[0]["greedy_accuracy"]


@pytest.mark.parametrize("rounds", [4, 3])
def test_example_trains_the_tiny_policy_in_rounds(rounds):
    spec = importlib.util.spec_from_file_location("torch_loop_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    history = example.train(steps=30, verbose=False, rounds=rounds)
    assert all(sum(record["counts"]) == 64 and record["rounds"] == rounds for record in history)
    first = np.mean([r["batch_success_rate"] for r in history[:5]])
    last = np.mean([r["batch_success_rate"] for r in history[-5:]])
    assert last > first + 0.2, (first, last)
    assert history[-1]["greedy_accuracy"] > history[0]["greedy_accuracy"]


def test_the_default_round_step_is_the_static_step_in_one_sample_call():
    # Rounds are opt-in: by default maxrl_round_step samples once, the plan()'s counts,
    # and its loss is maxrl_step's on the same rollouts.
    from sera_opt.integrations.torch_loop import maxrl_round_step

    assert sera_opt.rounds.DEFAULT_ROUNDS == 1
    probs = np.random.default_rng(2).uniform(0.05, 0.9, 12)
    rows = np.repeat(np.arange(12), 8)
    seen = (rows, np.random.default_rng(3).random(96) < probs[rows])
    outs, calls = [], []
    for step in (maxrl_round_step, maxrl_step):
        rng = np.random.default_rng(0)
        logits = torch.zeros(12, requires_grad=True)
        planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2,
                                          max_rollouts=24).observe(*seen)
        want = planner.plan(np.arange(12), 96).counts

        def rollout(plan, logits=logits, step=step, rng=rng):
            calls.append((step, plan.counts.copy()))
            rows = torch.as_tensor(plan.row_prompt_ids)
            rewards = torch.as_tensor(rng.random(plan.budget) < probs[plan.row_prompt_ids])
            return torch.nn.functional.logsigmoid(logits[rows]), rewards

        outs.append(step(planner, np.arange(12), 96, rollout))
        assert planner.tracker.step == 2  # the history, then the step's outcomes once
    assert [s for s, _ in calls] == [maxrl_round_step, maxrl_step]  # one call each
    np.testing.assert_array_equal(calls[0][1], want)
    np.testing.assert_array_equal(calls[1][1], want)
    assert len(set(want.tolist())) > 1, "the case must plan unequal counts"
    rounds, static = outs
    assert rounds.result.rounds == 1 and not rounds.round_index.any()
    torch.testing.assert_close(rounds.loss, static.loss)
    torch.testing.assert_close(rounds.advantages, static.advantages)


def test_maxrl_round_step_samples_each_round_once_at_the_fixed_budget():
    from sera_opt.integrations.torch_loop import maxrl_round_step

    rng = np.random.default_rng(0)
    probs = rng.uniform(0.05, 0.9, 12)
    logits = torch.zeros(12, requires_grad=True)
    calls = []

    def rollout(plan):
        calls.append(plan.counts.copy())
        rows = torch.as_tensor(plan.row_prompt_ids)
        rewards = torch.as_tensor(rng.random(plan.budget) < probs[plan.row_prompt_ids])
        width = 3 + len(calls)  # rounds of different widths are padded and masked
        logps = torch.nn.functional.logsigmoid(logits[rows])[:, None].expand(-1, width)
        return logps, rewards, torch.ones(plan.budget, width)

    planner = sera_opt.RolloutPlanner(max_rollouts=24)
    out = maxrl_round_step(planner, np.arange(12), 96, rollout, rounds=3)
    assert len(calls) == 3 and sum(int(c.sum()) for c in calls) == 96
    assert out.counts.sum() == 96 and out.result.rounds == 3
    assert np.array_equal(out.round_index, np.repeat([0, 1, 2], [int(c.sum()) for c in calls]))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logits.grad).all()
    want = sera_opt.maxrl_advantages(out.rewards, out.prompt_index, dtype=torch.float32,
                                     round_index=out.round_index)
    torch.testing.assert_close(out.advantages, want)
    assert planner.tracker.step == 1  # every round's outcomes, once, at the end
    s, f = planner.tracker.evidence(np.arange(12))
    np.testing.assert_array_equal(s + f, out.counts)
    diag = out.diagnostics()
    assert diag["rounds"] == 3 and 0 <= diag["min_scale"] <= diag["mean_scale"] <= 1
    assert diag["round_0_budget"] == 48 and "round_2_active" in diag


def test_reinforce_ada_step_trains_on_its_kept_group_with_the_pool_rate():
    from sera_opt.integrations.torch_loop import reinforce_ada_step
    from sera_opt.rounds import ReinforceAda

    rng = np.random.default_rng(1)
    probs = rng.uniform(0.05, 0.95, 10)
    logits = torch.zeros(10, requires_grad=True)
    calls = []

    def rollout(plan):
        calls.append(plan.counts.copy())
        rows = torch.as_tensor(plan.row_prompt_ids)
        rewards = rng.random(plan.budget) < probs[plan.row_prompt_ids]
        return torch.nn.functional.logsigmoid(logits[rows]), rewards

    planner = sera_opt.RolloutPlanner()
    out = reinforce_ada_step(ReinforceAda(), np.arange(10), rollout, planner=planner)
    assert len(calls) == out.result.rounds <= 4
    assert all(set(np.unique(c)) <= {0, 8} for c in calls)  # rounds of 8 per active prompt
    kept = out.kept
    # at most 4 kept per prompt, and the update is r - (the prompt's pool rate) on them only
    assert np.bincount(out.prompt_index[kept], minlength=10).max() <= 4
    r = out.rewards.numpy()
    rate = np.bincount(out.prompt_index, weights=r, minlength=10) / out.counts
    want = np.where(kept, r - rate[out.prompt_index], 0.0)
    np.testing.assert_allclose(out.advantages.numpy(), want, atol=1e-6)
    out.loss.backward()
    # seq-mean-token-sum over the kept rows: -mean_kept(A * log sigmoid(theta))
    theta = logits.detach().clone().requires_grad_(True)
    rows = torch.as_tensor(out.prompt_index[kept])
    ref = -(torch.as_tensor(want[kept], dtype=torch.float32)
            * torch.nn.functional.logsigmoid(theta[rows])).mean()
    ref.backward()
    torch.testing.assert_close(logits.grad, theta.grad)
    # the planner's tracker saw every rollout drawn, once
    s, f = planner.tracker.evidence(np.arange(10))
    np.testing.assert_array_equal(s + f, out.counts)
    assert "mean_scale" not in out.diagnostics()  # the rule has no MaxRL scale
    # capped at a budget: never more than it
    capped = reinforce_ada_step(ReinforceAda(per_round=2), np.arange(10), rollout, budget=50)
    assert capped.counts.sum() <= 50 and capped.kept.sum() <= 40


def test_maxrl_step_drops_switched_off_prompts_and_keeps_n0_weights():
    planner = sera_opt.RolloutPlanner("sera", offset=1, min_rollouts=0, max_rollouts=16)
    planner.observe([3] * 60 + [0, 0, 1, 1], [1] * 60 + [1, 0, 0, 1])
    seen = {}

    def rollout_fn(plan):
        seen["plan"] = plan
        log_probs = torch.zeros(plan.budget, requires_grad=True)
        rewards = torch.tensor([i % 2 for i in range(plan.budget)], dtype=torch.float64)
        return log_probs, rewards

    out = maxrl_step(planner, [0, 1, 2, 3], 16, rollout_fn)
    plan = seen["plan"]
    assert plan.counts[3] == 0 and plan.budget == 16 and plan.prompt_index.shape == (16,)
    assert 3 not in plan.prompt_index.tolist()
    assert plan.mean_count == 4.0
    expected = sera_opt.maxrl_advantages(out.rewards, torch.as_tensor(plan.prompt_index),
                                         mean_count=4.0)
    torch.testing.assert_close(out.advantages, expected.to(out.advantages.dtype))
    assert out.diagnostics["active_fraction"] == 0.75
    assert out.diagnostics["switched_off_too_easy"] == 1.0
    # no evidence for the switched-off prompt
    before = planner.tracker.evidence([3])
    assert before[0][0] == 60
