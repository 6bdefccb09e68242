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

import copy
import logging
import os
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls, register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu

from sera_opt.exceptions import SeraOptError
from sera_opt.integrations import _common
from sera_opt.integrations import verl as sera_verl

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
        super().__init__(base_config)
        self.sera_mean_count = int(base_config.actor_rollout_ref.rollout.n)
        self.sera_planner = sera_verl.build_planner(self.sera_options, self.sera_mean_count)
        self._sera_prompt_of_uid: OrderedDict[Any, Any] = OrderedDict()

    # -- 1. counts -------------------------------------------------------------------

    def _next_train_batch(self, num_prompts: int | None = None):
        batch = super()._next_train_batch(num_prompts)
        return self._sera_plan(batch)

    def _sera_plan(self, batch):
        """Plan the counts of a prompt batch and write them into ``__rollout_n__``."""
        prompt_ids = sera_verl.prompt_ids_from_batch(batch, self.sera_options.prompt_key)
        counts = sera_verl.plan_rollout_counts(self.sera_planner, prompt_ids, self.sera_mean_count)
        sera_verl.assign_rollout_counts(batch, counts)
        uids = tu.get(batch, "uid")
        if uids is None or len(uids) != len(prompt_ids):
            raise SeraOptError("the V1 training batch has no per-prompt 'uid' column.")
        for uid, prompt_id in zip(uids, prompt_ids, strict=True):
            self._sera_prompt_of_uid[uid] = prompt_id
        limit = _UID_MEMORY_BATCHES * max(len(prompt_ids), int(self.config.data.train_batch_size))
        while len(self._sera_prompt_of_uid) > limit:
            self._sera_prompt_of_uid.popitem(last=False)
        return batch

    # -- 2. outcomes and diagnostics -------------------------------------------------

    def _compute_advantage(self, batch, metrics: dict):
        _reject_multi_output_sessions(batch.keys)
        with sera_verl.collect_estimator_calls() as calls:
            batch = super()._compute_advantage(batch, metrics)
        for call in calls:
            self._sera_observe(call, metrics)
        return batch

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
