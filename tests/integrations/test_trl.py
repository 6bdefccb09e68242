"""SeraGRPOTrainer (trl 1.16) on CPU, offline, with a 2-layer GPT-2 and a character-level tokenizer.

The trainer's static step (``rounds=1``: the whole plan in one generation call); its default, a step in
rounds, is tested in test_trl_rounds.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections import Counter  # noqa: E402
from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tests.markers import has_module, requires_trl  # noqa: E402

pytestmark = [requires_trl, pytest.mark.trl]

if has_module("trl"):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import sera_opt
    from sera_opt import checked_state
    from sera_opt.exceptions import SeraOptError, SeraOptWarning
    from sera_opt.integrations.trl import (
        LOSS_TYPE_TO_MODE,
        PLANNER_STATE_FILE,
        SeraGRPOTrainer,
        check_grpo_config,
        default_planner,
        loss_mode,
        stable_prompt_id,
    )
    from sera_opt.integrations.trl_tiny import (
        build_tiny_model,
        build_tokenizer,
        copy_digit_reward,
        make_prompts,
    )

    class _RecordingTrainer(SeraGRPOTrainer):
        """Keeps the advantages the trainer hands to TRL's loss, in row order."""

        def __init__(self, *args, **kwargs):
            self.recorded_advantages = []
            super().__init__(*args, **kwargs)

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.recorded_advantages.append(output["advantages"].detach().clone())
            return output


NUM_PROMPTS = 4
NUM_GENERATIONS = 4
ROWS = NUM_PROMPTS * NUM_GENERATIONS


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(NUM_PROMPTS, seed=1)


def _dataset(prompts):
    return Dataset.from_dict({"prompt": prompts, "prompt_id": list(range(len(prompts)))})


def _config(tmp_path, **overrides):
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        seed=0,
        num_generations=NUM_GENERATIONS,
        per_device_train_batch_size=ROWS,
        max_completion_length=4,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    options.update(overrides)
    return GRPOConfig(**options)


def _seeded_planner():
    """A SERA planner that has already seen the 4 prompts with very different success rates."""
    planner = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=10, offset=1)
    history = {0: [0] * 8, 1: [1] + [0] * 7, 2: [1, 0] * 4, 3: [1] * 7 + [0]}
    ids = [prompt_id for prompt_id, outcomes in history.items() for _ in outcomes]
    outcomes = [value for values in history.values() for value in values]
    planner.observe(ids, np.asarray(outcomes, dtype=float))
    return planner


class _RewardRecorder:
    """Reward function that records every call (prompts and rewards, in row order)."""

    __name__ = "copy_digit"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        rewards = copy_digit_reward(prompts, completions)
        self.calls.append(
            {"prompts": list(prompts), "completions": list(completions), "rewards": rewards}
        )
        return rewards


def _assert_nested_equal(left, right, path="state"):
    if isinstance(left, dict):
        assert isinstance(right, dict) and left.keys() == right.keys(), f"{path}: keys differ"
        for key in left:
            _assert_nested_equal(left[key], right[key], f"{path}[{key!r}]")
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right), f"{path}: lengths differ"
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            _assert_nested_equal(a, b, f"{path}[{index}]")
    elif isinstance(left, (np.ndarray, torch.Tensor)):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right), err_msg=path)
    else:
        assert left == right or (left != left and right != right), f"{path}: {left!r} != {right!r}"


# --------------------------------------------------------------------------- the loss-type table


def test_loss_type_table_matches_trl_gradients(tmp_path, tokenizer, prompts):
    """Every loss_type's on-policy gradient is aggregate_loss(-A log pi, mask, mode) of the table."""
    model = build_tiny_model(tokenizer)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=copy_digit_reward,
        args=_config(
            tmp_path, max_completion_length=6, num_generations=2, per_device_train_batch_size=4
        ),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
    )
    trainer.model.eval()  # no dropout, and TRL's normalisers without gradient accumulation
    generator = torch.Generator().manual_seed(0)
    batch, prompt_length, completion_length = 5, 3, 6
    prompt_ids = torch.randint(2, len(tokenizer), (batch, prompt_length), generator=generator)
    completion_ids = torch.randint(
        2, len(tokenizer), (batch, completion_length), generator=generator
    )
    lengths = torch.tensor([6, 1, 3, 4, 2])
    completion_mask = (torch.arange(completion_length)[None, :] < lengths[:, None]).long()
    advantages = torch.randn(batch, generator=generator)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
    }
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([prompt_ids, completion_ids], dim=1),
        torch.cat([torch.ones_like(prompt_ids), completion_mask], dim=1),
        completion_length,
    )
    checked = []
    for loss_type, mode in sorted(LOSS_TYPE_TO_MODE.items()):
        for level in ("token", "sequence"):
            trainer.loss_type = loss_type
            trainer.importance_sampling_level = level
            # cispo multiplies by min(ratio, epsilon_high); trl recommends epsilon_high=5 for it.
            trainer.epsilon_high = 5.0 if loss_type == "cispo" else 0.2
            trl_grads = torch.autograd.grad(trainer._compute_loss(trainer.model, inputs), params)
            reference = sera_opt.aggregate_loss(-advantages[:, None] * logps, completion_mask, mode)
            if (
                loss_type == "dr_grpo"
            ):  # divides by sequences x max_completion_length instead of sequences
                reference = reference / trainer.max_completion_length
            reference_grads = torch.autograd.grad(reference, params, retain_graph=True)
            for trl_grad, reference_grad in zip(trl_grads, reference_grads, strict=True):
                label = f"{loss_type}/{level}"
                torch.testing.assert_close(
                    trl_grad,
                    reference_grad,
                    rtol=1e-4,
                    atol=1e-7,
                    msg=lambda m, label=label: f"{label}: {m}",
                )
            checked.append((loss_type, level))
    assert len(checked) == 2 * len(LOSS_TYPE_TO_MODE)


def test_loss_mode_rejects_unknown_loss_type():
    with pytest.raises(SeraOptError, match="loss_type"):
        loss_mode("ppo")
    assert loss_mode("dapo") == "token-mean"


def test_stable_prompt_id_is_deterministic_and_distinguishes_prompts():
    assert stable_prompt_id("12:") == stable_prompt_id("12:")
    assert stable_prompt_id("12:") != stable_prompt_id("21:")
    conversation = [{"role": "user", "content": "hi"}]
    assert stable_prompt_id(conversation) == stable_prompt_id([{"content": "hi", "role": "user"}])
    assert 0 <= stable_prompt_id(conversation) < 2**63


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer, prompts):
    """Three optimizer steps of SeraGRPOTrainer, with a checkpoint after the third."""
    output_dir = tmp_path_factory.mktemp("sera_grpo")
    recorder = _RewardRecorder()
    model = build_tiny_model(tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _RecordingTrainer(
        model=model,
        reward_funcs=recorder,
        args=_config(output_dir, save_strategy="steps", save_steps=3),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_seeded_planner(),
        rounds=1,  # the static trainer; the default (rounds) is tested in test_trl_rounds.py
    )
    trainer.train()
    return {"trainer": trainer, "recorder": recorder, "before": before, "output_dir": output_dir}


def test_three_optimizer_steps_ran(trained):
    trainer = trained["trainer"]
    assert trainer.state.global_step == 3
    assert len(trained["recorder"].calls) == 3
    assert len(trainer.sera_history) == 3
    changed = [
        not torch.equal(a, b.detach())
        for a, b in zip(trained["before"], trainer.model.parameters())
    ]
    assert any(changed), "no parameter moved"
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_completions_per_prompt_equal_allocated_counts(trained, prompts):
    trainer, recorder = trained["trainer"], trained["recorder"]
    saw_unequal_counts = False
    for record, call in zip(trainer.sera_history, recorder.calls, strict=True):
        allocated = dict(zip(record["prompt_ids"], record["allocated_counts"], strict=True))
        assert sum(allocated.values()) == ROWS
        # Counted independently, from the completions the reward function was given.
        seen = Counter(call["prompts"])
        assert {prompts.index(text): count for text, count in seen.items()} == allocated
        assert record["generated_counts"] == record["allocated_counts"]
        # Rows of one prompt are contiguous, in the planned order.
        expected_rows = [prompts[i] for i, n in allocated.items() for _ in range(n)]
        assert call["prompts"] == expected_rows
        saw_unequal_counts |= len(set(record["allocated_counts"])) > 1
    assert saw_unequal_counts, "the seeded planner should allocate unequal counts"


def test_advantages_equal_maxrl_advantages_on_the_same_rewards(trained):
    trainer, recorder = trained["trainer"], trained["recorder"]
    for advantages, call in zip(trainer.recorded_advantages, recorder.calls, strict=True):
        texts = call["prompts"]
        index = torch.tensor([sorted(set(texts), key=texts.index).index(text) for text in texts])
        rewards = torch.tensor(call["rewards"], dtype=torch.float32)
        expected = sera_opt.maxrl_advantages(
            rewards, index, estimator="mean_centred", multiplicity_correction=True
        )
        torch.testing.assert_close(advantages, expected.to(advantages.dtype))
    assert any(bool((a != 0).any()) for a in trainer.recorded_advantages), (
        "every advantage was zero"
    )


def test_diagnostics_are_logged_with_the_trainer_metrics(trained):
    logged = [entry for entry in trained["trainer"].state.log_history if "loss" in entry]
    for entry in logged:
        for key in ("sera/min_factor", "sera/alignment_proxy", "sera/count_min", "sera/count_max"):
            assert key in entry, f"{key} missing from {sorted(entry)}"
        assert entry["sera/num_rollouts"] == ROWS
        assert entry["sera/num_prompts"] == NUM_PROMPTS


def test_zero_spread_fraction_is_that_of_the_planned_groups(trained):
    """TRL's frac_reward_zero_std assumes groups of num_generations; the logged value is the real groups'."""
    logged = [entry for entry in trained["trainer"].state.log_history if "loss" in entry]
    assert len(logged) == len(trained["recorder"].calls) == 3
    for entry, call in zip(logged, trained["recorder"].calls, strict=True):
        by_prompt = {}
        for text, reward in zip(call["prompts"], call["rewards"], strict=True):
            by_prompt.setdefault(text, []).append(reward)
        zero_spread_rows = sum(len(r) for r in by_prompt.values() if len(set(r)) == 1)
        assert entry["frac_reward_zero_std"] == pytest.approx(
            zero_spread_rows / len(call["rewards"])
        )


def _resuming_trainer(trained, tokenizer, prompts, planner):
    """A fresh trainer on the trained run's folder, one step past its checkpoint."""
    return SeraGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=copy_digit_reward,
        args=_config(trained["output_dir"], max_steps=4),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=planner,
        rounds=1,
    )


def test_planner_state_is_saved_and_restored(trained, tokenizer, prompts):
    trainer = trained["trainer"]
    checkpoint = trained["output_dir"] / "checkpoint-3"
    path = checkpoint / PLANNER_STATE_FILE
    assert path.exists()
    saved = checked_state.unseal(torch.load(path, weights_only=False), source=str(path))
    _assert_nested_equal(saved, trainer.sera_planner.state_dict())

    fresh_planner = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=10, offset=1)
    resumed = _resuming_trainer(trained, tokenizer, prompts, fresh_planner)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4
    # The resumed planner started from the checkpoint and observed one more batch.
    first = resumed.sera_history[0]
    estimates_before = np.asarray(trainer.sera_planner.tracker.estimate(first["prompt_ids"]))
    replay = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=10, offset=1)
    replay.load_state_dict(saved)
    np.testing.assert_allclose(
        np.asarray(replay.tracker.estimate(first["prompt_ids"])), estimates_before
    )
    replay.observe(
        np.repeat(first["prompt_ids"], first["allocated_counts"]).tolist(),
        np.asarray(first["rewards"]),
    )
    _assert_nested_equal(replay.state_dict(), resumed.sera_planner.state_dict())


def test_resume_with_a_planner_of_another_configuration_is_refused(trained, tokenizer, prompts):
    """The trainer resumes with the planner it is given or says why it cannot: never with the
    checkpoint's policy in place of the one passed."""
    checkpoint = trained["output_dir"] / "checkpoint-3"
    other = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, min_rollouts=2, max_rollouts=10)
    resumed = _resuming_trainer(trained, tokenizer, prompts, other)
    with pytest.raises(SeraOptError, match="another planner configuration.*sera-fair"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert other.policy.name == "sera-fair"


def test_evaluation_uses_maxrl_advantages_on_uniform_groups(tmp_path, tokenizer, prompts):
    recorder = _RewardRecorder()
    trainer = _RecordingTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=recorder,
        args=_config(tmp_path, per_device_eval_batch_size=8, num_generations_eval=2),
        train_dataset=_dataset(prompts),
        eval_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_seeded_planner(),
    )
    metrics = trainer.evaluate()
    assert np.isfinite(metrics["eval_loss"])
    assert metrics["eval_sera/num_rollouts"] == 8 and metrics["eval_sera/num_prompts"] == 4
    assert len(trainer.sera_history) == 0, "evaluation must not plan or observe"
    call = recorder.calls[-1]
    index = torch.arange(len(call["rewards"])) // 2
    expected = sera_opt.maxrl_advantages(torch.tensor(call["rewards"]), index)
    torch.testing.assert_close(trainer.recorded_advantages[-1], expected)


# ----------------------------------------------------------------------- vLLM server mode


class _FakeVLLMClient:
    """Stands in for trl's VLLMClient: records each request and returns random completions."""

    def __init__(self, eos_token_id, vocab_size):
        self.requests = []
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size
        self.generator = np.random.default_rng(0)

    def generate(self, prompts, features=None, n=1, **sampling_params):
        self.requests.append({"prompts": [list(p) for p in prompts], "n": n})
        completion_ids = []
        for _ in prompts:
            for _ in range(n):
                length = int(self.generator.integers(1, 4))
                tokens = self.generator.integers(2, self.vocab_size, size=length).tolist()
                completion_ids.append([*tokens, self.eos_token_id])
        logprobs = [[[-1.0] for _ in ids] for ids in completion_ids]
        return {"prompt_ids": prompts, "completion_ids": completion_ids, "logprobs": logprobs}


def fake_vllm_server_trainer(tmp_path, tokenizer, prompts, **options):
    """A SeraGRPOTrainer on TRL's own vLLM server-mode path, with the HTTP client replaced
    by a recording fake; returns the trainer and the client."""
    from trl.generation.vllm_generation import VLLMGeneration

    trainer = SeraGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=copy_digit_reward,
        args=_config(tmp_path),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_seeded_planner(),
        **{"rounds": 1, **options},
    )
    client = _FakeVLLMClient(tokenizer.eos_token_id, len(tokenizer))
    # TRL's own server-mode code path, with the HTTP client replaced.
    generation = VLLMGeneration.__new__(VLLMGeneration)
    generation.__dict__.update(
        mode="server",
        accelerator=trainer.accelerator,
        vllm_client=client,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        max_completion_length=4,
        logprobs=0,
        structured_outputs_regex=None,
        generation_kwargs={},
        enable_sleep_mode=False,
    )
    generation.sync_weights = lambda: None
    trainer.use_vllm = True
    trainer.vllm_generation = generation
    trainer.vllm_importance_sampling_correction = False
    trainer._last_loaded_step = -1
    trainer.model.train()
    return trainer, client


def test_vllm_server_mode_sends_one_request_per_planned_row(tmp_path, tokenizer, prompts):
    trainer, client = fake_vllm_server_trainer(tmp_path, tokenizer, prompts)
    rows = [
        {"prompt": text, "prompt_id": i}
        for i, text in enumerate(prompts)
        for _ in range(NUM_GENERATIONS)
    ]
    output = trainer._generate_and_score_completions(rows)

    record = trainer.sera_history[-1]
    assert len(client.requests) == 1
    request = client.requests[0]
    assert request["n"] == 1, "server mode must ask for one completion per row"
    assert len(request["prompts"]) == ROWS
    token_counts = Counter(tuple(p) for p in request["prompts"])
    expected = {
        tuple(tokenizer(prompts[i])["input_ids"]): n
        for i, n in zip(record["prompt_ids"], record["allocated_counts"], strict=True)
    }
    assert dict(token_counts) == expected
    assert len(set(record["allocated_counts"])) > 1
    assert record["generated_counts"] == record["allocated_counts"]
    assert output["advantages"].shape == (ROWS,)


# ------------------------------------------------------------------------ two processes

_DDP_SCRIPT = """
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np, torch
torch.set_num_threads(1)
import sera_opt
from datasets import Dataset
from trl import GRPOConfig
from sera_opt.integrations.trl_tiny import build_tiny_model, build_tokenizer, copy_digit_reward, make_prompts
from sera_opt.integrations.trl import SeraGRPOTrainer

calls = []
def reward(prompts, completions, **kwargs):
    rewards = copy_digit_reward(prompts, completions)
    calls.append({"prompts": list(prompts), "rewards": rewards})
    return rewards

class Recording(SeraGRPOTrainer):
    def __init__(self, *args, **kwargs):
        self.advantages = []
        super().__init__(*args, **kwargs)
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.advantages.append(output["advantages"].tolist())
        return output

tokenizer = build_tokenizer()
prompts = make_prompts(8, seed=1)
planner = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
planner.observe([0] * 6 + [1] * 6, [0] * 6 + [1] * 6)
config = GRPOConfig(output_dir=sys.argv[1], use_cpu=True, bf16=False, report_to="none", num_generations=4,
                    per_device_train_batch_size=8, max_completion_length=4, max_steps=2, logging_steps=1,
                    save_strategy="no", disable_tqdm=True, learning_rate=1e-2, dataloader_num_workers=0)
trainer = Recording(model=build_tiny_model(tokenizer), reward_funcs=reward, args=config,
                    train_dataset=Dataset.from_dict({"prompt": prompts, "prompt_id": list(range(8))}),
                    processing_class=tokenizer, planner=planner,
                    rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 1)
trainer.train()
state = trainer.sera_planner.state_dict()["tracker"]
rank = trainer.accelerator.process_index
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as handle:
    json.dump({"calls": calls, "advantages": trainer.advantages, "history": list(trainer.sera_history),
               "tracker": {k: np.asarray(v).tolist() for k, v in state.items() if k in ("keys", "successes", "failures")},
               "log": [e for e in trainer.state.log_history if "loss" in e]}, handle)
# Tear the gloo process group down while both ranks are alive. Left to interpreter exit, its
# C++ threads are destroyed after Python has finished, and a rank can abort with
# "terminate called without an active exception" (accelerate: end_training() "should always
# be called at the end of your script").
trainer.accelerator.wait_for_everyone()
trainer.accelerator.end_training()
"""


@pytest.mark.slow
def test_two_processes_plan_locally_and_share_the_planner(tmp_path):
    """torchrun, 2 CPU processes (gloo): per-process counts honoured, global advantages, identical planners."""
    import json
    import shutil
    import subprocess

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH")
    script = tmp_path / "ddp_script.py"
    script.write_text(_DDP_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    completed = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["tracker"] == ranks[1]["tracker"], "the planners diverged across processes"
    for step in range(2):
        rewards, index, offset = [], [], 0
        for rank in ranks:
            call, record = rank["calls"][step], rank["history"][step]
            texts = call["prompts"]
            unique = sorted(set(texts), key=texts.index)
            assert [texts.count(text) for text in unique] == record["allocated_counts"]
            assert record["generated_counts"] == record["allocated_counts"]
            assert sum(record["allocated_counts"]) == 8
            rewards += call["rewards"]
            index += [offset + unique.index(text) for text in texts]
            offset += len(unique)
        expected = sera_opt.maxrl_advantages(torch.tensor(rewards), torch.tensor(index))
        actual = torch.tensor(ranks[0]["advantages"][step] + ranks[1]["advantages"][step])
        torch.testing.assert_close(actual, expected)
    assert any(
        len(set(rank["history"][step]["allocated_counts"])) > 1
        for rank in ranks
        for step in range(2)
    )
    assert len(ranks[0]["log"]) == 2
    assert all(entry["sera/num_rollouts"] == 16 for entry in ranks[0]["log"])
    assert all(entry["sera/num_prompts"] == 4 for entry in ranks[0]["log"])


# ------------------------------------------------------------------------------ rejections


def test_rejects_configurations_it_cannot_honour(tmp_path, tokenizer, prompts):
    common = dict(
        model=build_tiny_model(tokenizer),
        reward_funcs=copy_digit_reward,
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_seeded_planner(),
    )
    with pytest.raises(SeraOptError, match="rollout_func"):
        SeraGRPOTrainer(args=_config(tmp_path), rollout_func=lambda prompts, trainer: {}, **common)
    with pytest.raises(SeraOptError, match="multi_objective_aggregation"):
        SeraGRPOTrainer(
            args=_config(tmp_path, multi_objective_aggregation="normalize_then_sum"), **common
        )
    with pytest.raises(SeraOptError, match="estimator"):
        SeraGRPOTrainer(args=_config(tmp_path), estimator="mean", **common)
    with pytest.raises(SeraOptError, match="GRPOConfig"):
        SeraGRPOTrainer(args=None, **common)
    config = _config(tmp_path)
    config.loss_type = "ppo"
    with pytest.raises(SeraOptError, match="loss_type"):
        SeraGRPOTrainer(args=config, **common)


@pytest.mark.parametrize(
    "options",
    [
        {"steps_per_generation": 2, "per_device_train_batch_size": ROWS // 2},
        {"num_iterations": 2},
        {"gradient_accumulation_steps": 2, "per_device_train_batch_size": ROWS // 2},
        {"beta": 0.1},
        {"mask_truncated_completions": True},
    ],
    ids=["steps_per_generation", "num_iterations", "grad_accum", "beta", "mask_truncated"],
)
def test_trl_options_keep_the_planned_counts(tmp_path, tokenizer, prompts, options):
    """TRL's own handling of these options runs on the planned rows: counts honoured, loss finite."""
    recorder = _RewardRecorder()
    model = build_tiny_model(tokenizer)
    if options.get("beta"):
        # With beta > 0 TRL loads a reference model from the policy's path: give it one on disk.
        model.save_pretrained(tmp_path / "tiny")
        tokenizer.save_pretrained(tmp_path / "tiny")
        model = str(tmp_path / "tiny")
    trainer = SeraGRPOTrainer(
        model=model,
        reward_funcs=recorder,
        args=_config(tmp_path, max_steps=3, **options),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_seeded_planner(),
        rounds=1,
    )
    trainer.train()
    assert trainer.state.global_step == 3
    assert len(trainer.sera_history) >= 1
    assert any(len(set(r["allocated_counts"])) > 1 for r in trainer.sera_history)
    for record, call in zip(trainer.sera_history, recorder.calls, strict=True):
        assert record["generated_counts"] == record["allocated_counts"]
        assert sum(record["allocated_counts"]) == ROWS
        seen = Counter(call["prompts"])
        assert {prompts.index(t): n for t, n in seen.items()} == dict(
            zip(record["prompt_ids"], record["allocated_counts"], strict=True)
        )
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(np.isfinite(losses))


def test_rejects_rows_not_grouped_by_prompt(tmp_path, tokenizer, prompts):
    trainer = SeraGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=copy_digit_reward,
        args=_config(tmp_path),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_seeded_planner(),
    )
    grouped = [{"prompt": prompts[i], "prompt_id": i} for i in range(2) for _ in range(4)]
    assert len(trainer._sera_groups(grouped, 4)) == 2
    interleaved = [{"prompt": prompts[i % 2], "prompt_id": i % 2} for i in range(8)]
    with pytest.raises(SeraOptError, match="RepeatSampler"):
        trainer._sera_groups(interleaved, 4)
    with pytest.raises(SeraOptError, match="not a multiple"):
        trainer._sera_groups(grouped[:6], 4)


def test_warns_when_the_planner_offset_does_not_match_the_estimator(tmp_path, tokenizer, prompts):
    mismatched = sera_opt.RolloutPlanner("sera", min_rollouts=1, max_rollouts=10, offset=0)
    with pytest.warns(SeraOptWarning, match="offset=1"):
        SeraGRPOTrainer(
            model=build_tiny_model(tokenizer),
            reward_funcs=copy_digit_reward,
            args=_config(tmp_path),
            train_dataset=_dataset(prompts),
            processing_class=tokenizer,
            planner=mismatched,
        )


def test_default_planner_matches_the_estimator(tmp_path):
    for estimator, offset in sera_opt.ESTIMATOR_OFFSETS.items():
        planner = default_planner(estimator, num_generations=4)
        # The library's recommended default (docs/benchmarks.md's decision), not a copy of it.
        assert planner.policy.name == sera_opt.planner.DEFAULT_POLICY
        assert planner.policy.offset == offset
        assert planner.policy.min_rollouts == 1 + offset
        assert planner.policy.max_rollouts == 16


def test_rejects_prompt_groups_split_across_processes(tmp_path):
    config = _config(
        tmp_path, per_device_train_batch_size=12
    )  # 12 rows = 3 prompts of 4 on one process
    check_grpo_config(config)
    # On 2 processes the same generation batch gives 6 rows per process: 1.5 prompts.
    with mock.patch.object(
        GRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=2
    ):
        with pytest.raises(SeraOptError, match="multiple of"):
            check_grpo_config(config)


def test_a_config_without_generations_or_processes_is_a_clear_error(tmp_path):
    config = _config(tmp_path)
    for value in (0, None, -2, 2.5):
        with mock.patch.object(config, "num_generations", value):
            with pytest.raises(SeraOptError, match="num_generations must be a positive whole"):
                check_grpo_config(config)
    with mock.patch.object(
        GRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=0
    ):
        with pytest.raises(SeraOptError, match="world_size must be a positive whole number"):
            check_grpo_config(config)


def test_a_planner_that_is_not_a_planner_is_refused_at_construction(tmp_path, tokenizer, prompts):
    """Not at the first step, as an AttributeError: a name or a policy instead of a planner."""
    for planner in ("sera", sera_opt.get_policy("sera", offset=1, min_rollouts=2)):
        with pytest.raises(SeraOptError, match="planner must be a sera_opt.RolloutPlanner"):
            SeraGRPOTrainer(model=build_tiny_model(tokenizer), reward_funcs=copy_digit_reward,
                            args=_config(tmp_path), train_dataset=_dataset(prompts),
                            processing_class=tokenizer, planner=planner)


def test_trainer_options_of_the_wrong_kind_are_refused_and_numpy_integers_taken(
        tmp_path, tokenizer, prompts, monkeypatch):
    def build(**options):
        return SeraGRPOTrainer(model=build_tiny_model(tokenizer), reward_funcs=copy_digit_reward,
                               args=_config(tmp_path), train_dataset=_dataset(prompts),
                               processing_class=tokenizer, **options)

    with pytest.raises(SeraOptError, match="prompt_id_column must be the name of a dataset"):
        build(prompt_id_column=5)
    for bad in (0, True, 2.0):
        with pytest.raises(SeraOptError, match="history_size must be a positive integer"):
            build(history_size=bad)
    trainer = build(history_size=np.int64(8))
    assert trainer.sera_history.maxlen == 8


def test_rejects_other_trl_releases_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.delenv("SERA_OPT_ALLOW_UNTESTED_VERSIONS", raising=False)
    with mock.patch("trl.__version__", "1.17.0"):
        with pytest.raises(SeraOptError, match=r"trl 1\.16\.\*; found trl 1\.17\.0") as error:
            check_grpo_config(_config(tmp_path))
        assert "SERA_OPT_ALLOW_UNTESTED_VERSIONS=1" in str(error.value)
        monkeypatch.setenv("SERA_OPT_ALLOW_UNTESTED_VERSIONS", "1")
        with pytest.warns(SeraOptWarning, match="running anyway") as caught:
            check_grpo_config(_config(tmp_path))
        assert caught[0].filename == __file__, "the warning must point at the caller"


def test_restores_a_planner_saved_under_the_earlier_file_name(
    trained, tmp_path, tokenizer, prompts
):
    """Checkpoints written before the adapters shared one file name still resume with their planner."""
    import shutil

    from sera_opt.integrations._common import LEGACY_PLANNER_STATE_FILES

    checkpoint = tmp_path / "checkpoint-3"
    shutil.copytree(trained["output_dir"] / "checkpoint-3", checkpoint)
    (checkpoint / PLANNER_STATE_FILE).rename(checkpoint / LEGACY_PLANNER_STATE_FILES[0])
    resumed = SeraGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=copy_digit_reward,
        args=_config(tmp_path, max_steps=3),  # already at max_steps: restore, train nothing
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=10, offset=1),
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert len(resumed.sera_history) == 0
    _assert_nested_equal(
        resumed.sera_planner.state_dict(), trained["trainer"].sera_planner.state_dict()
    )


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (lambda prompts, completions, **kw: [None] * len(prompts), "no reward"),
        (lambda prompts, completions, **kw: [0.5] * len(prompts), "binary"),
    ],
    ids=["unscorable", "non-binary"],
)
def test_rejects_rewards_maxrl_cannot_use(tmp_path, tokenizer, prompts, reward, message):
    trainer = SeraGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=reward,
        args=_config(tmp_path, max_steps=1),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_seeded_planner(),
    )
    with pytest.raises(SeraOptError, match=message):
        trainer.train()


def _switching_planner():
    """A planner with an active set that has seen prompt 3 succeed 60 times in a row: its
    plan switches it off as too easy."""
    planner = sera_opt.RolloutPlanner("sera", min_rollouts=0, max_rollouts=16, offset=1)
    history = {0: [1, 0] * 4, 1: [1] + [0] * 7, 2: [1, 0] * 4, 3: [1] * 60}
    ids = [prompt_id for prompt_id, outcomes in history.items() for _ in outcomes]
    outcomes = [value for values in history.values() for value in values]
    planner.observe(ids, np.asarray(outcomes, dtype=float))
    return planner


def test_switched_off_prompts_leave_the_batch_its_size(tmp_path, tokenizer, prompts):
    recorder = _RewardRecorder()
    trainer = _RecordingTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=recorder,
        args=_config(tmp_path),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=_switching_planner(),
        rounds=1,
    )
    trainer.train()
    saw_zero = False
    for record, call, advantages in zip(trainer.sera_history, recorder.calls,
                                        trainer.recorded_advantages, strict=True):
        # The generation batch holds exactly its rows, switched-off prompts none of them.
        assert len(call["prompts"]) == ROWS
        assert sum(record["allocated_counts"]) == ROWS
        allocated = dict(zip(record["prompt_ids"], record["allocated_counts"], strict=True))
        seen = Counter(prompts.index(text) for text in call["prompts"])
        assert {i: n for i, n in allocated.items() if n} == dict(seen)
        saw_zero |= 0 in record["allocated_counts"]
        # The active prompts' weights are N0 / n_i, N0 the rows per prompt of the batch.
        texts = call["prompts"]
        index = torch.tensor([prompts.index(text) for text in texts])
        expected = sera_opt.maxrl_advantages(
            torch.tensor(call["rewards"], dtype=torch.float32), index,
            mean_count=float(NUM_GENERATIONS))
        torch.testing.assert_close(advantages, expected.to(advantages.dtype))
    assert saw_zero, "the planner should switch prompt 3 off"
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all("sera/active_fraction" in entry for entry in logged)
    assert min(entry["sera/active_fraction"] for entry in logged) < 1.0
    assert any(entry["sera/switched_off_too_easy"] >= 1 for entry in logged)


def test_the_trainer_ends_the_planners_epoch_at_each_pass(tmp_path, tokenizer, prompts):
    planner = sera_opt.RolloutPlanner.paper_sera()
    trainer = SeraGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=copy_digit_reward,
        args=_config(tmp_path, max_steps=-1, num_train_epochs=2),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        planner=planner,
        rounds=1,
    )
    trainer.train()
    assert planner.tracker.epoch == 2
    first = trainer.sera_history[0]
    assert first["allocated_counts"] == [NUM_GENERATIONS] * NUM_PROMPTS  # cold start
