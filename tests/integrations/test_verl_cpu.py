"""verl end to end on CPU: whole verl 0.9.1 runs of a tiny Llama through sera_opt's modes.

Each run goes through verl's own entry (``main_ppo.run_ppo`` with the V1 task runner)
via :func:`sera_opt.integrations.verl_cpu.run`: Ray, an FSDP2 actor on gloo, the
transformers rollout, the reward, the advantages, the update and the weight sync. A
run takes about a minute on two cores; the module starts five.

The stock GRPO run needs all nine workarounds of :mod:`sera_opt.integrations.verl_cpu`:
without the platform, the engine registration, the gloo patch, the trl fix, the
logical GPUs or the rollout it cannot start; without the single TransferQueue storage
unit the tight logical CPU budget leaves a storage unit unplaced, which the watchdog
reports (``test_a_resource_wait_fails_with_the_resource_named`` shows that message);
without the weight sync or in bf16 the rollout's log-probabilities drift from the
actor's, which the run checks.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import numpy as np
import pytest

from tests.markers import requires_verl

pytestmark = [pytest.mark.verl, requires_verl]

MEAN_COUNT = 4  # actor_rollout_ref.rollout.n of every run here
NUM_PROMPTS = 4  # data.train_batch_size: every step sees the same four prompts


@pytest.fixture(scope="module")
def vc():
    from sera_opt.integrations import verl_cpu

    return verl_cpu


def _children() -> dict[int, float]:
    """This process's live descendants, pid to creation time (a pid can be reused)."""
    import psutil

    alive = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                alive[child.pid] = child.create_time()
        except psutil.NoSuchProcess:
            pass
    return alive


def _no_processes_left(before: dict[int, float], timeout: float = 30.0) -> list[int]:
    """The descendants started since ``before`` (those of the run: not, e.g., a kernel
    compile an earlier test started in the background) still alive after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, created in _children().items() if before.get(pid) != created]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _train(vc, folder, extra=(), *, steps=2, mode="sync", record=None, **kwargs):
    """One CPU run; Ray is down and no process of it is left afterwards, pass or fail."""
    import ray

    overrides = vc.cpu_overrides(folder, mode=mode, steps=steps) + list(extra)
    before = _children()
    try:
        vc.run(overrides, record_dir=record, **kwargs)
    finally:
        assert not ray.is_initialized(), "the run left Ray running"
        left = _no_processes_left(before)
        assert not left, f"the run left processes behind: {left}"


def _metrics(record) -> dict[int, dict]:
    with open(os.path.join(record, "metrics.jsonl")) as handle:
        return {row["step"]: row["data"] for row in map(json.loads, handle)}


def _batch(record, step):
    import torch

    return torch.load(os.path.join(record, f"step_{step}.pt"), weights_only=False)


def _response_advantages(batch) -> np.ndarray:
    """The one advantage of each response, checked constant over its response tokens."""
    values = []
    for advantage, mask in zip(batch["advantages"], batch["response_mask"], strict=True):
        tokens = advantage[mask.bool()].double().numpy()
        assert tokens.size, "a response without tokens"
        np.testing.assert_allclose(tokens, tokens[0], rtol=0, atol=1e-6,
                                   err_msg="an advantage that varies over a response")
        values.append(tokens[0])
    return np.asarray(values)


def _counts(batch) -> list[int]:
    return sorted(Counter(batch["uids"]).values())


@pytest.fixture(scope="module")
def setup(vc, tmp_path_factory):
    return vc.build_tiny_setup(tmp_path_factory.mktemp("verl_cpu_setup"), num_prompts=NUM_PROMPTS)


def _fresh(setup, tmp_path):
    """A run folder sharing the module's model and data, with its own checkpoints."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("model", "train.parquet", "val.parquet"):
        os.symlink(os.path.join(setup, name), folder / name)
    return str(folder)


# --------------------------------------------------------------------------- each workaround


def test_each_workaround_is_registered_on_import(vc):
    """The platform, the engines, the gloo patch and both rollout registries (barriers 1-3, 7)."""
    from verl.plugin.platform import PlatformRegistry
    from verl.workers import engine_workers
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    assert PlatformRegistry.get("cpu") is vc.PlatformCPU
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry._engines["language_model"][backend]["cpu"] is FSDPEngineWithLMHead
    assert engine_workers.initialize_global_process_group_ray is vc._gloo_process_group
    assert RolloutReplicaRegistry.get("hf") is vc.HFRolloutReplica
    assert get_rollout_class("hf", "async") is vc.HFServerAdapter
    vc.apply()  # idempotent
    assert engine_workers.initialize_global_process_group_ray is vc._gloo_process_group
    # Importing the module leaves a GPU machine's detection alone: only VERL_PLATFORM picks it.
    assert not vc.PlatformCPU().is_platform_available(use_smi_check=True)


def test_the_cpu_platform_answers_what_verl_calls(vc, monkeypatch):
    """verl's device helpers, memory logging and FLOPs estimate on the CPU platform."""
    from verl.utils import device, distributed, flops_counter

    with vc.cpu_platform():
        assert device.get_device_name() == "cpu"
        assert device.get_device_id() == "cpu"  # verl moves tensors with .to(get_device_id())
        module = device.get_torch_device()
        module.empty_cache()
        module.synchronize()
        assert module.max_memory_allocated() == 0 and module.max_memory_reserved() == 0
        free, total = module.mem_get_info()
        assert 0 < free <= total
        assert flops_counter.get_device_flops() > 0  # utils/flops_counter.py 80
        captured = {}
        monkeypatch.setattr(distributed, "initialize_global_process_group_ray",
                            lambda timeout_second=None, backend=None: captured.update(b=backend))
        vc._gloo_process_group()
        assert captured["b"] == "gloo"  # not verl's "cpu:gloo,cpu:gloo"
    assert device.get_device_name() != "cpu", "cpu_platform() did not restore the platform"


def test_other_verl_releases_are_refused(vc, monkeypatch):
    from sera_opt.exceptions import SeraOptError, SeraOptWarning

    monkeypatch.delenv("SERA_OPT_ALLOW_UNTESTED_VERSIONS", raising=False)
    for version in ("0.9.0", "0.9.10", "0.10.0"):
        monkeypatch.setattr(vc.verl, "__version__", version)
        with pytest.raises(SeraOptError, match=rf"verl_cpu supports verl 0\.9\.1.*{version}"):
            vc._check_verl_version()
    monkeypatch.setenv("SERA_OPT_ALLOW_UNTESTED_VERSIONS", "1")
    with pytest.warns(SeraOptWarning, match="running anyway"):
        vc._check_verl_version()
    monkeypatch.delenv("SERA_OPT_ALLOW_UNTESTED_VERSIONS")
    for version in ("0.9.1", "0.9.1+cpu"):
        monkeypatch.setattr(vc.verl, "__version__", version)
        vc._check_verl_version()


def test_cpu_overrides_carry_the_configuration_barriers(vc, tmp_path):
    """Barriers 5, 6 and 9 are configuration: the overrides hold each one."""
    overrides = vc.cpu_overrides(tmp_path, ranks=2)
    for expected in (
        "trainer.device=cpu",
        "ray_kwargs.ray_init.num_cpus=11",
        "+ray_kwargs.ray_init.num_gpus=2",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    ):
        assert expected in overrides, expected
    vc.build_tiny_model(tmp_path / "model")
    config = vc.compose(vc.cpu_overrides(tmp_path))
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_PLATFORM == "cpu"
    assert "sera_opt.integrations.verl_cpu" in env.VERL_USE_EXTERNAL_MODULES.split(",")


def test_the_rollout_server_generates_and_takes_weights(vc, setup):
    """The server outside Ray: verl's generate signature, the weight update, the refusals."""
    import asyncio

    import torch

    from sera_opt.exceptions import SeraOptError

    config = vc.compose(vc.cpu_overrides(setup))
    server = vc.HFRolloutServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(setup, "model"))
    prompt = tokenizer.encode("3+4=", add_special_tokens=False)
    assert tokenizer.decode(prompt) == "3+4=" and len(prompt) == 4  # one token a character
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    output = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=params, request_id="a"))
    assert 1 <= len(output.token_ids) <= config.actor_rollout_ref.rollout.response_length
    assert len(output.log_probs) == len(output.token_ids)
    assert all(value <= 0 for value in output.log_probs)
    assert output.stop_reason in ("completed", "length")
    # The weights the adapter sends replace the server's: zeroed logits, uniform sampling.
    weights = {name: torch.zeros_like(tensor) for name, tensor in server.model.state_dict().items()}
    assert asyncio.run(server.update_weights(weights, global_steps=3)) == len(weights)
    output = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=params, request_id="b"))
    vocabulary = server.model.config.vocab_size
    np.testing.assert_allclose(output.log_probs, -np.log(vocabulary), rtol=1e-6)
    assert output.extra_fields["global_steps"] == 3
    with pytest.raises(SeraOptError, match="does not have"):
        asyncio.run(server.update_weights({"no.such.weight": torch.zeros(1)}))
    with pytest.raises(SeraOptError, match="not top_p=0.5"):
        asyncio.run(server.generate(prompt_ids=prompt, sampling_params={**params, "top_p": 0.5},
                                    request_id="c"))
    (failure,) = asyncio.run(server.errors())
    assert "Traceback" in failure and "top_p=0.5" in failure


def test_the_benchmark_splits_the_step_after_the_first(vc):
    from sera_opt.benchmarks import verl as bench

    def step(scale):
        row = {f"timing_s/{phase}": scale for phase in bench.PHASES}
        row["timing_s/step"] = 10 * scale
        row.update({f"sera_timing_s/{name}": scale / 10 for name in vc.SERA_TIMERS})
        return row

    split = bench.split({1: step(100.0), 2: step(1.0), 3: step(3.0)})
    assert split["gen"] == 2.0 and split["step"] == 20.0  # median of steps 2 and 3
    assert split["sera_opt"] == pytest.approx(0.6)
    assert split["sera_opt_share"] == pytest.approx(0.03)


# --------------------------------------------------------------------------- stock GRPO


def test_stock_grpo_trains_on_cpu(vc, setup, tmp_path):
    """verl's own GRPO, two steps; the rollout serves the weights the actor trained."""
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    record = str(tmp_path / "record")
    _train(vc, _fresh(setup, tmp_path), record=record)
    metrics = _metrics(record)
    assert sorted(metrics) == [1, 2]
    for step, data in metrics.items():
        for timer in ("gen", "old_log_prob", "update_actor", "update_weights"):
            assert data[f"timing_s/{timer}"] > 0, (step, timer)
        # The server's log-probabilities equal the actor's in fp32 only when the naive
        # weight sync after step 1 reached it (bf16 gives about 1e-3).
        assert data["training/rollout_probs_diff_max"] < 1e-5, (step, data)
    for step in (1, 2):
        batch = _batch(record, step)
        assert _counts(batch) == [MEAN_COUNT] * NUM_PROMPTS
        index = np.array(batch["uids"], dtype=object)
        lengths = [int(mask.sum()) for mask in batch["response_mask"]]
        mask = torch.zeros(len(lengths), max(lengths))
        scores = torch.zeros_like(mask)
        for row, length in enumerate(lengths):
            mask[row, :length] = 1
            scores[row, length - 1] = batch["scores"][row]
        expected, _ = compute_grpo_outcome_advantage(scores, mask, index)
        np.testing.assert_allclose(_response_advantages(batch), expected[:, 0].numpy(),
                                   atol=1e-5)


# --------------------------------------------------------------------------- sera_sync


@pytest.fixture(scope="module")
def sera_run(vc, setup, tmp_path_factory):
    """``sera_sync`` with the MaxRL estimator and SERA's counts, saved after each step."""
    tmp_path = tmp_path_factory.mktemp("sera_sync")
    folder = _fresh(setup, tmp_path)
    record = str(tmp_path / "record")
    extra = [
        "algorithm.adv_estimator=sera_maxrl",
        "+algorithm.sera_maxrl.policy=sera",
        "trainer.save_freq=1",
    ]
    _train(vc, folder, extra, mode="sera_sync", record=record)
    return {"folder": folder, "record": record, "extra": extra}


def test_sera_sync_plans_heterogeneous_counts(sera_run):
    metrics = _metrics(sera_run["record"])
    first, second = _batch(sera_run["record"], 1), _batch(sera_run["record"], 2)
    # No history before step 1: SERA gives every prompt the mean count.
    assert _counts(first) == [MEAN_COUNT] * NUM_PROMPTS
    # Step 1's outcomes differ between prompts, so step 2's counts do, on the same budget.
    counts = _counts(second)
    assert sum(counts) == MEAN_COUNT * NUM_PROMPTS and len(set(counts)) > 1, counts
    assert metrics[2]["sera/planned_min_count"] == counts[0]
    assert metrics[2]["sera/planned_max_count"] == counts[-1]
    assert metrics[2]["sera/observed_rollouts"] == MEAN_COUNT * NUM_PROMPTS


def test_two_fsdp_ranks_on_gloo_train_sera_sync(vc, setup, tmp_path):
    """Two FSDP ranks (two Ray actors on one gloo group) through ``sera_sync``: the same
    counts contract as one rank (the planned counts, the budget spent, every rollout
    observed), with the batch split between the ranks. A run costs
    about a minute more than one rank's on two cores (a second actor imports torch)."""
    record = str(tmp_path / "record")
    extra = ["algorithm.adv_estimator=sera_maxrl", "+algorithm.sera_maxrl.policy=sera"]
    overrides = vc.cpu_overrides(_fresh(setup, tmp_path), ranks=2, mode="sera_sync") + extra
    before = _children()
    try:
        vc.run(overrides, record_dir=record)
    finally:
        left = _no_processes_left(before)
        assert not left, f"the run left processes behind: {left}"
    metrics = _metrics(record)
    assert sorted(metrics) == [1, 2]
    # The counts are the planner's and the budget is spent; whether step 1's outcomes make
    # them unequal depends on the draws, which two ranks do not fix.
    for step in (1, 2):
        counts = _counts(_batch(record, step))
        assert sum(counts) == MEAN_COUNT * NUM_PROMPTS, (step, counts)
        assert metrics[step]["sera/planned_min_count"] == counts[0], (step, counts)
        assert metrics[step]["sera/planned_max_count"] == counts[-1], (step, counts)
        assert metrics[step]["sera/observed_rollouts"] == MEAN_COUNT * NUM_PROMPTS
    for data in metrics.values():
        assert data["timing_s/update_actor"] > 0
        assert data["training/rollout_probs_diff_max"] < 1e-5, data


def test_maxrl_advantages_in_the_trainer_batch_equal_sera_opt(sera_run):
    """The advantages verl's trainer holds are sera_opt.maxrl_advantages of the same batch."""
    import torch

    import sera_opt
    from sera_opt.integrations import verl as sv

    for step in (1, 2):
        batch = _batch(sera_run["record"], step)
        codes, num_prompts = sv.prompt_codes(batch["uids"])
        rewards = batch["scores"].double()
        expected = sera_opt.maxrl_advantages(
            rewards, torch.as_tensor(codes), num_prompts=num_prompts
        ).numpy()
        np.testing.assert_allclose(_response_advantages(batch), expected, atol=1e-6,
                                   err_msg=f"step {step}")
    # Step 2's counts differ, so the multiplicity correction is what the batch shows.
    uncorrected = sera_opt.maxrl_advantages(
        rewards, torch.as_tensor(codes), num_prompts=num_prompts, multiplicity_correction=False
    ).numpy()
    assert not np.allclose(uncorrected, expected, atol=1e-6)


def test_checkpoint_resumes_with_the_planner_state(vc, sera_run):
    """Resumed after step 1, step 2 is planned from the saved planner, not an empty one."""
    from sera_opt.integrations import _common
    from sera_opt.integrations import verl as sv

    saved = os.path.join(sera_run["folder"], "checkpoints", "global_step_1")
    assert os.path.isfile(os.path.join(saved, sv.PLANNER_STATE_FILE))
    reference = sv.build_planner(sv.SeraMaxRLConfig(policy="sera"), MEAN_COUNT)
    assert _common.load_planner(reference, saved) is not None
    expected = reference.plan(list(range(NUM_PROMPTS)), MEAN_COUNT * NUM_PROMPTS).counts
    # A planner without history would give the mean count to every prompt.
    assert len(set(expected.tolist())) > 1, expected
    original = _batch(sera_run["record"], 2)
    assert Counter(original["prompt_ids"]) == dict(enumerate(expected.tolist()))

    record = sera_run["record"] + "_resumed"
    resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={saved}"]
    _train(vc, sera_run["folder"], sera_run["extra"] + resume, mode="sera_sync", record=record)
    assert sorted(_metrics(record)) == [2], "the run did not resume after step 1"
    resumed = _batch(record, 2)
    assert Counter(resumed["prompt_ids"]) == dict(enumerate(expected.tolist()))


# --------------------------------------------------------------------------- loud failures


def test_a_resource_wait_fails_with_the_resource_named(vc, setup, tmp_path):
    """TransferQueue's default 8 storage units cannot be placed: an error, not a hang."""
    from sera_opt.exceptions import SeraOptError

    start = time.monotonic()
    with pytest.raises(SeraOptError, match=r"SimpleStorageUnit.*; the cluster has 0 of \d+ CPU"):
        _train(vc, _fresh(setup, tmp_path),
               ["transfer_queue.backend.SimpleStorage.num_data_storage_units=8"],
               hang_timeout=10)
    assert time.monotonic() - start < 240


def test_a_rollout_error_surfaces_with_its_traceback(vc, setup, tmp_path):
    """verl logs a failed session in its agent-loop worker; the run raises the server's error."""
    from sera_opt.exceptions import SeraOptError

    with pytest.raises(SeraOptError) as caught:
        _train(vc, _fresh(setup, tmp_path), ["actor_rollout_ref.rollout.top_p=0.5"], steps=1)
    message = str(caught.value)
    assert "Traceback (most recent call last)" in message
    assert "not top_p=0.5" in message and "_check_sampling_params" in message


# --------------------------------------------------------------------------- the authors' SERA


def test_sera_sync_with_the_authors_sera_switches_prompts_off(vc, setup, tmp_path):
    """``sera-paper`` in ``sera_sync``: prompts switched off, the step's rows fixed at M x n.

    Prompt 0's ground truth is empty (every response contains it) and prompt 1's is a
    character outside the vocabulary (no response does), so after the first epoch
    (one step: the data set is one batch) the authors' rule sees one prompt too easy
    and one too hard. Their threshold of 0.05 on the chance of a mixed group at the
    cap would need hundreds of outcomes to switch a prompt off; 0.9 does it after 4.
    """
    import pandas as pd

    from sera_opt.integrations import verl as sv

    folder = tmp_path / "run"
    folder.mkdir()
    os.symlink(os.path.join(setup, "model"), folder / "model")
    frame = pd.read_parquet(os.path.join(setup, "train.parquet"))
    answers = ["", "?"] + [row["ground_truth"] for row in frame["reward_model"][2:]]
    frame["reward_model"] = [{"style": "rule", "ground_truth": answer} for answer in answers]
    for name in ("train.parquet", "val.parquet"):
        frame.to_parquet(folder / name)
    record = str(tmp_path / "record")
    options = {"policy": "sera-paper", "policy_options": {"active_threshold": 0.9}}
    extra = [
        "algorithm.adv_estimator=sera_maxrl",
        "+algorithm.sera_maxrl.policy=sera-paper",
        "+algorithm.sera_maxrl.policy_options.active_threshold=0.9",
    ]
    _train(vc, str(folder), extra, mode="sera_sync", record=record)
    metrics = _metrics(record)
    first, second = _batch(record, 1), _batch(record, 2)
    budget = MEAN_COUNT * NUM_PROMPTS
    for batch in (first, second):
        assert len(batch["uids"]) == budget, "the step's row count moved"
    # Cold start: the whole first batch is uniform.
    assert Counter(first["prompt_ids"]) == dict.fromkeys(range(NUM_PROMPTS), MEAN_COUNT)
    # Step 2 applies the plan the authors' planner makes from step 1's outcomes.
    reference = sv.build_planner(sv.SeraMaxRLConfig(**options), MEAN_COUNT)
    reference.plan(list(range(NUM_PROMPTS)), budget)
    reference.observe(first["prompt_ids"], first["scores"].double().numpy())
    reference.end_epoch()
    plan = reference.plan(list(range(NUM_PROMPTS)), budget)
    assert plan.counts[0] == 0 and plan.counts[1] == 0, plan.counts
    applied = Counter(second["prompt_ids"])
    assert [applied.get(prompt, 0) for prompt in range(NUM_PROMPTS)] == plan.counts.tolist()
    assert metrics[2]["sera/active_prompts"] == plan.num_active
    # The estimator keeps N0 / n_i weights: nbar is the budget over all M prompts.
    import torch

    import sera_opt

    codes, num_prompts = sv.prompt_codes(second["uids"])
    expected = sera_opt.maxrl_advantages(
        second["scores"].double(), torch.as_tensor(codes), num_prompts=num_prompts,
        mean_count=MEAN_COUNT,
    ).numpy()
    np.testing.assert_allclose(_response_advantages(second), expected, atol=1e-6)
