"""Handing rollouts out once a solve knows where: one at a time from a binary heap over
the rows' next steps (:func:`hand_out`, the closed-form engine's one-at-a-time kernel and
the end of its bracket search), or level by level over tied ranges (:func:`water_fill`).
Both follow the tie rule of sums: the larger gain, then fewer rollouts, then the lower
index."""

from __future__ import annotations

import numpy as np

from .._jit import njit
from .floatkeys import counts_from
from .gains import gain

__all__ = ["hand_out", "room", "water_fill"]


@njit(cache=True, error_model="numpy", inline="always")
def room(lo, hi):
    """``sum(hi - lo)``, the most rollouts the rows can take above their minimums. A typed
    integer from the start: while the literal 0 is all numba knows of an accumulator, a
    call that passes it is compiled for ``Literal[int](0)``, and then again for int64."""
    total = np.int64(0)
    for i in range(lo.shape[0]):
        total += hi[i] - lo[i]
    return total


@njit(cache=True, error_model="numpy", inline="always")
def _step_before(g, k, i, h, k_h, i_h):
    """Whether step ``(g, k, i)`` (gain, count, row) goes before ``(h, k_h, i_h)``: the
    larger gain, then fewer rollouts, then the lower index (the tie rule of sums)."""
    if g != h:
        return g > h
    if k != k_h:
        return k < k_h
    return i < i_h


@njit(cache=True, error_model="numpy", inline="always")
def _sift_step(heap, gains, counts, root, size):
    """Sift the row at heap position ``root`` down the heap of rows ordered by their next
    step (:func:`_step_before`)."""
    row = heap[root]
    g = gains[row]
    k = counts[row]
    while True:
        child = 2 * root + 1
        if child >= size:
            break
        best = heap[child]
        if child + 1 < size:
            other = heap[child + 1]
            if _step_before(gains[other], counts[other], other, gains[best], counts[best],
                            best):
                child += 1
                best = other
        if not _step_before(gains[best], counts[best], best, g, k, row):
            break
        heap[root] = best
        root = child
    heap[root] = row


@njit(cache=True, error_model="numpy")
def hand_out(kind, p0, p1, p2, c, counts, stops, need):
    """Add ``need`` steps to ``counts`` one at a time, each to the row whose next step has
    the largest gain (then fewer rollouts, then the lower index), from a binary heap over
    the rows with ``counts < stops``; ``need`` must not exceed ``sum(stops - counts)``.
    Returns how many gains it evaluated."""
    m = counts.shape[0]
    gains = np.empty(m, dtype=np.float64)
    heap = np.empty(m, dtype=np.int64)
    size = 0
    for i in range(m):
        if stops[i] > counts[i]:
            gains[i] = gain(kind, p0[i], p1[i], p2[i], c, counts[i])
            heap[size] = i
            size += 1
    evaluated = size
    for root in range(size // 2 - 1, -1, -1):
        _sift_step(heap, gains, counts, root, size)
    for _ in range(need):
        row = heap[0]
        counts[row] += 1
        if counts[row] < stops[row]:
            gains[row] = gain(kind, p0[row], p1[row], p2[row], c, counts[row])
            evaluated += 1
        else:
            size -= 1
            heap[0] = heap[size]
        if size > 0:
            _sift_step(heap, gains, counts, 0, size)
    return evaluated


@njit(cache=True, error_model="numpy")
def water_fill(starts, stops, left, out):
    """``starts`` plus ``left`` steps taken one at a time from the tied ranges
    ``[starts_i, stops_i)``, the row with the fewest rollouts first, then the lower
    index (the tie rule of sums)."""
    m = starts.shape[0]
    counts = counts_from(starts, out)
    k_low = np.int64(0)
    k_high = np.int64(0)
    first = True
    for i in range(m):
        if stops[i] > starts[i]:
            if first or starts[i] < k_low:
                k_low = starts[i]
            if first or stops[i] > k_high:
                k_high = stops[i]
            first = False
    while k_low < k_high:
        mid = k_low + (k_high - k_low + 1) // 2
        s = 0
        for i in range(m):
            s += min(max(mid - starts[i], 0), stops[i] - starts[i])
        if s <= left:
            k_low = mid
        else:
            k_high = mid - 1
    used = 0
    for i in range(m):
        add = min(max(k_low - starts[i], 0), stops[i] - starts[i])
        counts[i] += add
        used += add
    for i in range(m):
        if used == left:
            break
        if counts[i] == k_low and k_low < stops[i] and starts[i] <= k_low:
            counts[i] += 1
            used += 1
    return counts
