"""The separable engine written in numpy, for objectives without a kernel (a user's
subclass): bisection on the gain value, a vectorized binary search per prompt; the
slow reference of the tests."""

from __future__ import annotations

import math

import numpy as np

from ..exceptions import SolverError
from ..problem import exact_sum
from . import tiers

# The numpy engine materializes tied max-min steps to order them; past this many
# it refuses rather than exhaust memory.
_MAX_TIED_STEPS = 10**7


def numpy_select(objective, idx, lo: np.ndarray, hi: np.ndarray,
                 spare: int) -> np.ndarray:
    """The engine in numpy for ``objective`` (a :class:`~sera_opt.SeparableObjective` that
    only defines :meth:`gains`).

    Bisection on the gain value (in the order of the float bit patterns, so at
    most 64 rounds), each round counting per prompt the gains above the trial
    value with a vectorized binary search over the count. The threshold found
    is the ``spare``-th largest gain; ties at it follow the tie rule of :mod:`sera_opt.separable`.
    """
    rows = np.arange(objective.num_prompts)[idx]
    full_lo = np.zeros(objective.num_prompts, dtype=np.int64)
    full_lo[rows] = lo

    def gain_at(k: np.ndarray) -> np.ndarray:
        full = full_lo.copy()
        full[rows] = k
        g = np.asarray(objective.gains(full), dtype=np.float64)
        if g.shape != (objective.num_prompts,):
            raise SolverError(
                f"{type(objective).__name__}.gains returned shape {g.shape}, expected "
                f"({objective.num_prompts},)."
            )
        return g[rows]

    total = exact_sum(hi - lo)
    if spare <= 0:
        return lo.copy()
    if spare >= total:
        return hi.copy()
    lo_total = exact_sum(lo)

    sentinel = _float_key(-math.inf) - 1  # a key below every gain value

    def count(k: int) -> np.ndarray:
        # First step in [lo, hi] whose gain is <= the value of key k (hi when none):
        # lo + #{gains above it}, per prompt, by a vectorized binary search.
        if k == sentinel:
            return hi.copy()
        lam = _float_unkey(k)
        left, right = lo.copy(), hi.copy()
        active = left < right
        while active.any():
            mid = np.where(active, (left + right) // 2, lo)
            g = gain_at(mid)
            if np.isnan(g[active]).any():
                raise SolverError(f"{type(objective).__name__}.gains returned NaN.")
            above = g > lam
            left = np.where(active & above, mid + 1, left)
            right = np.where(active & ~above, mid, right)
            active = left < right
        return left

    key_hi, key_lo = _float_key(math.inf), sentinel
    while key_hi - key_lo > 1:
        mid = key_lo + (key_hi - key_lo) // 2
        if exact_sum(count(mid)) - lo_total <= spare:
            key_hi = mid
        else:
            key_lo = mid
    above, at_or_above = count(key_hi), count(key_hi - 1)
    left = spare - (exact_sum(above) - lo_total)
    if left == 0:
        return above
    start, stop = above, at_or_above  # tied steps of row j: k in [start_j, stop_j)
    if objective.sense != "max-min":
        return start + tiers.even_increments(start, stop - start, left)
    # Max-min: the tied step whose next level is highest (next gain lowest) first.
    n_tied = exact_sum(stop - start)
    if n_tied > _MAX_TIED_STEPS:
        raise SolverError(
            f"{n_tied} steps of {type(objective).__name__} tie at the threshold; the numpy "
            f"engine orders at most {_MAX_TIED_STEPS}. Give the objective edges() for "
            f"constant levels."
        )
    owner = np.repeat(np.arange(len(lo)), stop - start)
    step = start[owner] + (np.arange(n_tied) - np.repeat(np.cumsum(stop - start) - (stop - start),
                                                          stop - start))
    nxt = np.empty(n_tied)
    # Evaluate each tied step's next gain one layer of steps at a time.
    for layer in range(int((stop - start).max())):
        sel = step - start[owner] == layer
        k = start.copy()
        k[owner[sel]] = step[sel] + 1
        nxt[sel] = gain_at(k)[owner[sel]]
    order = np.lexsort((owner, step, nxt))
    counts = start.copy()
    np.add.at(counts, owner[order[:left]], 1)
    return counts


def _float_key(x: float) -> int:
    """Monotone map of a float64 to an int: ``x < y`` iff ``key(x) < key(y)``."""
    bits = int(np.array(x, dtype=np.float64).view(np.int64))
    return bits if bits >= 0 else -(bits & 0x7FFFFFFFFFFFFFFF) - 1


def _float_unkey(k: int) -> float:
    bits = k if k >= 0 else (-(k + 1)) | (1 << 63)
    return float(np.array(bits & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).view(np.float64))
