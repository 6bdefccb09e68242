"""Tests of the GRPO advantages (sera_opt.estimator.grpo).

Agreement with TRL: a slow reference applies ``trl.GRPOTrainer``'s own formula (its
``nanstd``, its ``1e-4``, its NaN-to-zero step) group by group, which for groups of
equal size is the trainer's computation verbatim. Expectations: exact enumeration and
Monte Carlo on a softmax policy, against the expected gradient of docs/estimator.md,
"GRPO", with a tolerance derived from the number of draws.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt.estimator import GRPO_EPSILON, grpo_advantages
from sera_opt.exceptions import SeraOptError

trl_utils = pytest.importorskip("trl.trainer.utils")


def trl_reference(rewards, prompt_index, scale_rewards="group"):
    """``GRPOTrainer``'s sum-then-normalize advantages (one reward function), group by
    group: ``(r - nanmean(group)) / (nanstd(group) + 1e-4)``, NaN replaced by 0."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    prompt_index = torch.as_tensor(prompt_index)
    out = torch.zeros_like(rewards)
    batch_std = (trl_utils.nanstd(rewards) if rewards.numel() > 1
                 else torch.zeros((), dtype=torch.float64))
    for pid in torch.unique(prompt_index).tolist():
        rows = torch.nonzero(prompt_index == pid).flatten()
        values = rewards[rows].view(1, -1)  # one group of the trainer's view(-1, G)
        mean = torch.nanmean(values, dim=1).repeat_interleave(values.shape[1])
        if scale_rewards == "group":
            std = (trl_utils.nanstd(values, dim=1).repeat_interleave(values.shape[1])
                   if values.shape[1] > 1 else torch.zeros_like(mean))
        else:
            std = batch_std.expand_as(mean)
        advantages = values.flatten() - mean
        if scale_rewards != "none":
            advantages = advantages / (std + 1e-4)
        out[rows] = torch.nan_to_num(advantages, nan=0.0)
    return out


@st.composite
def ragged_batches(draw):
    """Random groups of different sizes (singletons included) with arbitrary ids."""
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
    ids = draw(st.lists(st.integers(-50, 10**6), min_size=len(sizes), max_size=len(sizes),
                        unique=True))
    index = np.repeat(ids, sizes)
    rewards = np.array(draw(st.lists(st.booleans(), min_size=index.size,
                                     max_size=index.size)), dtype=np.float64)
    order = np.array(draw(st.permutations(range(index.size))))
    return torch.tensor(rewards[order]), torch.tensor(index[order])


@pytest.mark.parametrize("scale", sera_opt.GRPO_SCALES)
@settings(max_examples=60, deadline=None)
@given(batch=ragged_batches())
def test_matches_trl_formula_on_random_groups(batch, scale):
    rewards, index = batch
    actual = grpo_advantages(rewards, index, scale_rewards=scale, dtype=torch.float64)
    expected = trl_reference(rewards, index, scale)
    # TRL's Bessel factor count / (count - 1) divides integer counts in float32: the
    # reference is exact to about 1e-7 relative, the library's values to float64.
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-9,
                               msg=f"scale_rewards={scale}")


def test_matches_trl_on_equal_groups_as_the_trainer_lays_them_out():
    """Equal groups in the trainer's order: its reshaped computation, in float32 as it runs."""
    g = torch.Generator().manual_seed(3)
    num_generations = 8
    rewards = (torch.rand(16 * num_generations, generator=g) < 0.3).float()
    index = torch.arange(16).repeat_interleave(num_generations)
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    std = trl_utils.nanstd(rewards.view(-1, num_generations), dim=1)
    expected = (rewards - mean.repeat_interleave(num_generations)) / (
        std.repeat_interleave(num_generations) + 1e-4)
    actual = grpo_advantages(rewards, index)
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, torch.nan_to_num(expected, nan=0.0), rtol=1e-6,
                               atol=1e-6)


def test_hand_computed_values():
    # Prompt 7: 1 success of 4, mean 1/4, unbiased std sqrt(3/16 * 4/3) = 1/2.
    # Prompt 2: all fail. Prompt 5: a singleton success.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    index = torch.tensor([7, 7, 7, 7, 2, 2, 5])
    adv = grpo_advantages(rewards, index, dtype=torch.float64)
    s = 0.5 + GRPO_EPSILON
    expected = torch.tensor([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s, 0, 0, 0],
                            dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-15)
    assert torch.equal(adv[4:], torch.zeros(3, dtype=torch.float64))
    none = grpo_advantages(rewards, index, scale_rewards="none", dtype=torch.float64)
    torch.testing.assert_close(none[:4], torch.tensor([0.75, -0.25, -0.25, -0.25],
                                                      dtype=torch.float64))


def test_groups_sum_to_zero_and_ids_are_labels():
    g = torch.Generator().manual_seed(5)
    index = torch.randint(0, 30, (400,), generator=g)
    rewards = (torch.rand(400, generator=g) < 0.4)
    adv = grpo_advantages(rewards, index, dtype=torch.float64)
    sums = torch.zeros(30, dtype=torch.float64).index_add_(0, index, adv)
    torch.testing.assert_close(sums, torch.zeros(30, dtype=torch.float64), atol=1e-12, rtol=0)
    perm = torch.randperm(400, generator=g)
    relabelled = grpo_advantages(rewards[perm], index[perm] * 1_000_003 + 11,
                                 dtype=torch.float64)
    torch.testing.assert_close(relabelled, adv[perm], rtol=0, atol=0)


def test_prompts_without_rows_and_an_empty_batch():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    index = torch.tensor([0, 0, 3, 3])  # prompts 1 and 2 switched off
    dense = grpo_advantages(rewards, index, num_prompts=5, dtype=torch.float64)
    torch.testing.assert_close(dense, trl_reference(rewards, index), rtol=1e-6, atol=1e-9)
    empty = grpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), num_prompts=3)
    assert empty.shape == (0,)


def test_threshold_and_bool_rewards_agree_with_binary_ones():
    graded = torch.tensor([0.2, 0.9, 0.7, 0.1])
    index = torch.tensor([0, 0, 1, 1])
    binary = (graded >= 0.5).float()
    torch.testing.assert_close(grpo_advantages(graded, index, success_threshold=0.5),
                               grpo_advantages(binary, index))
    torch.testing.assert_close(grpo_advantages(binary.bool(), index, dtype=torch.float32),
                               grpo_advantages(binary, index))


@pytest.mark.parametrize("kwargs,match", [
    ({"scale_rewards": "groups"}, "unknown scale_rewards"),
    ({"scale_rewards": True}, "trl's True is 'group'"),
    ({"epsilon": -1.0}, "epsilon must be"),
    ({"epsilon": float("nan")}, "epsilon must be"),
])
def test_bad_options_raise_library_error(kwargs, match):
    with pytest.raises(SeraOptError, match=match):
        grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), **kwargs)


def test_non_binary_rewards_are_refused_with_the_fix():
    with pytest.raises(SeraOptError, match="success_threshold"):
        grpo_advantages(torch.tensor([0.5, 0.0]), torch.tensor([0, 0]))


# ----------------------------------------------------------------------------
# Expectations on a softmax policy
# ----------------------------------------------------------------------------
#
# Prompt i has logits theta_i over V actions; actions in SUCCESS succeed. The score of
# action a is e_a - pi_i (prompt i's block of parameters), and
# grad log p_i = sum_{a in SUCCESS} pi_i(a) (e_a - pi_i) / p_i, both exact.

V = 3
SUCCESS = torch.tensor([True, False, False])
LOGITS = torch.tensor([[0.4, 0.0, -0.3], [-1.2, 0.3, 0.1], [0.9, -0.5, 0.0],
                       [-0.2, 0.8, -0.4], [-2.0, 0.5, 0.5]], dtype=torch.float64)
UNIFORM_COUNTS = torch.tensor([4, 4, 4, 4, 4])
RAGGED_COUNTS = torch.tensor([1, 2, 3, 4, 5])


def softmax_policy():
    probs = torch.softmax(LOGITS, dim=1)
    p = probs[:, SUCCESS].sum(1)
    scores = torch.eye(V, dtype=torch.float64)[None, :, :] - probs[:, None, :]
    grad_log_p = (probs[:, :, None] * scores * SUCCESS[None, :, None]).sum(1) / p[:, None]
    return probs, p, scores, grad_log_p


def group_std(k, n):
    """The unbiased standard deviation of k successes in n binary rewards."""
    return math.sqrt(k * (n - k) / (n * (n - 1))) if n > 1 else math.nan


def rho(p: float, n: int, eps: float = GRPO_EPSILON) -> float:
    """docs/estimator.md, "GRPO": E[sum_j A_j S_j] = rho(p, n) grad log p."""
    if n < 2:
        return 0.0
    total = 0.0
    for b in range(n):  # B ~ Binomial(n - 1, p): successes among the other rollouts
        weight = math.comb(n - 1, b) * p**b * (1 - p) ** (n - 1 - b)
        up = (n - 1 - b) / (group_std(b + 1, n) + eps) if b + 1 < n else 0.0
        down = b / (group_std(b, n) + eps) if b > 0 else 0.0
        total += weight * (up + down)
    return p * total


def expected_gradient(counts):
    """(1/N) sum_i rho(p_i, n_i) grad log p_i, prompt block by prompt block, (M, V)."""
    _, p, _, grad_log_p = softmax_policy()
    weights = torch.tensor([rho(float(pi), int(n)) for pi, n in zip(p, counts)],
                           dtype=torch.float64)
    return weights[:, None] * grad_log_p / counts.sum().double()


def batch_gradient(actions, batch_of, prompt_of, num_batches, counts):
    """(1/N) sum_j A_j S_j per batch, as (batches, M, V)."""
    _, _, scores, _ = softmax_policy()
    m, n = counts.numel(), int(counts.sum())
    adv = grpo_advantages(SUCCESS[actions], batch_of * m + prompt_of,
                          num_prompts=num_batches * m, dtype=torch.float64)
    out = torch.zeros(num_batches * m, V, dtype=torch.float64)
    out.index_add_(0, batch_of * m + prompt_of, adv[:, None] * scores[prompt_of, actions] / n)
    return out.view(num_batches, m, V)


@pytest.mark.parametrize("counts", [UNIFORM_COUNTS, RAGGED_COUNTS], ids=["uniform", "ragged"])
def test_exact_expectation_by_enumeration(counts):
    probs, _, _, _ = softmax_policy()
    m, total = counts.numel(), int(counts.sum())
    expected = expected_gradient(counts)
    for i, n_i in enumerate(counts.tolist()):
        outcomes = torch.tensor(list(itertools.product(range(V), repeat=n_i)))
        num_batches = outcomes.shape[0]
        prompt_of = torch.repeat_interleave(torch.arange(m), counts).repeat(num_batches)
        batch_of = torch.arange(num_batches).repeat_interleave(total)
        actions = torch.zeros(num_batches, total, dtype=torch.int64)
        start = int(counts[:i].sum())
        actions[:, start:start + n_i] = outcomes
        grads = batch_gradient(actions.view(-1), batch_of, prompt_of, num_batches, counts)[:, i]
        weights = probs[i][outcomes].prod(1)
        mean = (weights[:, None] * grads).sum(0)
        torch.testing.assert_close(mean, expected[i], rtol=0, atol=1e-12,
                                   msg=f"prompt {i} (n={n_i})")


MC_BATCHES = 40_000
MC_SIGMAS = 5.0  # per component; 2 count vectors x 15 components: P(false alarm) < 2e-5


@pytest.mark.parametrize("counts", [UNIFORM_COUNTS, RAGGED_COUNTS], ids=["uniform", "ragged"])
def test_monte_carlo_expectation(counts):
    probs, p, _, grad_log_p = softmax_policy()
    g = torch.Generator().manual_seed(21)
    m, n = counts.numel(), int(counts.sum())
    prompt_of = torch.repeat_interleave(torch.arange(m), counts).repeat(MC_BATCHES)
    batch_of = torch.arange(MC_BATCHES).repeat_interleave(n)
    actions = torch.multinomial(probs[prompt_of], 1, generator=g).squeeze(1)
    grads = batch_gradient(actions, batch_of, prompt_of, MC_BATCHES, counts)
    mean = grads.mean(0)
    tolerance = MC_SIGMAS * grads.std(0) / math.sqrt(MC_BATCHES) + 1e-12
    expected = expected_gradient(counts)
    assert ((mean - expected).abs() <= tolerance).all(), (
        f"mean\n{mean}\nexpected\n{expected}\ntolerance\n{tolerance}")
    # The test has power: MaxRL's expectation (uncorrected, same counts) is rejected.
    w = torch.as_tensor(sera_opt.attenuation(p.numpy(), counts.numpy(), 1))
    maxrl = (counts.double() * w)[:, None] * grad_log_p / n
    assert ((mean - maxrl).abs() > tolerance).any()


def test_rho_approaches_its_large_group_limit():
    """For large n, rho(p, n) ~ (n - 1) sqrt(p / (1 - p)) as docs/estimator.md says."""
    for p in (0.1, 0.5, 0.8):
        n = 400
        assert rho(p, n, eps=0.0) == pytest.approx((n - 1) * math.sqrt(p / (1 - p)), rel=0.01)
