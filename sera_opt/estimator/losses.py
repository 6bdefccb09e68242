"""Input checks and the reduction behind the estimator's loss functions (private).

:func:`sera_opt.aggregate_loss` and :func:`sera_opt.policy_gradient_loss`
validate in two stages. Structure (types, shapes, dtypes, devices) is metadata
and is always checked, on the host, for free. Values (NaN, inf, negative mask
weights) live on the device: with ``validate=True`` every value check becomes
one on-device count of offending entries, the counts travel together (through
the collective the reduction needs anyway under data parallelism, so every rank
sees every rank's counts) and are read back once. A rank whose own inputs are
at fault says what is wrong; the others say where to look. With
``validate=False`` nothing is counted and nothing is read back.

Half precision: a bfloat16 or float16 loss (or log-probabilities) is computed
and reduced in float32 and returned in its own dtype, rounded once. A float16 sum
of a batch's token losses overflows at 65,504 (8,192 tokens of loss 8) even when
their mean is small, and a bfloat16 PPO ratio ``exp(logprob - old)`` is
resolved only to 2**-8, coarser than the clip range's edges are meant.

Masked tokens are ignored by selection (``torch.where``), not by multiplying
with 0, so a NaN or inf in a padding position (a common sight: padded
log-probabilities) reaches neither the loss nor its gradient, and the checks
only look at the tokens that count.
"""

from __future__ import annotations

import numbers
import warnings

import torch

from ..exceptions import SeraOptError, SeraOptWarning
from .groups import as_tensor, check_flag, check_not_meta, distributed_world

LOSS_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "token-sum")


def _check_tokens(tensor, name: str, hint: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise SeraOptError(
            f"{name} must be a torch.Tensor of shape (sequences, tokens), got "
            f"{type(tensor).__name__}."
        )
    check_not_meta(tensor, name)
    if tensor.ndim != 2 or not tensor.is_floating_point():
        raise SeraOptError(
            f"{name} must be a floating tensor of shape (sequences, tokens), got shape "
            f"{tuple(tensor.shape)} and dtype {tensor.dtype}; {hint}"
        )
    return tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the loss is computed in: float32 for 16-bit floats, else ``dtype``."""
    return torch.float32 if dtype.itemsize < 4 else dtype


def check_mode(mode) -> str:
    if mode not in LOSS_MODES:
        raise SeraOptError(f"unknown loss mode {mode!r}; use one of {LOSS_MODES}.")
    return mode


def check_mask(mask, like: torch.Tensor, like_name: str):
    """The mask as a tensor on ``like``'s device (structure only), or None."""
    if mask is None:
        return None
    mask = as_tensor(mask, "mask", device=like.device)
    if mask.shape != like.shape:
        raise SeraOptError(
            f"mask must have the shape of {like_name}, {tuple(like.shape)}, got "
            f"{tuple(mask.shape)}."
        )
    if mask.device != like.device:
        raise SeraOptError(f"mask is on {mask.device} but {like_name} is on {like.device}.")
    if mask.is_complex():
        raise SeraOptError(
            "mask must be bool or real non-negative token weights, got a complex tensor."
        )
    return mask


def kept_tokens(mask):
    """Boolean tensor of the tokens that count (mask != 0), or None for no mask."""
    if mask is None:
        return None
    return mask if mask.dtype == torch.bool else mask != 0


def _position(bad: torch.Tensor) -> tuple[str, int]:
    """('[k, t]' or '[k]', flat index) of the first True entry (host read; error path only)."""
    flat = int(torch.nonzero(bad.reshape(-1))[0, 0])
    if bad.ndim == 2:
        row, col = divmod(flat, bad.shape[1])
        return f"[{row}, {col}]", flat
    return f"[{flat}]", flat


class ValueChecks:
    """Named on-device counts of bad entries, raised on after one read-back.

    Each check is registered with the boolean tensor of its offending entries
    and the tensor they come from (for the message); checks are reported in the
    order they were added, so inputs come before the quantities derived from them.
    """

    def __init__(self):
        self._checks: list[tuple[str, torch.Tensor, torch.Tensor, str]] = []

    def add(self, name: str, bad: torch.Tensor, values: torch.Tensor, what: str, fix: str):
        self._checks.append((name, bad, values, f"{what}\x00{fix}"))

    def __len__(self) -> int:
        return len(self._checks)

    def counts(self, dtype, device) -> torch.Tensor:
        if not self._checks:
            return torch.zeros(0, dtype=dtype, device=device)
        return torch.stack([torch.count_nonzero(bad) for _, bad, _, _ in self._checks]).to(dtype)

    def raise_if(self, local_counts: list[float], global_counts: list[float]) -> None:
        """Raise the first failed check of this rank, else say that another rank failed."""
        for (name, bad, values, text), count in zip(self._checks, local_counts, strict=True):
            if count > 0:
                what, fix = text.split("\x00")
                where, flat = _position(bad)
                value = values.reshape(-1)[flat].item()
                raise SeraOptError(
                    f"{name} contains {int(count)} {what}, the first at {where} ({value!r}). "
                    f"{fix}"
                )
        failed = [name for (name, *_), count in zip(self._checks, global_counts, strict=True)
                  if count > 0]
        if failed:
            raise SeraOptError(
                f"invalid {' and '.join(failed)} on another rank of the process group (see "
                f"that rank's error); every rank raises so that none is left waiting in a "
                f"collective."
            )


def add_mask_check(checks: ValueChecks, mask) -> None:
    if mask is None or mask.dtype == torch.bool:
        return
    if mask.is_floating_point():
        bad = ~(torch.isfinite(mask) & (mask >= 0))
    else:
        bad = mask < 0
    checks.add(
        "mask", bad, mask, "value(s) that are not non-negative finite token weights",
        "Use bool or 0/1 values (True or 1 for tokens that count, False or 0 for padding); "
        "other non-negative values act as token weights.",
    )


def add_finite_check(checks: ValueChecks, tensor: torch.Tensor, name: str, keep, fix: str,
                     context: str = ""):
    bad = ~torch.isfinite(tensor)
    if keep is not None:
        bad = bad & keep
        context += " at unmasked tokens"
    checks.add(name, bad, tensor, f"non-finite value(s) (NaN or inf){context}", fix)


def reduce_loss(per_token_loss, mask, keep, mode, process_group, checks) -> torch.Tensor:
    """The reduction of :func:`sera_opt.aggregate_loss`; ``checks`` is None when not validating."""
    dist, world = distributed_world(process_group)
    # Token and sequence counts in float64 (float32 on MPS): a bfloat16 count
    # would already be inexact beyond 256 tokens.
    count_dtype = torch.float32 if per_token_loss.device.type == "mps" else torch.float64
    device = per_token_loss.device
    result_dtype = per_token_loss.dtype
    per_token_loss = per_token_loss.to(compute_dtype(result_dtype))
    if mask is None:
        masked = per_token_loss
        lengths = torch.full(per_token_loss.shape[:1], per_token_loss.shape[1],
                             dtype=count_dtype, device=device)
    else:
        if mask.dtype == torch.bool:
            masked = torch.where(mask, per_token_loss, 0)
        else:
            masked = torch.where(keep, per_token_loss * mask.to(per_token_loss.dtype), 0)
        lengths = mask.sum(dim=1, dtype=count_dtype)
    if mode == "token-sum":
        numerator, denominator = masked.sum(), None
    elif mode == "token-mean":
        numerator, denominator = masked.sum(), lengths.sum()
    else:
        per_sequence = masked.sum(dim=1)
        if mode == "seq-mean-token-mean":
            # An empty sequence has a zero numerator; dividing by 1 keeps it 0.
            per_sequence = per_sequence / torch.where(lengths != 0, lengths, 1)
        numerator = per_sequence.sum()
        denominator = torch.count_nonzero(lengths).to(count_dtype)

    counts = checks.counts(count_dtype, device) if checks is not None else None
    if denominator is not None:
        denominator = denominator.detach().reshape(1)
    global_counts = counts
    if dist is not None and (denominator is not None or counts is not None):
        # One collective carries the denominator and every rank's bad-value counts.
        parts = [t for t in (denominator, counts) if t is not None]
        shared = torch.cat(parts)
        dist.all_reduce(shared, group=process_group)
        if denominator is not None:
            denominator, global_counts = shared[:1], shared[1:]
        else:
            global_counts = shared
    if counts is not None and len(checks):
        both = torch.cat([counts, global_counts]).tolist()
        checks.raise_if(both[:len(checks)], both[len(checks):])
    if dist is not None:
        numerator = numerator * world
    if denominator is None:
        return numerator.to(result_dtype)
    # Nothing unmasked anywhere: the numerator is 0 and so is the loss.
    loss = numerator / torch.where(denominator > 0, denominator, 1)[0]
    return loss.to(result_dtype)


def aggregate_loss(per_token_loss, mask, mode, process_group, validate):
    mode = check_mode(mode)
    validate = check_flag(validate, "validate")
    per_token_loss = _check_tokens(per_token_loss, "per_token_loss",
                                   "for one loss per sequence use shape (N, 1).")
    mask = check_mask(mask, per_token_loss, "per_token_loss")
    keep = kept_tokens(mask)
    checks = None
    if validate:
        checks = ValueChecks()
        add_mask_check(checks, mask)
        add_finite_check(
            checks, per_token_loss.detach(), "per_token_loss", keep,
            "It would make the loss NaN or inf. Find where the model or the loss produced it, "
            "or mask those tokens (masked tokens are ignored, whatever their value).",
        )
    return reduce_loss(per_token_loss, mask, keep, mode, process_group, checks)


def _clip_bounds(clip_range):
    pair = clip_range if isinstance(clip_range, (tuple, list)) else (clip_range, clip_range)
    if isinstance(clip_range, (str, bytes)) or len(pair) != 2:
        raise SeraOptError(f"clip_range must be a float or a pair of floats, got {clip_range!r}.")
    for v in pair:
        if isinstance(v, (bool, str, bytes)) or not isinstance(v, numbers.Real):
            raise SeraOptError(
                f"clip_range must be a number eps or a pair (eps_low, eps_high) of numbers (the "
                f"PPO ratio is clipped to [1 - eps_low, 1 + eps_high]), got {clip_range!r}."
            )
    low, high = (float(v) for v in pair)
    if not (0 <= low < 1 and high >= 0):
        raise SeraOptError(
            f"clip_range must satisfy 0 <= eps_low < 1 and eps_high >= 0, got {clip_range!r}."
        )
    return low, high


def policy_gradient_loss(token_logprobs, advantages, mask, mode, old_token_logprobs,
                         clip_range, process_group, validate):
    mode = check_mode(mode)
    validate = check_flag(validate, "validate")
    token_logprobs = _check_tokens(token_logprobs, "token_logprobs",
                                   "for sequence log-probabilities use shape (N, 1).")
    advantages = as_tensor(advantages, "advantages", device=token_logprobs.device)
    if advantages.shape != token_logprobs.shape[:1]:
        raise SeraOptError(
            f"advantages must have one entry per sequence, shape ({token_logprobs.shape[0]},), "
            f"got {tuple(advantages.shape)}."
        )
    if advantages.is_complex() or advantages.dtype == torch.bool:
        raise SeraOptError(f"advantages must be real numbers, got dtype {advantages.dtype}.")
    if advantages.device != token_logprobs.device:
        raise SeraOptError(
            f"advantages are on {advantages.device} but token_logprobs are on "
            f"{token_logprobs.device}."
        )
    mask = check_mask(mask, token_logprobs, "token_logprobs")
    keep = kept_tokens(mask)
    if old_token_logprobs is not None:
        old_token_logprobs = as_tensor(old_token_logprobs, "old_token_logprobs",
                                        device=token_logprobs.device)
        if old_token_logprobs.shape != token_logprobs.shape:
            raise SeraOptError(
                f"old_token_logprobs must have the shape of token_logprobs, "
                f"{tuple(token_logprobs.shape)}, got {tuple(old_token_logprobs.shape)}."
            )
        if not old_token_logprobs.is_floating_point():
            raise SeraOptError(
                f"old_token_logprobs must be a floating tensor, got {old_token_logprobs.dtype}."
            )
        low, high = _clip_bounds(0.2 if clip_range is None else clip_range)
    elif clip_range is not None:
        warnings.warn("clip_range is ignored without old_token_logprobs (no PPO ratio).",
                      SeraOptWarning, stacklevel=3)
    result_dtype = token_logprobs.dtype
    compute = compute_dtype(result_dtype)
    advantages = advantages.detach().to(compute)
    checks = None
    if validate:
        checks = ValueChecks()
        add_mask_check(checks, mask)
        add_finite_check(
            checks, advantages, "advantages", None,
            "maxrl_advantages never returns them: check how the advantages were computed, "
            "or whether they overflowed on conversion.",
            context=f" (as {compute}, the dtype the loss is computed in)",
        )
        add_finite_check(
            checks, token_logprobs.detach(), "token_logprobs", keep,
            "A sampled token's log-probability must be finite (-inf means the policy gives "
            "it probability 0); mask padding tokens instead of passing them.",
        )
        if old_token_logprobs is not None:
            add_finite_check(
                checks, old_token_logprobs.detach(), "old_token_logprobs", keep,
                "They must be finite log-probabilities of the sampled tokens under the "
                "sampling policy; mask padding tokens instead of passing them.",
            )
    column = advantages[:, None]
    if old_token_logprobs is None:
        per_token_loss = -column * token_logprobs.to(compute)
    else:
        log_ratio = token_logprobs.to(compute) - old_token_logprobs.detach().to(compute)
        if keep is not None:
            # Padding may hold -inf in both: exp(-inf - -inf) is NaN, and exp's
            # backward (upstream * result) would carry that NaN into the gradient.
            log_ratio = torch.where(keep, log_ratio, 0)
        ratio = torch.exp(log_ratio)
        clipped = ratio.clamp(1.0 - low, 1.0 + high)
        per_token_loss = -torch.minimum(ratio * column, clipped * column)
    if validate:
        # Finite inputs can still overflow (exp of a large log-ratio): caught last,
        # so that a bad input is named before what it caused.
        add_finite_check(
            checks, per_token_loss.detach(), "the per-token loss", keep,
            "Its inputs are finite, so it overflowed: with old_token_logprobs this is "
            "exp(logprob - old_logprob) beyond the dtype's range; check that the two "
            "log-probabilities belong to the same tokens.",
        )
    return reduce_loss(per_token_loss, mask, keep, mode, process_group, checks).to(result_dtype)
