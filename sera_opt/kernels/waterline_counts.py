"""Counting pre-levels below a level (numba kernels): the waterline solver's read-only
pass, in vectorizable blocks, and the extremes that both searches open with.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(cache=True, inline="always", error_model="numpy")
def count_one(a, m, c, level):
    """How many of ``a * (m + k)``, k = 0 .. c-1, lie strictly below ``level``.

    The division gives the count up to rounding; the two loops then settle it
    with the same products that the one-at-a-time greedy compares, so the
    result is exactly what the greedy would see.
    """
    y = level / a - m
    if y <= 0.0:
        k = 0
    elif y >= c:
        k = c
    else:
        k = np.int64(np.ceil(y))
    while k > 0 and a * (m + k - 1) >= level:
        k -= 1
    while k < c and a * (m + k) < level:
        k += 1
    return k


@njit(cache=True, inline="always", error_model="numpy")
def prompt_bounds(lo, hi, uniform, c, i):
    """``(m_lo, cap)`` of prompt ``i``."""
    j = 0 if uniform else i
    return lo[j] - c, hi[j] - lo[j]


# Prompts are counted in blocks of COUNT_BLOCK. A first loop, which the compiler
# vectorizes, takes each count from one division and a ceiling and settles it with
# one step each way of the products that the one-at-a-time greedy compares (the
# quotient is off by less than one step while it is below _EXACT_STEP); a second
# loop sums the block. Only a block holding a larger quotient is recounted one
# prompt at a time (:func:`count_one`).
COUNT_BLOCK = 256


_EXACT_STEP = 2.0**50


@njit(cache=True, error_model="numpy")
def _settled_count(a, m, cap, level):
    """:func:`count_one` for ``m``, ``cap`` given as floats, in straight-line code; exact
    while ``level / a - m < _EXACT_STEP`` (the second value says whether it is)."""
    y = level / a - m
    k = min(max(np.ceil(y), 0.0), cap)
    k = k - 1.0 if (k > 0.0) & (a * (m + k - 1.0) >= level) else k
    k = k + 1.0 if (k < cap) & (a * (m + k) < level) else k
    return k, (y < _EXACT_STEP) | (y - cap > 2.0)


@njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def _block_sum(out, e):
    """``sum(out[:e])`` of non-negative whole numbers held as floats, exactly. Summed in
    floats in any order while the total stays below ``2**52`` (every partial sum is
    then a whole number float64 holds), else again in integers."""
    total = 0.0
    for f in range(e):
        total += out[f]
    if total < 2.0**52:
        return np.int64(total)
    exact = 0
    for f in range(e):
        exact += np.int64(out[f])
    return exact


@njit(cache=True, error_model="numpy")
def block_counts(rates, lo, hi, uniform, c, level, s, e, out):
    """Counts of pre-levels below ``level`` for prompts ``s..e-1`` into ``out[0:e-s]``
    (float64 holding whole numbers); returns their sum."""
    exact = True
    if uniform:
        m = float(lo[0] - c)
        cap = float(hi[0] - lo[0])
        for i in range(s, e):
            k, ok = _settled_count(rates[i], m, cap, level)
            out[i - s] = k
            exact &= ok
    else:
        for i in range(s, e):
            k, ok = _settled_count(rates[i], float(lo[i] - c), float(hi[i] - lo[i]), level)
            out[i - s] = k
            exact &= ok
    if not exact:
        for i in range(s, e):
            j = 0 if uniform else i
            out[i - s] = count_one(rates[i], lo[j] - c, hi[j] - lo[j], level)
    return _block_sum(out, e - s)


@njit(cache=True, error_model="numpy")
def total_below(rates, lo, hi, uniform, c, level):
    """``G(level)``, the number of pre-levels strictly below ``level`` (one read-only pass)."""
    n = rates.shape[0]
    buf = np.empty(COUNT_BLOCK, dtype=np.float64)
    total = 0
    for s in range(0, n, COUNT_BLOCK):
        total += block_counts(rates, lo, hi, uniform, c, level, s, min(s + COUNT_BLOCK, n), buf)
    return total


@njit(cache=True, error_model="numpy")
def level_extremes(rates, lo, hi, uniform, c):
    """What both searches open with, in one pass: the smallest first pre-level, the
    largest last pre-level and the largest level at the maximum, the total capacity, and
    ``sum 1/a`` and ``sum m_lo`` (the root of the relaxation if every prompt were
    strictly between its bounds)."""
    first = np.inf
    last = -np.inf
    top = -np.inf
    total = 0
    inv_sum = 0.0
    m_sum = 0.0
    for i in range(rates.shape[0]):
        m, cap = prompt_bounds(lo, hi, uniform, c, i)
        if cap > 0:
            a = rates[i]
            b0 = a * m
            b1 = a * (m + cap - 1)
            b2 = a * (m + cap)
            if b0 < first:
                first = b0
            if b1 > last:
                last = b1
            if b2 > top:
                top = b2
            total += cap
            inv_sum += 1.0 / a
            m_sum += m
    return first, last, top, total, inv_sum, m_sum
