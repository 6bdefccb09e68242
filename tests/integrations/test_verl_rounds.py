"""Tests of the round mode of ``sera_sync`` (``algorithm.sera_maxrl.rounds``), on CPU.

verl's own V1 code runs: the trainer's ``step`` and ``_step_once``, its
``_submit_batch_to_rollout``, the agent loop worker's ``generate_sequences`` and
``_run_prompt`` (which read ``__rollout_n__``), the sync replay buffer's ``sample``,
``_compute_advantage`` and ``compute_advantage``, over an in-memory TransferQueue.
What CPU cannot run is replaced at the lowest level: the inference engine (one
agent-loop session, whose response is scored by verl's rule-based
``default_compute_score``), and the GPU stages of a step (log-probs, balancing,
the actor update), which are identities here apart from verl's padding rows.
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

import sera_opt
from sera_opt.exceptions import SeraOptError, SeraOptWarning
from tests.integrations.test_verl import HISTORY, collated_prompts, needs_v1, states_equal
from tests.markers import has_module, requires_verl

pytestmark = [pytest.mark.verl, requires_verl, needs_v1]

NUM_PROMPTS, MEAN_COUNT, ROUNDS, FIRST_ROUND = 6, 4, 3, 2
#: Success probabilities of prompts 100..105 in the fake engine (hard to easy).
SUCCESS = {100 + i: p for i, p in enumerate([0.05, 0.15, 0.3, 0.5, 0.7, 0.9])}


@pytest.fixture(scope="module")
def sv():
    return importlib.import_module("sera_opt.integrations.verl")


@pytest.fixture(scope="module")
def variant():
    if not has_module("hydra"):
        pytest.skip("needs hydra-core (a verl dependency)")
    from omegaconf import OmegaConf

    from sera_opt.integrations import _verl_trainer

    config = _verl_trainer.compose_config(
        [
            "algorithm.adv_estimator=sera_maxrl",
            "trainer.v1.trainer_mode=sera_sync",
            f"actor_rollout_ref.rollout.n={MEAN_COUNT}",
            f"data.train_batch_size={NUM_PROMPTS}",
        ]
    )

    def make(sera_maxrl=None, **dotted):
        copy = OmegaConf.create(OmegaConf.to_container(config))
        block = {"max_rollouts": 9, **(sera_maxrl or {})}
        OmegaConf.update(copy, "algorithm.sera_maxrl", block, force_add=True)
        for key, value in dotted.items():
            OmegaConf.update(copy, key.replace("__", "."), value, force_add=True)
        return copy

    return make


# ----------------------------------------------------------------------------
# An in-memory TransferQueue and a fake inference engine under verl's agent loop
# ----------------------------------------------------------------------------


class FakeTransferQueue:
    """The TransferQueue calls of verl's V1 trainer, replay buffer and agent loop."""

    def __init__(self):
        self.tags = defaultdict(dict)  # partition -> key -> tag
        self.fields = defaultdict(dict)  # partition -> key -> {field: value}
        self.written = {}  # key -> {field: tensor}, what the trainer wrote back

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        for k, key in enumerate(keys):
            self.tags[partition_id].setdefault(key, {}).update(tags[k] if tags else {})
        if fields is not None:
            for name in fields.keys():
                values = fields[name]
                values = values.unbind() if isinstance(values, torch.Tensor) else list(values)
                for key, value in zip(keys, values, strict=True):
                    self.written.setdefault(key, {})[name] = value
        return KVBatchMeta(
            keys=list(keys), tags=[self.tags[partition_id][k] for k in keys], partition_id=partition_id
        )

    async def async_kv_put(self, key, partition_id, tag):
        self.tags[partition_id].setdefault(key, {}).update(tag)

    def put_row(self, key, fields, tag, partition_id="train"):
        self.fields[partition_id][key] = fields
        self.tags[partition_id][key] = tag

    def kv_list(self, partition_id=None):
        if partition_id is not None:
            return {partition_id: dict(self.tags[partition_id])}
        return {p: dict(items) for p, items in self.tags.items()}

    def kv_clear(self, keys, partition_id):
        for key in [keys] if isinstance(keys, str) else keys:
            self.tags[partition_id].pop(key, None)
            self.fields[partition_id].pop(key, None)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from tensordict import NonTensorStack, TensorDict

        rows = [self.fields[partition_id][key] for key in keys]
        data = {}
        for name in select_fields:
            if name not in rows[0]:
                continue
            values = [row[name] for row in rows]
            data[name] = (
                torch.nested.as_nested_tensor(values, layout=torch.jagged)
                if isinstance(values[0], torch.Tensor)
                else NonTensorStack(*values)
            )
        return TensorDict(data, batch_size=[len(rows)])

    def prompt_keys(self):
        return [k for k, tag in self.tags["train"].items() if tag.get("is_prompt")]


class FakeEngine:
    """One agent-loop session on a fake inference engine: a response that answers right
    with the prompt's success probability, scored by verl's rule-based reward function."""

    def __init__(self, store, seed=0, fail=None, outputs=1):
        self.store = store
        self.rng = np.random.default_rng(seed)
        self.calls = []  # one list of sessions per generate_sequences call
        self.fail = fail  # (call, session) whose session raises
        self.outputs = outputs

    async def run_agent_loop(self, sampling_params, trajectory, trace, session_id, **prompt):
        from verl.utils.reward_score import default_compute_score

        assert "__rollout_n__" not in prompt
        call = len(self.calls) - 1
        if self.fail == (call, session_id) and prompt["index"] == 100:
            raise RuntimeError("the inference engine lost the request")
        answer = "42" if self.rng.random() < SUCCESS[prompt["index"]] else "7"
        reward = float(default_compute_score("openai/gsm8k", f"#### {answer}", "42"))
        length = int(self.rng.integers(1, 6))
        scores = torch.zeros(length)
        scores[-1] = reward
        for output in range(self.outputs):
            key = f"{prompt['uid']}_{session_id}_{output}"
            fields = {
                "uid": prompt["uid"],
                "rm_scores": scores,
                "response_mask": torch.ones(length, dtype=torch.int64),
            }
            self.store.put_row(key, fields, {"status": "success", "seq_len": 4 + length,
                                              "global_steps": prompt["global_steps"]})
        self.calls[call].append(
            {
                "key": f"{prompt['uid']}_{session_id}_0",
                "uid": prompt["uid"],
                "index": prompt["index"],
                "round": prompt.get("sera_round"),
                "session": session_id,
                "reward": reward,
            }
        )


class FakeAgentLoopManager:
    """verl's AgentLoopManagerTQ.generate_sequences with one worker, run to completion."""

    def __init__(self, engine, rollout_n):
        from omegaconf import OmegaConf
        from verl.trainer.ppo.v1 import agent_loop_tq

        self.engine = engine
        self.worker_cls = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
        rollout = OmegaConf.create(
            {
                "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": False,
                "n": rollout_n,
                "val_kwargs": {"n": 1, "top_p": 1.0, "top_k": -1, "temperature": 0.0},
                "agent": {"default_agent_loop": "single_turn_agent"},
            }
        )
        self.worker = types.SimpleNamespace(
            config=OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}}),
            background_tasks=set(),
            _run_agent_loop=engine.run_agent_loop,
        )
        self.worker._run_prompt = types.MethodType(self.worker_cls._run_prompt, self.worker)

    def generate_sequences(self, batch):
        self.engine.calls.append([])

        async def drive():
            await self.worker_cls.generate_sequences(self.worker, batch)
            await asyncio.gather(*list(self.worker.background_tasks))

        asyncio.run(drive())


PADDING = 2


def pad_and_shuffle(store):
    """Stands in for verl's _balance_batch: appends no-op padding rows as verl's
    upsample_batch_to_divisible_size does (own uid, zero reward, is_padding tag) and
    reorders the rows, as the balancing by sequence length does."""
    from transfer_queue import KVBatchMeta

    def balance(batch, metrics, **kwargs):
        pad_uid = f"pad{uuid.uuid4().hex}"
        keys, tags = list(batch.keys), list(batch.tags)
        for i in range(PADDING):
            key = f"{pad_uid}_{i}_0"
            tag = {"status": "success", "seq_len": 128, "is_padding": True}
            store.put_row(key, {"uid": pad_uid, "rm_scores": torch.zeros(1),
                                "response_mask": torch.zeros(1, dtype=torch.int64)}, tag)
            keys.append(key)
            tags.append(tag)
        order = np.random.default_rng(3).permutation(len(keys)).tolist()
        return KVBatchMeta(partition_id=batch.partition_id, keys=[keys[i] for i in order],
                           tags=[tags[i] for i in order])

    return balance


def build_trainer(variant, monkeypatch, tmp_path, *, seed=0, sera_maxrl=None, fail=None, outputs=1,
                  history=True, **dotted):
    """A real SeraPPOTrainerSync wired to the fakes; returns (trainer, engine, store)."""
    from verl.trainer.ppo.v1 import agent_loop_tq, replay_buffer, trainer_base

    from sera_opt.integrations import _verl_trainer

    store = FakeTransferQueue()
    for module in (trainer_base, replay_buffer, agent_loop_tq, _verl_trainer):
        monkeypatch.setattr(module, "tq", store)
    config = variant(sera_maxrl, trainer__default_local_dir=str(tmp_path), **dotted)
    trainer = _verl_trainer.SeraPPOTrainerSync(config)
    trainer.train_dataloader = [collated_prompts(NUM_PROMPTS)]
    trainer.train_dataloader_it = None
    trainer.global_steps = 1
    trainer.timing_raw = {}
    trainer.curr_step_profile = False
    engine = FakeEngine(store, seed=seed, fail=fail, outputs=outputs)
    trainer.agent_loop_manager = FakeAgentLoopManager(engine, MEAN_COUNT)
    trainer.reward_loop_manager = types.SimpleNamespace(reward_loop_worker_handles=[object()])
    trainer.checkpoint_manager = types.SimpleNamespace(sleep_replicas=lambda: None)
    trainer._balance_batch = pad_and_shuffle(store)
    for stage in ("_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values",
                  "_update_critic", "_update_actor"):
        setattr(trainer, stage, lambda batch, metrics: batch)
    if history:
        trainer.sera_planner.observe(*HISTORY)
    return trainer, engine, store


def run_step(trainer):
    metrics = {}
    batch = trainer.step(metrics, trainer.timing_raw)
    return batch, metrics


def fresh_planner(sv, trainer):
    return sv.build_planner(trainer.sera_options, trainer.sera_mean_count).observe(*HISTORY)


# ----------------------------------------------------------------------------
# The round loop through verl's trainer
# ----------------------------------------------------------------------------


@pytest.fixture
def rounds_step(sv, variant, monkeypatch, tmp_path):
    trainer, engine, store = build_trainer(
        variant, monkeypatch, tmp_path, sera_maxrl={"rounds": ROUNDS, "first_round": FIRST_ROUND}
    )
    before = fresh_planner(sv, trainer)
    batch, metrics = run_step(trainer)
    return types.SimpleNamespace(
        trainer=trainer, engine=engine, store=store, batch=batch, metrics=metrics, before=before
    )


def test_each_round_is_one_call_of_verls_agent_loop_with_that_rounds_counts(rounds_step):
    result, calls = rounds_step.trainer.sera_round_result, rounds_step.engine.calls
    assert result.rounds == ROUNDS
    assert len(calls) == ROUNDS, "one generate_sequences call per round"
    prompt_ids = list(range(100, 100 + NUM_PROMPTS))
    for r, call in enumerate(calls):
        # Counted from what verl's agent loop started, session by session.
        started = Counter(session["index"] for session in call)
        planned = {i: int(n) for i, n in zip(prompt_ids, result.round_counts[r], strict=True) if n}
        assert started == planned
        assert {session["round"] for session in call} == {r}  # the rows carry their round
    assert dict(Counter(s["index"] for s in calls[0])) == dict.fromkeys(prompt_ids, FIRST_ROUND)
    # The budget: the step spends M * rollout.n, as the static mode does.
    assert result.counts.sum() == NUM_PROMPTS * MEAN_COUNT == sum(len(c) for c in calls)
    assert result.round_budgets[0] == NUM_PROMPTS * FIRST_ROUND
    assert sum(result.round_budgets) == NUM_PROMPTS * MEAN_COUNT
    assert len(set(result.counts.tolist())) > 1, "the later rounds should favour some prompts"
    # Each round's rewards (verl's reward function) are what the session recorded.
    recorded = [s["reward"] for call in calls for s in call]
    np.testing.assert_array_equal(result.rewards, recorded)
    # Every group was taken: nothing is left pending in TransferQueue.
    assert rounds_step.store.prompt_keys() == []


def test_the_batch_holds_every_rounds_rows_with_shared_uids_and_no_key_collisions(rounds_step):
    trainer, calls, batch = rounds_step.trainer, rounds_step.engine.calls, rounds_step.batch
    real = [k for k, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding")]
    generated = [s["key"] for call in calls for s in call]
    assert sorted(real) == sorted(generated) and len(set(generated)) == len(generated)
    assert len(batch.keys) == NUM_PROMPTS * MEAN_COUNT + PADDING
    # One TransferQueue uid per prompt and round; one group (the prompt's uid) per prompt.
    round_uids = {s["uid"] for call in calls for s in call}
    prompt_of_round_uid = {s["uid"]: s["index"] for call in calls for s in call}
    assert len(round_uids) == sum(int((c > 0).sum()) for c in trainer.sera_round_result.round_counts)
    assert trainer._sera_round_groups.keys() == round_uids
    prompt_uid_of = defaultdict(set)
    for uid, (prompt_uid, _) in trainer._sera_round_groups.items():
        prompt_uid_of[prompt_of_round_uid[uid]].add(prompt_uid)
    assert all(len(uids) == 1 for uids in prompt_uid_of.values()) and len(prompt_uid_of) == 6
    assert rounds_step.metrics["sera/num_prompts"] == NUM_PROMPTS  # verl's padding is no prompt
    assert rounds_step.metrics["sera/num_rollouts"] == NUM_PROMPTS * MEAN_COUNT


def test_advantages_are_maxrl_with_the_first_round_baseline(rounds_step):
    trainer, calls, batch, store = (rounds_step.trainer, rounds_step.engine.calls,
                                    rounds_step.batch, rounds_step.store)
    session_of = {s["key"]: (s, r) for r, call in enumerate(calls) for s in call}
    real = [k for k in batch.keys if k in session_of]
    outcomes = torch.tensor([session_of[k][0]["reward"] for k in real])
    prompt = torch.tensor([session_of[k][0]["index"] - 100 for k in real])
    rounds = torch.tensor([session_of[k][1] for k in real])
    expected = sera_opt.maxrl_advantages(outcomes, prompt, round_index=rounds)
    pooled = sera_opt.maxrl_advantages(outcomes, prompt)
    assert not torch.equal(expected, pooled), "the case must tell the two baselines apart"
    got = torch.stack([store.written[k]["advantages"][0] for k in real])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for k, tag in zip(batch.keys, batch.tags, strict=True):
        if tag.get("is_padding"):  # padding rows never enter the groups: advantage 0
            assert torch.count_nonzero(store.written[k]["advantages"]) == 0
        else:  # broadcast over the response tokens
            values = store.written[k]["advantages"]
            assert torch.equal(values, values[0].expand_as(values))
    assert trainer.sera_round_result.offset == 1  # the mean-centred estimator's planner


def test_the_planner_observes_each_rollout_once(sv, rounds_step):
    trainer, calls = rounds_step.trainer, rounds_step.engine.calls
    reference = rounds_step.before
    sessions = [s for call in calls for s in call]
    reference.observe([s["index"] for s in sessions], np.array([s["reward"] for s in sessions]))
    assert states_equal(trainer.sera_planner.state_dict(), reference.state_dict())
    assert rounds_step.metrics["sera/observed_rollouts"] == NUM_PROMPTS * MEAN_COUNT
    assert trainer._sera_prompt_of_uid == {}


def test_round_diagnostics_are_logged(rounds_step):
    metrics, result = rounds_step.metrics, rounds_step.trainer.sera_round_result
    assert metrics["sera/rounds"] == ROUNDS
    for r in range(ROUNDS):
        assert metrics[f"sera/round_{r}_budget"] == result.round_budgets[r]
        assert metrics[f"sera/round_{r}_active"] == pytest.approx(result.active_fraction[r])
    assert sum(metrics[f"sera/round_{r}_budget"] for r in range(ROUNDS)) == 24
    assert metrics["sera/mean_scale"] == pytest.approx(float(np.mean(result.factors)))
    assert 0 < metrics["sera/min_scale"] <= metrics["sera/mean_scale"] <= 1
    assert metrics["sera/planned_max_count"] == result.counts.max()
    assert rounds_step.trainer.timing_raw["sera_rounds"] > 0  # verl logs it as timing_s/sera_rounds


def test_two_steps_run_their_own_rounds(sv, variant, monkeypatch, tmp_path):
    trainer, engine, store = build_trainer(
        variant, monkeypatch, tmp_path, sera_maxrl={"rounds": 2}
    )
    run_step(trainer)
    first = trainer.sera_round_result
    trainer.global_steps = 2
    _, metrics = run_step(trainer)
    assert len(engine.calls) == 4 and trainer.sera_round_result is not first
    # first_round defaults to half of rollout.n, raised to min_rollouts = 2 (mean-centred).
    assert first.round_counts[0].tolist() == [2] * NUM_PROMPTS
    assert metrics["sera/num_rollouts"] == NUM_PROMPTS * MEAN_COUNT
    assert store.prompt_keys() == []


def test_success_average_rounds(sv, variant, monkeypatch, tmp_path):
    trainer, engine, store = build_trainer(
        variant, monkeypatch, tmp_path, history=False,
        sera_maxrl={"rounds": 3, "first_round": 1, "estimator": "success_average"},
    )
    batch, metrics = run_step(trainer)
    result = trainer.sera_round_result
    assert result.round_counts[0].tolist() == [1] * NUM_PROMPTS and result.offset == 0
    session_of = {s["key"]: s for call in engine.calls for s in call}
    real = [k for k in batch.keys if k in session_of]
    outcomes = torch.tensor([session_of[k]["reward"] for k in real])
    prompt = torch.tensor([session_of[k]["index"] - 100 for k in real])
    expected = sera_opt.maxrl_advantages(outcomes, prompt, estimator="success_average")
    got = torch.stack([store.written[k]["advantages"][0] for k in real])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert metrics["sera/rounds"] == 3


def test_one_round_is_the_static_mode(sv, variant, monkeypatch, tmp_path):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    trainer, engine, _ = build_trainer(variant, monkeypatch, tmp_path, seed=5,
                                       sera_maxrl={"rounds": 1, "policy": "sera-fair"})
    assert trainer.sera_rounds == 1 and type(trainer.replay_buffer) is ReplayBuffer
    prompt_ids = list(range(100, 100 + NUM_PROMPTS))
    planned = fresh_planner(sv, trainer).plan(prompt_ids, NUM_PROMPTS * MEAN_COUNT).counts
    assert len(set(planned.tolist())) > 1, "the case must plan unequal counts"
    _, metrics = run_step(trainer)
    assert len(engine.calls) == 1  # verl's own submission, with the planner's static counts
    sessions = engine.calls[0]
    drawn = Counter(s["index"] for s in sessions)
    assert [drawn[i] for i in prompt_ids] == planned.tolist()
    assert {s["round"] for s in sessions} == {None}  # no sera_round column
    assert "sera/rounds" not in metrics and not hasattr(trainer, "sera_round_result")
    # Its advantages are the static mode's (test_verl.py), verl's padding as a group of its own.
    assert metrics["sera/observed_rollouts"] == NUM_PROMPTS * MEAN_COUNT


def test_the_default_step_is_one_agent_loop_call_with_the_static_plan(sv, variant, monkeypatch,
                                                                      tmp_path):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    trainer, engine, _ = build_trainer(variant, monkeypatch, tmp_path, seed=5)
    assert trainer.sera_rounds == sera_opt.rounds.DEFAULT_ROUNDS == 1
    assert type(trainer.replay_buffer) is ReplayBuffer
    prompt_ids = list(range(100, 100 + NUM_PROMPTS))
    planned = fresh_planner(sv, trainer).plan(prompt_ids, NUM_PROMPTS * MEAN_COUNT).counts
    _, metrics = run_step(trainer)
    assert len(engine.calls) == 1  # one agent-loop call, the static plan's counts
    drawn = Counter(s["index"] for s in engine.calls[0])
    assert [drawn[i] for i in prompt_ids] == planned.tolist()
    assert "sera/rounds" not in metrics and not hasattr(trainer, "sera_round_result")


def test_rounds_asked_for_are_the_decisions_schedule(sv, variant, monkeypatch, tmp_path):
    trainer, engine, _ = build_trainer(variant, monkeypatch, tmp_path, seed=5,
                                       sera_maxrl={"rounds": 4})
    assert trainer.sera_rounds == 4
    assert (trainer.sera_planner.policy.name, trainer.sera_planner.round_policy.name) == (
        "uniform", "uniform")
    _, metrics = run_step(trainer)
    result = trainer.sera_round_result
    assert result.rounds == metrics["sera/rounds"] == 4
    assert result.round_budgets == (12, 4, 4, 4)  # half of rollout.n each first, then even
    assert result.round_counts[0].tolist() == [MEAN_COUNT // 2] * NUM_PROMPTS
    assert len(engine.calls) == 4 and result.counts.sum() == NUM_PROMPTS * MEAN_COUNT


# ----------------------------------------------------------------------------
# The estimator's round groups
# ----------------------------------------------------------------------------


def test_round_groups_pool_rounds_and_leave_padding_out(sv):
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rng = np.random.default_rng(1)
    layout = [(0, 0), (0, 0), (1, 0), (1, 0), (0, 1), (1, 1), (1, 1), (0, 2)]
    round_uid = {(p, r): f"r{r}p{p}" for p, r in set(layout)}
    groups = {uid: (f"prompt{p}", r) for (p, r), uid in round_uid.items()}
    uids = [round_uid[x] for x in layout] + ["padx", "padx"]
    outcomes = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 1, 0, 0])
    order = rng.permutation(len(uids))
    rewards = torch.zeros(len(uids), 3)
    rewards[:, -1] = outcomes
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards[order],
                 "response_mask": torch.ones(len(uids), 3, dtype=torch.int64)},
        non_tensors={"uid": np.array(uids, dtype=object)[order]},
    )
    config = {"adv_estimator": "sera_maxrl"}
    with sv.round_groups(groups), sv.collect_estimator_calls() as calls:
        out = compute_advantage(data, adv_estimator="sera_maxrl", config=config)
    real = np.array([k < len(layout) for k in order])
    expected = sera_opt.maxrl_advantages(
        outcomes[: len(layout)], torch.tensor([p for p, _ in layout]),
        round_index=torch.tensor([r for _, r in layout]),
    )
    got = torch.zeros(len(layout))
    got[torch.as_tensor(order[real])] = out.batch["advantages"][torch.as_tensor(real), 0]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert torch.count_nonzero(out.batch["advantages"][torch.as_tensor(~real)]) == 0
    assert calls[0].diagnostics["num_prompts"] == 2 and len(calls[0].uids) == len(layout)
    assert set(calls[0].uids.tolist()) == {"prompt0", "prompt1"}
    with pytest.raises(SeraOptError, match="given twice"):
        with sv.round_groups(groups), sv.round_index(np.zeros(len(uids), dtype=np.int64)):
            compute_advantage(data, adv_estimator="sera_maxrl", config=config)
    for bad in ({"a": ("p", -1)}, {"a": ("p", True)}, {"a": "p"}, [("a", ("p", 0))]):
        with pytest.raises(SeraOptError, match="round_groups"):
            with sv.round_groups(bad):
                pass


# ----------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "match"),
    [
        ({"rounds": 0}, "rounds must be a positive integer"),
        ({"rounds": True}, "rounds must be a positive integer"),
        ({"rounds": 2.0}, "rounds must be a positive integer"),
        ({"rounds": 2, "first_round": 0}, "first_round must be None"),
        ({"rounds": 2, "first_round": False}, "first_round must be None"),
        ({"rounds": 1, "first_round": 2}, "set algorithm.sera_maxrl.rounds >= 2"),
        ({"first_round": 2}, "in one call by default; set algorithm.sera_maxrl.rounds >= 2"),
        ({"rounds": "4"}, "rounds must be a positive integer"),
    ],
)
def test_bad_round_options_are_refused(sv, block, match):
    with pytest.raises(SeraOptError, match=match):
        sv.SeraMaxRLConfig.from_mapping(block)


@pytest.mark.parametrize(
    ("dotted", "match"),
    [
        ({"trainer__v1__trainer_mode": "sera_colocate_async"}, "trainer_mode=sera_sync"),
        ({"trainer__v1__trainer_mode": "sera_separate_async"}, "trainer_mode=sera_sync"),
        ({"algorithm__filter_groups__enable": True}, "DAPO"),
        ({"trainer__v1__sampler__sync_refill_failed_groups": True}, "sync_refill_failed_groups"),
        ({"trainer__v1__sampler__custom_sampler__path": "x.py"}, "custom_sampler"),
        ({"trainer__v1__sync__parameter_sync_step": 2}, "parameter_sync_step"),
        ({"reward__reward_model__enable": True}, "colocated reward model"),
        ({"skip__rollout_tq__enable": True}, "skip.rollout_tq"),
    ],
)
def test_configs_rounds_cannot_honour_are_refused(sv, variant, dotted, match):
    with pytest.raises(SeraOptError, match=match):
        sv.check_trainer_config(variant({"rounds": 2}, **dotted))
    sv.check_trainer_config(variant({"rounds": 1}, **dotted))  # the control: one round is fine
    # The default (no rounds named) is one call, which every mode and feature runs: no
    # warning; a first round without rounds is refused, since nothing follows it.
    with warnings.catch_warnings():
        warnings.simplefilter("error", SeraOptWarning)
        assert sv.check_trainer_config(variant(None, **dotted)).rounds == 1
    with pytest.raises(SeraOptError, match="first_round is the first of several rounds"):
        sv.check_trainer_config(variant({"first_round": 2}, **dotted))


def test_the_default_is_one_round_in_sera_sync(sv, variant):
    assert sv.check_trainer_config(variant(None)).rounds == sera_opt.rounds.DEFAULT_ROUNDS == 1
    assert sv.SeraMaxRLConfig().rounds is None  # resolved against the whole config
    options = sv.check_trainer_config(variant({"rounds": 4, "first_round": 3}))
    assert (options.rounds, options.first_round) == (4, 3)
    assert sv.build_planner(options, 4).round_policy.name == "uniform"
    named = sv.build_planner(sv.check_trainer_config(variant({"policy": "sera"})), 4)
    assert named.round_policy is named.policy


def test_a_first_round_above_the_budget_is_refused(sv, variant):
    with pytest.raises(SeraOptError, match="exceeds actor_rollout_ref.rollout.n=4"):
        sv.check_trainer_config(variant({"rounds": 2, "first_round": 5}))
    assert sv.check_trainer_config(variant({"rounds": 2, "first_round": 4})).first_round == 4


def test_async_modes_refuse_rounds_when_built(sv, variant):
    from sera_opt.integrations import _verl_trainer

    config = variant({"rounds": 2}, trainer__v1__trainer_mode="sera_colocate_async")
    with pytest.raises(SeraOptError, match="trainer_mode=sera_sync"):
        _verl_trainer.SeraPPOTrainerColocateAsync(config)


def test_a_colocated_reward_model_is_refused_at_the_step(variant, monkeypatch, tmp_path):
    trainer, engine, _ = build_trainer(variant, monkeypatch, tmp_path, sera_maxrl={"rounds": 2})
    trainer.reward_loop_manager = types.SimpleNamespace(reward_loop_worker_handles=None)
    with pytest.raises(SeraOptError, match="colocated reward model"):
        run_step(trainer)
    assert engine.calls == []


def test_a_failed_session_stops_the_step(variant, monkeypatch, tmp_path):
    trainer, engine, _ = build_trainer(
        variant, monkeypatch, tmp_path, sera_maxrl={"rounds": 2}, fail=(0, 1)
    )
    with pytest.raises(SeraOptError, match="returned 1 of the 2 rollouts planned for prompt 100"):
        run_step(trainer)
    assert len(engine.calls) == 1  # no later round was generated


def test_multi_output_sessions_are_refused_in_rounds(variant, monkeypatch, tmp_path):
    trainer, engine, _ = build_trainer(
        variant, monkeypatch, tmp_path, sera_maxrl={"rounds": 2}, outputs=2
    )
    with pytest.raises(SeraOptError, match="several outputs"):
        run_step(trainer)
    assert len(engine.calls) == 1


def test_rows_from_outside_the_rounds_are_refused(variant, monkeypatch, tmp_path):
    from transfer_queue import KVBatchMeta

    trainer, _, _ = build_trainer(variant, monkeypatch, tmp_path, sera_maxrl={"rounds": 2})
    with pytest.raises(SeraOptError, match="before its rounds ran"):
        trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=6)
    meta = KVBatchMeta(keys=["stranger_0_0"], tags=[{}], partition_id="train")
    with pytest.raises(SeraOptError, match="did not generate"):
        trainer._compute_advantage(meta, {})


# ----------------------------------------------------------------------------
# Prompts switched off (an active set) in the sync mode
# ----------------------------------------------------------------------------


def test_switched_off_prompts_keep_the_batchs_rollouts_and_n0_weights(sv, variant, monkeypatch,
                                                                      tmp_path):
    trainer, engine, store = build_trainer(
        variant, monkeypatch, tmp_path, seed=3, history=False,
        sera_maxrl={"rounds": 1, "policy": "sera", "max_rollouts": 16,
                    "policy_options": {"active_threshold": 0.05}})
    assert trainer.sera_switches_off
    # Prompt 105 has succeeded 60 times: too easy to give a mixed group at 2 rollouts.
    ids = [100] * 8 + [101] * 8 + [102] * 8 + [103] * 8 + [104] * 8 + [105] * 60
    outcomes = [0] * 7 + [1] + [0] * 6 + [1] * 2 + [1, 0] * 4 + [1, 0] * 4 + [1] * 6 + [0] * 2
    trainer.sera_planner.observe(ids, np.asarray(outcomes + [1] * 60, dtype=float))
    prompt_ids = list(range(100, 100 + NUM_PROMPTS))
    planner = sv.build_planner(trainer.sera_options, trainer.sera_mean_count)
    planner.load_state_dict(trainer.sera_planner.state_dict())
    planned = planner.plan(prompt_ids, NUM_PROMPTS * MEAN_COUNT)
    assert planned.counts[5] == 0, "the case must switch prompt 105 off"
    batch, metrics = run_step(trainer)
    sessions = [s for call in engine.calls for s in call]
    assert len(engine.calls) == 1
    # The step drew exactly the batch's rollouts, none for the switched-off prompt.
    assert len(sessions) == NUM_PROMPTS * MEAN_COUNT
    drawn = Counter(s["index"] for s in sessions)
    assert [drawn[i] for i in prompt_ids] == planned.counts.tolist()
    assert metrics["sera/active_fraction"] == pytest.approx(5 / 6)
    assert metrics["sera/switched_off_too_easy"] == 1.0
    # The advantages: MaxRL with N0 / n_i weights (N0 = rollout.n).
    session_of = {s["key"]: s for s in sessions}
    real = [k for k in batch.keys if k in session_of]
    outcomes_t = torch.tensor([session_of[k]["reward"] for k in real])
    prompt = torch.tensor([session_of[k]["index"] - 100 for k in real])
    expected = sera_opt.maxrl_advantages(outcomes_t, prompt, mean_count=float(MEAN_COUNT))
    got = torch.stack([store.written[k]["advantages"][0] for k in real])
    torch.testing.assert_close(got, expected.to(got.dtype), rtol=0, atol=0)
