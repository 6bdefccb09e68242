"""The multiplicity-corrected MaxRL gradient estimator (PyTorch).

docs/theory.md sections 2 and 4. Prompt ``i`` of a batch of ``M`` prompts gets
``n_i`` rollouts with binary outcomes ``r_ij``, ``K_i`` of them successes
(``N = sum_i n_i`` rollouts in all, ``nbar = N / M``). This module turns the
outcomes into one advantage ``A_ij`` per rollout such that, with
``S_ij = grad log pi(y_ij | x_i)`` the score of a rollout,

    E[(1/N) sum_ij A_ij S_ij] = (1/M) sum_i w_c(p_i, n_i) grad log p_i      (corrected)
    E[(1/N) sum_ij A_ij S_ij] = (1/N) sum_i n_i w_c(p_i, n_i) grad log p_i  (uncorrected)

with the attenuation factor ``w_c(p, n) = 1 - (1 - p) ** (n - c)`` of
:func:`sera_opt.attenuation`. In code: ``(advantages * seq_logprob).mean()``
is an estimate of the right-hand side (its gradient is), and
:func:`aggregate_loss` turns per-token losses into the scalar a trainer
minimises. Everything is vectorised (one scatter and one gather over the
rollouts), works for any floating dtype on any device, and reads nothing back
to the host when ``num_prompts`` is given and ``validate=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..exceptions import SeraOptError
from .groups import as_tensor, check_flag, computable_integers, distributed_world, group
from .policy_loss import LOSS_MODES as _LOSS_MODES
from .policy_loss import aggregate_loss, policy_gradient_loss

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_OFFSETS",
    "LOSS_MODES",
    "GroupStatistics",
    "group_statistics",
    "maxrl_advantages",
    "aggregate_loss",
    "policy_gradient_loss",
    "advantage_diagnostics",
]

#: The MaxRL estimators, by name.
ESTIMATORS = ("mean_centred", "success_average")

#: The offset ``c`` of each estimator's attenuation factor ``w_c(p, n)``; pass it
#: as ``offset=`` when allocating rollouts for that estimator.
ESTIMATOR_OFFSETS = {"mean_centred": 1, "success_average": 0}

#: How :func:`aggregate_loss` reduces a (sequences, tokens) loss to a scalar.
LOSS_MODES = _LOSS_MODES


def _check_estimator(estimator) -> int:
    if estimator not in ESTIMATOR_OFFSETS:
        raise SeraOptError(
            f"unknown estimator {estimator!r}; use one of {ESTIMATORS} ('mean_centred' is "
            f"the official MaxRL form, offset c = 1; 'success_average' has c = 0)."
        )
    return ESTIMATOR_OFFSETS[estimator]


@dataclass(frozen=True)
class GroupStatistics:
    """Per-prompt rollout counts and successes of a batch (global under data parallelism).

    The table has one *slot* per prompt id; slots of ids that have no rollouts
    (possible when ``num_prompts`` is given or the ids have gaps) have
    ``counts == 0`` and are not prompts of the batch.

    Attributes
    ----------
    prompt_ids : torch.Tensor of int64, shape (S,)
        The prompt id of each slot, increasing.
    counts : torch.Tensor of int64, shape (S,)
        ``n_i``, the number of rollouts of each slot's prompt.
    successes : torch.Tensor of int64, shape (S,)
        ``K_i``, the number of successful rollouts.
    slot_index : torch.Tensor of int64, shape (N,)
        The slot of each (local) rollout: ``prompt_ids[slot_index] == prompt_index``.
    num_prompts : torch.Tensor of int64, shape ()
        ``M``, the number of slots with at least one rollout.
    num_rollouts : torch.Tensor of int64, shape ()
        ``N``, the total number of rollouts (over all ranks).
    """

    prompt_ids: torch.Tensor
    counts: torch.Tensor
    successes: torch.Tensor
    slot_index: torch.Tensor
    num_prompts: torch.Tensor
    num_rollouts: torch.Tensor

    @property
    def mean_count(self) -> torch.Tensor:
        """``nbar = N / M`` as a float64 tensor (0 for an empty batch)."""
        return self.num_rollouts.double() / self.num_prompts.clamp_min(1).double()


_COMMON_PARAMETERS = """
    rewards : torch.Tensor, shape (N,)
        The outcome of every rollout: bool, or numbers that are exactly 0 or 1.
        Other values are an error unless ``success_threshold`` is given.
    prompt_index : torch.Tensor of integers, shape (N,)
        The prompt each rollout belongs to, on the same device as ``rewards``. Any
        integer ids in any order: groups need not be contiguous, sizes may differ,
        singletons are allowed. Under data parallelism the ids must name the same
        prompt on every rank.
    success_threshold : float, optional
        Count ``rewards >= success_threshold`` as successes (for graded rewards).
        Without it, rewards must be binary. Bool rewards are the numbers 0 and 1
        here too: with a threshold ``t``, ``True`` succeeds iff ``1 >= t`` and
        ``False`` iff ``0 >= t``, exactly as the rewards 1.0 and 0.0 would.
    num_prompts : int, optional
        If given, the ids must be dense: ``0 <= prompt_index < num_prompts``. This
        skips the host read of the id range; with ``validate=False`` the call then
        never synchronises with the device. Ids in that range without rollouts are
        not counted in ``M``. If None, ids are arbitrary integers: a range of at
        most about ``4 N`` values is tabulated directly, wider ones are compressed
        with :func:`torch.unique`.
    process_group : torch.distributed.ProcessGroup, optional
        Data parallelism: each rank passes its shard of the rollouts, and the
        per-prompt counts and successes (hence ``n_i``, ``K_i``, ``N``, ``M``) are
        all-reduced over this group, so that each rank's result equals the
        single-process result on the concatenated batch. Pass
        ``torch.distributed.group.WORLD`` for all processes. None: this process only.
    validate : bool, default True
        Check that rewards are binary (or finite, with a threshold) and ids are in
        range, at the cost of one host read-back (two for float16 results, whose
        range a group of more than 65504 rollouts can exceed: refused rather than
        returned as inf). With False, invalid inputs give undefined results (without a
        threshold, any nonzero reward counts as a success).
"""


def _doc(func):
    func.__doc__ = func.__doc__.replace("    {common}\n", _COMMON_PARAMETERS.lstrip("\n"))
    return func


@_doc
def group_statistics(rewards, prompt_index, *, success_threshold=None, num_prompts=None,
                     process_group=None, validate: bool = True) -> GroupStatistics:
    """Per-prompt rollout counts ``n_i`` and successes ``K_i`` of a batch.

    Parameters
    ----------
    {common}

    Returns
    -------
    GroupStatistics
    """
    validate = check_flag(validate, "validate")
    groups = group(rewards, prompt_index, success_threshold=success_threshold,
                   num_prompts=num_prompts, process_group=process_group, validate=validate)
    counts = groups.failures + groups.successes
    prompt_ids = groups.prompt_ids()
    successes = groups.successes.clone()
    slot_index = (groups.codes >> 1).long()
    if not groups.ids_increasing:
        # Hashed slots come in discovery order; present them by id, as documented.
        prompt_ids, order = torch.sort(prompt_ids)
        counts, successes = counts[order], successes[order]
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=order.device)
        slot_index = rank[slot_index]
    return GroupStatistics(
        prompt_ids=prompt_ids,
        counts=counts,
        successes=successes,
        slot_index=slot_index,
        num_prompts=torch.count_nonzero(counts),
        num_rollouts=counts.sum(),
    )


def _slot_values(groups, offset: int, multiplicity_correction: bool, mean_count=None):
    """Per slot, the advantage of a failed and of a successful rollout, shape (S, 2).

    Entries that no rollout reads (the success value of a prompt without
    successes, both values of a slot without rollouts) may be inf or NaN.
    """
    # Per-slot arithmetic is O(M), so it is done in float64 (where the device has
    # it) and rounded once to the result dtype: every dtype gets the correctly
    # rounded value of the float64 result.
    compute = torch.float32 if groups.device.type == "mps" else torch.float64
    # One contiguous cast of the whole table: casting each strided column is slower.
    pair = groups.table.view(-1, 2).to(compute)
    failures = pair[:, 0]
    successes = pair[:, 1]
    counts = failures + successes
    signal = successes > 0
    values = torch.empty(pair.shape, dtype=groups.dtype, device=groups.device)
    # Prompt i's coefficients are (nbar / n_i) A_ij with the correction, A_ij without.
    # Written with the failure count n - K, all-success prompts give exactly 0
    # under mean-centring without relying on a cancellation.
    if multiplicity_correction:
        if mean_count is None:
            mean_count = counts.sum() / torch.count_nonzero(counts).clamp_min(1)  # nbar = N / M
        if offset == 1:
            # (nbar / n) (r - K/n) / (K/n): success nbar (n - K) / (K n), failure -nbar / n.
            values[:, 1] = failures * mean_count / (successes * counts)
            values[:, 0] = torch.rsub(signal * mean_count, 0) / counts
        else:
            # (nbar / n) r / (K/n) = nbar r / K.
            values[:, 1] = mean_count / successes
            values[:, 0] = 0
    else:
        if offset == 1:
            # (r - K/n) / (K/n): success (n - K) / K, failure -1.
            values[:, 1] = failures / successes
            values[:, 0] = torch.rsub(signal.to(compute), 0)
        else:
            # r / (K/n) = n r / K.
            values[:, 1] = counts / successes
            values[:, 0] = 0
    return values


@_doc
def maxrl_advantages(rewards, prompt_index, *, estimator: str = "mean_centred",
                     multiplicity_correction: bool = True, success_threshold=None,
                     num_prompts=None, process_group=None, validate: bool = True,
                     dtype=None, allocation=None, round_index=None,
                     mean_count=None) -> torch.Tensor:
    """One MaxRL advantage per rollout, optionally multiplicity-corrected.

    With ``K_i`` successes among the ``n_i`` rollouts of prompt ``i``,
    ``rbar_i = K_i / n_i``, ``N`` rollouts and ``M`` prompts in the batch and
    ``nbar = N / M``:

    * ``"mean_centred"`` (offset c = 1): ``A_ij = (r_ij - rbar_i) / rbar_i``;
    * ``"success_average"`` (offset c = 0): ``A_ij = r_ij / rbar_i``;
    * ``multiplicity_correction=True`` multiplies prompt ``i``'s advantages by
      ``nbar / n_i``;
    * prompts with ``K_i = 0`` get exactly 0 (and so do all-success prompts and
      singletons under mean-centring, whose ``A_ij`` are 0 by the formula).

    **Contract.** Let ``S_ij = grad log pi(y_ij | x_i)`` and ``p_i`` the prompt's
    success probability, and let the counts ``n_i`` be fixed before sampling.
    Then the gradient of ``(advantages * seq_logprob).mean()`` (a mean over all
    ``N`` rollouts; ``seq_logprob`` the sequence log-probabilities) has expectation

    * ``(1/M) sum_i w_c(p_i, n_i) grad log p_i`` with the correction, and
    * ``(1/N) sum_i n_i w_c(p_i, n_i) grad log p_i`` without it,

    where ``w_c(p, n) = 1 - (1 - p) ** (n - c)`` is :func:`sera_opt.attenuation`.
    With the correction a prompt's weight does not depend on how many rollouts
    it received. Equivalently, ``sum_j A_ij S_ij = (n_i or nbar) * g_i`` with
    ``g_i`` the per-prompt estimator of docs/theory.md section 2. The loss to
    minimise is the negative; :func:`policy_gradient_loss` builds it per token.

    Parameters
    ----------
    {common}
    estimator : {"mean_centred", "success_average"}
        Which MaxRL estimator (see :data:`ESTIMATOR_OFFSETS` for its offset ``c``).
    multiplicity_correction : bool, default True
        Scale prompt ``i``'s advantages by ``nbar / n_i`` (docs/theory.md section 4).
    dtype : torch.dtype, optional
        Floating dtype of the result. Default: that of ``rewards`` if floating,
        else :func:`torch.get_default_dtype`.
    allocation : Allocation, optional
        The plan the counts came from (``RolloutPlanner.plan`` or
        :func:`sera_opt.allocate`). Given, the pairing is checked on the host
        (no device read-back): its offset must be the estimator's ``c``
        (offset 1 also guarantees the 2 rollouts per prompt that
        ``"mean_centred"`` needs for a signal). Prompts the plan switched off (0
        rollouts: :attr:`~sera_opt.Allocation.active_set`) have no rows; the
        correction's ``nbar`` is then the plan's ``budget / num_prompts``, switched-off
        prompts included (the authors' ``N0 / n_i`` weights: each switched-off prompt's
        share of the budget went to the active ones).
    mean_count : float, optional
        The correction's ``nbar``, given explicitly (e.g. a trainer's rollouts per
        prompt ``N0``); default ``N / M`` over the prompts with rows, or the plan's
        ``budget / num_prompts`` when ``allocation`` is given.
    round_index : torch.Tensor of integers, shape (N,), optional
        The round (0-based) of each rollout when the step was sampled in rounds
        (:class:`sera_opt.rounds.RoundSession`; ``RoundResult.round_index``). The
        counts are then not fixed before sampling, and the contract's factor
        becomes each prompt's scale ``kappa_i`` (docs/theory.md section 9), which
        ``RoundResult.factors`` reports. ``"success_average"`` is unchanged (its
        scale is ``P(K_i >= 1)`` under any reward-only rule). ``"mean_centred"``
        replaces the pooled baseline, whose scale under adaptive stopping depends
        on the rule and exceeds 1 for some, by the first round's: ``A_ij = s_i
        (r_ij / K_i - 1{K1_i >= 1} 1{j in round 0} / n0_i)``, with ``n0_i`` and
        ``K1_i`` the prompt's first-round rollouts and successes and ``s_i`` its
        ``nbar`` (corrected) or ``n_i``; its scale is ``P(K_i >= 1) - p_i (1 -
        p_i)^(n0_i - 1)`` whatever the later rounds did, provided round 0 was
        planned before any of the step's rewards were seen. With every rollout in
        round 0 this is the usual estimator.

    Returns
    -------
    torch.Tensor, shape (N,)
        The advantages, on the device of the inputs, without autograd history.
        Every rollout of a prompt with the same outcome gets a bit-identical value.

    Raises
    ------
    SeraOptError
        Bad shapes or dtypes, non-binary rewards without ``success_threshold``,
        ids out of range with ``num_prompts``, an unknown estimator, an
        ``allocation`` planned for the other estimator.
    """
    offset = _check_estimator(estimator)
    if allocation is not None:
        _check_allocation(allocation, estimator, offset)
    mean_count = _mean_count(mean_count, allocation)
    multiplicity_correction = check_flag(multiplicity_correction, "multiplicity_correction")
    validate = check_flag(validate, "validate")
    groups = group(rewards, prompt_index, success_threshold=success_threshold,
                   num_prompts=num_prompts, process_group=process_group, validate=validate,
                   dtype=dtype)
    if validate:
        _check_range(groups)
    if round_index is not None:
        first = _first_round_mask(round_index, groups, validate)
        if offset == 1:
            values = _first_round_values(groups, first, multiplicity_correction, process_group,
                                         validate, mean_count)
            index = groups.codes.long() * 2 + first.long()
            return values.view(-1).index_select(0, index)
    values = _slot_values(groups, offset, multiplicity_correction, mean_count)
    return values.view(-1).index_select(0, groups.codes)


def _mean_count(mean_count, allocation) -> float | None:
    """The correction's ``nbar`` when the caller fixes it (explicitly, or through the plan
    whose budget and prompts it is); None: the batch's own ``N / M``."""
    if mean_count is not None:
        from ..problem import validate_real

        return validate_real(mean_count, "mean_count", minimum=0.0, strict=True,
                             meaning="the multiplicity correction's nbar (rollouts per prompt)")
    if allocation is not None and allocation.num_prompts:
        return allocation.budget / allocation.num_prompts
    return None


def _first_round_mask(round_index, groups, validate: bool) -> torch.Tensor:
    """``round_index == 0``, after checking its shape, dtype and (with ``validate``) sign."""
    rounds = as_tensor(round_index, "round_index", device=groups.device)
    n = groups.codes.shape[0]
    if rounds.ndim != 1 or rounds.shape[0] != n:
        raise SeraOptError(
            f"round_index must be 1-D with one round per rollout, i.e. shape ({n},); got "
            f"shape {tuple(rounds.shape)}."
        )
    if rounds.dtype == torch.bool or rounds.is_floating_point() or rounds.is_complex():
        raise SeraOptError(
            f"round_index must be an integer tensor of rounds (0 for the first), got dtype "
            f"{rounds.dtype}."
        )
    if rounds.device != groups.device:
        raise SeraOptError(
            f"round_index must be on the device of rewards ({groups.device}), got "
            f"{rounds.device}."
        )
    # A uint64 index beyond int64's range turns negative and is refused below.
    rounds = computable_integers(rounds)
    if validate and n and bool((rounds < 0).any()):
        raise SeraOptError(
            "round_index must be >= 0 (0 is the first round): pass RoundResult.round_index as "
            "it is."
        )
    return rounds == 0


def _first_round_values(groups, first: torch.Tensor, multiplicity_correction: bool,
                        process_group, validate: bool = True, mean_count=None
                        ) -> torch.Tensor:
    """Per slot, the advantages of (failure, later), (failure, first), (success, later),
    (success, first) under the first-round baseline, shape (S, 2, 2)."""
    compute = torch.float32 if groups.device.type == "mps" else torch.float64
    first_table = torch.zeros_like(groups.table)
    codes = groups.codes.long()
    first_table.index_add_(0, codes[first], torch.ones_like(codes[first]))
    dist, _ = distributed_world(process_group)
    if dist is not None:
        dist.all_reduce(first_table, group=process_group)
    pair = groups.table.view(-1, 2).to(compute)
    counts = pair[:, 0] + pair[:, 1]
    successes = pair[:, 1]
    first_pair = first_table.view(-1, 2).to(compute)
    n0 = first_pair[:, 0] + first_pair[:, 1]
    if validate:
        # Every prompt's baseline is its own first round's: a prompt without one would
        # silently lose it (rounds counted from 1, or rows of the first round left out).
        missing = (counts > 0) & (n0 == 0)
        if bool(missing.any()):
            lacking = int(missing.sum())
            raise SeraOptError(
                f"round_index gives {lacking} prompt(s) no rollout in round 0, but the "
                f"mean-centred estimator's first-round baseline is each prompt's round-0 "
                f"rollouts. Rounds count from 0 (pass RoundResult.round_index as it is; "
                f"subtract 1 if you counted from 1), and every prompt's first round must be "
                f"among the rows; or pass round_index=None for rollouts drawn in one round."
            )
    gate = (first_pair[:, 1] > 0).to(compute)
    if multiplicity_correction:
        scale = (counts.sum() / torch.count_nonzero(counts).clamp_min(1) if mean_count is None
                 else torch.tensor(mean_count, dtype=compute, device=groups.device))
    else:
        scale = counts
    baseline = gate * scale / n0  # read only where n0 >= 1 (a first-round rollout)
    values = torch.zeros((pair.shape[0], 2, 2), dtype=compute, device=groups.device)
    values[:, 0, 1] = 0.0 - baseline  # +0.0, not -0.0, where the gate is closed
    values[:, 1, 0] = scale / successes
    values[:, 1, 1] = scale / successes - baseline
    return values.to(groups.dtype)


def _check_allocation(allocation, estimator: str, offset: int) -> None:
    """Refuse counts planned for the other estimator (checked on the host)."""
    # An allocation for offset 1 gives every prompt at least 2 rollouts (the
    # allocator refuses fewer), so the offset is the whole check.
    planned = getattr(allocation, "offset", None)
    if planned is None or getattr(allocation, "counts", None) is None:
        raise SeraOptError(
            f"allocation must be the Allocation that planned the counts (from "
            f"RolloutPlanner.plan or sera_opt.allocate), got {type(allocation).__name__}."
        )
    if int(planned) != offset:
        raise SeraOptError(
            f"the allocation was planned with offset={int(planned)} but the {estimator!r} "
            f"estimator has offset {offset}: its factors w_c(p, n) are not the ones the counts "
            f"were chosen for. Plan with offset={offset} (ESTIMATOR_OFFSETS[{estimator!r}]), "
            f"or pass the estimator that matches the plan."
        )


def _check_range(groups) -> None:
    """Refuse a result dtype too narrow for the advantages (only float16 can be).

    No advantage exceeds the largest group's rollout count in magnitude (``n / K``,
    ``nbar / K``, ``(n - K) / K``, ``nbar / n`` are all at most ``max n``), so one
    read of the largest count decides, for dtypes whose maximum a count can reach."""
    limit = torch.finfo(groups.dtype).max
    if limit >= 2.0**63 or groups.table.numel() == 0:
        return
    largest = int((groups.failures + groups.successes).max())
    if largest > limit:
        raise SeraOptError(
            f"a prompt has {largest} rollouts, and its advantages can reach {largest}, "
            f"beyond {groups.dtype}'s largest value {limit:g}: they would be inf. Pass "
            f"dtype=torch.float32 (the advantages are computed in float64 and rounded once to "
            f"that dtype), or give the rewards a wider dtype."
        )


@_doc
def advantage_diagnostics(rewards, prompt_index, *, estimator: str = "mean_centred",
                          multiplicity_correction: bool = True, success_probs=None,
                          success_threshold=None, num_prompts=None, process_group=None,
                          validate: bool = True, allocation=None,
                          mean_count=None) -> dict[str, float]:
    """What a trainer logs each step about the batch's effective prompt weights.

    A prompt's expected contribution to the batch gradient is
    ``v_i w_c(p_i, n_i) grad log p_i`` up to a common constant, with ``v_i = 1``
    under the multiplicity correction and ``v_i = n_i / nbar`` without it. The
    *effective weight* ``e_i = v_i w_c(p_i, n_i)`` should be equal across
    prompts for the batch gradient to align with the likelihood gradient
    ``sum_i grad log p_i`` (docs/theory.md section 6).

    Parameters
    ----------
    {common}
    estimator, multiplicity_correction
        As in :func:`maxrl_advantages`.
    success_probs : torch.Tensor, shape (N,), optional
        Each rollout's prompt's success-probability estimate (for example the one
        the allocation used), in [0, 1]; the mean over a prompt's rollouts is used.
        Default: the posterior mean ``(K_i + 1) / (n_i + 2)`` under a uniform prior,
        computed from the batch itself.
    allocation, mean_count
        As in :func:`maxrl_advantages`: the correction's ``nbar`` (prompts the plan
        switched off have no rows and are not counted in ``M``).

    Returns
    -------
    dict[str, float]
        ``num_prompts`` (M), ``num_rollouts`` (N), ``mean_count`` (nbar),
        ``min_count``, ``max_count``, ``success_rate`` (K/N over the batch),
        ``zero_success_fraction``, ``all_success_fraction``, ``signal_fraction``
        (prompts whose advantages are not all zero), ``min_factor``,
        ``mean_factor``, ``max_factor`` (the attenuation factors ``w_c``),
        ``min_correction``, ``max_correction`` (``nbar / n_i``, or 1 without the
        correction), ``weight_spread`` (std / mean of ``e_i``; NaN if every
        ``e_i`` is 0) and ``alignment_proxy`` (``mean(e) / sqrt(mean(e^2))``: the
        cosine between the expected and the exact gradient if the ``grad log p_i``
        were orthogonal with equal norms; 1 when all ``e_i`` are equal, 0 when all
        are 0). Means are over the M prompts.
    """
    offset = _check_estimator(estimator)
    multiplicity_correction = check_flag(multiplicity_correction, "multiplicity_correction")
    validate = check_flag(validate, "validate")
    groups = group(rewards, prompt_index, success_threshold=success_threshold,
                   num_prompts=num_prompts, process_group=process_group, validate=validate,
                   dtype=torch.float64)
    dist, _ = distributed_world(process_group)
    successes = groups.successes
    counts = groups.failures + successes
    present = counts > 0
    n = counts.double()
    k = successes.double()
    num_prompts_t = torch.count_nonzero(counts).double()
    m = num_prompts_t.clamp_min(1)
    num_rollouts = n.sum()
    fixed = _mean_count(mean_count, allocation)
    mean_count = num_rollouts / m if fixed is None else torch.tensor(
        fixed, dtype=torch.float64, device=n.device)
    n_safe = n.clamp_min(1)

    if success_probs is None:
        probs = (k + 1) / (n + 2)
    else:
        probs = _slot_probs(success_probs, groups, n_safe, dist, process_group)
    exponent = n - offset
    factor = torch.where(exponent > 0, -torch.expm1(exponent * torch.log1p(-probs)), 0.0)
    factor = torch.where(present, factor, 0.0)
    if multiplicity_correction:
        correction = mean_count / n_safe
        weight = factor
    else:
        correction = torch.ones_like(n)
        weight = factor * n / mean_count
    weight = torch.where(present, weight, 0.0)
    mean_weight = weight.sum() / m
    mean_square = (weight * weight).sum() / m
    deviation = torch.where(present, weight - mean_weight, 0.0)
    spread = ((deviation * deviation).sum() / m).sqrt() / mean_weight
    alignment = torch.where(mean_square > 0, mean_weight / mean_square.sqrt(), 0.0)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=n.device)
    signal = (successes > 0) & (successes < counts) if offset == 1 else successes > 0

    def masked_min(x):
        return torch.where(present, x, inf).min() if x.numel() else inf

    def masked_max(x):
        return torch.where(present, x, -inf).max() if x.numel() else -inf

    values = torch.stack([
        num_prompts_t, num_rollouts, mean_count, masked_min(n), masked_max(n),
        k.sum() / num_rollouts.clamp_min(1),
        ((successes == 0) & present).sum() / m,
        ((successes == counts) & present).sum() / m,
        (signal & present).sum() / m,
        masked_min(factor), factor.sum() / m, masked_max(factor),
        masked_min(correction), masked_max(correction),
        spread, alignment,
    ]).tolist()
    keys = ("num_prompts", "num_rollouts", "mean_count", "min_count", "max_count",
            "success_rate", "zero_success_fraction", "all_success_fraction", "signal_fraction",
            "min_factor", "mean_factor", "max_factor", "min_correction", "max_correction",
            "weight_spread", "alignment_proxy")
    return dict(zip(keys, values, strict=True))


def _slot_probs(success_probs, groups, n_safe, dist, process_group):
    probs = as_tensor(success_probs, "success_probs", device=groups.device)
    if probs.dtype == torch.bool:
        raise SeraOptError(
            "success_probs must be floating probabilities in [0, 1], got booleans; booleans are "
            "outcomes, not probabilities: pass the estimates (for example the planner's)."
        )
    if probs.shape != groups.codes.shape or not probs.is_floating_point():
        raise SeraOptError(
            f"success_probs must be a floating tensor with one entry per rollout, shape "
            f"{tuple(groups.codes.shape)}, got {tuple(probs.shape)} ({probs.dtype}); expand "
            f"per-prompt estimates with success_probs[prompt_index]."
        )
    probs = probs.to(device=groups.device, dtype=torch.float64)
    # The range check travels with the sums (one extra slot), so that under data
    # parallelism every rank raises together instead of one waiting in a collective.
    totals = torch.zeros(groups.num_slots + 1, dtype=torch.float64, device=groups.device)
    totals[:-1].index_add_(0, groups.codes >> 1, probs)
    totals[-1] = (~((probs >= 0) & (probs <= 1))).sum()
    if dist is not None:
        dist.all_reduce(totals, group=process_group)
    if totals[-1].item() > 0:
        raise SeraOptError(
            "success_probs must be probabilities in [0, 1] (no NaN); "
            f"{int(totals[-1].item())} value(s) are not. sera_opt does not clip them."
        )
    return (totals[:-1] / n_safe).clamp(0, 1)
