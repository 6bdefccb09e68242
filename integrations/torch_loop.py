"""One MaxRL training step with planned rollout counts, for any PyTorch loop.

The step has five parts, and this module supplies the four that do not depend on
the model:

1. :func:`plan_rollouts` asks a :class:`sera_opt.RolloutPlanner` how many rollouts
   each prompt of the batch gets (the counts sum to the budget) and returns the
   prompt of every rollout row;
2. *you* sample one completion per row and score it (binary rewards);
3. :func:`maxrl_loss` turns the rewards into MaxRL advantages
   (:func:`sera_opt.maxrl_advantages`, with the multiplicity correction) and
   combines them with your sequence or token log-probabilities through
   :func:`sera_opt.aggregate_loss`;
4. :func:`observe` feeds the rewards back to the planner, so that the next plan
   uses them.

:func:`maxrl_round_step` is the documented step, around a callable that does part 2
for one generation call. By default (:data:`sera_opt.rounds.DEFAULT_ROUNDS`, 1) it is
the static step: the whole plan in one call, :func:`maxrl_step`'s counts and loss.
With ``rounds=R >= 2`` (opt-in) it samples the step's budget in R rounds, each
planned on the rewards of the rounds before it, one generation call per round::

    planner = sera_opt.RolloutPlanner(max_rollouts=32)   # the default policies
    for prompt_ids in batches:                           # M distinct prompt ids
        out = maxrl_round_step(planner, prompt_ids, 8 * len(prompt_ids), rollout_fn)
        out.loss.backward(); optimizer.step(); optimizer.zero_grad()

where ``rollout_fn(plan)`` samples and scores one completion per row of ``plan`` and
returns ``(log_probs, rewards)`` or ``(log_probs, rewards, mask)``. Rounds are opt-in
because each is one more generation call: through TRL on CPU a step in 4 rounds took
2.04x to 2.24x a one-call step (docs/benchmarks.md). :func:`maxrl_step` is the
static step itself; it chains the four parts the same way. By hand::

    planner = sera_opt.RolloutPlanner(min_rollouts=2, max_rollouts=16)  # the default policy
    for prompt_ids in batches:                      # M distinct prompt ids
        plan = plan_rollouts(planner, prompt_ids, budget=8 * len(prompt_ids))
        completions = my_sampler(plan.row_prompt_ids)          # one per row
        rewards = my_reward(plan.row_prompt_ids, completions)  # 0/1 per row
        logps, mask = my_token_logps(plan.row_prompt_ids, completions)
        out = maxrl_loss(logps, rewards, plan.prompt_index, mask=mask)
        out.loss.backward(); optimizer.step(); optimizer.zero_grad()
        observe(planner, plan, rewards)

This module imports torch; ``import sera_opt`` does not import it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import sera_opt
from sera_opt.estimator.groups import check_not_meta
from sera_opt.exceptions import SeraOptError, SeraOptWarning
from sera_opt.integrations import _common
from sera_opt.rounds import run_rounds

__all__ = [
    "LOSS_MODES",
    "MaxRLLoss",
    "RolloutPlan",
    "StepOutput",
    "check_planner_offset",
    "maxrl_loss",
    "maxrl_round_step",
    "RoundStepOutput",
    "maxrl_step",
    "observe",
    "plan_rollouts",
    "reinforce_ada_step",
]

#: The aggregation modes of :func:`sera_opt.aggregate_loss` (:data:`sera_opt.LOSS_MODES`).
LOSS_MODES = _common.LOSS_MODES


@dataclass(frozen=True)
class RolloutPlan:
    """Which prompt every rollout row of one batch belongs to.

    Attributes
    ----------
    prompt_ids : numpy.ndarray, shape (M,)
        The batch's prompt ids, in the order given to :func:`plan_rollouts`.
    counts : numpy.ndarray of int64, shape (M,)
        Rollouts allocated to each prompt; ``counts.sum() == budget``.
    prompt_index : numpy.ndarray of int64, shape (B,)
        For each rollout row, the position of its prompt in ``prompt_ids``. Rows of
        one prompt are contiguous and prompts keep their order:
        ``prompt_index == np.repeat(np.arange(M), counts)``.
    allocation : sera_opt.Allocation or None
        The planner's allocation (factors, levels, waterline, ...), or None when the
        plan was built from counts directly.
    """

    prompt_ids: np.ndarray
    counts: np.ndarray
    prompt_index: np.ndarray
    allocation: Any = field(default=None, repr=False, compare=False)

    @property
    def budget(self) -> int:
        """Total number of rollout rows, B."""
        return int(self.prompt_index.shape[0])

    @property
    def num_prompts(self) -> int:
        """Number of prompts, M (those switched off included)."""
        return int(self.prompt_ids.shape[0])

    @property
    def mean_count(self) -> float:
        """``N0 = B / M``, the multiplicity correction's ``nbar``: a switched-off prompt's
        share of the budget went to the active prompts, whose weights stay ``N0 / n_i``."""
        return self.budget / self.num_prompts

    @property
    def row_prompt_ids(self) -> np.ndarray:
        """The prompt id of every rollout row, shape (B,)."""
        return self.prompt_ids[self.prompt_index]

    def prompt_index_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``prompt_index`` as an int64 tensor on ``device``."""
        return torch.as_tensor(self.prompt_index, dtype=torch.long, device=device)

    @classmethod
    def from_counts(
        cls, prompt_ids: Sequence[Any], counts: Sequence[int], allocation: Any = None
    ) -> RolloutPlan:
        """Build a plan from given per-prompt counts (validated: integers >= 1).

        Parameters
        ----------
        prompt_ids : sequence, length M
            Distinct prompt ids.
        counts : sequence of int, length M
            Rollouts per prompt.
        allocation : sera_opt.Allocation, optional
            Kept on the plan for logging. An allocation with an active set lets prompts
            have 0 rollouts (they get no rows); otherwise every count is at least 1.
        """
        ids = _as_prompt_id_array(prompt_ids)
        counts_arr = _common.check_counts(counts, ids.shape[0],
                                          minimum=_common.count_minimum(allocation))
        prompt_index = np.repeat(np.arange(ids.shape[0], dtype=np.int64), counts_arr)
        return cls(
            prompt_ids=ids, counts=counts_arr, prompt_index=prompt_index, allocation=allocation
        )


@dataclass(frozen=True)
class MaxRLLoss:
    """Result of :func:`maxrl_loss`.

    Attributes
    ----------
    loss : torch.Tensor
        Scalar loss; ``loss.backward()`` ascends the (multiplicity-corrected) MaxRL
        objective.
    advantages : torch.Tensor, shape (B,)
        The per-rollout coefficients used (detached).
    """

    loss: torch.Tensor
    advantages: torch.Tensor


@dataclass(frozen=True)
class StepOutput:
    """Result of :func:`maxrl_step`.

    Attributes
    ----------
    loss : torch.Tensor
        Scalar loss to back-propagate.
    advantages : torch.Tensor, shape (B,)
        Per-rollout advantages.
    rewards : torch.Tensor, shape (B,)
        Rewards returned by the rollout function, as float.
    plan : RolloutPlan
        The plan that was sampled.
    diagnostics : dict of str to float
        :func:`sera_opt.advantage_diagnostics` of the batch.
    """

    loss: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    plan: RolloutPlan
    diagnostics: dict[str, float]


def _as_prompt_id_array(prompt_ids: Sequence[Any]) -> np.ndarray:
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.detach().cpu().numpy()
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1:
        raise SeraOptError(
            f"prompt_ids must be a 1-D sequence of ids; got an array of shape {ids.shape}."
        )
    if ids.shape[0] == 0:
        raise SeraOptError("prompt_ids is empty; a batch needs at least one prompt.")
    uniques, first = np.unique(ids, return_index=True)
    if uniques.shape[0] != ids.shape[0]:
        duplicated = np.setdiff1d(np.arange(ids.shape[0]), first)
        raise SeraOptError(
            f"prompt_ids must be distinct within a batch; {ids[duplicated].tolist()!r} repeat. "
            "Give a prompt more rollouts through the planner instead of listing it twice."
        )
    return ids


def check_planner_offset(planner: Any, estimator: str, *, stacklevel: int = 2) -> None:
    """Warn when an offset-sensitive planner equalizes the factors of the other estimator.

    SERA equalizes ``w_c(p, n) = 1 - (1 - p)^(n - c)`` for the offset ``c`` it was
    built with; the estimator's attenuation has its own offset
    (``sera_opt.ESTIMATOR_OFFSETS``: 1 for ``"mean_centred"``, 0 for
    ``"success_average"``). With the wrong one the allocation equalizes the wrong
    factors (and, for the mean-centred estimator with ``c = 0``, may give a prompt
    a single rollout, which carries no signal).

    Parameters
    ----------
    planner : sera_opt.RolloutPlanner
        The planner. Only policies that declare ``offset_sensitive`` (their counts
        depend on c: ``"sera"``, ``"sera-bayes"``, ...) are checked; the others'
        counts are the same whatever their offset.
    estimator : str
        The MaxRL estimator the advantages use.
    stacklevel : int
        Passed to :func:`warnings.warn`.
    """
    expected = _common.ESTIMATOR_OFFSETS.get(estimator)
    policy = getattr(planner, "policy", None)
    offset = getattr(policy, "offset", None)
    if expected is None or offset is None or not getattr(policy, "offset_sensitive", False):
        return
    if int(offset) != expected:
        warnings.warn(
            f"the planner's {policy.name!r} policy equalizes factors with offset {offset}, but the "
            f"{estimator!r} estimator's attenuation has offset {expected}; build the planner with "
            f"offset={expected}.",
            SeraOptWarning,
            stacklevel=stacklevel,
        )


def plan_rollouts(planner: Any, prompt_ids: Sequence[Any], budget: int) -> RolloutPlan:
    """Allocate ``budget`` rollouts over the batch's prompts and lay out the rows.

    Parameters
    ----------
    planner : sera_opt.RolloutPlanner
        Anything with ``plan(prompt_ids, budget) -> Allocation``.
    prompt_ids : sequence, length M
        Distinct ids of the batch's prompts (ints or strings, as the planner's
        tracker accepts them). The same prompt must keep its id across steps so that
        its history is used.
    budget : int
        Total number of rollouts, B (``sum(counts) == budget``).

    Returns
    -------
    RolloutPlan
        ``plan.row_prompt_ids`` lists the prompt of each of the B rows to sample.

    Raises
    ------
    SeraOptError
        If the ids repeat, the budget is not a positive integer, or the planner
        returns counts that do not sum to the budget.
    """
    _common.check_planner(planner, "plan")
    ids = _as_prompt_id_array(prompt_ids)
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
        raise SeraOptError(f"budget must be a positive integer number of rollouts; got {budget!r}.")
    allocation = planner.plan(ids.tolist(), int(budget))
    counts = _common.check_counts(allocation, ids.shape[0],
                                  minimum=_common.count_minimum(allocation), budget=int(budget))
    return RolloutPlan.from_counts(ids, counts, allocation=allocation)


def _rewards_tensor(rewards: Any, num_rows: int, device: torch.device | None) -> torch.Tensor:
    # The dtype is kept: 0/1 integers or booleans are exact, and float scores keep
    # their precision for success_threshold.
    tensor = torch.as_tensor(
        np.asarray(rewards) if not isinstance(rewards, torch.Tensor) else rewards
    )
    tensor = tensor.detach().to(device=device).reshape(-1)
    if tensor.shape[0] != num_rows:
        raise SeraOptError(
            f"expected one reward per rollout row ({num_rows}); got {tensor.shape[0]}."
        )
    return tensor


def maxrl_loss(
    log_probs: torch.Tensor,
    rewards: Any,
    prompt_index: Any,
    *,
    mask: torch.Tensor | None = None,
    mode: str | None = None,
    estimator: str = "mean_centred",
    multiplicity_correction: bool = True,
    success_threshold: float | None = None,
    process_group: Any = None,
    round_index: Any = None,
    mean_count: float | None = None,
) -> MaxRLLoss:
    """The MaxRL policy-gradient loss of one batch of rollouts.

    ``loss = aggregate_loss(-A[:, None] * log_probs, mask, mode)`` with
    ``A = sera_opt.maxrl_advantages(rewards, prompt_index, ...)`` (detached), so that
    ``loss.backward()`` gives minus the multiplicity-corrected MaxRL gradient of the
    chosen aggregation.

    Parameters
    ----------
    log_probs : torch.Tensor, shape (B,) or (B, T)
        Log-probabilities under the current policy, with gradients: one per rollout
        (the sequence log-probability, the sum of its token log-probabilities) or
        one per token.
    rewards : array-like, shape (B,)
        Binary outcome of each rollout (or scores turned into outcomes by
        ``success_threshold``).
    prompt_index : array-like of int, shape (B,)
        Prompt of each rollout, e.g. :attr:`RolloutPlan.prompt_index`.
    mask : torch.Tensor, shape (B, T), optional
        1 for completion tokens, 0 for padding. Default: all ones. Not allowed
        with sequence log-probabilities.
    mode : str, optional
        Aggregation, one of :data:`LOSS_MODES` (see :func:`sera_opt.aggregate_loss`).
        Default: ``"token-mean"`` for token log-probabilities,
        ``"seq-mean-token-sum"`` (the mean over rollouts) for sequence ones. The
        ``"seq-mean-token-mean"`` mode divides each sequence by its own length, a
        length weighting on top of the estimator.
    estimator : {"mean_centred", "success_average"}
        The MaxRL estimator (see the theory page).
    multiplicity_correction : bool
        Scale prompt i's coefficients by ``nbar / n_i`` so that prompts with more
        rollouts do not get more weight. Keep it on with planned counts.
    success_threshold : float, optional
        Passed to :func:`sera_opt.maxrl_advantages`.
    process_group : torch.distributed.ProcessGroup, optional
        Data parallelism: passed to :func:`sera_opt.maxrl_advantages` (global counts
        per prompt) and :func:`sera_opt.policy_gradient_loss` (global normaliser, for
        gradients averaged over the group).
    round_index : array-like of int, shape (B,), optional
        The round of each rollout when the step was sampled in rounds
        (:func:`maxrl_round_step`); passed to :func:`sera_opt.maxrl_advantages`, whose
        mean-centred estimator then uses the first round's baseline.
    mean_count : float, optional
        The correction's ``nbar`` (:func:`sera_opt.maxrl_advantages`); :func:`maxrl_step`
        passes :attr:`RolloutPlan.mean_count`, so that prompts switched off by the plan
        leave the active prompts' weights at ``N0 / n_i``.

    Returns
    -------
    MaxRLLoss
        The scalar loss and the advantages.
    """
    if not isinstance(log_probs, torch.Tensor):
        raise SeraOptError(f"log_probs must be a torch.Tensor; got {type(log_probs).__name__}.")
    # Before the rewards follow it to its device, where they would be named instead.
    check_not_meta(log_probs, "log_probs")
    if log_probs.dim() == 1:
        if mask is not None:
            raise SeraOptError(
                "mask was given with sequence log-probabilities (shape (B,)); pass per-token "
                "log-probabilities of shape (B, T) with the mask, or drop the mask."
            )
        per_row_logps = log_probs.unsqueeze(1)
        mask_tensor = torch.ones_like(per_row_logps)
        mode = "seq-mean-token-sum" if mode is None else mode
    elif log_probs.dim() == 2:
        per_row_logps = log_probs
        if mask is None:
            mask_tensor = torch.ones_like(per_row_logps)
        else:
            mask_tensor = torch.as_tensor(mask, device=log_probs.device)
            if mask_tensor.shape != log_probs.shape:
                raise SeraOptError(
                    f"mask has shape {tuple(mask_tensor.shape)} but log_probs has shape {tuple(log_probs.shape)}; "
                    "they must match."
                )
        mode = "token-mean" if mode is None else mode
    else:
        raise SeraOptError(
            f"log_probs must have shape (B,) or (B, T); got {tuple(log_probs.shape)}."
        )
    if mode not in LOSS_MODES:
        raise SeraOptError(f"unknown mode {mode!r}; use one of {LOSS_MODES}.")
    num_rows = per_row_logps.shape[0]
    reward_rows = int(np.size(rewards)) if not isinstance(rewards, torch.Tensor) \
        else int(rewards.numel())
    index_rows = int(prompt_index.numel()) if isinstance(prompt_index, torch.Tensor) \
        else int(np.size(prompt_index))
    if reward_rows == index_rows != num_rows:
        # The rewards and the prompt index agree: the log-probabilities are the odd ones out.
        raise SeraOptError(
            f"log_probs has {num_rows} rows but there are {reward_rows} rewards and prompt "
            f"indices; pass one log-probability row per rollout, in the rewards' order.")
    reward_tensor = _rewards_tensor(rewards, num_rows, log_probs.device)
    index = torch.as_tensor(
        np.array(prompt_index) if not isinstance(prompt_index, torch.Tensor) else prompt_index
    )
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise SeraOptError(
            f"prompt_index must hold integers (one prompt position or id per row); got dtype {index.dtype}."
        )
    index = index.to(device=log_probs.device, dtype=torch.long).reshape(-1)
    if index.shape[0] != num_rows:
        raise SeraOptError(
            f"expected one prompt index per rollout row ({num_rows}); got {index.shape[0]}."
        )
    advantages = sera_opt.maxrl_advantages(
        reward_tensor,
        index,
        estimator=estimator,
        multiplicity_correction=multiplicity_correction,
        success_threshold=success_threshold,
        process_group=process_group,
        dtype=per_row_logps.dtype if per_row_logps.is_floating_point() else None,
        round_index=None if round_index is None else torch.as_tensor(
            np.array(round_index) if not isinstance(round_index, torch.Tensor) else round_index,
            device=log_probs.device),
        mean_count=mean_count,
    )
    advantages = advantages.detach().to(device=log_probs.device, dtype=per_row_logps.dtype)
    # policy_gradient_loss is aggregate_loss(-A[:, None] * log_probs, mask, mode).
    loss = sera_opt.policy_gradient_loss(
        per_row_logps, advantages, mask_tensor, mode, process_group=process_group
    )
    return MaxRLLoss(loss=loss, advantages=advantages)


def observe(
    planner: Any, plan: RolloutPlan, rewards: Any, *, success_threshold: float | None = None
) -> None:
    """Feed a batch's outcomes back to the planner (one reward per row of ``plan``).

    Parameters
    ----------
    planner : sera_opt.RolloutPlanner
        Anything with ``observe(prompt_ids, rewards)`` taking one entry per rollout.
    plan : RolloutPlan
        The plan the rewards were sampled from.
    rewards : array-like, shape (B,)
        The rewards, in row order: binary (0/1 or bool) unless ``success_threshold``
        is given.
    success_threshold : float, optional
        When given, the planner sees ``rewards >= success_threshold`` (as 0/1), the
        outcomes :func:`sera_opt.maxrl_advantages` uses with the same threshold.

    Raises
    ------
    SeraOptError
        A reward count other than ``plan.budget``, NaN rewards, or non-binary
        rewards without a threshold.
    """
    _common.check_planner(planner, "observe")
    if not isinstance(plan, RolloutPlan):
        raise SeraOptError(
            f"plan must be the RolloutPlan the rewards were sampled from (what plan_rollouts "
            f"returns); got {type(plan).__name__}.")
    values = _common.binary_outcomes(_rewards_tensor(rewards, plan.budget, None), success_threshold)
    planner.observe(plan.row_prompt_ids.tolist(), values)


def _unpack_rollouts(result: Any) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
    if isinstance(result, Mapping):
        missing = {"log_probs", "rewards"} - set(result)
        if missing:
            raise SeraOptError(
                f"the rollout function returned a mapping without {sorted(missing)}; it must hold 'log_probs', "
                "'rewards' and optionally 'mask'."
            )
        return result["log_probs"], result["rewards"], result.get("mask")
    if isinstance(result, tuple) and len(result) in (2, 3):
        log_probs, rewards = result[0], result[1]
        return log_probs, rewards, (result[2] if len(result) == 3 else None)
    raise SeraOptError(
        "the rollout function must return (log_probs, rewards), (log_probs, rewards, mask) or a mapping with "
        f"those keys; got {type(result).__name__}."
    )


def maxrl_step(
    planner: Any,
    prompt_ids: Sequence[Any],
    budget: int,
    rollout_fn: Callable[[RolloutPlan], Any],
    *,
    mode: str | None = None,
    estimator: str = "mean_centred",
    multiplicity_correction: bool = True,
    success_threshold: float | None = None,
    update_planner: bool = True,
) -> StepOutput:
    """Plan, roll out, score and build the loss of one batch.

    Parameters
    ----------
    planner : sera_opt.RolloutPlanner
        Decides the counts and learns from the rewards.
    prompt_ids : sequence, length M
        Distinct ids of the batch's prompts.
    budget : int
        Total rollouts for the batch.
    rollout_fn : callable
        ``rollout_fn(plan)`` samples one completion for each of ``plan.budget`` rows
        (row r belongs to prompt ``plan.row_prompt_ids[r]``), scores it, and returns
        ``(log_probs, rewards)`` or ``(log_probs, rewards, mask)`` (or a mapping with
        those keys): log-probabilities of the sampled completions under the current
        policy *with gradients*, shape (B,) or (B, T); one reward per row.
    mode, estimator, multiplicity_correction, success_threshold
        As in :func:`maxrl_loss`.
    update_planner : bool
        Call :func:`observe` with the rewards (default). Turn off to observe later,
        e.g. after gathering rewards from other ranks.

    Returns
    -------
    StepOutput
        Call ``out.loss.backward()`` and step the optimizer.
    """
    _common.check_planner(planner, "plan", "observe")
    check_planner_offset(planner, estimator, stacklevel=3)
    plan = plan_rollouts(planner, prompt_ids, budget)
    log_probs, rewards, mask = _unpack_rollouts(rollout_fn(plan))
    result = maxrl_loss(
        log_probs,
        rewards,
        plan.prompt_index,
        mask=mask,
        mode=mode,
        estimator=estimator,
        multiplicity_correction=multiplicity_correction,
        success_threshold=success_threshold,
        mean_count=plan.mean_count,
    )
    reward_tensor = _rewards_tensor(rewards, plan.budget, result.advantages.device)
    if not reward_tensor.is_floating_point():
        reward_tensor = reward_tensor.to(result.advantages.dtype)
    diagnostics = sera_opt.advantage_diagnostics(
        reward_tensor,
        plan.prompt_index_tensor(reward_tensor.device),
        estimator=estimator,
        multiplicity_correction=multiplicity_correction,
        success_threshold=success_threshold,
        mean_count=plan.mean_count,
    )
    diagnostics = {key: float(value) for key, value in dict(diagnostics).items()}
    diagnostics.update(_common.active_set_metrics(plan.allocation))
    if update_planner:
        observe(planner, plan, reward_tensor, success_threshold=success_threshold)
    return StepOutput(
        loss=result.loss,
        advantages=result.advantages,
        rewards=reward_tensor,
        plan=plan,
        diagnostics=diagnostics,
    )


@dataclass(frozen=True)
class RoundStepOutput:
    """Result of :func:`maxrl_round_step`.

    Attributes
    ----------
    loss : torch.Tensor
        Scalar loss to back-propagate.
    advantages : torch.Tensor, shape (B,)
        Per-rollout advantages (first-round baseline under ``"mean_centred"``).
    rewards : torch.Tensor, shape (B,)
        The outcomes, in row order (round by round, grouped by prompt within a round).
    prompt_index : numpy.ndarray of int64, shape (B,)
        The position of each row's prompt in ``prompt_ids``.
    round_index : numpy.ndarray of int64, shape (B,)
        The round of each row.
    result : sera_opt.RoundResult
        The session's record: realized counts, round budgets, the fraction of prompts
        active after each round, and each prompt's expected scale (``factors``).
    """

    loss: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    prompt_index: np.ndarray
    round_index: np.ndarray
    result: Any = field(repr=False)
    #: The rows the update used (:func:`reinforce_ada_step`); None: every row.
    kept: np.ndarray | None = field(default=None, repr=False)

    @property
    def counts(self) -> np.ndarray:
        """Each prompt's realized number of rollouts."""
        return self.result.counts

    def diagnostics(self) -> dict[str, float]:
        """The step's round diagnostics: rounds used, the budget of each round, the
        fraction of prompts active after each, and the mean and smallest expected
        scale."""
        return _common.round_diagnostics(self.result)


def _pad_cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate (B_r,) or (B_r, T_r) tensors along rows, zero-padding the columns."""
    if parts[0].dim() == 1:
        return torch.cat(parts)
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


def _draw_rounds(session: Any, ids: np.ndarray, rollout_fn: Callable[[RolloutPlan], Any],
                 success_threshold: float | None):
    """Run every round of ``session`` through ``rollout_fn``; returns the rounds' log
    probabilities and masks (zero-padded to one width), their binary outcomes as a
    tensor, and the session's result."""
    positions = np.arange(ids.shape[0], dtype=np.int64)
    log_parts: list[torch.Tensor] = []
    mask_parts: list[torch.Tensor] = []
    reward_parts: list[np.ndarray] = []

    def sample(counts: np.ndarray) -> np.ndarray:
        plan = RolloutPlan(prompt_ids=ids, counts=counts,
                           prompt_index=np.repeat(positions, counts))
        log_probs, rewards, mask = _unpack_rollouts(rollout_fn(plan))
        if not isinstance(log_probs, torch.Tensor) or log_probs.dim() not in (1, 2):
            raise SeraOptError(
                "the rollout function must return log_probs as a torch.Tensor of shape (B,) or "
                "(B, T) for each round."
            )
        outcomes = _common.binary_outcomes(_rewards_tensor(rewards, plan.budget, None),
                                           success_threshold)
        log_parts.append(log_probs)
        if log_probs.dim() == 2:
            mask_parts.append(torch.ones_like(log_probs) if mask is None
                              else torch.as_tensor(mask, device=log_probs.device))
        reward_parts.append(outcomes)
        return outcomes

    run_rounds(session, sample)
    result = session.result()
    if not log_parts:
        raise SeraOptError("the step drew no rollouts (a zero budget?); nothing to train on.")
    dims = {p.dim() for p in log_parts}
    if len(dims) > 1:
        raise SeraOptError("the rollout function returned sequence log-probabilities in some "
                           "rounds and token log-probabilities in others; return one kind.")
    log_probs = _pad_cat(log_parts)
    mask = _pad_cat(mask_parts) if mask_parts else None
    rewards = torch.as_tensor(np.concatenate(reward_parts), device=log_probs.device)
    return log_probs, mask, rewards, result


def maxrl_round_step(
    planner: Any,
    prompt_ids: Sequence[Any],
    budget: int,
    rollout_fn: Callable[[RolloutPlan], Any],
    *,
    rounds: int | None = None,
    first_round: int | None = None,
    later_budgets: Sequence[int] | None = None,
    mode: str | None = None,
    estimator: str = "mean_centred",
    multiplicity_correction: bool = True,
    success_threshold: float | None = None,
) -> RoundStepOutput:
    """One MaxRL step sampled in ``rounds`` rounds at the fixed ``budget``
    (:meth:`sera_opt.RolloutPlanner.start_rounds`, docs/theory.md section 9); by
    default in one, the static plan (one generation call).

    ``rollout_fn(plan)`` is called once per round (one generation call each) with that
    round's :class:`RolloutPlan` (a prompt may have 0 rows in it), and returns what it
    returns for :func:`maxrl_step`. The rewards of each round feed the session before
    the next is planned; the planner's tracker receives all of them when the step
    ends (do not :func:`observe` them again). Token log-probabilities of rounds with
    different lengths are zero-padded (and masked) to one width.

    Parameters
    ----------
    planner : sera_opt.RolloutPlanner
    prompt_ids : sequence, length M
        Distinct ids of the batch's prompts.
    budget : int
        Total rollouts of the step, over all rounds.
    rollout_fn : callable
        As in :func:`maxrl_step`, called once per round.
    rounds, first_round, later_budgets
        As in :meth:`sera_opt.RolloutPlanner.start_rounds`: by default
        :data:`sera_opt.rounds.DEFAULT_ROUNDS` (1) round, the static plan in one
        call. Rounds are opt-in (``rounds=4``, say): the first gives every prompt half
        the average count, the rest is split evenly over the later rounds; with the
        default planner they share their budget evenly among the prompts still
        without a success (:attr:`sera_opt.RolloutPlanner.round_policy`).
    mode, estimator, multiplicity_correction, success_threshold
        As in :func:`maxrl_loss`.

    Returns
    -------
    RoundStepOutput
    """
    # observe() too: a policy has start_rounds(), but takes success probabilities, not ids.
    _common.check_planner(planner, "start_rounds", "observe")
    check_planner_offset(planner, estimator, stacklevel=3)
    ids = _as_prompt_id_array(prompt_ids)
    session = planner.start_rounds(ids, budget, rounds=rounds, first_round=first_round,
                                   later_budgets=later_budgets)
    log_probs, mask, rewards, result = _draw_rounds(session, ids, rollout_fn, success_threshold)
    loss = maxrl_loss(log_probs, rewards, result.prompt_index, mask=mask, mode=mode,
                      estimator=estimator, multiplicity_correction=multiplicity_correction,
                      round_index=result.round_index)
    return RoundStepOutput(loss=loss.loss, advantages=loss.advantages, rewards=rewards,
                           prompt_index=result.prompt_index, round_index=result.round_index,
                           result=result)


def reinforce_ada_step(
    rule: Any,
    prompt_ids: Sequence[Any],
    rollout_fn: Callable[[RolloutPlan], Any],
    *,
    budget: int | None = None,
    mode: str | None = None,
    success_threshold: float | None = None,
    planner: Any = None,
) -> RoundStepOutput:
    """One step of the Reinforce-Ada peer (:class:`sera_opt.rounds.ReinforceAda`), for
    comparisons: its rounds with early exits, its kept group per prompt, and its update
    ``r - rbar`` on the kept rollouts only (``rbar`` the prompt's pooled success rate).

    Not a MaxRL step: the rule ascends a different objective and its budget is its own
    unless ``budget`` caps it (docs/policies.md, "Reinforce-Ada"). ``rollout_fn`` is
    called once per round, as in :func:`maxrl_round_step`. The loss is
    ``aggregate_loss(-A[:, None] * log_probs, mask, mode)`` over the kept rows, the batch
    the paper's update sees. A ``planner`` given observes every drawn rollout (its
    tracker then follows the prompts as in the other loops); its policy is not used.

    Returns
    -------
    RoundStepOutput
        ``advantages`` is 0 on the rows not kept; ``kept`` marks the kept rows;
        ``result.factors`` is NaN (the rule has no MaxRL scale).
    """
    if not isinstance(rule, sera_opt.rounds.ReinforceAda):
        raise SeraOptError(
            f"rule must be a sera_opt.rounds.ReinforceAda (its options: exit, per_round, "
            f"max_rounds, keep); got {type(rule).__name__} {rule!r}. Pass ReinforceAda().")
    if planner is not None:
        _common.check_planner(planner, "observe")
    ids = _as_prompt_id_array(prompt_ids)
    session = rule.start_rounds(budget=budget, num_prompts=ids.shape[0])
    log_probs, mask, rewards, result = _draw_rounds(session, ids, rollout_fn, success_threshold)
    kept, advantages = session.advantages()
    rows = torch.as_tensor(np.flatnonzero(kept), device=log_probs.device)
    adv = torch.as_tensor(advantages, dtype=log_probs.dtype, device=log_probs.device)
    if log_probs.dim() == 1:
        kept_logps, kept_mask = log_probs[rows].unsqueeze(1), None
        mode = "seq-mean-token-sum" if mode is None else mode
    else:
        kept_logps, kept_mask = log_probs[rows], None if mask is None else mask[rows]
        mode = "token-mean" if mode is None else mode
    if kept_mask is None:
        kept_mask = torch.ones_like(kept_logps)
    # policy_gradient_loss is aggregate_loss(-A[:, None] * log_probs, mask, mode).
    loss = sera_opt.policy_gradient_loss(kept_logps, adv[rows], kept_mask, mode)
    if planner is not None:
        planner.observe(ids[result.prompt_index].tolist(), rewards)
    return RoundStepOutput(loss=loss, advantages=adv, rewards=rewards,
                           prompt_index=result.prompt_index, round_index=result.round_index,
                           result=result, kept=kept)
