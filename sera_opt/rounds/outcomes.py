"""What the round sessions share: a round's rewards read as binary outcomes, and the
layout of the rollouts recorded round by round. Public within :mod:`sera_opt.rounds`
(both :class:`~sera_opt.rounds.RoundSession` and
:class:`~sera_opt.rounds.ReinforceAdaSession` use them)."""

from __future__ import annotations

import numpy as np

from ..exceptions import SeraOptError

__all__ = ["binary_rewards", "read_only", "rollout_layout"]


def read_only(a: np.ndarray) -> np.ndarray:
    """``a``, flagged read-only (the caller owns it: nothing else writes to it)."""
    a.setflags(write=False)
    return a


def binary_rewards(rewards, n: int) -> np.ndarray:
    """A round's rewards as float64 0/1 (one per rollout, ``n`` in all), or a clear error.

    Torch tensors are read on any device and in any floating dtype: half precision
    (bfloat16, float16), which numpy cannot hold, is widened to float64 first (0 and 1
    are exact in every float format, so nothing is rounded).
    """
    if hasattr(rewards, "detach"):  # a torch tensor, on any device
        rewards = rewards.detach().cpu()
        if rewards.is_floating_point():
            rewards = rewards.double()
        rewards = rewards.numpy()
    if isinstance(rewards, np.ma.MaskedArray):
        raise SeraOptError("rewards must not be a masked array; drop the masked rollouts.")
    try:
        r = np.asarray(rewards)
    except (TypeError, ValueError):
        raise SeraOptError(
            "rewards must be a flat sequence of 0/1 outcomes, one per rollout of this round."
        ) from None
    # Named before the shape: a complex scalar is a wrong kind of reward, not a wrong count.
    if np.issubdtype(r.dtype, np.complexfloating):
        raise SeraOptError(
            f"rewards must be real 0/1 outcomes, got complex numbers (dtype {r.dtype}); take "
            f"the outcome you mean (for example rewards.real) before recording them.")
    if r.ndim != 1 or r.shape[0] != n:
        raise SeraOptError(
            f"record() takes this round's rewards, one per rollout grouped by prompt in "
            f"order ({n} in all), got shape {r.shape}."
        )
    if r.dtype != np.bool_ and not np.issubdtype(r.dtype, np.number):
        raise SeraOptError(f"rewards must be numbers 0/1 or booleans, got dtype {r.dtype}.")
    r = r.astype(np.float64)
    if not np.all((r == 0.0) | (r == 1.0)):
        bad = int(np.flatnonzero(~((r == 0.0) | (r == 1.0)))[0])
        raise SeraOptError(
            f"rewards must be binary (0/1); got {r[bad]!r} at position {bad}. Threshold graded "
            f"rewards yourself (rewards >= t) before recording them."
        )
    return r


def rollout_layout(round_counts: list[np.ndarray], m: int):
    """``(round_counts (R, M), prompt_index, round_index)`` of rollouts recorded round by
    round, grouped by prompt within a round."""
    if not round_counts:
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros((0, m), dtype=np.int64), empty, empty.copy()
    ids = np.arange(m, dtype=np.int64)
    prompt_index = np.concatenate([np.repeat(ids, c) for c in round_counts])
    round_index = np.repeat(np.arange(len(round_counts), dtype=np.int64),
                            [int(c.sum()) for c in round_counts])
    return np.stack(round_counts), prompt_index, round_index
