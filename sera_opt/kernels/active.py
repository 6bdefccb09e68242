"""The authors' bisection of the waterline (docs/theory.md section 10) in one compiled
pass per try (numba kernels, used by :mod:`sera_opt.policies.active`).

The bisection's outcome must equal numpy's, bit for bit: each step compares
``np.sum(np.clip(c + level / a, lo, hi))`` with the budget. Division, addition and
clipping are IEEE operations that give the same bits here; numpy's sum is its pairwise
sum, which :func:`pairwise_total` repeats in the same order. Only ``exp`` differs: numpy
may dispatch a SIMD ``exp`` whose last bit is not libm's, so the kernel records every
step (:func:`bisect`) and the caller checks its levels against ``np.exp`` and repeats the
steps whose comparison a different level would change.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit

# numpy's pairwise sum: blocks of at most 128 summed with eight accumulators.
_BLOCK = 128


@njit(cache=True, inline="always", error_model="numpy")
def _count(rates, lo, hi, uniform, offset, level, i):
    x = offset + level / rates[i]
    low = lo[0] if uniform else lo[i]
    high = hi[0] if uniform else hi[i]
    # np.clip: max with the lower bound, then min with the upper one.
    if x < low:
        x = low
    if x > high:
        x = high
    return x


@njit(cache=True, inline="always", error_model="numpy")
def _block_total(rates, lo, hi, uniform, offset, level, start, n):
    """One leaf of numpy's pairwise sum: ``n <= 128`` terms from ``start``."""
    if n < 8:
        res = 0.0
        for i in range(start, start + n):
            res += _count(rates, lo, hi, uniform, offset, level, i)
        return res
    r0 = _count(rates, lo, hi, uniform, offset, level, start)
    r1 = _count(rates, lo, hi, uniform, offset, level, start + 1)
    r2 = _count(rates, lo, hi, uniform, offset, level, start + 2)
    r3 = _count(rates, lo, hi, uniform, offset, level, start + 3)
    r4 = _count(rates, lo, hi, uniform, offset, level, start + 4)
    r5 = _count(rates, lo, hi, uniform, offset, level, start + 5)
    r6 = _count(rates, lo, hi, uniform, offset, level, start + 6)
    r7 = _count(rates, lo, hi, uniform, offset, level, start + 7)
    whole = n - n % 8
    i = 8
    while i < whole:
        j = start + i
        r0 += _count(rates, lo, hi, uniform, offset, level, j)
        r1 += _count(rates, lo, hi, uniform, offset, level, j + 1)
        r2 += _count(rates, lo, hi, uniform, offset, level, j + 2)
        r3 += _count(rates, lo, hi, uniform, offset, level, j + 3)
        r4 += _count(rates, lo, hi, uniform, offset, level, j + 4)
        r5 += _count(rates, lo, hi, uniform, offset, level, j + 5)
        r6 += _count(rates, lo, hi, uniform, offset, level, j + 6)
        r7 += _count(rates, lo, hi, uniform, offset, level, j + 7)
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += _count(rates, lo, hi, uniform, offset, level, start + i)
        i += 1
    return res


@njit(cache=True, error_model="numpy")
def pairwise_total(rates, lo, hi, uniform, offset, level, start, n):
    """``sum_i clip(offset + level / rates[i], lo_i, hi_i)`` over ``start .. start + n``,
    added in the order of numpy's pairwise sum (``np.add.reduce`` of a contiguous
    float64 array): halves cut at a multiple of 8 down to blocks of at most 128, left
    total plus right total. The tree is walked with a stack (a cached numba function must
    not call itself)."""
    if n <= _BLOCK:
        return _block_total(rates, lo, hi, uniform, offset, level, start, n)
    # Each level of the tree leaves at most two entries on the stack, and a count of
    # int64 halves at most 63 times.
    starts = np.empty(192, dtype=np.int64)
    sizes = np.empty(192, dtype=np.int64)
    combine = np.empty(192, dtype=np.bool_)
    totals = np.empty(192, dtype=np.float64)
    top = 0
    done = 0
    starts[0], sizes[0], combine[0] = start, n, False
    top = 1
    while top:
        top -= 1
        first, size = starts[top], sizes[top]
        if combine[top]:
            done -= 1
            totals[done - 1] = totals[done - 1] + totals[done]
        elif size <= _BLOCK:
            totals[done] = _block_total(rates, lo, hi, uniform, offset, level, first, size)
            done += 1
        else:
            half = size // 2
            half -= half % 8
            starts[top], sizes[top], combine[top] = first, size, True
            starts[top + 1], sizes[top + 1], combine[top + 1] = first + half, size - half, False
            starts[top + 2], sizes[top + 2], combine[top + 2] = first, half, False
            top += 3
    return totals[0]


@njit(cache=True, error_model="numpy")
def bisect(rates, lo, hi, uniform, offset, budget, first, log_low, log_high, lows, highs,
           mids, levels, above):
    """Steps ``first ..`` of the bisection of ``log(level)`` from ``[log_low, log_high]``:
    step ``s`` records its bracket (``lows[s]``, ``highs[s]``), its midpoint ``mids[s]``,
    the level ``exp(mids[s])`` it used and whether the counts then sum above ``budget``
    (the midpoint becomes the upper end) or not (the lower end). Returns the final lower
    end and the number of steps taken: a step that leaves the bracket as it was (its
    midpoint is one of its ends, once the bracket is down to adjacent floats) is repeated
    by every later step, so the steps stop there."""
    n = rates.size
    for s in range(first, mids.size):
        lows[s] = log_low
        highs[s] = log_high
        mid = 0.5 * (log_low + log_high)
        level = math.exp(mid)
        mids[s] = mid
        levels[s] = level
        over = pairwise_total(rates, lo, hi, uniform, offset, level, 0, n) > budget
        above[s] = over
        if over:
            log_high = mid
        else:
            log_low = mid
        if log_low == lows[s] and log_high == highs[s]:
            return log_low, s + 1
    return log_low, mids.size
