"""How max-min prompts whose level is 0 or infinite at every count enter the order.

This is the one place that rule lives; every max-min solver (the waterline
kernels, the MILP, the pure-Python greedy, and the engine for Beta levels)
goes through :func:`fill_tiers`.

A prompt's level after ``m = n - c`` effective rollouts is ``a m`` with
``a = -log(1 - p)`` (or, under a Beta posterior, ``-log E[(1 - p)^m]``). At
``p = 0`` every level is 0 and at ``p = 1`` every level is infinite, so the
plain order cannot rank extra rollouts among such prompts. sera_opt orders
them as the limits ``p -> 0+`` and ``p -> 1-`` do: a ``p = 0`` prompt's level
behaves like ``eps * m``, below every positive level, and a ``p = 1`` prompt's
like ``m / eps``, above every finite one. Hence three tiers, served in order:
``p = 0`` prompts take spare rollouts first (evenly among themselves, up to
their maximum, where docs/theory.md section 3 pins them), then the ordinary
prompts, then ``p = 1`` prompts (which keep their minimum unless everything
else is full).
Within the two edge tiers the level is ``m`` itself: the budget is spread
evenly, the fewest effective rollouts first, ties to the lower index.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

EDGE_LEVEL = {"zero": 0.0, "infinite": np.inf}


def tiers(zero: np.ndarray, infinite: np.ndarray) -> list[tuple[str, np.ndarray | slice]]:
    """``(tier name, index)`` in serving order; one ``"finite"`` slice when no edges."""
    if not zero.any() and not infinite.any():
        return [("finite", slice(None))]
    finite = ~(zero | infinite)
    return [(name, np.flatnonzero(mask)) for name, mask in
            (("zero", zero), ("finite", finite), ("infinite", infinite)) if mask.any()]


def even_increments(start: np.ndarray, cap: np.ndarray, extra: int) -> np.ndarray:
    """Hand ``extra`` rollouts one at a time to the lowest ``start + increment``
    (ties to the lower index), each row taking at most ``cap``.

    Water-filling: the largest level ``T`` with ``sum clip(T - start, 0, cap) <=
    extra``, then one more, in index order, to the rows sitting at ``T`` that can
    still take one. Returns the increments (int64).
    """
    start = np.asarray(start, dtype=np.int64)
    cap = np.asarray(cap, dtype=np.int64)
    if extra <= 0 or start.size == 0:
        return np.zeros(start.shape, dtype=np.int64)
    low, high = int(start.min()), int((start + cap).max())
    if low == int(start.max()) and int(cap.min()) == high - low:
        # Equal starts and caps (a round's first rollouts, uniform bounds): the same share
        # each, the remainder to the lowest indices, without the search.
        return even_split(start.size, min(extra, start.size * (high - low)))
    # np.maximum and np.minimum into one buffer rather than np.clip, whose checks of its
    # bounds cost more than the arithmetic on a batch of a thousand rows.
    buf = np.empty(start.shape, dtype=np.int64)

    def filled(level):  # clip(level - start, 0, cap), in buf
        np.subtract(level, start, out=buf)
        np.maximum(buf, 0, out=buf)
        return np.minimum(buf, cap, out=buf)

    while low < high:  # largest T with sum(clip(T - start, 0, cap)) <= extra
        mid = low + (high - low + 1) // 2
        if int(filled(mid).sum()) <= extra:
            low = mid
        else:
            high = mid - 1
    inc = filled(low)
    left = extra - int(inc.sum())
    if left:
        at_level = np.flatnonzero((start + inc == low) & (inc < cap))[:left]
        inc[at_level] += 1
    return inc


def even_split(m: int, extra: int) -> np.ndarray:
    """:func:`even_increments` of ``extra`` rollouts over ``m`` rows with equal starts and
    room for them all: ``extra // m`` each, and one more to each of the first ``extra % m``
    rows (ties to the lower index)."""
    share, left = divmod(extra, m)
    inc = np.full(m, share, dtype=np.int64)
    inc[:left] += 1
    return inc


def even_continuous(start: np.ndarray, cap: np.ndarray, extra: float) -> tuple[float, np.ndarray]:
    """The continuous relaxation of :func:`even_increments`: ``x_i = clip(L - start_i,
    0, cap_i)`` with ``sum x = extra``, exactly (the sorted breakpoints of a piecewise
    linear function). Returns ``(L, x)``."""
    start = np.asarray(start, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.float64)
    if extra <= 0:
        return float(start.min()), np.zeros(start.shape)
    ends = start + cap
    points = np.unique(np.concatenate([start, ends]))
    # F(t) = sum clip(t - start, 0, cap) has slope #{start <= t < end} between points.
    slope = (np.searchsorted(np.sort(start), points, side="right")
             - np.searchsorted(np.sort(ends), points, side="right"))
    filled = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(points))])
    j = int(np.searchsorted(filled, extra))  # first breakpoint with F >= extra
    if j >= points.size:
        return float(points[-1]), cap.copy()
    if j == 0:
        level = float(points[0])
    else:
        t0, t1, f0, f1 = points[j - 1], points[j], filled[j - 1], filled[j]
        level = float(t0 + (extra - f0) * (t1 - t0) / (f1 - f0))
    return level, np.clip(level - start, 0, cap)


def fill_tiers(m_lo: np.ndarray, cap: np.ndarray, extra: int, zero: np.ndarray,
               infinite: np.ndarray, finite_fill: Callable[[np.ndarray | slice, int], object],
               *, continuous: bool = False, finite_level: Callable[[], float] | None = None):
    """Serve ``extra`` spare rollouts tier by tier.

    ``m_lo`` are the prompts' effective rollouts at their minimum and ``cap`` how
    many more each may take; ``finite_fill(idx, take)`` returns the increments of
    the ordinary prompts ``idx`` (or ``(level, increments)`` when ``continuous``).
    Returns the increments over the minimum (int64; float64 when ``continuous``),
    and with ``continuous`` also the level where the budget ran out
    (``finite_level()`` when no spare rollout reaches the ordinary prompts).
    """
    inc = np.zeros(m_lo.shape, dtype=np.float64 if continuous else np.int64)
    level = None
    for name, idx in tiers(zero, infinite):
        tier_cap = cap[idx]
        take = min(extra, int(tier_cap.sum()))
        if take <= 0:
            continue
        if name == "finite":
            out = finite_fill(idx, take)
            if continuous:
                level, out = out
        elif continuous:
            _, out = even_continuous(m_lo[idx], tier_cap, take)
            level = EDGE_LEVEL[name]
        else:
            out = even_increments(m_lo[idx], tier_cap, take)
        inc[idx] = inc[idx] + out
        extra -= take
    if continuous:
        return (finite_level() if level is None and finite_level else level), inc
    return inc
