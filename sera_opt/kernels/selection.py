"""Selecting the last rollouts from a small collected set (numba kernels): the k-th
largest by a heap, the tie rules, and one more rollout for every value beyond a
threshold.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(cache=True, error_model="numpy")
def _sift_down_min(a, start, end, root):
    # Min-heap on a[start:end] rooted at `start` (heap offsets relative to it);
    # sifts the entry at offset `root` down.
    n = end - start
    while True:
        child = 2 * root + 1
        if child >= n:
            return
        if child + 1 < n and a[start + child + 1] < a[start + child]:
            child += 1
        if a[start + child] < a[start + root]:
            t = a[start + child]
            a[start + child] = a[start + root]
            a[start + root] = t
            root = child
        else:
            return


@njit(cache=True, error_model="numpy")
def kth_largest(a, r):
    """The ``r``-th largest value of ``a`` (1-based); reorders ``a``.

    Three-way quickselect (median-of-three pivots, so runs of equal values
    are cheap), falling back after 64 rounds to a size-r heap over the rest,
    so the worst case stays O(N log N).
    """
    # np.int64, not 0: a literal 0 passed on to _sift_down_min makes numba compile it
    # for Literal[int](0) as well as for int64.
    lo = np.int64(0)
    hi = a.shape[0] - 1
    target = r - 1
    for _ in range(64):
        if lo >= hi:
            return a[lo]
        mid = lo + (hi - lo) // 2
        x, y, z = a[lo], a[mid], a[hi]
        if x > y:
            x, y = y, x
        if y > z:
            y = z
            if x > y:
                y = x
        pivot = y
        lt = lo
        i = lo
        gt = hi
        while i <= gt:
            v = a[i]
            if v > pivot:
                a[i] = a[lt]
                a[lt] = v
                lt += 1
                i += 1
            elif v < pivot:
                a[i] = a[gt]
                a[gt] = v
                gt -= 1
            else:
                i += 1
        if target < lt:
            hi = lt - 1
        elif target <= gt:
            return pivot
        else:
            lo = gt + 1
    # Keep the (target - lo + 1) largest of a[lo:hi+1] in a min-heap.
    size = target - lo + 1
    for s in range(size // 2 - 1, -1, -1):
        _sift_down_min(a, lo, lo + size, s)
    root = np.int64(0)
    for i in range(lo + size, hi + 1):
        if a[i] > a[lo]:
            a[lo] = a[i]
            _sift_down_min(a, lo, lo + size, root)
    return a[lo]


@njit(cache=True, error_model="numpy")
def _tie_before(e, f, nxt, step, owner, maxmin):
    """Tie order: (max-min) lower next gain, i.e. higher next level; then fewer
    rollouts so far; then the lower index."""
    if maxmin and nxt[e] != nxt[f]:
        return nxt[e] < nxt[f]
    if step[e] != step[f]:
        return step[e] < step[f]
    return owner[e] < owner[f]


@njit(cache=True, error_model="numpy")
def pick_ties(band, left, nxt, step, owner, maxmin, counts):
    """Hand ``left`` rollouts to the tied steps ``band`` (row-major order, each
    row's tied steps contiguous) one at a time, always to the best row head
    by the tie order; a row's next tied step becomes its head. A binary heap,
    O(T log T)."""
    n = band.shape[0]
    heap = np.empty(n, dtype=np.int64)
    size = 0
    for j in range(n):
        if j == 0 or owner[band[j - 1]] != owner[band[j]]:
            # push j
            heap[size] = j
            pos = size
            size += 1
            while pos > 0:
                parent = (pos - 1) // 2
                if _tie_before(band[heap[pos]], band[heap[parent]], nxt, step, owner, maxmin):
                    t = heap[pos]
                    heap[pos] = heap[parent]
                    heap[parent] = t
                    pos = parent
                else:
                    break
    for _ in range(left):
        top = heap[0]
        counts[owner[band[top]]] += 1
        nxt_pos = top + 1
        if nxt_pos < n and owner[band[nxt_pos]] == owner[band[top]]:
            heap[0] = nxt_pos
        else:
            size -= 1
            heap[0] = heap[size]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= size:
                break
            if child + 1 < size and _tie_before(band[heap[child + 1]], band[heap[child]], nxt,
                                                step, owner, maxmin):
                child += 1
            if _tie_before(band[heap[child]], band[heap[pos]], nxt, step, owner, maxmin):
                t = heap[pos]
                heap[pos] = heap[child]
                heap[child] = t
                pos = child
            else:
                break


@njit(cache=True, inline="always", error_model="numpy")
def take_beyond(vals, e, threshold, owner, counts, larger):
    """One more rollout for ``owner[f]`` for every ``vals[f]`` (``f < e``) strictly beyond
    ``threshold`` (greater with ``larger``, else smaller). Returns how many were taken and
    the indices ``f`` of the values equal to it, in order: the tied band, which the
    caller's tie rule splits. Both exact solvers select their last steps this way."""
    taken = 0
    n_tied = 0
    for f in range(e):
        v = vals[f]
        if (v > threshold) if larger else (v < threshold):
            counts[owner[f]] += 1
            taken += 1
        elif v == threshold:
            n_tied += 1
    band = np.empty(n_tied, dtype=np.int64)
    t = 0
    for f in range(e):
        if vals[f] == threshold:
            band[t] = f
            t += 1
    return taken, band
