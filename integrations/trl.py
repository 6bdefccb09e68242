"""TRL integration: ``GRPOTrainer`` with planned per-prompt rollout counts and MaxRL advantages.

:class:`SeraGRPOTrainer` is a subclass of ``trl.GRPOTrainer`` (trl 1.16) that

* gives prompt i of each generation batch n_i completions, as a
  :class:`sera_opt.RolloutPlanner` allocates them, with the sum fixed to the batch
  size, so every step costs what plain GRPO costs (``num_generations`` becomes the
  *mean* count, nbar);
* replaces GRPO's group-normalised advantages by :func:`sera_opt.maxrl_advantages`
  with the multiplicity correction (every loss type of trl 1.16 sums over
  rollouts before dividing by a batch-wide count, see :data:`LOSS_TYPE_TO_MODE`);
* logs :func:`sera_opt.advantage_diagnostics` and the allocation with the
  trainer's metrics (``sera/...``), and feeds the rewards back to the planner;
* generates each step's completions in one call of the backend, the whole plan at
  once (the default), or, when asked for (``rounds=4``, say), in ``rounds`` calls
  (docs/theory.md section 9): a first look of ``first_round`` completions per prompt,
  then the rest of the same fixed budget where the planner sends it, each round
  scored by the trainer's reward functions before the next is planned. Rounds are
  opt-in because each is one more generation call: on CPU a step in 4 rounds took
  2.04x to 2.24x a one-call step (docs/benchmarks.md);
* saves the planner's state with every checkpoint and restores it on resume;
* refuses, with :class:`sera_opt.SeraOptError`, configurations whose counts or
  advantages it could not honour (see :func:`check_grpo_config`).

How: TRL's sampler repeats each prompt ``num_generations`` times. The trainer
keeps one row per prompt, asks the planner for counts, repeats row i n_i times,
and lets TRL generate one completion per row (the transformers ``generate`` path
and vLLM colocate mode already do; in vLLM server mode the request is sent with
``n=1`` per row instead of ``n=num_generations`` per unique prompt). After TRL
scores the rows, the advantages are recomputed from the rewards and the plan.

Import this module only where trl is installed (``pip install 'sera_opt[trl]'``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import numbers
import os
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from sera_opt.exceptions import MissingDependencyError, SeraOptError, SeraOptWarning

try:
    import torch
    import trl
    from accelerate.utils import gather, gather_object
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "sera_opt.integrations.trl needs trl 1.16: pip install 'sera_opt[trl]'"
    ) from _error

import sera_opt
from sera_opt.integrations import _common
from sera_opt.integrations.torch_loop import (
    RolloutPlan,
    _as_prompt_id_array,
    check_planner_offset,
    plan_rollouts,
)
from sera_opt.rounds import run_rounds

__all__ = [
    "LOSS_TYPE_TO_MODE",
    "PLANNER_STATE_FILE",
    "SUPPORTED_TRL_VERSIONS",
    "SeraGRPOTrainer",
    "check_grpo_config",
    "default_planner",
    "loss_mode",
    "stable_prompt_id",
]

#: trl release series this adapter was written and tested against; it overrides
#: private methods of ``GRPOTrainer``, so other series are refused
#: (:func:`sera_opt.integrations._common.check_version`).
SUPPORTED_TRL_VERSIONS = ("1.16.",)

#: How each ``GRPOConfig.loss_type`` of trl 1.16 aggregates per-token losses, in
#: :func:`sera_opt.aggregate_loss` terms (read from ``GRPOTrainer._compute_loss``):
#:
#: * ``grpo``, ``sapo``: mean over the micro-batch's sequences of each sequence's
#:   token mean -> ``"seq-mean-token-mean"`` (sequences weighted by 1/length);
#: * ``bnpo``: token mean over the micro-batch -> ``"token-mean"`` (local batch);
#: * ``dapo``, ``cispo``, ``vespo``: token sum over the generation batch's token
#:   count -> ``"token-mean"``;
#: * ``dr_grpo``: token sum / (sequences x ``max_completion_length``) ->
#:   ``"seq-mean-token-sum"`` up to a constant; ``luspo``: per-sequence token sum,
#:   mean over sequences -> ``"seq-mean-token-sum"``.
#:
#: All of them sum rollout coefficients over the batch before a batch-wide division,
#: so prompt i's weight grows with n_i: the multiplicity correction applies to every
#: one of them.
LOSS_TYPE_TO_MODE = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "vespo": "token-mean",
    "dr_grpo": "seq-mean-token-sum",
    "luspo": "seq-mean-token-sum",
}

#: File name of the planner state inside a ``checkpoint-<step>`` folder (the name the
#: verl adapter uses too). Checkpoints written under the earlier name,
#: ``sera_planner_state.pt``, are still restored.
PLANNER_STATE_FILE = _common.PLANNER_STATE_FILE


def loss_mode(loss_type: str) -> str:
    """The :func:`sera_opt.aggregate_loss` mode of a trl ``loss_type``.

    Raises
    ------
    SeraOptError
        For a loss type this adapter does not know.
    """
    return _common.loss_mode(LOSS_TYPE_TO_MODE, loss_type, option="loss_type")


def stable_prompt_id(prompt: Any) -> int:
    """A 63-bit id of a prompt that is the same in every process and every run.

    Python's ``hash`` is salted per process, so it cannot identify a prompt across
    data-parallel ranks or across a resume; this hashes the prompt's JSON text.
    """
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def default_planner(estimator: str = "mean_centred", num_generations: int | None = None):
    """The planner :class:`SeraGRPOTrainer` uses when none is given.

    The library's default planner (:data:`sera_opt.planner.DEFAULT_POLICY`, and
    :data:`sera_opt.planner.DEFAULT_ROUND_POLICY` for the later rounds) with the
    offset of the estimator (``c = 1`` for ``"mean_centred"``, whose prompts need at
    least 2 rollouts to carry any signal, ``c = 0`` for ``"success_average"``),
    ``min_rollouts`` 2 (1 for ``"success_average"``) and ``max_rollouts = 4 *
    num_generations`` when ``num_generations`` is given.
    """
    offset = _common.estimator_offset(estimator)
    options: dict[str, Any] = {
        "min_rollouts": _common.default_min_rollouts(estimator),
        "offset": offset,
    }
    if num_generations is not None:
        options["max_rollouts"] = _common.default_max_rollouts(num_generations)
    return sera_opt.RolloutPlanner(**options)


def _rounds_unavailable(kwargs: dict[str, Any]) -> str | None:
    """Why the trainer built with GRPOTrainer's ``kwargs`` cannot sample in rounds, or None."""
    if kwargs.get("tools") or kwargs.get("environment_factory"):
        return "tools and environment_factory set up their per-row state for one generation call per step"
    columns = getattr(kwargs.get("train_dataset"), "column_names", None)
    if isinstance(columns, (list, tuple)) and ({"image", "images"} & set(columns)):
        return "image prompts (an image or images column) build their multimodal messages for one generation call"
    return None


def check_grpo_config(
    args: GRPOConfig,
    *,
    rollout_func: Any = None,
    estimator: str = "mean_centred",
    stacklevel: int = 2,
) -> None:
    """Refuse a ``GRPOConfig`` whose counts or advantages the adapter cannot honour.

    ``stacklevel`` places the warning for an allowed untested trl release, as in
    :func:`warnings.warn`.

    Raises
    ------
    SeraOptError
        With the reason and the fix, when

        * trl is not a 1.16 release (private methods are overridden), unless
          ``SERA_OPT_ALLOW_UNTESTED_VERSIONS=1`` is set (then a warning);
        * ``rollout_func`` is set (a custom rollout decides its own completions per
          prompt, so the counts could not be guaranteed);
        * ``multi_objective_aggregation`` is not ``"sum_then_normalize"`` (the other
          choice normalises rewards per group of ``num_generations``; MaxRL needs the
          raw outcomes);
        * ``loss_type`` is unknown;
        * a process's share of the generation batch is not a whole number of prompt
          groups (``per_device_train_batch_size * steps_per_generation`` must be a
          multiple of ``num_generations``), since each process plans its own prompts;
        * the estimator is unknown.
    """
    _common.check_version(
        "trl",
        trl.__version__,
        SUPPORTED_TRL_VERSIONS,
        adapter="sera_opt.integrations.trl",
        reason=(
            "It overrides private methods of GRPOTrainer (_generate_and_score_completions, "
            "_generate, _generate_single_turn, _calculate_rewards, _save_checkpoint, "
            "_load_optimizer_and_scheduler)."
        ),
        stacklevel=stacklevel,
    )
    if not isinstance(args, GRPOConfig):
        raise SeraOptError(f"args must be a trl.GRPOConfig; got {type(args).__name__}.")
    _common.estimator_offset(estimator)
    if rollout_func is not None:
        raise SeraOptError(
            "rollout_func is not supported by SeraGRPOTrainer: a custom rollout decides how many completions each "
            "prompt gets, so the planned counts could not be guaranteed. Generate through the trainer "
            "(transformers or vLLM), or use sera_opt.integrations.torch_loop in your own loop."
        )
    if args.multi_objective_aggregation != "sum_then_normalize":
        raise SeraOptError(
            f"multi_objective_aggregation={args.multi_objective_aggregation!r} normalises each reward per group of "
            "num_generations, which MaxRL cannot use; set multi_objective_aggregation='sum_then_normalize' and "
            "make the weighted reward sum a 0/1 outcome (or pass success_threshold)."
        )
    loss_mode(args.loss_type)
    generations = args.num_generations
    if isinstance(generations, bool) or not isinstance(generations, numbers.Integral) \
            or generations < 1:
        raise SeraOptError(
            f"num_generations must be a positive whole number (the mean number of completions "
            f"per prompt); got {generations!r}. Set GRPOConfig(num_generations=...), e.g. 8.")
    world_size = args.world_size
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) \
            or world_size < 1:
        raise SeraOptError(
            f"the GRPOConfig's world_size must be a positive whole number of processes; got "
            f"{world_size!r}. Launch with accelerate or torchrun, or leave it to a single "
            f"process.")
    if args.generation_batch_size is None:
        raise SeraOptError(
            "the GRPOConfig has no generation_batch_size; build it with GRPOConfig(...) so that "
            "trl derives it from per_device_train_batch_size and steps_per_generation.")
    rows_per_process = args.generation_batch_size // world_size
    if rows_per_process % args.num_generations != 0:
        raise SeraOptError(
            f"each process holds {rows_per_process} rows of the generation batch "
            f"(per_device_train_batch_size * steps_per_generation), which is not a multiple of "
            f"num_generations={args.num_generations}; a prompt's rows would be split across processes. Choose "
            "per_device_train_batch_size * steps_per_generation divisible by num_generations."
        )


#: The completion-length metrics TRL's ``_generate`` logs once per call; with rounds the
#: trainer logs them once per step, for the step's whole batch.
_LENGTH_METRICS = (
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)


def _concatenate_generations(outputs: list[tuple]) -> tuple:
    """One ``GRPOTrainer._generate`` output from the rounds' outputs, rows in order.

    Without tools or a custom rollout (both refused with rounds) the tool mask and
    images are None, the extra fields empty and the tool images lists.
    """
    fields = list(zip(*outputs, strict=True))
    merged = []
    for values in fields:
        if all(value is None for value in values):
            merged.append(None)
        elif all(isinstance(value, dict) for value in values):
            if any(values):  # pragma: no cover - only a rollout_func sets extra fields
                raise SeraOptError("extra generation fields cannot be merged across rounds.")
            merged.append({})
        elif all(isinstance(value, list) for value in values):
            merged.append([item for value in values for item in value])
        else:
            raise SeraOptError(  # pragma: no cover - e.g. logprobs in some rounds only
                "the generation backend returned a field in some rounds and not in others."
            )
    return tuple(merged)


class _EpochBoundary(TrainerCallback):
    """Tells the trainer's planner where each pass over the training data ends
    (:meth:`sera_opt.RolloutPlanner.end_epoch`; nothing to do for a tracker that updates
    after every step)."""

    def __init__(self, trainer: SeraGRPOTrainer):
        self._trainer = trainer

    def on_epoch_end(self, args, state, control, **kwargs):
        end = getattr(self._trainer.sera_planner, "end_epoch", None)
        if end is not None:
            end()
        return control


class SeraGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with planned rollout counts and MaxRL advantages.

    Takes every argument of ``GRPOTrainer`` plus the keyword-only ones below.
    ``args.num_generations`` is the mean number of completions per prompt; each
    generation batch still holds ``args.generation_batch_size`` completions.

    Parameters
    ----------
    planner : sera_opt.RolloutPlanner, optional
        Decides the counts (``plan``) and learns from the rewards (``observe``).
        Default: :func:`default_planner` for the estimator.
    estimator : {"mean_centred", "success_average"}
        The MaxRL estimator (:func:`sera_opt.maxrl_advantages`).
    multiplicity_correction : bool
        Scale prompt i's advantages by ``nbar / n_i`` (default True; every trl loss
        type needs it under unequal counts).
    success_threshold : float, optional
        Passed to :func:`sera_opt.maxrl_advantages` when the weighted reward sum is
        not already 0/1.
    prompt_id_column : str or None
        Dataset column holding a stable id per prompt (default ``"prompt_id"``).
        When the column is absent (or this is None) the id is a hash of the prompt
        (:func:`stable_prompt_id`).
    history_size : int
        Number of generation batches kept in :attr:`sera_history`.
    rounds : int or None
        Generation calls per step. None (the default):
        :data:`sera_opt.rounds.DEFAULT_ROUNDS`, 1, the whole plan in one call, by the
        planner's ``policy`` (the static plan). Rounds are opt-in: each costs one more
        call of the generation backend, and through TRL on CPU a step in 4 rounds took
        2.04x to 2.24x a one-call step (docs/benchmarks.md), so the default stays one
        call until a compute-matched experiment says otherwise. With ``rounds=R >= 2``
        each process runs a
        :class:`sera_opt.RoundSession` over its prompts: round 1 gives every prompt
        ``first_round`` completions, the later rounds split the rest of the process's
        share of the generation batch and go where the planner's ``round_policy``
        sends them (the default planner: evenly among the prompts still without a
        success), each scored before the next is planned. The total per step stays
        ``generation_batch_size``; the advantages use the first-round baseline
        (``round_index``). Every process runs the same rounds with the same number
        of rows, so the backend's collective calls line up. Costs one generation call
        (and one reward call) per round. Not available with ``tools`` or
        ``environment_factory`` (their per-row state is set up for one generation
        call) or with image prompts (a dataset with an ``image`` or ``images``
        column).
    first_round : int, optional
        Completions per prompt in the first round (default: half of
        ``num_generations``); a prompt gets at least its ``min_rollouts`` in it
        (:meth:`sera_opt.RolloutPlanner.start_rounds`). Needs ``rounds >= 2``.

    Attributes
    ----------
    sera_planner : sera_opt.RolloutPlanner
        The planner in use (its state is saved with each checkpoint).
    sera_history : collections.deque of dict
        One record per generation batch of this process: ``global_step``,
        ``prompt_ids``, ``allocated_counts``, ``generated_counts`` (completions the
        generation backend returned per prompt), ``prompt_index``, ``rewards``,
        ``advantages`` (row order, before TRL shuffles the batch) and
        ``diagnostics``; with rounds also ``round_index`` (each row's round),
        ``round_counts`` (rounds x prompts) and ``rounds``.
    sera_loss_mode : str
        The aggregation of ``args.loss_type`` (:data:`LOSS_TYPE_TO_MODE`).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        *posargs: Any,
        planner: Any = None,
        estimator: str = "mean_centred",
        multiplicity_correction: bool = True,
        success_threshold: float | None = None,
        prompt_id_column: str | None = "prompt_id",
        history_size: int = 256,
        rounds: int | None = None,
        first_round: int | None = None,
        **kwargs: Any,
    ):
        if args is None:
            raise SeraOptError(
                "SeraGRPOTrainer needs an explicit GRPOConfig (args=...), so that num_generations, the batch sizes "
                "and loss_type are chosen on purpose."
            )
        if posargs:
            raise SeraOptError(
                "pass GRPOTrainer's arguments after `args` by keyword (train_dataset=..., processing_class=...)."
            )
        check_grpo_config(
            args, rollout_func=kwargs.get("rollout_func"), estimator=estimator, stacklevel=3
        )
        if isinstance(history_size, bool) or not isinstance(history_size, numbers.Integral) \
                or history_size < 1:
            raise SeraOptError(f"history_size must be a positive integer; got {history_size!r}.")
        history_size = int(history_size)
        if prompt_id_column is not None and not isinstance(prompt_id_column, str):
            raise SeraOptError(
                f"prompt_id_column must be the name of a dataset column (a str) or None (ids "
                f"from the prompt's text); got {prompt_id_column!r}.")
        if planner is not None:
            _common.check_planner(planner)
        self.sera_planner = (
            planner if planner is not None else default_planner(estimator, args.num_generations)
        )
        check_planner_offset(self.sera_planner, estimator, stacklevel=3)
        if not isinstance(multiplicity_correction, bool):
            raise SeraOptError(
                f"multiplicity_correction must be True or False; got {multiplicity_correction!r}."
            )
        self.sera_estimator = estimator
        self.sera_multiplicity_correction = multiplicity_correction
        self.sera_success_threshold = _common.check_success_threshold(success_threshold)
        self.sera_prompt_id_column = prompt_id_column
        self.sera_loss_mode = loss_mode(args.loss_type)
        self.sera_history: deque[dict[str, Any]] = deque(maxlen=history_size)
        rounds, self.sera_first_round = _common.check_rounds(rounds, first_round)
        unavailable = _rounds_unavailable(kwargs)
        # The default is one call, which every setting can run: only rounds asked for
        # are refused below.
        self.sera_rounds = _common.resolve_rounds(rounds)
        self._sera_plan: RolloutPlan | None = None
        self._sera_generated_counts: np.ndarray | None = None
        self._sera_rewards_per_func: torch.Tensor | None = None
        self._sera_pregenerated: tuple | None = None
        self._sera_round_rewards: torch.Tensor | None = None
        if self.sera_rounds > 1 and unavailable:
            raise SeraOptError(
                f"rounds={self.sera_rounds} is not available: {unavailable}. Drop rounds (the default, one "
                "call per step) or set rounds=1, or drive the rounds yourself with "
                "sera_opt.integrations.torch_loop.maxrl_round_step."
            )
        # A tracker frozen per epoch (the authors' estimates) folds an epoch's outcomes in at
        # each pass over the training data.
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or ()), _EpochBoundary(self)]
        super().__init__(model, reward_funcs, args, **kwargs)

    # ------------------------------------------------------------------ planning
    def _sera_prompt_id(self, row: dict[str, Any]) -> Any:
        column = self.sera_prompt_id_column
        if column is not None and column in row:
            value = row[column]
            if isinstance(value, (np.integer, torch.Tensor)):
                value = value.item()
            return value
        if "prompt" not in row:
            raise SeraOptError(
                "a dataset row has neither a 'prompt' nor a prompt id column; add a "
                f"{column or 'prompt_id'!r} column with one stable id per prompt."
            )
        return stable_prompt_id(row["prompt"])

    def _sera_groups(
        self, inputs: Sequence[dict[str, Any]], group_size: int
    ) -> list[dict[str, Any]]:
        """One row per prompt from TRL's repeated rows, checking the repeats agree."""
        if len(inputs) % group_size != 0:
            raise SeraOptError(
                f"the generation batch of this process has {len(inputs)} rows, not a multiple of "
                f"num_generations={group_size}; see check_grpo_config."
            )
        groups = []
        for start in range(0, len(inputs), group_size):
            first = inputs[start]
            first_id = self._sera_prompt_id(first)
            for row in inputs[start + 1 : start + group_size]:
                if self._sera_prompt_id(row) != first_id:
                    raise SeraOptError(
                        "the rows TRL's sampler delivered are not grouped by prompt in runs of num_generations; "
                        "SeraGRPOTrainer needs trl's RepeatSampler ordering (do not replace the train sampler)."
                    )
            groups.append(first)
        return groups

    # --------------------------------------------------------------- generation
    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        if self._sera_plan is not None:
            # The rows are already repeated as planned: one completion per row. This is
            # what the transformers path and vLLM colocate mode do anyway; in vLLM server
            # mode it turns "n=num_generations per unique prompt" into one request per row.
            num_generations = 1
        return super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
        )

    def _generate(self, prompts: list):
        if self._sera_pregenerated is not None:
            # The rounds already generated (and checked) every row, in this order.
            result = self._sera_pregenerated
            if len(result[1]) != len(prompts):  # pragma: no cover - guarded by the row layout
                raise SeraOptError(
                    "the rounds generated a different number of rows than the batch holds."
                )
            return result
        result = super()._generate(prompts)
        plan = self._sera_plan
        if plan is None:
            return result
        prompt_ids, completion_ids = result[0], result[1]
        if len(completion_ids) != plan.budget or len(prompt_ids) != plan.budget:
            raise SeraOptError(
                f"the generation backend returned {len(completion_ids)} completions for {plan.budget} planned rows; "
                "the planned counts cannot be honoured with this backend configuration."
            )
        # Count, per planned prompt, the completions whose prompt tokens (as returned by
        # the backend) are that prompt's: a backend that reordered or merged rows fails here.
        generated = np.zeros(plan.num_prompts, dtype=np.int64)
        reference: dict[int, list[int]] = {}
        for row, prompt_position in enumerate(plan.prompt_index.tolist()):
            tokens = list(prompt_ids[row])
            expected = reference.setdefault(prompt_position, tokens)
            if tokens != expected:
                raise SeraOptError(
                    f"completion row {row} was generated for a different prompt than planned; the generation "
                    "backend reordered rows, so the planned counts cannot be honoured."
                )
            generated[prompt_position] += 1
        self._sera_generated_counts = generated
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._sera_round_rewards is not None:
            # Each round was scored when it was generated; gathered here in the layout
            # TRL expects (every process's rows, process by process).
            rewards_per_func = gather(self._sera_round_rewards)
            self._sera_rewards_per_func = rewards_per_func
            return rewards_per_func
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        # Already gathered over processes, in process order: kept to rebuild the advantages.
        self._sera_rewards_per_func = rewards_per_func
        return rewards_per_func

    # ---------------------------------------------------------------- advantages
    def _sera_global_index(self, local_index: np.ndarray, num_local_prompts: int) -> torch.Tensor:
        device = self.accelerator.device
        offset = self.accelerator.process_index * num_local_prompts
        local = torch.as_tensor(local_index + offset, dtype=torch.long, device=device)
        return self.accelerator.gather(local)

    def _sera_rewards(self, rewards_per_func: torch.Tensor | None = None) -> torch.Tensor:
        if rewards_per_func is None:
            rewards_per_func = self._sera_rewards_per_func
        if rewards_per_func is None:  # pragma: no cover - guarded by TRL's control flow
            raise SeraOptError("no rewards were computed for the generation batch.")
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        if bool(unscorable.any()):
            raise SeraOptError(
                f"{int(unscorable.sum())} completions got no reward (every reward function returned None); MaxRL "
                "needs an outcome for every rollout. Make at least one reward function score every completion."
            )
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        return (rewards_per_func * weights).nansum(dim=1)

    def _sera_replace_advantages(
        self,
        output: dict[str, Any],
        mode: str,
        global_index: torch.Tensor,
        rewards: torch.Tensor,
        round_index: torch.Tensor | None = None,
        mean_count: float | None = None,
    ) -> torch.Tensor:
        advantages = sera_opt.maxrl_advantages(
            rewards,
            global_index,
            estimator=self.sera_estimator,
            multiplicity_correction=self.sera_multiplicity_correction,
            success_threshold=self.sera_success_threshold,
            round_index=round_index,
            mean_count=mean_count,
        )
        advantages = advantages.to(
            device=output["advantages"].device, dtype=output["advantages"].dtype
        )
        num_local = output["advantages"].shape[0]
        start = self.accelerator.process_index * num_local
        output["advantages"] = advantages[start : start + num_local]

        # TRL logged its own (group-normalised) advantages and zero-std fraction for
        # fixed groups; replace them by the ones actually used.
        self._logs["advantages"].clear()
        self._logs["advantages"].extend(advantages.tolist())
        group_min = torch.full((int(global_index.max()) + 1,), float("inf"), device=rewards.device)
        group_max = torch.full_like(group_min, float("-inf"))
        group_min = group_min.scatter_reduce(0, global_index, rewards, reduce="amin")
        group_max = group_max.scatter_reduce(0, global_index, rewards, reduce="amax")
        zero_spread = (group_max == group_min)[global_index].float().mean().item()
        zero_std_log = self._metrics[mode]["frac_reward_zero_std"]
        if zero_std_log:
            zero_std_log[-1] = zero_spread
        else:  # pragma: no cover - TRL always logs it
            zero_std_log.append(zero_spread)
        return advantages

    def _sera_log_diagnostics(
        self, mode: str, global_index: torch.Tensor, rewards: torch.Tensor, plan
    ) -> dict:
        diagnostics = sera_opt.advantage_diagnostics(
            rewards,
            global_index,
            estimator=self.sera_estimator,
            success_threshold=self.sera_success_threshold,
            mean_count=None if plan is None else plan.mean_count,
        )
        diagnostics = {key: float(value) for key, value in dict(diagnostics).items()}
        # Prompts the plan switched off (0 rollouts), summed over the processes' plans.
        if plan is not None:
            diagnostics.update(self._sera_active_set_metrics(plan.allocation))
        for key, value in diagnostics.items():
            self._metrics[mode][f"sera/{key}"].append(value)
        if plan is not None:
            counts = plan.counts.astype(float)
            self._metrics[mode]["sera/count_min"].append(float(counts.min()))
            self._metrics[mode]["sera/count_max"].append(float(counts.max()))
            allocation = plan.allocation
            min_factor = getattr(allocation, "min_factor", None)
            if min_factor is not None:
                self._metrics[mode]["sera/planned_min_factor"].append(float(min_factor))
        return diagnostics

    def _sera_active_set_metrics(self, allocation) -> dict:
        """The active fraction and the prompts switched off as too easy, as too hard and
        forced on, over every process's plan of this generation batch."""
        local = _common.active_set_metrics(allocation)
        num_prompts = float(getattr(allocation, "num_prompts", 0) or 0)
        values = torch.tensor(
            [local["active_fraction"] * num_prompts, num_prompts,
             local["switched_off_too_easy"], local["switched_off_too_hard"],
             local["forced_activations"]],
            dtype=torch.float64, device=self.accelerator.device)
        total = self.accelerator.reduce(values, reduction="sum")
        active, prompts, easy, hard, forced = total.tolist()
        return {"active_fraction": active / prompts if prompts else 1.0,
                "switched_off_too_easy": easy, "switched_off_too_hard": hard,
                "forced_activations": forced}

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        if mode == "eval":
            return self._sera_eval_batch(inputs)

        groups = self._sera_groups(inputs, self.num_generations)
        prompt_ids = [self._sera_prompt_id(row) for row in groups]
        rounds_result = None
        if self.sera_rounds > 1:
            rounds_result, generated, pregenerated, round_rewards, rows = (
                self._sera_generate_rounds(groups, prompt_ids, len(inputs))
            )
            # Rows round by round (a prompt's rows are not contiguous), as generated.
            plan = RolloutPlan(
                prompt_ids=_as_prompt_id_array(prompt_ids),
                counts=rounds_result.counts,
                prompt_index=rounds_result.prompt_index,
            )
        else:
            plan = plan_rollouts(self.sera_planner, prompt_ids, len(inputs))
            pregenerated = round_rewards = None
            # Shallow copies: TRL may write into rows, and a row repeated n_i times must not alias.
            rows = [copy.copy(groups[position]) for position in plan.prompt_index.tolist()]

        if rounds_result is None:
            self._sera_plan = plan
            self._sera_generated_counts = None
        self._sera_pregenerated = pregenerated
        self._sera_round_rewards = round_rewards
        self._sera_rewards_per_func = None
        try:
            output = super()._generate_and_score_completions(rows)
        finally:
            self._sera_plan = None
            self._sera_pregenerated = None
            self._sera_round_rewards = None
        if rounds_result is None:
            generated = self._sera_generated_counts
        if generated is None or not np.array_equal(generated, plan.counts):
            raise SeraOptError(
                f"planned counts {plan.counts.tolist()} but the backend generated "
                f"{None if generated is None else generated.tolist()}."
            )

        rewards = self._sera_rewards()
        global_index = self._sera_global_index(plan.prompt_index, plan.num_prompts)
        round_index = None
        if rounds_result is not None:
            round_index = self.accelerator.gather(
                torch.tensor(
                    rounds_result.round_index, dtype=torch.long, device=self.accelerator.device
                )
            )
        # N0 / n_i weights: a prompt the plan switched off handed its share of the batch to
        # the active ones (every process plans its share with the same N0).
        advantages = self._sera_replace_advantages(output, mode, global_index, rewards, round_index,
                                                   mean_count=plan.mean_count)
        diagnostics = self._sera_log_diagnostics(mode, global_index, rewards, plan)
        if rounds_result is not None:
            diagnostics.update(self._sera_log_round_diagnostics(mode, rounds_result))

        # Every process observes every rollout, so the planners stay identical across processes.
        row_prompt_ids = gather_object(plan.row_prompt_ids.tolist())
        self.sera_planner.observe(row_prompt_ids, self._sera_outcomes(rewards))

        num_local = len(rows)
        start = self.accelerator.process_index * num_local
        record = {
            "global_step": int(self.state.global_step),
            "prompt_ids": plan.prompt_ids.tolist(),
            "allocated_counts": plan.counts.tolist(),
            "generated_counts": generated.tolist(),
            "prompt_index": plan.prompt_index.tolist(),
            "rewards": rewards[start : start + num_local].tolist(),
            "advantages": advantages[start : start + num_local].tolist(),
            "diagnostics": diagnostics,
        }
        if rounds_result is not None:
            record["rounds"] = rounds_result.rounds
            record["round_index"] = rounds_result.round_index.tolist()
            record["round_counts"] = rounds_result.round_counts.tolist()
        self.sera_history.append(record)
        return output

    # ------------------------------------------------------------------- rounds
    def _sera_generate_rounds(self, groups, prompt_ids, budget):
        """Generate and score this process's rows in ``self.sera_rounds`` rounds.

        Returns the session's result, the completions generated per prompt, the
        concatenated output of the rounds' ``_generate`` calls (row order: round by
        round), this process's rewards per function for those rows, and the rows
        themselves (one shallow copy per row, made once for the round's reward call and
        reused for the batch).
        """
        if "images" in groups[0] or "image" in groups[0]:
            raise SeraOptError(
                "rounds > 1 is not available with image prompts (their multimodal messages are built for one "
                "generation call); use rounds=1."
            )
        session = self.sera_planner.start_rounds(
            prompt_ids,
            budget,
            rounds=self.sera_rounds,
            first_round=self.sera_first_round,
            observe=False,
        )
        # Each round's backend call gathers over processes: every process must run the
        # same rounds with the same number of rows (same share, same plan of budgets).
        all_budgets = gather_object([list(session.round_budgets)])
        if any(b != all_budgets[0] for b in all_budgets):
            raise SeraOptError(
                f"the processes planned different round budgets {all_budgets}; every process needs the same number "
                "of prompts and rows per generation batch, and the same first_round."
            )
        rank = self.accelerator.process_index
        positions = np.arange(len(groups), dtype=np.int64)
        ids = _as_prompt_id_array(prompt_ids)
        outputs: list[tuple] = []
        local_rewards: list[torch.Tensor] = []
        rows: list[dict[str, Any]] = []
        generated = np.zeros(len(groups), dtype=np.int64)

        def sample(counts: np.ndarray) -> np.ndarray:
            # Every round run_rounds hands out samples (empty rounds are dropped when the
            # session starts, the same on every process: the budgets were checked equal).
            rows_in_round = int(counts.sum())
            index = np.repeat(positions, counts)
            # Shallow copies: TRL may write into rows, and a repeated row must not alias.
            round_rows = [copy.copy(groups[p]) for p in index.tolist()]
            rows.extend(round_rows)
            prompts = [row["prompt"] for row in round_rows]
            self._sera_plan = RolloutPlan(prompt_ids=ids, counts=counts, prompt_index=index)
            self._sera_generated_counts = None
            try:
                result = self._generate(prompts)
            finally:
                self._sera_plan = None
            # _generate checked the round's rows against its plan, prompt by prompt.
            np.add(generated, self._sera_generated_counts, out=generated)
            completion_ids, completions = result[1], result[3]
            gathered = GRPOTrainer._calculate_rewards(
                self, round_rows, prompts, completions, completion_ids
            )
            local = slice(rank * rows_in_round, (rank + 1) * rows_in_round)
            outputs.append(result)
            local_rewards.append(gathered[local])
            # Checked on the gathered rewards, so that every process raises together.
            return self._sera_outcomes(self._sera_rewards(gathered)[local])

        mode = "train" if self.model.training else "eval"
        logged_before = {key: len(self._metrics[mode][key]) for key in _LENGTH_METRICS}
        run_rounds(session, sample)
        merged = _concatenate_generations(outputs)
        self._sera_log_batch_lengths(mode, logged_before, merged[1])
        return (
            session.result(),
            generated,
            merged,
            torch.cat(local_rewards, dim=0),
            rows,
        )

    def _sera_log_batch_lengths(self, mode: str, logged_before: dict, completion_ids) -> None:
        """Replace the completion-length metrics each round's call logged by the step's.

        TRL averages a step's entries when it logs, so per-round entries would report the
        mean of the rounds' minima as the minimum (and means unweighted by round size).
        These are computed as ``GRPOTrainer._generate`` computes them for one call (no
        tools with rounds, so a completion's length is its token count).
        """
        device = self.accelerator.device
        lengths = self.accelerator.gather(
            torch.tensor([len(ids) for ids in completion_ids], device=device)
        ).float()
        ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        truncated = self.accelerator.gather(
            torch.tensor([ids[-1] not in ends for ids in completion_ids], device=device)
        )
        terminated = lengths[~truncated]
        if len(terminated) == 0:  # as TRL: no completion ended before the limit
            terminated = torch.zeros(1, device=device)
        values = {
            "completions/mean_length": lengths.mean(),
            "completions/min_length": lengths.min(),
            "completions/max_length": lengths.max(),
            "completions/clipped_ratio": truncated.float().mean(),
            "completions/mean_terminated_length": terminated.mean(),
            "completions/min_terminated_length": terminated.min(),
            "completions/max_terminated_length": terminated.max(),
        }
        for key, value in values.items():
            log = self._metrics[mode][key]
            del log[logged_before[key] :]
            log.append(value.item())

    def _sera_log_round_diagnostics(self, mode: str, result) -> dict:
        """Log the rounds' diagnostics (``sera/rounds``, ``sera/round_<r>_budget``, ...)
        over all processes: budgets summed, active fractions and the mean scale
        averaged (every process has the same number of prompts), the minimum scale
        the smallest."""
        local = _common.round_diagnostics(result)
        every = gather_object([local])
        combined = {}
        for key in local:
            values = [d[key] for d in every]
            if key.endswith("_budget"):
                combined[key] = float(sum(values))
            elif key == "min_scale":
                combined[key] = float(min(values))
            else:
                combined[key] = float(np.mean(values))
        for key, value in combined.items():
            self._metrics[mode][f"sera/{key}"].append(value)
        return combined

    def _sera_outcomes(self, rewards: torch.Tensor) -> np.ndarray:
        return _common.binary_outcomes(rewards, self.sera_success_threshold)

    def _sera_eval_batch(self, inputs):
        # Evaluation keeps TRL's uniform groups of num_generations_eval; only the
        # advantages (and so the reported eval loss) become MaxRL's.
        group_size = self.num_generations_eval
        self._sera_rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        rewards = self._sera_rewards()
        # TRL groups consecutive rows of the gathered eval batch (a group may span
        # processes), so the index is built on the gathered rows.
        global_index = torch.arange(rewards.shape[0], device=rewards.device) // group_size
        self._sera_replace_advantages(output, "eval", global_index, rewards)
        self._sera_log_diagnostics("eval", global_index, rewards, None)
        return output

    # -------------------------------------------------------------- checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            _common.save_planner(
                self.sera_planner, os.path.join(self._get_output_dir(trial=trial), folder)
            )

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        if _common.load_planner(self.sera_planner, checkpoint) is None:
            warnings.warn(
                f"checkpoint {checkpoint} has no {PLANNER_STATE_FILE}; the planner starts from its prior.",
                SeraOptWarning,
                stacklevel=2,
            )
