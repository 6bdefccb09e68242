"""The ``sera_*`` trainer modes for verl 0.9.1's V1 trainer, and the launcher.

Imported on demand by :func:`sera_opt.integrations.verl.register_trainers` and
:func:`sera_opt.integrations.verl.main`: it imports verl's V1 trainer, which needs
TransferQueue (``pip install TransferQueue``, part of ``verl[verl-core]``).

Each mode extends one of verl's (``sera_sync`` -> ``sync`` and so on) with
:class:`SeraTrainerMixin`, which

1. plans the counts of every prompt batch the trainer draws from its dataloader
   (``_next_train_batch``, which every path of the V1 trainer goes through: the
   step's batch, refills of failed or filtered groups, async warm-up), with budget
   ``M * rollout.n``, and writes them into the ``__rollout_n__`` column that the
   agent loop reads;
2. records the estimator's outcomes and diagnostics while verl computes the
   advantages (``_compute_advantage``), feeds the outcomes to the planner's tracker
   and logs the diagnostics as ``sera/<name>`` metrics;
3. saves and restores the planner with verl's checkpoints.

With ``algorithm.sera_maxrl.rounds=R >= 2`` (``sera_sync`` only; opt-in, the default is
one call: :attr:`sera_opt.integrations.verl.SeraMaxRLConfig.rounds`) the step's prompts
are generated in R rounds instead (docs/theory.md section 9, :meth:`SeraTrainerMixin.prepare_step`):
each round submits the prompts it gives rollouts to through verl's own
``_submit_batch_to_rollout`` (TransferQueue and the agent loop, which reads the
round's counts from ``__rollout_n__``), waits for them with verl's replay buffer,
reads the rewards verl's reward loop computed for them, and records them in a
:class:`sera_opt.RoundSession` that plans the next round. The rows of all rounds
form the step's batch, which verl's replay buffer hands to the rest of the step.

verl's V1 trainer branches on ``config.trainer.v1.trainer_mode`` (replay buffer type,
TransferQueue persistence, checkpoint contents, per-mode options under
``trainer.v1.<mode>``). The mixin therefore hands verl's constructor a copy of the
config whose mode is the base mode's name, so a ``sera_*`` mode behaves exactly like
its base mode apart from the three points above; the caller's config is not changed.

The launcher (:func:`launch`) also makes every process of the job import
:mod:`sera_opt.integrations.verl` (``VERL_USE_EXTERNAL_MODULES`` in Ray's runtime
environment), so that verl's workers get the estimator and the verl-beside-trl fix
of :mod:`sera_opt.integrations._verl_compat`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import uuid
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls, register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer

import sera_opt
from sera_opt.exceptions import SeraOptError
from sera_opt.integrations import _common
from sera_opt.integrations import verl as sera_verl
from sera_opt.rounds import run_rounds

__all__ = [
    "PLANNER_STATE_FILE",
    "SeraPPOTrainerColocateAsync",
    "SeraPPOTrainerSeparateAsync",
    "SeraPPOTrainerSync",
    "SeraTrainerMixin",
    "WORKER_MODULES_ENV",
    "compose_config",
    "launch",
    "register",
    "with_worker_modules",
]

logger = logging.getLogger(__name__)

#: File, inside verl's ``global_step_<n>`` checkpoint folder, holding the planner state.
PLANNER_STATE_FILE = _common.PLANNER_STATE_FILE

#: The variable verl reads in every process that imports it, to import more modules.
WORKER_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"

#: uids remembered for matching outcomes to prompt ids, per prompt of a training batch;
#: groups that verl drops before the advantage step (staleness, DAPO filtering)
#: never come back, so the oldest entries beyond this are forgotten.
_UID_MEMORY_BATCHES = 16


class SeraTrainerMixin:
    """Planned per-prompt rollout counts for a verl V1 trainer (put it first in the bases).

    Attributes
    ----------
    sera_options : SeraMaxRLConfig
        The validated ``algorithm.sera_maxrl`` block.
    sera_planner : sera_opt.RolloutPlanner
        Plans every batch; checkpointed as :data:`PLANNER_STATE_FILE`.
    sera_mean_count : int
        ``actor_rollout_ref.rollout.n``, the mean count (budget per prompt).
    sera_round_result : sera_opt.RoundResult
        With ``rounds >= 2``: the last step's rounds (counts per round, each rollout's
        prompt and round, rewards, expected scales). Absent before the first step.
    """

    #: The verl trainer mode this class extends (set by each concrete class).
    sera_base_mode: str = ""

    def __init__(self, config):
        self.sera_options = sera_verl.check_trainer_config(config)
        # verl's constructor and methods branch on the mode's name: make them see the
        # base mode, whose behaviour (and trainer.v1.<mode> options) this class keeps.
        # A copy, so the caller's config (verl's task runner keeps its own) still names
        # the sera mode.
        base_config = copy.deepcopy(config)
        with open_dict(base_config):
            base_config.trainer.v1.trainer_mode = self.sera_base_mode
        self.sera_mean_count = int(base_config.actor_rollout_ref.rollout.n)
        # Built before verl's constructor, which builds the replay buffer: a planner that
        # switches prompts off needs the buffer of the rounds (the batch has fewer prompts
        # than verl's train_batch_size).
        self.sera_planner = sera_verl.build_planner(self.sera_options, self.sera_mean_count)
        super().__init__(base_config)
        self._sera_prompt_of_uid: OrderedDict[Any, Any] = OrderedDict()
        # Round mode: each round's uid -> (the prompt's uid, the round), for this step's batch.
        self._sera_round_groups: dict[str, tuple[Any, int]] = {}

    @property
    def sera_rounds(self) -> int:
        """Generation calls per step (``algorithm.sera_maxrl.rounds``)."""
        return self.sera_options.rounds

    @property
    def sera_switches_off(self) -> bool:
        """Whether the planner's policy can give prompts 0 rollouts (an active set): the
        step then submits only the active prompts, as a step in one round."""
        return getattr(self.sera_planner.policy, "active_threshold", None) is not None

    @property
    def _sera_prepares(self) -> bool:
        # The step's rows are generated by prepare_step (rounds, or an active set).
        return self.sera_options.rounds > 1 or self.sera_switches_off

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        # Called by verl's constructor, after sera_options and the planner are set.
        return _RoundReplayBuffer(buffer) if self._sera_prepares else buffer

    def _sera_mark_epochs(self) -> None:
        """End the planner's epochs up to the one of the step about to be planned: a
        tracker frozen per epoch (the authors') folds a pass's outcomes in at its end.
        Read from the steps, so a resumed run (whose tracker carries its epoch) agrees."""
        tracker_epoch = getattr(self.sera_planner.tracker, "epoch", None)
        steps_per_epoch = getattr(self, "steps_per_epoch", 0)
        if tracker_epoch is None or not steps_per_epoch:
            return
        step_epoch = max(int(self.global_steps) - 1, 0) // int(steps_per_epoch)
        while self.sera_planner.tracker.epoch < step_epoch:
            self.sera_planner.end_epoch()

    # -- 1. counts -------------------------------------------------------------------

    def _next_train_batch(self, num_prompts: int | None = None):
        batch = super()._next_train_batch(num_prompts)
        self._sera_mark_epochs()
        if self._sera_prepares:
            return batch  # planned (round by round) in prepare_step
        return self._sera_plan(batch)

    def _sera_plan(self, batch):
        """Plan the counts of a prompt batch and write them into ``__rollout_n__``."""
        prompt_ids = sera_verl.prompt_ids_from_batch(batch, self.sera_options.prompt_key)
        counts = sera_verl.plan_rollout_counts(self.sera_planner, prompt_ids, self.sera_mean_count)
        sera_verl.assign_rollout_counts(batch, counts)
        self._sera_remember(batch, prompt_ids)
        return batch

    def _sera_remember(self, batch, prompt_ids: list) -> list:
        """Remember each prompt's id under its uid, for matching outcomes later; returns the uids."""
        uids = tu.get(batch, "uid")
        if uids is None or len(uids) != len(prompt_ids):
            raise SeraOptError("the V1 training batch has no per-prompt 'uid' column.")
        for uid, prompt_id in zip(uids, prompt_ids, strict=True):
            self._sera_prompt_of_uid[uid] = prompt_id
        limit = _UID_MEMORY_BATCHES * max(len(prompt_ids), int(self.config.data.train_batch_size))
        while len(self._sera_prompt_of_uid) > limit:
            self._sera_prompt_of_uid.popitem(last=False)
        return list(uids)

    # -- 1b. counts in rounds --------------------------------------------------------

    def prepare_step(self) -> dict:
        """Submit the step's prompts: in one call (verl's), or in rounds.

        verl's ``step`` calls this before it samples the step's batch from the replay
        buffer. With ``rounds >= 2`` it runs the whole round loop here, while the
        rollout replicas are awake (the sync mode puts them to sleep once the batch is
        sampled), and leaves the rows of all rounds with the replay buffer, whose next
        sample returns them. Returns the rounds' diagnostics as ``sera/...`` metrics:
        ``rounds``, ``round_<r>_budget``, ``round_<r>_active`` (the fraction of prompts
        without a success after round r), ``mean_scale`` and ``min_scale`` (the
        expected scales of the prompts' likelihood gradients).
        """
        if not self._sera_prepares:
            return super().prepare_step()
        return self._sera_generate_rounds()

    def _sera_generate_rounds(self) -> dict:
        if self.reward_loop_manager.reward_loop_worker_handles is None:
            raise SeraOptError(
                "algorithm.sera_maxrl.rounds >= 2 needs each round's rewards before the next round "
                "is planned, but this job scores with a colocated reward model, which verl runs "
                "only after sampling; use a rule-based reward or reward.reward_model."
                "enable_resource_pool=true."
            )
        prompts = self._next_train_batch()
        prompt_ids = sera_verl.prompt_ids_from_batch(prompts, self.sera_options.prompt_key)
        uids = self._sera_remember(prompts, prompt_ids)
        budget = len(prompt_ids) * self.sera_mean_count
        session = self.sera_planner.start_rounds(
            prompt_ids,
            budget,
            # The default's rounds are not warned about when the budget fills fewer
            # (the options resolve the default to its number; the session then just
            # runs the rounds that sample).
            rounds=self.sera_options.rounds,  # >= 2, or 1 for a planner with an active set
            first_round=self.sera_options.first_round if self.sera_options.rounds > 1 else None,
            observe=False,  # observed once, from the estimator's outcomes (_compute_advantage)
        )
        self._sera_round_groups = {}
        keys: list[str] = []
        tags: list[dict] = []
        metrics: dict = {}
        timing = getattr(self, "timing_raw", None)

        def sample(counts: np.ndarray) -> np.ndarray:
            with marked_timer("sera_rounds", timing if timing is not None else {}):
                round_keys, round_tags, outcomes = self._sera_run_round(
                    prompts, uids, prompt_ids, counts, session.round, metrics
                )
            keys.extend(round_keys)
            tags.extend(round_tags)
            return outcomes

        run_rounds(session, sample)
        self.replay_buffer.prepared = KVBatchMeta(partition_id="train", keys=keys, tags=tags)
        result = session.result()
        self.sera_round_result = result
        if int(result.counts.sum()) != budget:  # pragma: no cover - the session's own invariant
            raise AssertionError(f"the rounds spent {int(result.counts.sum())} of {budget}")
        if self.sera_options.rounds > 1:
            metrics.update({f"sera/{name}": value
                            for name, value in _common.round_diagnostics(result).items()})
        if self.sera_switches_off:
            active = result.counts > 0
            metrics["sera/active_fraction"] = float(active.mean()) if active.size else 1.0
            metrics["sera/active_prompts"] = float(active.sum())
            plan = getattr(session, "static_allocation", None)
            if plan is not None:
                metrics.update({f"sera/{name}": value
                                for name, value in _common.active_set_metrics(plan).items()})
        return metrics

    def _sera_run_round(self, prompts, uids, prompt_ids, counts, round_number, metrics):
        """Generate one round through verl's agent loop and read its rewards.

        Returns the round's TransferQueue keys and tags, grouped by prompt in the
        batch's order and by session within a prompt (the order
        :meth:`sera_opt.rounds.RoundSession.record` takes), and the 0/1 outcomes.
        """
        active = np.flatnonzero(counts)
        round_batch = tu.index_select_tensor_dict(prompts, torch.as_tensor(active))
        # verl keys a prompt's rollouts {uid}_{session}_{output}, sessions from 0 at each
        # submission: a fresh uid per round keeps the rounds' rows apart; round_groups
        # pools them back under the prompt's uid for the estimator. uuid4 strings have
        # no "_", which verl's key parsing splits on.
        round_uids = [str(uuid.uuid4()) for _ in active]
        tu.assign_non_tensor_stack(round_batch, "uid", round_uids)
        # The agent loop copies every prompt column into its rows: each row carries its round.
        tu.assign_non_tensor_stack(round_batch, sera_verl.ROUND_KEY, [round_number] * len(active))
        sera_verl.assign_rollout_counts(round_batch, counts[active])
        for uid, position in zip(round_uids, active.tolist(), strict=True):
            self._sera_round_groups[uid] = (uids[position], round_number)

        self._submit_batch_to_rollout(round_batch)
        sampled, buffer_metrics = self.replay_buffer.inner.sample(
            global_steps=self.global_steps, partition_id="train", batch_size=len(active)
        )
        for name, value in buffer_metrics.items():
            if isinstance(value, (int, float)):
                metrics[name] = metrics.get(name, 0) + value

        rows: dict[str, dict[int, tuple[str, dict]]] = defaultdict(dict)
        for key, tag in zip(sampled.keys, sampled.tags, strict=True):
            uid, session, output = key.rsplit("_", 2)
            if output != "0":
                _reject_multi_output_sessions([key])
            if uid not in self._sera_round_groups:
                raise SeraOptError(
                    f"verl's replay buffer returned {key!r}, which round {round_number} did not submit; "
                    "another producer is writing to the 'train' partition of TransferQueue."
                )
            rows[uid][int(session)] = (key, tag)
        keys, tags = [], []
        for uid, position in zip(round_uids, active.tolist(), strict=True):
            planned = int(counts[position])
            if sorted(rows[uid]) != list(range(planned)):
                raise SeraOptError(
                    f"round {round_number} returned {len(rows[uid])} of the {planned} rollouts planned "
                    f"for prompt {prompt_ids[position]!r}: a session failed (see the agent loop's "
                    "log). A round's outcomes are recorded whole, so the step cannot go on; fix the "
                    "failure, or train with algorithm.sera_maxrl.rounds=1, where verl pads failed "
                    "groups."
                )
            for session in range(planned):
                key, tag = rows[uid][session]
                keys.append(key)
                tags.append(tag)
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores"])
        if "rm_scores" not in data.keys():
            raise SeraOptError(
                f"round {round_number}'s rows carry no 'rm_scores': verl's reward loop did not score "
                "them during the rollout. Configure a reward function or a reward model with "
                "reward.reward_model.enable_resource_pool=true."
            )
        scores = [float(row.sum()) for row in data["rm_scores"].unbind()]
        try:
            outcomes = _common.binary_outcomes(
                np.asarray(scores, dtype=np.float64), self.sera_options.success_threshold
            )
        except SeraOptError as exc:
            raise SeraOptError(
                f"{exc} (verl: the outcome of a response is the sum of its rm_scores; for graded "
                "rewards set +algorithm.sera_maxrl.success_threshold=<value>.)"
            ) from exc
        return keys, tags, outcomes

    # -- 2. outcomes and diagnostics -------------------------------------------------

    def _compute_advantage(self, batch, metrics: dict):
        _reject_multi_output_sessions(batch.keys)
        with contextlib.ExitStack() as stack:
            calls = stack.enter_context(sera_verl.collect_estimator_calls())
            if self._sera_prepares:
                stack.enter_context(sera_verl.round_groups(self._sera_batch_groups(batch)))
            if self.sera_switches_off:
                # N0 / n_i: switched-off prompts handed their rollouts to the active ones.
                stack.enter_context(sera_verl.fixed_mean_count(self.sera_mean_count))
            batch = super()._compute_advantage(batch, metrics)
        for call in calls:
            self._sera_observe(call, metrics)
        return batch

    def _sera_batch_groups(self, batch) -> dict[str, tuple[Any, int]]:
        """The round groups of a batch's rows; verl's padding rows are left out."""
        groups = {}
        for key, tag in zip(batch.keys, batch.tags, strict=True):
            if tag.get("is_padding", False):
                continue
            uid = key.rsplit("_", 2)[0]
            group = self._sera_round_groups.get(uid)
            if group is None:
                raise SeraOptError(
                    f"the training batch holds {key!r}, which this step's rounds did not generate; "
                    "with algorithm.sera_maxrl.rounds >= 2 every step's batch comes from its rounds."
                )
            groups[uid] = group
        return groups

    def _sera_observe(self, call: sera_verl.EstimatorCall, metrics: dict) -> None:
        """Feed one estimator call's outcomes to the planner and its diagnostics to the metrics."""
        prompt_ids, successes, observed = [], [], set()
        for uid, success in zip(call.uids.tolist(), call.successes.tolist(), strict=True):
            prompt_id = self._sera_prompt_of_uid.get(uid, _UNKNOWN)
            # Padding rows and prompts re-issued after a restart have no planned id.
            if prompt_id is _UNKNOWN:
                continue
            prompt_ids.append(prompt_id)
            successes.append(success)
            observed.add(uid)
        if prompt_ids:
            self.sera_planner.observe(prompt_ids, np.asarray(successes, dtype=np.float64))
        for uid in observed:
            self._sera_prompt_of_uid.pop(uid, None)
        metrics.update({f"sera/{name}": value for name, value in call.diagnostics.items()})
        metrics["sera/observed_rollouts"] = float(len(prompt_ids))
        if observed:
            # The diagnostics include verl's padding group; these are the planned prompts' counts only.
            sizes = Counter(uid for uid in call.uids.tolist() if uid in observed).values()
            metrics["sera/planned_min_count"] = float(min(sizes))
            metrics["sera/planned_max_count"] = float(max(sizes))

    # -- 3. checkpoints --------------------------------------------------------------

    def _save_checkpoint(self):
        super()._save_checkpoint()
        folder = os.path.join(
            self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"
        )
        _common.save_planner(self.sera_planner, folder)

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if not self.global_steps:
            return
        folder = _resumed_folder(self.config, self.global_steps)
        if _common.load_planner(self.sera_planner, folder) is None:
            logger.warning(
                "no %s in %s: the rollout planner starts without history",
                PLANNER_STATE_FILE,
                folder,
            )


_UNKNOWN = object()


class _RoundReplayBuffer:
    """verl's replay buffer, whose next training sample is the batch the rounds built.

    verl's ``_step_once`` samples the step's batch from ``self.replay_buffer``. In
    round mode the rounds have already waited for (and taken) every group through
    the wrapped buffer, so the training sample returns their rows; anything else
    (validation) goes to verl's buffer unchanged.

    Attributes
    ----------
    inner : verl.trainer.ppo.v1.replay_buffer.ReplayBuffer
        verl's buffer; the rounds sample each round's groups from it.
    prepared : transfer_queue.KVBatchMeta or None
        The rows of the step's rounds, until the step samples them.
    """

    def __init__(self, inner):
        self.inner = inner
        self.prepared = None

    def __getattr__(self, name):
        if name == "inner":  # not set yet (copying, unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        if partition_id != "train":
            return self.inner.sample(
                global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
            )
        if self.prepared is None:
            raise SeraOptError(
                "the training step sampled before its rounds ran; with algorithm.sera_maxrl.rounds "
                ">= 2 each step's batch is generated by the trainer's prepare_step."
            )
        batch, self.prepared = self.prepared, None
        return batch, {}


def _reject_multi_output_sessions(keys: Sequence[str]) -> None:
    """The estimator counts rows; an agent loop returning several outputs per session breaks that."""
    for key in keys:
        if not key.endswith("_0"):
            raise SeraOptError(
                f"the batch holds several outputs of one rollout session (key {key!r}); the "
                f"{sera_verl.ESTIMATOR_NAME} estimator counts every row as a rollout, so agent loops "
                f"that return more than one output per session are not supported."
            )


def _resumed_folder(config, global_steps: int) -> str:
    """The ``global_step_<n>`` folder verl's ``_load_checkpoint`` resumed from."""
    if config.trainer.resume_mode == "resume_path":
        folder = config.trainer.resume_from_path
    else:
        folder = os.path.join(config.trainer.default_local_dir, f"global_step_{global_steps}")
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


class SeraPPOTrainerSync(SeraTrainerMixin, PPOTrainerSync):
    """verl's synchronous V1 trainer with planned per-prompt rollout counts."""

    sera_base_mode = "sync"


class SeraPPOTrainerColocateAsync(SeraTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated asynchronous V1 trainer with planned per-prompt rollout counts."""

    sera_base_mode = "colocate_async"


class SeraPPOTrainerSeparateAsync(SeraTrainerMixin, PPOTrainerSeparateAsync):
    """verl's separate-resources asynchronous V1 trainer with planned per-prompt rollout counts."""

    sera_base_mode = "separate_async"


_CLASSES = {
    "sera_sync": SeraPPOTrainerSync,
    "sera_colocate_async": SeraPPOTrainerColocateAsync,
    "sera_separate_async": SeraPPOTrainerSeparateAsync,
}


def _registered_trainer(mode: str) -> type | None:
    """verl's trainer class for ``mode``, or None (``get_trainer_cls`` raises for unknown modes)."""
    try:
        return get_trainer_cls(mode)
    except ValueError:
        return None


def register() -> dict[str, type]:
    """Register the ``sera_*`` trainer modes with verl's ``register_trainer`` (idempotent).

    Only verl's public ``register_trainer`` and ``get_trainer_cls`` are used. A mode
    that already holds this module's class, or the same-named class of a reloaded
    copy of this module, is left as it is; one held by another class is refused.

    Returns
    -------
    dict
        Mode name -> the class verl holds for it.
    """
    registered = {}
    for mode, cls in _CLASSES.items():
        if sera_verl.TRAINER_MODES[mode] != cls.sera_base_mode:  # pragma: no cover - a typo guard
            raise AssertionError(f"{mode} does not extend {cls.sera_base_mode}")
        existing = _registered_trainer(mode)
        if existing is None:
            registered[mode] = register_trainer(mode)(cls)
        elif existing is cls or (
            existing.__qualname__ == cls.__qualname__ and existing.__module__ == cls.__module__
        ):
            registered[mode] = existing
        else:
            raise SeraOptError(
                f"verl already has a trainer mode named {mode!r} ({existing!r}); sera_opt cannot "
                f"register its own under that name."
            )
    return registered


# --------------------------------------------------------------------------- launcher


def compose_config(overrides: Sequence[str] = ()):
    """verl's ``ppo_trainer`` Hydra config with ``overrides``, checked for the sera modes.

    The same composition as ``python -m verl.trainer.main_ppo <overrides>``. When
    ``trainer.v1.trainer_mode`` is a ``sera_*`` mode, :func:`check_trainer_config`
    runs on it here, before any worker starts.
    """
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=list(overrides))
    mode = config.trainer.v1.trainer_mode
    if mode in sera_verl.TRAINER_MODES:
        if not config.trainer.use_v1:
            raise SeraOptError(
                f"trainer.v1.trainer_mode={mode} plans per-prompt counts through verl's V1 trainer; "
                f"set trainer.use_v1=true."
            )
        sera_verl.check_trainer_config(config)
    return config


def with_worker_modules(config, module: str = "sera_opt.integrations.verl"):
    """A copy of ``config`` whose Ray runtime environment makes every process import ``module``.

    verl imports the modules listed in ``VERL_USE_EXTERNAL_MODULES`` in every
    process that imports verl; ``run_ppo`` passes
    ``ray_kwargs.ray_init.runtime_env.env_vars`` to every Ray process of the job.
    ``module`` is appended to the list already given there, or else in this
    process's environment, so other external modules keep working. When Ray is
    already initialised before the launch, verl does not call ``ray.init`` and the
    running cluster's environment applies instead (set the variable there).
    """
    from omegaconf import OmegaConf

    given = OmegaConf.select(
        config, f"ray_kwargs.ray_init.runtime_env.env_vars.{WORKER_MODULES_ENV}", default=None
    )
    if given is None:
        given = os.environ.get(WORKER_MODULES_ENV, "")
    modules = [name.strip() for name in str(given).split(",") if name.strip()]
    if module not in modules:
        modules.append(module)
    updated = copy.deepcopy(config)
    with open_dict(updated):
        OmegaConf.update(
            updated,
            f"ray_kwargs.ray_init.runtime_env.env_vars.{WORKER_MODULES_ENV}",
            ",".join(modules),
            force_add=True,
        )
    return updated


def _task_runner_class():
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1

    class SeraTaskRunnerV1(TaskRunnerV1.__ray_actor_class__):
        """verl's V1 task runner, with the sera estimator and trainer modes registered."""

        def run(self, config):
            # This runs in the task runner's own process, where verl looks both up.
            sera_verl.register_estimator()
            register()
            return super().run(config)

    return ray.remote(SeraTaskRunnerV1)


def launch(argv: Sequence[str] | None = None) -> None:
    """Run verl's PPO training with ``argv`` as Hydra overrides (see :func:`compose_config`)."""
    import sys

    from verl.trainer import main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    config = compose_config(sys.argv[1:] if argv is None else argv)
    auto_set_device(config)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    if not config.trainer.use_v1:
        raise SeraOptError(
            "sera_opt's verl launcher runs verl's V1 trainer: set trainer.use_v1=true."
        )
    main_ppo.run_ppo(with_worker_modules(config), task_runner_class=_task_runner_class())
