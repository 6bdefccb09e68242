"""Tests of the verl 0.9.1 integration (sera_opt.integrations.verl), on CPU.

The estimator is driven through verl's own ``compute_advantage`` and compared with
:func:`sera_opt.maxrl_advantages`, with a loop over prompts written from
docs/theory.md sections 2 and 4, and with verl's GRPO and RLOO estimators where the
formulas coincide.
The loss side uses verl's ``agg_loss``: with the multiplicity correction every
prompt's weight in the gradient is independent of its rollout count, for every
``loss_agg_mode``. Per-prompt counts are checked through ``DataProto`` repeats and
through verl's real V1 agent-loop code, which reads ``__rollout_n__``.
"""

from __future__ import annotations

import asyncio
import importlib
import types
import uuid
import warnings
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt.exceptions import SeraOptError, SeraOptWarning
from tests.markers import has_module, requires_trl, requires_verl

pytestmark = [pytest.mark.verl, requires_verl]

COMBINATIONS = [(e, c) for e in ("mean_centred", "success_average") for c in (True, False)]


# ----------------------------------------------------------------------------
# Fixtures: verl is imported only when it is installed (the module is skipped otherwise).
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sv():
    return importlib.import_module("sera_opt.integrations.verl")


@pytest.fixture(scope="module")
def core_algos(sv):
    from verl.trainer.ppo import core_algos

    return core_algos


@pytest.fixture(scope="module")
def compute_advantage(sv):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    return compute_advantage


def algorithm_config(adv_estimator="sera_maxrl", **sera_options):
    from omegaconf import OmegaConf

    config = {
        "adv_estimator": adv_estimator,
        "use_kl_in_reward": False,
        "norm_adv_by_std_in_grpo": True,
    }
    if sera_options:
        config["sera_maxrl"] = sera_options
    return OmegaConf.create(config)


def make_batch(counts, outcomes, *, seed=0, width=7, shuffle=True, reward_scale=1.0):
    """A post-generation DataProto: prompt i has counts[i] responses, outcome at the last token.

    Returns the batch and the integer prompt of every row (in the batch's order).
    """
    from verl import DataProto

    rng = np.random.default_rng(seed)
    counts = np.asarray(counts)
    prompt = np.repeat(np.arange(len(counts)), counts)
    outcomes = np.asarray(outcomes, dtype=np.float32)
    order = rng.permutation(len(prompt)) if shuffle else np.arange(len(prompt))
    prompt, outcomes = prompt[order], outcomes[order]
    lengths = rng.integers(1, width + 1, size=len(prompt))
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    rewards = np.zeros((len(prompt), width), dtype=np.float32)
    rewards[np.arange(len(prompt)), lengths - 1] = outcomes * reward_scale
    uids = np.array([f"uid-{i:04d}" for i in range(len(counts))], dtype=object)[prompt]
    batch = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.from_numpy(rewards),
            "response_mask": torch.from_numpy(mask),
        },
        non_tensors={"uid": uids},
    )
    return batch, torch.from_numpy(prompt), torch.from_numpy(outcomes)


def loop_reference(outcomes, prompt, estimator, correction):
    """docs/theory.md sections 2 and 4, one prompt at a time (float64)."""
    outcomes = [float(r) for r in outcomes]
    prompt = [int(i) for i in prompt]
    groups = defaultdict(list)
    for row, i in enumerate(prompt):
        groups[i].append(row)
    nbar = len(outcomes) / len(groups)
    out = np.zeros(len(outcomes))
    for rows in groups.values():
        n, k = len(rows), sum(outcomes[r] for r in rows)
        if k == 0:
            continue
        rbar = k / n
        scale = nbar / n if correction else 1.0
        for r in rows:
            base = (
                (outcomes[r] - rbar) / rbar if estimator == "mean_centred" else outcomes[r] / rbar
            )
            out[r] = scale * base
    return out


def group_means(values, prompt):
    sums = torch.zeros(int(prompt.max()) + 1, dtype=torch.float64).index_add_(
        0, prompt, values.double()
    )
    counts = torch.bincount(prompt).double()
    return (sums / counts)[prompt], counts[prompt]


# ----------------------------------------------------------------------------
# Registration
# ----------------------------------------------------------------------------


def test_registered_on_import(sv, core_algos):
    assert core_algos.get_adv_estimator_fn("sera_maxrl") is sv.compute_sera_maxrl_advantage
    assert core_algos.get_adv_estimator_fn(sv.ESTIMATOR_NAME) is sv.compute_sera_maxrl_advantage


def test_registration_is_idempotent_and_leaves_verl_estimators_alone(sv, core_algos):
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert sv.register_estimator() is sv.compute_sera_maxrl_advantage
    assert sv.register_estimator("sera_maxrl") is sv.compute_sera_maxrl_advantage
    assert core_algos.ADV_ESTIMATOR_REGISTRY == before
    builtin = {member.value for member in core_algos.AdvantageEstimator}
    for name in builtin & set(before):
        assert core_algos.ADV_ESTIMATOR_REGISTRY[name].__module__ == core_algos.__name__, name


def test_builtin_names_and_taken_names_are_refused(sv, core_algos):
    grpo = core_algos.ADV_ESTIMATOR_REGISTRY["grpo"]
    with pytest.raises(SeraOptError, match="verl's own"):
        sv.register_estimator("grpo")
    assert core_algos.ADV_ESTIMATOR_REGISTRY["grpo"] is grpo

    def someone_elses(token_level_rewards, response_mask, index=None, config=None):
        raise AssertionError("never called")

    core_algos.register_adv_est("sera_test_taken")(someone_elses)
    try:
        with pytest.raises(SeraOptError, match="already has"):
            sv.register_estimator("sera_test_taken")
        assert core_algos.ADV_ESTIMATOR_REGISTRY["sera_test_taken"] is someone_elses
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("sera_test_taken")
    with pytest.raises(SeraOptError, match="non-empty string"):
        sv.register_estimator("")


def test_copy_from_a_reloaded_module_counts_as_registered(sv, core_algos, monkeypatch):
    # What importlib.reload leaves behind: the same code, in the same module namespace,
    # in another function object. verl's public API cannot swap it, and need not.
    live = sv.compute_sera_maxrl_advantage
    stale = types.FunctionType(
        live.__code__, live.__globals__, live.__name__, live.__defaults__, live.__closure__
    )
    stale.__qualname__, stale.__kwdefaults__ = live.__qualname__, live.__kwdefaults__
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "sera_maxrl", stale)
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert sv.register_estimator() is stale
    assert core_algos.ADV_ESTIMATOR_REGISTRY == before
    batch, _, _ = make_batch([2, 3], [1, 0, 0, 1, 1])
    args = dict(
        token_level_rewards=batch.batch["token_level_rewards"],
        response_mask=batch.batch["response_mask"],
        index=batch.non_tensor_batch["uid"],
    )
    torch.testing.assert_close(stale(**args)[0], live(**args)[0], rtol=0, atol=0)


class _RecordingRegistry(dict):
    """A registry dict that records which function wrote each entry."""

    def __init__(self, *args):
        super().__init__(*args)
        self.writers = []

    def __setitem__(self, key, value):
        import sys

        caller = sys._getframe(1)
        self.writers.append((key, caller.f_code.co_name, caller.f_globals.get("__name__")))
        super().__setitem__(key, value)


def test_registration_goes_through_verls_public_api_only(sv, core_algos, monkeypatch):
    registry = _RecordingRegistry(core_algos.ADV_ESTIMATOR_REGISTRY)
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", registry)
    assert sv.register_estimator() is sv.compute_sera_maxrl_advantage  # already there: no write
    assert sv.register_estimator("sera_maxrl_public_api") is sv.compute_sera_maxrl_advantage
    assert (
        core_algos.get_adv_estimator_fn("sera_maxrl_public_api") is sv.compute_sera_maxrl_advantage
    )
    # The one write was made by verl's register_adv_est decorator, in core_algos.
    assert registry.writers == [("sera_maxrl_public_api", "decorator", core_algos.__name__)]


def test_other_verl_releases_are_refused_unless_allowed(sv, monkeypatch):
    monkeypatch.setattr(sv.verl, "__version__", "0.10.0")
    monkeypatch.delenv("SERA_OPT_ALLOW_UNTESTED_VERSIONS", raising=False)
    with pytest.raises(SeraOptError, match=r"verl 0\.9\.\*; found verl 0\.10\.0") as error:
        sv._check_verl_version()
    assert "SERA_OPT_ALLOW_UNTESTED_VERSIONS=1" in str(error.value)
    monkeypatch.setenv("SERA_OPT_ALLOW_UNTESTED_VERSIONS", "1")
    with pytest.warns(SeraOptWarning, match="running anyway"):
        sv._check_verl_version()
    monkeypatch.setattr(sv.verl, "__version__", "0.9.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sv._check_verl_version()


# ----------------------------------------------------------------------------
# The estimator through verl's compute_advantage
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(("estimator", "correction"), COMBINATIONS)
def test_compute_advantage_equals_sera_opt(sv, compute_advantage, estimator, correction):
    counts = [1, 2, 3, 5, 8, 4, 4, 6]
    rng = np.random.default_rng(11)
    outcomes = (rng.random(sum(counts)) < 0.45).astype(np.float32)
    outcomes[:1] = 1  # a singleton with a success
    batch, prompt, rewards = make_batch(counts, outcomes, seed=3)
    config = algorithm_config(estimator=estimator, multiplicity_correction=correction)
    out = compute_advantage(batch, adv_estimator="sera_maxrl", config=config)
    expected = sera_opt.maxrl_advantages(
        rewards, prompt, estimator=estimator, multiplicity_correction=correction
    )
    mask = batch.batch["response_mask"]
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask, rtol=0, atol=0)
    torch.testing.assert_close(out.batch["returns"], out.batch["advantages"], rtol=0, atol=0)
    reference = loop_reference(rewards, prompt, estimator, correction)
    np.testing.assert_allclose(
        out.batch["advantages"].double().sum(-1) / mask.sum(-1), reference, rtol=1e-6, atol=1e-6
    )


@settings(max_examples=30, deadline=None)
@given(
    counts=st.lists(st.integers(1, 7), min_size=1, max_size=9),
    seed=st.integers(0, 2**16),
    combination=st.sampled_from(COMBINATIONS),
)
def test_compute_advantage_matches_loop_reference(sv, compute_advantage, counts, seed, combination):
    estimator, correction = combination
    rng = np.random.default_rng(seed)
    outcomes = (rng.random(sum(counts)) < rng.random()).astype(np.float32)
    batch, prompt, rewards = make_batch(counts, outcomes, seed=seed)
    config = algorithm_config(estimator=estimator, multiplicity_correction=correction)
    out = compute_advantage(batch, adv_estimator="sera_maxrl", config=config)
    advantages = out.batch["advantages"]
    mask = batch.batch["response_mask"]
    assert torch.all(advantages[mask == 0] == 0), "advantages leak outside the response mask"
    per_row = advantages.double().sum(-1) / mask.sum(-1)
    np.testing.assert_allclose(
        per_row, loop_reference(rewards, prompt, estimator, correction), rtol=1e-5, atol=1e-6
    )


def test_default_options_with_verl_algo_config(sv, compute_advantage):
    # verl's own dataclass config has no sera_maxrl block: the defaults apply.
    from verl.trainer.config import AlgoConfig

    batch, prompt, rewards = make_batch([2, 3, 4], [1, 0, 1, 1, 0, 0, 0, 0, 1])
    out = compute_advantage(
        batch, adv_estimator="sera_maxrl", config=AlgoConfig(adv_estimator="sera_maxrl")
    )
    expected = sera_opt.maxrl_advantages(rewards, prompt)  # mean-centred, corrected
    torch.testing.assert_close(
        out.batch["advantages"], expected[:, None] * batch.batch["response_mask"], rtol=0, atol=0
    )


def test_uniform_counts_coincide_with_grpo_and_rloo(sv, compute_advantage):
    """Uniform n: MaxRL = Dr.GRPO / rbar = RLOO (n - 1) / (n rbar); the correction is 1."""
    n, num_prompts = 6, 10
    rng = np.random.default_rng(5)
    outcomes = (rng.random(n * num_prompts) < rng.random(n * num_prompts).repeat(1)).astype(
        np.float32
    )
    outcomes[:n] = 0  # a prompt without success
    outcomes[n : 2 * n] = 1  # and one without failure
    batch, prompt, rewards = make_batch([n] * num_prompts, outcomes, seed=8)
    mask = batch.batch["response_mask"]

    def advantages(name, **kwargs):
        out = compute_advantage(
            batch.slice(0, len(batch)), adv_estimator=name, config=algorithm_config(name), **kwargs
        )
        return out.batch["advantages"].double().sum(-1) / mask.sum(-1)

    sera = advantages("sera_maxrl")
    rbar, _ = group_means(rewards, prompt)
    dr_grpo = advantages("grpo", norm_adv_by_std_in_grpo=False)
    expected = torch.where(rbar > 0, dr_grpo / rbar.clamp_min(1e-12), torch.zeros_like(rbar))
    torch.testing.assert_close(sera, expected, rtol=1e-6, atol=1e-6)
    # GRPO proper divides by the group's (unbiased) standard deviation plus 1e-6.
    std = (rbar * (1 - rbar) * n / (n - 1)).sqrt()
    for name in ("grpo", "grpo_vectorized"):
        grpo = advantages(name)
        expected = torch.where(
            rbar > 0, grpo * (std + 1e-6) / rbar.clamp_min(1e-12), torch.zeros_like(rbar)
        )
        torch.testing.assert_close(sera, expected, rtol=1e-5, atol=1e-5)
    rloo = advantages("rloo")
    expected = torch.where(
        rbar > 0, rloo * (n - 1) / (n * rbar.clamp_min(1e-12)), torch.zeros_like(rbar)
    )
    torch.testing.assert_close(sera, expected, rtol=1e-6, atol=1e-6)
    assert torch.count_nonzero(sera) > 0


def test_heterogeneous_counts_are_grpo_times_the_correction(sv, compute_advantage):
    counts = [2, 3, 5, 8, 12, 2]
    rng = np.random.default_rng(9)
    outcomes = (rng.random(sum(counts)) < 0.5).astype(np.float32)
    batch, prompt, rewards = make_batch(counts, outcomes, seed=2)
    mask = batch.batch["response_mask"]
    sera = compute_advantage(
        batch.slice(0, len(batch)), adv_estimator="sera_maxrl", config=algorithm_config()
    ).batch["advantages"]
    grpo = compute_advantage(
        batch.slice(0, len(batch)),
        adv_estimator="grpo",
        config=algorithm_config("grpo"),
        norm_adv_by_std_in_grpo=False,
    ).batch["advantages"]
    rbar, n = group_means(rewards, prompt)
    nbar = len(rewards) / len(counts)
    scale = torch.where(rbar > 0, nbar / (n * rbar.clamp_min(1e-12)), torch.zeros_like(rbar))
    torch.testing.assert_close(
        sera.double(), grpo.double() * scale[:, None] * mask, rtol=1e-6, atol=1e-6
    )


def test_graded_rewards_need_a_threshold(sv, compute_advantage):
    counts = [3, 4]
    outcomes = [1, 0, 1, 0, 0, 1, 1]
    batch, prompt, rewards = make_batch(counts, outcomes, reward_scale=2.5)  # scores 0 or 2.5
    with pytest.raises(SeraOptError, match="success_threshold"):
        compute_advantage(
            batch.slice(0, len(batch)), adv_estimator="sera_maxrl", config=algorithm_config()
        )
    out = compute_advantage(
        batch.slice(0, len(batch)),
        adv_estimator="sera_maxrl",
        config=algorithm_config(success_threshold=1.0),
    )
    expected = sera_opt.maxrl_advantages(rewards, prompt)
    torch.testing.assert_close(
        out.batch["advantages"], expected[:, None] * batch.batch["response_mask"], rtol=0, atol=0
    )


def test_estimator_rejects_what_it_cannot_honour(sv):
    from omegaconf import OmegaConf

    rewards = torch.zeros(3, 4)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0])
    mask = torch.ones(3, 4, dtype=torch.int64)
    uid = np.array(["a", "a", "b"], dtype=object)
    fn = sv.compute_sera_maxrl_advantage
    kl = OmegaConf.create({"use_kl_in_reward": True})
    with pytest.raises(SeraOptError, match="use_kl_loss"):
        fn(token_level_rewards=rewards, response_mask=mask, index=uid, config=kl)
    with pytest.raises(SeraOptError, match="uid"):
        fn(token_level_rewards=rewards, response_mask=mask, index=None)
    with pytest.raises(SeraOptError, match="3 responses"):
        fn(token_level_rewards=rewards, response_mask=mask, index=uid[:2])
    with pytest.raises(SeraOptError, match="shape of token_level_rewards"):
        fn(token_level_rewards=rewards, response_mask=mask[:, :2], index=uid)
    with pytest.raises(SeraOptError, match="unknown key"):
        fn(
            token_level_rewards=rewards,
            response_mask=mask,
            index=uid,
            config=algorithm_config(estimatr="mean_centred"),
        )
    with pytest.raises(SeraOptError, match="estimator must be one of"):
        fn(
            token_level_rewards=rewards,
            response_mask=mask,
            index=uid,
            config=algorithm_config(estimator="grpo"),
        )
    with pytest.warns(SeraOptWarning, match="reward_baselines"):
        fn(
            token_level_rewards=rewards,
            response_mask=mask,
            index=uid,
            reward_baselines=torch.zeros(3),
        )
    with pytest.raises(SeraOptError, match="hashable"):
        fn(token_level_rewards=rewards, response_mask=mask, index=[["a"], ["a"], ["b"]])


def test_fully_masked_rows_still_count_like_grpo(sv, compute_advantage):
    # verl's padding rows: own uid, zero reward, empty response mask.
    batch, prompt, rewards = make_batch([2, 4], [1, 0, 1, 1, 0, 0], shuffle=False)
    from verl import DataProto

    pad = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.zeros(2, 7),
            "response_mask": torch.zeros(2, 7, dtype=torch.int64),
        },
        non_tensors={"uid": np.array(["pad0", "pad0"], dtype=object)},
    )
    padded = DataProto.concat([batch, pad])
    out = compute_advantage(padded, adv_estimator="sera_maxrl", config=algorithm_config())
    advantages = out.batch["advantages"]
    assert torch.all(advantages[-2:] == 0)
    # The padding group raises N and M: nbar goes from 6/2 to 8/3, the same factor for every prompt.
    unpadded = sera_opt.maxrl_advantages(rewards, prompt)
    ratio = (
        advantages[:-2].double().sum(-1) / batch.batch["response_mask"].sum(-1)
    ) / unpadded.double()
    torch.testing.assert_close(
        ratio[unpadded != 0], torch.full_like(ratio[unpadded != 0], (8 / 3) / 3)
    )


def test_collect_estimator_calls(sv, compute_advantage):
    batch, prompt, rewards = make_batch([2, 5], [1, 0, 1, 1, 0, 0, 1], seed=4)
    compute_advantage(
        batch.slice(0, len(batch)), adv_estimator="sera_maxrl", config=algorithm_config()
    )
    with sv.collect_estimator_calls() as calls:
        compute_advantage(
            batch.slice(0, len(batch)), adv_estimator="sera_maxrl", config=algorithm_config()
        )
    assert len(calls) == 1
    call = calls[0]
    assert list(call.uids) == list(batch.non_tensor_batch["uid"])
    np.testing.assert_array_equal(call.successes, rewards.numpy())
    assert call.diagnostics == sera_opt.advantage_diagnostics(rewards, prompt)
    assert call.diagnostics["min_count"] == 2 and call.diagnostics["max_count"] == 5
    with sv.collect_estimator_calls() as outer:
        with sv.collect_estimator_calls() as inner:
            compute_advantage(
                batch.slice(0, len(batch)), adv_estimator="sera_maxrl", config=algorithm_config()
            )
        assert len(inner) == 1 and outer == []


# ----------------------------------------------------------------------------
# Loss aggregation: verl's agg_loss and the multiplicity correction
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    [
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "seq-mean-token-mean",
        "token-sum",
    ],
)
def test_agg_loss_modes_equal_sera_opt_aggregate_loss(sv, core_algos, mode):
    generator = torch.Generator().manual_seed(1)
    loss = torch.randn(9, 6, generator=generator, dtype=torch.float64)
    mask = (torch.rand(9, 6, generator=generator) < 0.7).to(torch.int64)
    mask[0] = 0  # a fully masked sequence: excluded from the sequence count by both
    mask[1, 0] = 1
    verl_loss = core_algos.agg_loss(loss, mask, mode)
    ours = sera_opt.aggregate_loss(loss, mask, sv.LOSS_AGG_MODES[mode])
    factor = 1 / mask.shape[-1] if mode == "seq-mean-token-sum-norm" else 1.0
    torch.testing.assert_close(verl_loss, ours * factor)


def prompt_gradients(core_algos, mode, counts, lengths, advantages_fn):
    """Gradient of verl's agg_loss w.r.t. each prompt's own parameter vector.

    Prompt i's rollouts alternate success / failure (success rate 1/2 for every
    prompt); its sequences have length lengths[i], and every sequence's token
    scores add up to the same total whatever its length and prompt. So the
    per-prompt estimate g_i is the same vector for every prompt, and any
    difference between the prompts' gradients comes from the aggregation.
    """
    dim = 3
    success_feature = torch.tensor([1.0, 0.5, -0.25], dtype=torch.float64)
    failure_feature = torch.tensor([-0.5, 1.0, 0.75], dtype=torch.float64)
    width = max(lengths)
    thetas = torch.zeros(len(counts), dim, dtype=torch.float64, requires_grad=True)
    rows, prompt, outcomes, mask = [], [], [], []
    for i, (n, length) in enumerate(zip(counts, lengths, strict=True)):
        for j in range(n):
            success = j % 2 == 0
            feature = success_feature if success else failure_feature
            token = torch.zeros(width, dtype=torch.float64)
            token[:length] = 1.0 / length
            rows.append((i, feature, token))
            prompt.append(i)
            outcomes.append(float(success))
            mask.append((torch.arange(width) < length).to(torch.int64))
    prompt = torch.tensor(prompt)
    outcomes = torch.tensor(outcomes, dtype=torch.float64)
    mask = torch.stack(mask)
    token_logp = torch.stack([(thetas[i] @ feature) * token for i, feature, token in rows])
    advantages = advantages_fn(outcomes, prompt).double()
    per_token_loss = -advantages[:, None] * token_logp
    loss = core_algos.agg_loss(per_token_loss, mask, mode)
    (grad,) = torch.autograd.grad(loss, thetas)
    return grad


@pytest.mark.parametrize(
    "mode",
    [
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "seq-mean-token-mean",
        "token-sum",
    ],
)
def test_corrected_loss_gives_each_prompt_a_count_independent_weight(sv, core_algos, mode):
    counts = [2, 4, 8, 6, 10]
    lengths = [5] * len(counts)

    def corrected(outcomes, prompt):
        return sera_opt.maxrl_advantages(outcomes, prompt, multiplicity_correction=True)

    def uncorrected(outcomes, prompt):
        return sera_opt.maxrl_advantages(outcomes, prompt, multiplicity_correction=False)

    grad = prompt_gradients(core_algos, mode, counts, lengths, corrected)
    assert grad.abs().max() > 0
    torch.testing.assert_close(grad, grad[:1].expand_as(grad), rtol=1e-10, atol=1e-12)
    # Without the correction prompt i weighs n_i: the distortion the correction removes.
    grad = prompt_gradients(core_algos, mode, counts, lengths, uncorrected)
    weights = grad.norm(dim=1) / grad[0].norm()
    torch.testing.assert_close(weights, torch.tensor(counts, dtype=torch.float64) / counts[0])


def test_seq_mean_token_mean_weights_prompts_by_inverse_length(sv, core_algos):
    """The documented distortion that the multiplicity correction does not touch."""
    counts = [2, 4, 8, 6]
    lengths = [2, 3, 5, 8]

    def corrected(outcomes, prompt):
        return sera_opt.maxrl_advantages(outcomes, prompt)

    for mode in ("token-mean", "seq-mean-token-sum", "token-sum"):
        grad = prompt_gradients(core_algos, mode, counts, lengths, corrected)
        torch.testing.assert_close(grad, grad[:1].expand_as(grad), rtol=1e-10, atol=1e-12)
    grad = prompt_gradients(core_algos, "seq-mean-token-mean", counts, lengths, corrected)
    weights = grad.norm(dim=1) / grad[0].norm()
    torch.testing.assert_close(weights, lengths[0] / torch.tensor(lengths, dtype=torch.float64))


# ----------------------------------------------------------------------------
# Per-prompt counts: DataProto repeats
# ----------------------------------------------------------------------------


def prompt_batch(num_prompts=4, with_uid=False):
    from verl import DataProto

    non_tensors = {
        "raw_prompt": np.array([f"prompt {i}" for i in range(num_prompts)], dtype=object)
    }
    if with_uid:
        non_tensors["uid"] = np.array([f"u{i}" for i in range(num_prompts)], dtype=object)
    return DataProto.from_dict(
        tensors={"input_ids": torch.arange(num_prompts * 5).reshape(num_prompts, 5)},
        non_tensors=non_tensors,
        meta_info={"temperature": 0.7},
    )


def test_repeat_by_counts_lays_out_rollouts_per_prompt(sv):
    batch = prompt_batch()
    counts = [3, 1, 0, 2]
    out = sv.repeat_by_counts(batch, counts)
    assert len(out) == 6
    assert "uid" not in batch.non_tensor_batch  # the input is left alone
    expected_rows = np.repeat(np.arange(4), counts)
    torch.testing.assert_close(out.batch["input_ids"], batch.batch["input_ids"][expected_rows])
    assert list(out.non_tensor_batch["raw_prompt"]) == [f"prompt {i}" for i in expected_rows]
    assert out.meta_info == {"temperature": 0.7}
    uids = out.non_tensor_batch["uid"]
    sizes = Counter(uids.tolist())
    assert sorted(sizes.values()) == [1, 2, 3]
    for row, prompt in enumerate(expected_rows):  # one uid per prompt, uuid4 strings
        assert uids[row] == uids[np.flatnonzero(expected_rows == prompt)[0]]
        uuid.UUID(uids[row])
    assert len(set(uids.tolist())) == 3


def test_repeat_by_counts_keeps_existing_uids_and_accepts_allocations(sv):
    batch = prompt_batch(with_uid=True)
    allocation = sera_opt.allocate([0.2, 0.5, 0.7, 0.9], budget=12, min_rollouts=2)
    out = sv.repeat_by_counts(batch, allocation)
    assert Counter(out.non_tensor_batch["uid"].tolist()) == {
        f"u{i}": int(c) for i, c in enumerate(allocation.counts)
    }
    out = sv.repeat_by_counts(batch, torch.tensor([1, 2, 3, 4]))
    assert out.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u1", "u2", "u2", "u2"] + ["u3"] * 4


def _round_batch(sv, batch, round_counts, seed=0):
    """The rows of every round (repeat_by_counts with round_number=r), concatenated, with
    random 0/1 outcomes on the last token."""
    from verl import DataProto

    parts = [
        sv.repeat_by_counts(batch, counts, round_number=r) for r, counts in enumerate(round_counts)
    ]
    joined = DataProto.concat(parts)
    rng = np.random.default_rng(seed)
    outcomes = torch.from_numpy((rng.random(len(joined)) < 0.4).astype(np.float32))
    rewards = torch.zeros(len(joined), 4)
    rewards[:, -1] = outcomes
    joined.batch["token_level_rewards"] = rewards
    joined.batch["response_mask"] = torch.ones(len(joined), 4, dtype=torch.int64)
    return joined, outcomes


def test_rounds_carry_their_round_to_the_estimator(sv, compute_advantage):
    batch = prompt_batch(num_prompts=4, with_uid=True)
    round_counts = [[2, 2, 2, 2], [0, 3, 1, 4], [2, 0, 0, 1]]
    joined, outcomes = _round_batch(sv, batch, round_counts)
    rounds = joined.non_tensor_batch[sv.ROUND_KEY]
    assert rounds.tolist() == [r for r, c in enumerate(round_counts) for _ in range(sum(c))]
    # every round's rows of a prompt share the prompt's uid
    assert Counter(joined.non_tensor_batch["uid"].tolist()) == {
        f"u{i}": sum(c[i] for c in round_counts) for i in range(4)
    }
    prompt = torch.tensor([i for c in round_counts for i, n in enumerate(c) for _ in range(n)])
    expected = sera_opt.maxrl_advantages(outcomes, prompt, round_index=torch.from_numpy(rounds))
    with sv.round_index(rounds):
        out = compute_advantage(joined, adv_estimator="sera_maxrl", config=algorithm_config())
    torch.testing.assert_close(out.batch["advantages"][:, 0], expected, rtol=0, atol=0)
    # the direct call takes it as an argument too, and without it the baseline is the whole group's
    direct, _ = sv.compute_sera_maxrl_advantage(
        joined.batch["token_level_rewards"], joined.batch["response_mask"],
        index=joined.non_tensor_batch["uid"], round_index=rounds,
    )
    torch.testing.assert_close(direct[:, 0], expected, rtol=0, atol=0)
    pooled = sera_opt.maxrl_advantages(outcomes, prompt)
    outside = compute_advantage(joined, adv_estimator="sera_maxrl", config=algorithm_config())
    torch.testing.assert_close(outside.batch["advantages"][:, 0], pooled, rtol=0, atol=0)
    assert not torch.equal(expected, pooled)


def test_round_options_are_checked(sv):
    batch = prompt_batch(num_prompts=3, with_uid=True)
    for bad in (-1, True, 1.5):
        with pytest.raises(SeraOptError, match="round_number must be a round"):
            sv.repeat_by_counts(batch, [1, 1, 1], round_number=bad)
    with pytest.raises(SeraOptError, match="needs the prompt batch's 'uid' column"):
        sv.repeat_by_counts(prompt_batch(num_prompts=3), [1, 1, 1], round_number=0)
    for bad in ([[0, 1]], [0.5, 1.0], [-1, 0]):
        with pytest.raises(SeraOptError, match="round_index"):
            with sv.round_index(np.asarray(bad)):
                pass
    joined, _ = _round_batch(sv, batch, [[1, 1, 1], [2, 0, 1]])
    with pytest.raises(SeraOptError, match="round_index has"):
        sv.compute_sera_maxrl_advantage(
            joined.batch["token_level_rewards"], joined.batch["response_mask"],
            index=joined.non_tensor_batch["uid"], round_index=np.zeros(2, dtype=np.int64),
        )


def test_repeat_by_counts_then_compute_advantage(sv, compute_advantage):
    batch = prompt_batch(num_prompts=5)
    counts = np.array([2, 6, 3, 1, 4])
    repeated = sv.repeat_by_counts(batch, counts)
    rng = np.random.default_rng(0)
    outcomes = torch.from_numpy((rng.random(len(repeated)) < 0.5).astype(np.float32))
    rewards = torch.zeros(len(repeated), 4)
    rewards[:, -1] = outcomes
    repeated.batch["token_level_rewards"] = rewards
    repeated.batch["response_mask"] = torch.ones(len(repeated), 4, dtype=torch.int64)
    with sv.collect_estimator_calls() as calls:
        out = compute_advantage(repeated, adv_estimator="sera_maxrl", config=algorithm_config())
    prompt = torch.from_numpy(np.repeat(np.arange(5), counts))
    expected = sera_opt.maxrl_advantages(outcomes, prompt)
    torch.testing.assert_close(out.batch["advantages"][:, 0], expected, rtol=0, atol=0)
    stats = sera_opt.group_statistics(outcomes, prompt)
    assert calls[0].diagnostics["min_count"] == stats.counts.min() == 1
    assert calls[0].diagnostics["max_count"] == stats.counts.max() == 6


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ([1, 2, 3], "one entry per prompt"),
        ([1, -1, 2, 2], "at least 0"),
        ([1.5, 1, 2, 2], "whole numbers"),
        ([True, True, False, True], "whole numbers"),
        ([0, 0, 0, 0], "sum to 0"),
        ([[1, 2], [3, 4]], "one entry per prompt"),
    ],
)
def test_repeat_by_counts_rejects_bad_counts(sv, counts, match):
    with pytest.raises(SeraOptError, match=match):
        sv.repeat_by_counts(prompt_batch(), counts)


def test_repeat_by_counts_rejects_shared_uids(sv):
    batch = prompt_batch(with_uid=True)
    batch.non_tensor_batch["uid"][2] = "u1"
    with pytest.raises(SeraOptError, match="repeats ids"):
        sv.repeat_by_counts(batch, [1, 1, 1, 1])
    with pytest.raises(SeraOptError, match="DataProto"):
        sv.repeat_by_counts({"input_ids": torch.zeros(2)}, [1, 1])


# ----------------------------------------------------------------------------
# Per-prompt counts: the V1 trainer's __rollout_n__, through verl's agent loop code
# ----------------------------------------------------------------------------

needs_v1 = pytest.mark.skipif(
    not has_module("transfer_queue"),
    reason="verl's V1 trainer needs TransferQueue (docs/integrations/verl.md)",
)


def v1_prompt_batch(num_prompts, index=None):
    """A V1 training batch as verl's _fetch_one_gen_batch builds it from a collated dict."""
    from verl.utils import tensordict_utils as tu

    batch_dict = collated_prompts(num_prompts, index)
    batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in range(num_prompts)], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    return batch


def collated_prompts(num_prompts, index=None):
    from verl.utils.dataset.rl_dataset import collate_fn

    index = list(range(100, 100 + num_prompts)) if index is None else index
    return collate_fn(
        [
            {
                "input_ids": torch.arange(4) + i,
                "raw_prompt": [{"role": "user", "content": f"q{i}"}],
                "index": index[i],
                "data_source": "unit",
            }
            for i in range(num_prompts)
        ]
    )


def run_v1_agent_loop(batch, monkeypatch, default_n=8):
    """Run verl's AgentLoopWorkerTQ.generate_sequences/_run_prompt with generation stubbed out.

    Returns the number of sessions started per uid and the final status per uid.
    """
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import agent_loop_tq

    worker_cls = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    statuses = {}

    async def kv_put(key, partition_id, tag):
        statuses[key] = tag["status"]

    monkeypatch.setattr(agent_loop_tq, "tq", types.SimpleNamespace(async_kv_put=kv_put))
    sessions = Counter()

    async def run_agent_loop(sampling_params, trajectory, trace, session_id, **prompt):
        assert "__rollout_n__" not in prompt
        sessions[prompt["uid"]] += 1

    rollout = OmegaConf.create(
        {
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "calculate_log_probs": False,
            "n": default_n,
            "val_kwargs": {"n": 1, "top_p": 1.0, "top_k": -1, "temperature": 0.0},
            "agent": {"default_agent_loop": "single_turn_agent"},
        }
    )
    worker = types.SimpleNamespace(
        config=OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}}),
        background_tasks=set(),
        _run_agent_loop=run_agent_loop,
    )
    worker._run_prompt = types.MethodType(worker_cls._run_prompt, worker)

    async def drive():
        await worker_cls.generate_sequences(worker, batch)
        await asyncio.gather(*list(worker.background_tasks))

    asyncio.run(drive())
    return sessions, statuses


@needs_v1
@pytest.mark.parametrize("counts", [[3, 1, 7, 2, 5], [4, 4, 4, 4, 4]])
def test_rollout_counts_reach_verl_agent_loop(sv, monkeypatch, counts):
    batch = v1_prompt_batch(len(counts))
    sv.assign_rollout_counts(batch, counts)
    from verl.utils import tensordict_utils as tu

    uids = tu.get(batch, "uid")
    sessions, statuses = run_v1_agent_loop(batch, monkeypatch, default_n=8)
    assert [sessions[uid] for uid in uids] == counts
    assert all(statuses[uid] == "finished" for uid in uids)


@needs_v1
def test_without_counts_verl_uses_rollout_n(sv, monkeypatch):
    batch = v1_prompt_batch(3)
    sessions, _ = run_v1_agent_loop(batch, monkeypatch, default_n=5)
    assert sorted(sessions.values()) == [5, 5, 5]  # the control for the test above


def test_assign_rollout_counts_rejects_bad_counts(sv):
    batch = v1_prompt_batch(3)
    with pytest.raises(SeraOptError, match="at least 1"):
        sv.assign_rollout_counts(batch, [2, 0, 1])
    with pytest.raises(SeraOptError, match="one entry per prompt"):
        sv.assign_rollout_counts(batch, [2, 1])


def test_prompt_ids_from_batch(sv):
    assert sv.prompt_ids_from_batch(v1_prompt_batch(3)) == [100, 101, 102]
    with pytest.raises(SeraOptError, match="extra_info.index"):
        sv.prompt_ids_from_batch(v1_prompt_batch(3, index=[0, 0, 0]))
    with pytest.raises(SeraOptError, match="no 'question_id' column"):
        sv.prompt_ids_from_batch(v1_prompt_batch(3), "question_id")
    assert sv.prompt_ids_from_batch(v1_prompt_batch(1, index=[0])) == [0]
    strings = v1_prompt_batch(2, index=["a", "b"])
    assert sv.prompt_ids_from_batch(strings) == ["a", "b"]


# ----------------------------------------------------------------------------
# Options and the trainer config check
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"estimator": "rloo"}, "estimator must be one of"),
        ({"multiplicity_correction": "yes"}, "true or false"),
        ({"success_threshold": float("nan")}, "finite number"),
        ({"success_threshold": True}, "finite number"),
        ({"min_rollouts": 0}, "positive integer"),
        ({"max_rollouts": 2.5}, "positive integer"),
        ({"min_rollouts": 5, "max_rollouts": 3}, "exceeds"),
        ({"policy_options": 3}, "mapping"),
        ({"estimatr": "mean_centred"}, "unknown key"),
    ],
)
def test_options_are_validated(sv, options, match):
    with pytest.raises(SeraOptError, match=match):
        sv.SeraMaxRLConfig.from_mapping(options)


def test_options_defaults_and_offsets(sv):
    options = sv.SeraMaxRLConfig.from_algorithm_config(algorithm_config())
    assert options == sv.SeraMaxRLConfig() and options.offset == 1
    assert sv.SeraMaxRLConfig(estimator="success_average").offset == 0
    assert sv.SeraMaxRLConfig.from_algorithm_config(None) == sv.SeraMaxRLConfig()
    assert (
        sv.SeraMaxRLConfig.from_algorithm_config({"sera_maxrl": {"min_rollouts": 3}}).min_rollouts
        == 3
    )
    # The documented default bounds: 1 + c and 4 x rollout.n.
    for estimator, bounds in [("mean_centred", (2, 16)), ("success_average", (1, 16))]:
        planner = sv.build_planner(sv.SeraMaxRLConfig(estimator=estimator), mean_count=4)
        assert (planner.policy.min_rollouts, planner.policy.max_rollouts) == bounds
        assert planner.policy.offset == sera_opt.ESTIMATOR_OFFSETS[estimator]
        # The library's recommended default policy, not a copy of it.
        assert planner.policy.name == sera_opt.planner.DEFAULT_POLICY


@pytest.fixture(scope="module")
def composed():
    if not has_module("hydra"):
        pytest.skip("needs hydra-core (a verl dependency)")
    from omegaconf import OmegaConf

    from sera_opt.integrations import _verl_trainer

    base = [
        "algorithm.adv_estimator=sera_maxrl",
        "trainer.v1.trainer_mode=sera_sync",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=6",
    ]
    config = _verl_trainer.compose_config(base)

    def variant(**dotted):
        copy = OmegaConf.create(OmegaConf.to_container(config))
        for key, value in dotted.items():
            OmegaConf.update(copy, key.replace("__", "."), value, force_add=True)
        return copy

    return config, variant


@needs_v1
def test_check_trainer_config(sv, composed):
    config, variant = composed
    assert sv.check_trainer_config(config) == sv.SeraMaxRLConfig(rounds=1)  # the default: one call
    options = sv.check_trainer_config(
        variant(algorithm__sera_maxrl={"estimator": "success_average", "max_rollouts": 9})
    )
    assert options.estimator == "success_average" and options.max_rollouts == 9
    cases = [
        ({"algorithm__adv_estimator": "grpo"}, "adv_estimator=sera_maxrl"),
        ({"actor_rollout_ref__actor__loss_agg_mode": "my-mode"}, "loss_agg_mode"),
        ({"algorithm__use_kl_in_reward": True}, "use_kl_loss"),
        ({"actor_rollout_ref__rollout__n": 1}, "within"),  # mean-centred needs >= 2
        ({"algorithm__sera_maxrl": {"max_rollouts": 3}}, "within"),
        ({"algorithm__sera_maxrl": {"estimatr": 1}}, "unknown key"),
    ]
    for dotted, match in cases:
        with pytest.raises(SeraOptError, match=match):
            sv.check_trainer_config(variant(**dotted))


@needs_v1
def test_compose_config_checks_sera_modes(sv):
    from sera_opt.integrations import _verl_trainer

    with pytest.raises(SeraOptError, match="use_v1"):
        _verl_trainer.compose_config(
            [
                "algorithm.adv_estimator=sera_maxrl",
                "trainer.use_v1=false",
                "trainer.v1.trainer_mode=sera_sync",
            ]
        )
    with pytest.raises(SeraOptError, match="adv_estimator=sera_maxrl"):
        _verl_trainer.compose_config(["trainer.v1.trainer_mode=sera_sync"])
    # verl's own modes are composed untouched.
    assert (
        _verl_trainer.compose_config(["algorithm.adv_estimator=grpo"]).trainer.v1.trainer_mode
        == "sync"
    )


@needs_v1
def test_trainer_modes_register_idempotently(sv):
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    classes = sv.register_trainers()
    assert set(classes) == set(sv.TRAINER_MODES)
    assert sv.register_trainers() == classes
    for mode, base in sv.TRAINER_MODES.items():
        cls = get_trainer_cls(mode)
        assert cls is classes[mode]
        assert issubclass(cls, get_trainer_cls(base))
    assert get_trainer_cls("sync") is PPOTrainerSync


@needs_v1
def test_trainer_modes_register_through_verls_public_api_only(sv, monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base

    registry = _RecordingRegistry(
        {k: v for k, v in trainer_base.TRAINER_REGISTRY.items() if k not in sv.TRAINER_MODES}
    )
    monkeypatch.setattr(trainer_base, "TRAINER_REGISTRY", registry)
    classes = sv.register_trainers()
    assert {mode: trainer_base.get_trainer_cls(mode) for mode in sv.TRAINER_MODES} == classes
    assert sorted(registry.writers) == sorted(
        (mode, "decorator", trainer_base.__name__) for mode in sv.TRAINER_MODES
    )
    assert sv.register_trainers() == classes and len(registry.writers) == len(sv.TRAINER_MODES)

    class Someone(trainer_base.PPOTrainer):
        pass

    monkeypatch.setitem(registry, "sera_sync", Someone)
    with pytest.raises(SeraOptError, match="already has a trainer mode"):
        sv.register_trainers()


# ----------------------------------------------------------------------------
# The sera_* trainer modes, on a real verl V1 trainer object (no workers started)
# ----------------------------------------------------------------------------


@pytest.mark.slow  # a fresh interpreter that imports verl
def test_external_modules_hook_registers_the_estimator(sv):
    """verl imports VERL_USE_EXTERNAL_MODULES while it initialises: no circular-import trouble."""
    import os
    import subprocess
    import sys

    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "print(get_adv_estimator_fn('sera_maxrl').__module__)\n"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="sera_opt.integrations.verl")
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "sera_opt.integrations.verl"


class FakeTransferQueue:
    """The two TransferQueue calls of verl's V1 ``_compute_advantage``, over an in-memory table."""

    def __init__(self, rows):
        self.rows = rows
        self.written = None

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from tensordict import NonTensorStack, TensorDict

        assert [row["key"] for row in self.rows] == list(keys)
        data = {}
        for name in select_fields:
            if name not in self.rows[0]:
                continue
            values = [row[name] for row in self.rows]
            data[name] = (
                torch.nested.as_nested_tensor(values, layout=torch.jagged)
                if isinstance(values[0], torch.Tensor)
                else NonTensorStack(*values)
            )
        return TensorDict(data, batch_size=[len(self.rows)])

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        self.written = fields
        return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id)


def generated_rows(uids, counts, seed):
    """One row per rollout, as the agent loop stores them: key uid_session_0, 0/1 reward on the last token."""
    rng = np.random.default_rng(seed)
    rows = []
    for uid, n in zip(uids, counts, strict=True):
        for session in range(n):
            length = int(rng.integers(1, 6))
            scores = torch.zeros(length)
            scores[-1] = float(rng.random() < 0.5)
            rows.append(
                {
                    "key": f"{uid}_{session}_0",
                    "uid": uid,
                    "rm_scores": scores,
                    "response_mask": torch.ones(length, dtype=torch.int64),
                }
            )
    return rows


def states_equal(a, b):
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(states_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (np.ndarray, torch.Tensor)):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


@pytest.fixture
def trainer(sv, composed, tmp_path):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from sera_opt.integrations import _verl_trainer

    _, variant = composed
    config = variant(
        trainer__default_local_dir=str(tmp_path),
        # the static mode (rounds are tested in test_verl_rounds.py), allocating by the
        # tracker's estimates so that counts differ (the default planner is uniform)
        algorithm__sera_maxrl={"max_rollouts": 9, "rounds": 1, "policy": "sera-fair"},
    )
    before = OmegaConf.to_container(config)
    trainer = _verl_trainer.SeraPPOTrainerSync(config)
    # The caller's config is left exactly as it was (verl's task runner keeps using it) ...
    assert OmegaConf.to_container(config) == before
    assert config.trainer.v1.trainer_mode == "sera_sync"
    # ... while verl's constructor saw the base mode: the sync replay buffer, not the async one.
    assert trainer.config is not config and trainer.config.trainer.v1.trainer_mode == "sync"
    assert trainer.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer
    trainer.train_dataloader = [
        collated_prompts(6),
        collated_prompts(6, index=list(range(200, 206))),
    ]
    trainer.train_dataloader_it = None
    trainer.global_steps = 1
    prompt_ids, rewards = HISTORY
    trainer.sera_planner.observe(prompt_ids, rewards)
    return trainer


def history():
    """Earlier outcomes of prompts 100..105: success rates from 1/8 to 7/8, so their counts differ."""
    prompt_ids, rewards = [], []
    for i, successes in enumerate([1, 2, 4, 5, 6, 7]):
        prompt_ids += [100 + i] * 8
        rewards += [1.0] * successes + [0.0] * (8 - successes)
    return prompt_ids, np.array(rewards)


HISTORY = history()


def reference_planner(sv, trainer):
    planner = sv.build_planner(trainer.sera_options, trainer.sera_mean_count)
    return planner.observe(*HISTORY)


@needs_v1
def test_trainer_plans_counts_that_reach_the_agent_loop(sv, trainer, monkeypatch):
    from verl.utils import tensordict_utils as tu

    reference = reference_planner(sv, trainer)
    batch = trainer._next_train_batch()
    prompt_ids = sv.prompt_ids_from_batch(batch)
    assert prompt_ids == list(range(100, 106))
    counts = tu.get(batch, "__rollout_n__")
    assert sum(counts) == 6 * 4 and min(counts) >= 2 and max(counts) <= 9
    assert counts[0] > counts[-1], "the hardest prompt should get more rollouts than the easiest"
    np.testing.assert_array_equal(counts, reference.plan(prompt_ids, 24).counts)
    uids = tu.get(batch, "uid")
    sessions, _ = run_v1_agent_loop(batch, monkeypatch, default_n=4)
    assert [sessions[uid] for uid in uids] == counts


@needs_v1
def test_trainer_advantage_step_observes_outcomes(sv, trainer, monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base
    from verl.utils import tensordict_utils as tu

    reference = reference_planner(sv, trainer)
    batch = trainer._next_train_batch()
    uids, counts = tu.get(batch, "uid"), tu.get(batch, "__rollout_n__")
    prompt_ids = sv.prompt_ids_from_batch(batch)
    rows = generated_rows(uids, counts, seed=7)
    rows.append(
        {
            "key": "padabc_0_0",
            "uid": "padabc",
            "rm_scores": torch.zeros(1),
            "response_mask": torch.zeros(1, dtype=torch.int64),
        }
    )  # verl's padding row
    fake = FakeTransferQueue(rows)
    monkeypatch.setattr(trainer_base, "tq", fake)
    from transfer_queue import KVBatchMeta

    meta = KVBatchMeta(
        keys=[row["key"] for row in rows], tags=[{} for _ in rows], partition_id="train"
    )
    metrics = {}
    trainer._compute_advantage(meta, metrics)

    # verl wrote back the sera_maxrl advantages of the whole batch (padding group included).
    codes, _ = sv.prompt_codes([row["uid"] for row in rows])
    outcomes = torch.stack([row["rm_scores"].sum() for row in rows])
    expected = sera_opt.maxrl_advantages(outcomes, torch.from_numpy(codes))
    written = fake.written["advantages"].unbind()
    assert len(written) == len(rows)
    for k, row in enumerate(rows):
        torch.testing.assert_close(written[k], expected[k] * row["response_mask"], rtol=0, atol=0)
    assert any(torch.count_nonzero(w) for w in written)
    assert len(set(counts)) > 1 and metrics["sera/max_count"] == max(counts)
    assert metrics["sera/planned_min_count"] == min(counts) and metrics[
        "sera/planned_max_count"
    ] == max(counts)
    assert metrics["sera/min_count"] == 1  # verl's padding group
    assert metrics["sera/num_prompts"] == 7
    assert metrics["sera/observed_rollouts"] == sum(counts)

    # The planner saw the same evidence as a reference fed directly (padding skipped).
    real = [row for row in rows if row["uid"] != "padabc"]
    prompt_of_uid = dict(zip(uids, prompt_ids, strict=True))
    reference.observe(
        [prompt_of_uid[row["uid"]] for row in real],
        np.array([float(row["rm_scores"].sum()) for row in real]),
    )
    assert states_equal(trainer.sera_planner.state_dict(), reference.state_dict())
    assert not states_equal(
        trainer.sera_planner.state_dict(), reference_planner(sv, trainer).state_dict()
    )
    assert trainer._sera_prompt_of_uid == {}


@needs_v1
def test_trainer_refuses_multi_output_sessions(sv, trainer):
    from transfer_queue import KVBatchMeta

    meta = KVBatchMeta(keys=["u1_0_0", "u1_0_1"], tags=[{}, {}], partition_id="train")
    with pytest.raises(SeraOptError, match="several outputs"):
        trainer._compute_advantage(meta, {})


@needs_v1
def test_trainer_checkpoints_the_planner(sv, trainer, monkeypatch, tmp_path):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    # verl's own checkpoint code needs the worker groups; only the planner file is under test.
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: None)
    trainer.sera_planner.observe([100, 100, 101, 102], np.array([1.0, 0.0, 0.0, 1.0]))
    trainer.global_steps = 3
    trainer._save_checkpoint()
    path = tmp_path / "global_step_3" / "sera_planner.pt"
    assert path.exists()

    def resume(self):
        self.global_steps = 3

    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", resume)
    saved = trainer.sera_planner.state_dict()
    trainer.sera_planner = sv.build_planner(trainer.sera_options, trainer.sera_mean_count)
    assert not states_equal(trainer.sera_planner.state_dict(), saved)
    trainer._load_checkpoint()
    assert states_equal(trainer.sera_planner.state_dict(), saved)


@needs_v1
def test_trainer_resumes_without_a_planner_file_with_a_warning(sv, trainer, monkeypatch, caplog):
    import logging

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    def resume(self):
        self.global_steps = 5

    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", resume)
    before = trainer.sera_planner.state_dict()
    with caplog.at_level(logging.WARNING, logger="sera_opt.integrations._verl_trainer"):
        trainer._load_checkpoint()
    assert any("sera_planner.pt" in record.getMessage() for record in caplog.records)
    assert states_equal(trainer.sera_planner.state_dict(), before)


LAUNCH_OVERRIDES = [
    "algorithm.adv_estimator=sera_maxrl",
    "trainer.v1.trainer_mode=sera_sync",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=1",
]


@needs_v1
def test_launcher_hands_verl_a_task_runner_that_registers_first(sv, core_algos, monkeypatch):
    from verl.trainer import main_ppo
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from sera_opt.integrations import _verl_trainer

    launched = {}
    monkeypatch.setattr(
        main_ppo,
        "run_ppo",
        lambda config, task_runner_class: launched.update(config=config, cls=task_runner_class),
    )
    overrides = list(LAUNCH_OVERRIDES)
    _verl_trainer.launch(overrides)
    assert overrides == LAUNCH_OVERRIDES
    assert launched["config"].trainer.v1.trainer_mode == "sera_sync"
    env_vars = launched["config"].ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == "sera_opt.integrations.verl"
    runner_cls = launched["cls"].__ray_actor_class__  # a Ray actor class; Ray is not started here
    base = main_ppo.TaskRunnerV1.__ray_actor_class__
    assert issubclass(runner_cls, base)

    # Inside the task runner's process, run() registers everything before verl looks it up.
    for mode in sv.TRAINER_MODES:
        monkeypatch.delitem(TRAINER_REGISTRY, mode, raising=False)
    monkeypatch.delitem(core_algos.ADV_ESTIMATOR_REGISTRY, "sera_maxrl")
    seen = {}

    def verl_run(self, config):
        seen["modes"] = set(TRAINER_REGISTRY)
        seen["estimator"] = core_algos.ADV_ESTIMATOR_REGISTRY.get("sera_maxrl")
        return "trained"

    monkeypatch.setattr(base, "run", verl_run)
    assert runner_cls().run(launched["config"]) == "trained"
    assert set(sv.TRAINER_MODES) <= seen["modes"]
    assert seen["estimator"] is sv.compute_sera_maxrl_advantage

    with pytest.raises(SeraOptError, match="loss_agg_mode"):
        _verl_trainer.launch(LAUNCH_OVERRIDES + ["actor_rollout_ref.actor.loss_agg_mode=weird"])


@needs_v1
def test_launcher_makes_every_ray_process_import_the_integration(sv, monkeypatch):
    """verl's own run_ppo, with ray.init captured: the runtime env names the module for every process."""
    import ray

    from sera_opt.integrations import _verl_trainer

    captured = {}

    class Runner:
        @classmethod
        def remote(cls):
            return types.SimpleNamespace(
                run=types.SimpleNamespace(remote=lambda config: captured.update(config=config))
            )

    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)  # verl drops defaults already set
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: captured.update(init=kwargs))
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(_verl_trainer, "_task_runner_class", lambda: Runner)
    given = "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=my_plugin"
    _verl_trainer.launch(LAUNCH_OVERRIDES + [given])
    env_vars = captured["init"]["runtime_env"]["env_vars"]
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == "my_plugin,sera_opt.integrations.verl"
    assert env_vars["VLLM_LOGGING_LEVEL"] == "WARN"  # verl's own defaults are still merged in
    assert captured["config"].trainer.v1.trainer_mode == "sera_sync"


@needs_v1
def test_with_worker_modules_keeps_the_callers_config(sv):
    from omegaconf import OmegaConf

    from sera_opt.integrations import _verl_trainer

    config = OmegaConf.create({"ray_kwargs": {"ray_init": {"num_cpus": None}}})
    OmegaConf.set_struct(config, True)
    before = OmegaConf.to_container(config)
    updated = _verl_trainer.with_worker_modules(config)
    assert OmegaConf.to_container(config) == before
    env_vars = updated.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.VERL_USE_EXTERNAL_MODULES == "sera_opt.integrations.verl"
    again = _verl_trainer.with_worker_modules(updated)  # listed once, not twice
    assert again.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == (
        "sera_opt.integrations.verl"
    )


# ----------------------------------------------------------------------------
# verl beside trl (issue 14): verl's apply_monkey_patch on a tiny model, trl installed
# ----------------------------------------------------------------------------

TINY_QWEN2 = """
from transformers import Qwen2Config, Qwen2ForCausalLM

def tiny_qwen2():
    config = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(config)
"""


def tiny_qwen2():
    namespace = {}
    exec(TINY_QWEN2, namespace)
    return namespace["tiny_qwen2"]()


@pytest.fixture
def transformers_patches_undone(monkeypatch):
    """apply_monkey_patch replaces transformers' flash-attention forward process-wide: undo it."""
    from transformers.integrations import flash_attention

    monkeypatch.setattr(
        flash_attention, "_flash_attention_forward", flash_attention._flash_attention_forward
    )
    return flash_attention


def _value_head_missing_from_trl():
    from sera_opt.integrations import _verl_compat

    if _verl_compat.trl_value_head_available():
        pytest.skip("this trl still has AutoModelForCausalLMWithValueHead: nothing to fix")
    return _verl_compat


@requires_trl
def test_apply_monkey_patch_runs_beside_trl(sv, monkeypatch, caplog, transformers_patches_undone):
    import logging

    from verl.models.transformers import monkey_patch
    from verl.utils import import_utils

    compat = _value_head_missing_from_trl()
    assert import_utils.is_trl_available(), "verl's own check finds trl"
    assert compat.needed() and compat.applied()
    # verl's own check is untouched where it is defined, and in its other caller.
    from verl.utils import model as verl_model

    assert verl_model.is_trl_available is import_utils.is_trl_available
    monkeypatch.setattr(compat, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="sera_opt.integrations.verl"):
        monkey_patch.apply_monkey_patch(tiny_qwen2())
        monkey_patch.apply_monkey_patch(tiny_qwen2())
    notices = [r for r in caplog.records if r.name == "sera_opt.integrations.verl"]
    assert len(notices) == 1, "warned once"
    assert notices[0].levelno == logging.WARNING
    assert "AutoModelForCausalLMWithValueHead" in notices[0].getMessage()
    # It got past the trl block to the attention patch that follows it.
    assert (
        transformers_patches_undone._flash_attention_forward
        is monkey_patch._ulysses_flash_attention_forward
    )
    assert sv._verl_compat.apply() is True  # idempotent


@requires_trl
def test_apply_monkey_patch_fails_beside_trl_without_the_fix(
    sv, monkeypatch, transformers_patches_undone
):
    """The control: verl's own check in place, trl 1.16 installed -> the crash of issue 14."""
    from verl.models.transformers import monkey_patch
    from verl.utils import import_utils

    _value_head_missing_from_trl()
    monkeypatch.setattr(monkey_patch, "is_trl_available", import_utils.is_trl_available)
    with pytest.raises(ImportError, match="AutoModelForCausalLMWithValueHead"):
        monkey_patch.apply_monkey_patch(tiny_qwen2())


def test_fix_is_not_applied_where_trl_still_has_the_class(sv, monkeypatch):
    """A trl with AutoModelForCausalLMWithValueHead (verl's fsdp extra pins trl 0.27): verl is left alone."""
    from verl.models.transformers import monkey_patch
    from verl.utils import import_utils

    from sera_opt.integrations import _verl_compat

    monkeypatch.setattr(monkey_patch, "is_trl_available", import_utils.is_trl_available)
    monkeypatch.setattr(_verl_compat, "trl_value_head_available", lambda: True)
    assert not _verl_compat.needed()
    assert _verl_compat.apply() is False and not _verl_compat.applied()
    assert monkey_patch.is_trl_available is import_utils.is_trl_available


_WORKER_SCRIPT = (
    TINY_QWEN2
    + """
import json, logging, sys, warnings
if "--without-trl" in sys.argv:
    sys.modules["trl"] = None  # trl cannot be imported and importlib cannot find it
notices = []
handler = logging.Handler()
handler.emit = lambda record: notices.append(record.getMessage())
logging.getLogger("sera_opt.integrations.verl").addHandler(handler)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import verl  # what a Ray worker does first; verl imports VERL_USE_EXTERNAL_MODULES here
    from verl.models.transformers import monkey_patch
    from verl.utils import import_utils
    try:
        monkey_patch.apply_monkey_patch(tiny_qwen2())
        error = None
    except ImportError as exc:
        error = str(exc)
print(json.dumps({
    "error": error,
    "integration_loaded": "sera_opt.integrations.verl" in sys.modules,
    "verl_check_untouched": monkey_patch.is_trl_available is import_utils.is_trl_available,
    "trl_found": bool(import_utils.is_trl_available()),
    "sera_notices": notices + [str(w.message) for w in caught if "sera_opt" in str(w.message)],
}))
"""
)


def _run_script(tmp_path, name, source, *args, external_modules=True):
    """Run ``source`` as ``tmp_path/name`` in a fresh interpreter (with or without the
    external-module variable, as a Ray worker would); returns its last stdout line as JSON
    and the whole stdout."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / name
    script.write_text(source)
    env = {key: value for key, value in os.environ.items() if key != "VERL_USE_EXTERNAL_MODULES"}
    if external_modules:
        env["VERL_USE_EXTERNAL_MODULES"] = "sera_opt.integrations.verl"
    result = subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stdout


def _run_worker(tmp_path, *args, external_modules=True):
    return _run_script(tmp_path, "worker.py", _WORKER_SCRIPT, *args,
                       external_modules=external_modules)[0]


@pytest.mark.slow  # fresh interpreters that import verl
@requires_trl
def test_external_modules_variable_alone_lets_a_fresh_worker_patch_its_model(sv, tmp_path):
    _value_head_missing_from_trl()
    fixed = _run_worker(tmp_path)
    assert fixed["error"] is None, fixed
    assert fixed["integration_loaded"] and fixed["trl_found"]
    assert not fixed["verl_check_untouched"]
    assert (
        len(fixed["sera_notices"]) == 1
        and "AutoModelForCausalLMWithValueHead" in (fixed["sera_notices"][0])
    )
    # The control: the same fresh worker without the variable dies as in issue 14.
    broken = _run_worker(tmp_path, external_modules=False)
    assert not broken["integration_loaded"]
    assert "AutoModelForCausalLMWithValueHead" in broken["error"]


@pytest.mark.slow  # a fresh interpreter that imports verl
def test_nothing_changes_without_trl(sv, tmp_path):
    without = _run_worker(tmp_path, "--without-trl")
    assert without["integration_loaded"] and not without["trl_found"]
    assert without["error"] is None
    assert without["verl_check_untouched"], "verl's check must stay verl's own without trl"
    assert without["sera_notices"] == []


# ----------------------------------------------------------------------------
# The actor update: verl's policy loss over micro-batches, as the V1 trainer normalises it
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def actor_config(composed):
    from verl.utils.config import omega_conf_to_dataclass

    _, variant = composed
    config = variant(actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=4)
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def actor_prompt_gradients(
    core_algos, actor, mode, counts, lengths, advantages_fn, *, loss_scale_factor=None, rows=4
):
    """Gradient w.r.t. each prompt's parameters of one mini-batch through verl's actor loss.

    As verl's V1 trainer runs it: rows shuffled (a prompt's rollouts land in different
    micro-batches), each micro-batch padded to its own longest response, verl's
    ``vanilla`` policy loss on policy (old log-probs = current ones) per micro-batch with
    the mini-batch's ``batch_num_tokens`` and ``global_batch_size`` (``_update_actor``:
    ``ppo_mini_batch_size x rollout.n`` responses), and the micro-batch losses summed, as
    gradient accumulation does. The construction is that of :func:`prompt_gradients`.
    """
    success_feature = torch.tensor([1.0, 0.5, -0.25], dtype=torch.float64)
    failure_feature = torch.tensor([-0.5, 1.0, 0.75], dtype=torch.float64)
    width = max(lengths)
    thetas = torch.zeros(len(counts), 3, dtype=torch.float64, requires_grad=True)
    logps, prompt, outcomes, row_lengths = [], [], [], []
    for i, (n, length) in enumerate(zip(counts, lengths, strict=True)):
        for j in range(n):
            feature = success_feature if j % 2 == 0 else failure_feature
            token = torch.zeros(width, dtype=torch.float64)
            token[:length] = 1.0 / length
            logps.append((thetas[i] @ feature) * token)
            prompt.append(i)
            outcomes.append(float(j % 2 == 0))
            row_lengths.append(length)
    logps = torch.stack(logps)
    row_lengths = torch.tensor(row_lengths)
    mask = torch.arange(width)[None, :] < row_lengths[:, None]
    advantages = advantages_fn(
        torch.tensor(outcomes, dtype=torch.float64), torch.tensor(prompt)
    ).double()
    policy_loss = core_algos.get_policy_loss_fn("vanilla")
    actor.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=int(mask.sum()),
        global_batch_size=len(prompt),
        loss_scale_factor=loss_scale_factor,
    )
    order = np.random.default_rng(0).permutation(len(prompt))
    total = 0
    for chunk in np.array_split(order, -(-len(prompt) // rows)):
        chunk = torch.from_numpy(chunk)
        chunk_width = int(row_lengths[chunk].max())
        log_prob = logps[chunk, :chunk_width]
        loss, _ = policy_loss(
            old_log_prob=log_prob.detach(),
            log_prob=log_prob,
            advantages=advantages[chunk, None].expand(-1, chunk_width),
            response_mask=mask[chunk, :chunk_width],
            loss_agg_mode=mode,
            config=actor,
        )
        total = total + loss
    (grad,) = torch.autograd.grad(total, thetas)
    return grad


@needs_v1
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "token-sum"])
def test_actor_loss_over_micro_batches_gives_count_independent_prompt_weights(
    sv, core_algos, actor_config, mode
):
    counts, lengths = [2, 4, 8, 6, 10], [2, 7, 3, 5, 4]

    def corrected(outcomes, prompt):
        return sera_opt.maxrl_advantages(outcomes, prompt)

    def uncorrected(outcomes, prompt):
        return sera_opt.maxrl_advantages(outcomes, prompt, multiplicity_correction=False)

    grad = actor_prompt_gradients(core_algos, actor_config, mode, counts, lengths, corrected)
    assert grad.abs().max() > 0
    torch.testing.assert_close(grad, grad[:1].expand_as(grad), rtol=1e-10, atol=1e-12)
    grad = actor_prompt_gradients(core_algos, actor_config, mode, counts, lengths, uncorrected)
    weights = grad.norm(dim=1) / grad[0].norm()
    torch.testing.assert_close(weights, torch.tensor(counts, dtype=torch.float64) / counts[0])


@needs_v1
def test_seq_mean_token_sum_norm_needs_a_constant_loss_scale_factor(sv, core_algos, actor_config):
    """Without loss_scale_factor each micro-batch divides by its own padded width (docs: set it)."""
    counts, lengths = [2, 4, 8, 6, 10], [2, 7, 3, 5, 4]

    def corrected(outcomes, prompt):
        return sera_opt.maxrl_advantages(outcomes, prompt)

    mode = "seq-mean-token-sum-norm"
    grad = actor_prompt_gradients(
        core_algos, actor_config, mode, counts, lengths, corrected, loss_scale_factor=7
    )
    torch.testing.assert_close(grad, grad[:1].expand_as(grad), rtol=1e-10, atol=1e-12)
    grad = actor_prompt_gradients(core_algos, actor_config, mode, counts, lengths, corrected)
    weights = grad.norm(dim=1) / grad.norm(dim=1).mean()
    assert float(weights.max() - weights.min()) > 0.05, weights


_ENGINE_SCRIPT = """
import json, logging, sys, traceback
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM
from sera_opt.integrations.trl_tiny import build_tokenizer

path = sys.argv[1]
tokenizer = build_tokenizer()
config = Qwen2Config(
    vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    tie_word_embeddings=False,
)
Qwen2ForCausalLM(config).save_pretrained(path)
tokenizer.save_pretrained(path)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
reached, error, frames, notices = [], None, [], []
handler = logging.Handler()
handler.emit = lambda record: notices.append(record.getMessage())
logging.getLogger("sera_opt.integrations.verl").addHandler(handler)
from verl.trainer.config import CheckpointConfig
from verl.utils.device import get_device_name
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
try:
    # sdpa: verl's default attention is flash_attention_2, which needs the flash-attn package.
    model = HFModelConfig(path=path, override_config={"attn_implementation": "sdpa"})
    engine = FSDPEngineWithLMHead(
        model, FSDPEngineConfig(strategy="fsdp2"), FSDPOptimizerConfig(lr=1e-3),
        CheckpointConfig(),
    )
    reached.append("engine built")
    engine.initialize()
    reached.append("engine initialized")
except Exception as exc:
    error = type(exc).__name__ + ": " + str(exc)
    frames = [(frame.filename, frame.name) for frame in traceback.extract_tb(exc.__traceback__)]
dist.destroy_process_group()
print(json.dumps({
    "device_name": get_device_name(), "reached": reached, "error": error, "frames": frames,
    "sera_notices": notices,
}))
"""


@pytest.mark.slow  # a fresh interpreter that imports verl and builds its actor engine
@requires_trl
def test_verls_actor_engine_on_cpu_patches_the_model_and_stops_at_cuda(sv, tmp_path):
    """How far verl's real FSDP actor engine gets on a CPU-only machine, with trl installed.

    It builds the model from a local checkpoint and runs apply_monkey_patch (through the
    fix, which warns once), then stops at its first CUDA call: verl 0.9.1 registers no
    CPU platform and falls back to 'nvidia' (docs/integrations/verl.md, "Where CPU stops").
    """
    import os
    import socket

    _value_head_missing_from_trl()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    report, stdout = _run_script(tmp_path, "engine.py", _ENGINE_SCRIPT, str(tmp_path / "model"),
                                 port)
    if report["reached"] == ["engine built", "engine initialized"]:
        pytest.fail("verl's engine initialised on CPU: go further, and update the docs' boundary")
    assert report["device_name"] == "cuda", report  # no GPU here, yet verl picks CUDA
    assert report["reached"] == ["engine built"], report
    functions = [name for _, name in report["frames"]]
    assert "_build_model_optimizer" in functions and "log_gpu_memory_usage" in functions, report
    assert any(f"torch{os.sep}cuda" in filename for filename, _ in report["frames"]), report
    # apply_monkey_patch ran inside verl's engine, through the fix, and returned.
    assert len(report["sera_notices"]) == 1, report
    assert "AutoModelForCausalLMWithValueHead" in report["sera_notices"][0]
    assert "Skipping monkey patch for Qwen2ForCausalLM" in stdout
