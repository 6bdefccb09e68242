"""Where one row's gains cross a value (numba kernels): a closed-form or guessed start,
settled exactly by a galloping search on the gain function itself, and the count of
gains above a value over all rows.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from .gains import (
    crossing_guess,
    exact_guess,
    fair_inverse_crossing,
    fair_log_crossing,
    gain,
    hit_walk,
    knapsack_count,
    pass_constant,
)
from .kinds import FAIR_INVERSE, FAIR_LOG, HIT_UTILITY, KNAPSACK, PRODUCT_MAX, RLOO_VARIANCE


@njit(cache=True, error_model="numpy", inline="always")
def _guessed_start(kind, x0, x1, x2, c, lam, aux, floor, ceil):
    """The guessed (real) crossing ``g`` of ``gain(k) = lam`` and the integer start of the
    search it gives, clamped to ``[floor, ceil]`` (``floor`` where ``g`` is NaN)."""
    if kind == FAIR_LOG:
        g = fair_log_crossing(x0, x1, c, lam, aux)
    elif kind == FAIR_INVERSE:
        g = fair_inverse_crossing(x0, x1, c, lam, aux)
    else:
        g = crossing_guess(kind, x0, x1, x2, c, lam)
    return g, clamped_start(g, floor, ceil)


@njit(cache=True, error_model="numpy", inline="always")
def clamped_start(g, floor, ceil):
    """The integer start of a search from the guessed crossing ``g``: ``ceil(g)`` clamped
    to ``[floor, ceil]`` (``floor`` where ``g`` is NaN)."""
    if g != g or g <= floor:
        return floor
    if g >= ceil:
        return ceil
    return np.int64(math.ceil(g))


@njit(cache=True, error_model="numpy", inline="always")
def settled_start(kind, x0, x1, x2, c, lam, aux, floor, ceil):
    """``(k, settled)``: the count of a row whose crossing of ``lam`` is known without
    evaluating a gain (``settled``), else the start of the galloping search."""
    if kind == KNAPSACK:
        k = knapsack_count(x0, x1, x2, aux, floor, ceil)
        if k >= 0:
            return k, True
    g, start = _guessed_start(kind, x0, x1, x2, c, lam, aux, floor, ceil)
    if kind == RLOO_VARIANCE:
        # The root reads d = lam - b, rounded to 1.2e-16 max(|lam|, |b|): where that is
        # below 1.2e-11 d, it moves the root by less than 6e-12 relative, and evaluating a
        # gain errs by less than 5e-11 d, far inside the margin of _off_step (a root 1e-9
        # off a step puts the gains beside it 2e-9 d from lam).
        return start, _off_step(g) and max(abs(lam), abs(x1)) < 1e5 * (lam - x1)
    return start, exact_guess(kind, x2) and _off_step(g)


@njit(cache=True, error_model="numpy")
def row_crossing(kind, x0, x1, x2, c, lam, floor, ceil, start, g_below, g_ceil):
    """First ``k`` in ``[floor, ceil)`` with ``gain(k) <= lam``, else ``ceil``.

    Galloping search from ``start``, exact for non-increasing rows whatever
    the quality of ``start``. ``g_below = gain(floor - 1)`` and ``g_ceil =
    gain(ceil)`` are passed in (NaN when unknown). Returns ``(k, gain(k),
    gain(k - 1))`` (the gains NaN when unknown).
    """
    if start < floor:
        start = floor
    elif start > ceil:
        start = ceil
    bottom = floor - 1
    g_bot = g_below
    top = ceil
    g_top = g_ceil
    # pred(k): k == ceil or gain(k) <= lam; false below the answer, true from it.
    g_start = g_ceil if start == ceil else gain(kind, x0, x1, x2, c, start)
    if start == ceil or g_start <= lam:
        top = start
        g_top = g_start
        step = 1
        while True:
            cand = top - step
            if cand < floor:
                break
            g = gain(kind, x0, x1, x2, c, cand)
            if g <= lam:
                top = cand
                g_top = g
                step *= 2
            else:
                bottom = cand
                g_bot = g
                break
    else:
        bottom = start
        g_bot = g_start
        step = 1
        while True:
            cand = bottom + step
            if cand >= ceil:
                break
            g = gain(kind, x0, x1, x2, c, cand)
            if g <= lam:
                top = cand
                g_top = g
                break
            bottom = cand
            g_bot = g
            step *= 2
    while top - bottom > 1:
        mid = bottom + (top - bottom) // 2
        g = gain(kind, x0, x1, x2, c, mid)
        if g <= lam:
            top = mid
            g_top = g
        else:
            bottom = mid
            g_bot = g
    return top, g_top, g_bot


@njit(cache=True, error_model="numpy", inline="always")
def row_count(kind, x0, x1, x2, c, lam, aux, floor, ceil, g_below, g_ceil):
    """A row's count at ``lam`` when it lies in ``[floor, ceil]`` (``gain(floor - 1) =
    g_below > lam``, ``gain(ceil) = g_ceil``), with the gains at it and one below, as
    :func:`row_crossing` returns them."""
    k, settled = settled_start(kind, x0, x1, x2, c, lam, aux, floor, ceil)
    if settled:
        # The crossing is known in closed form and is not within rounding of a step:
        # the count is settled without evaluating a gain (unknown gains are cached as
        # NaN, except the bracket ends already known).
        return (k, g_ceil if k == ceil else np.nan, g_below if k == floor else np.nan)
    return row_search(kind, x0, x1, x2, c, lam, floor, ceil, k, g_below, g_ceil)


@njit(cache=True, error_model="numpy", inline="always")
def row_search(kind, x0, x1, x2, c, lam, floor, ceil, k, g_below, g_ceil):
    """:func:`row_count`'s search from the start ``k`` (in ``[floor, ceil]``)."""
    if (kind == HIT_UTILITY and floor < k < ceil and k <= PRODUCT_MAX
            and x0 > 0.0 and x1 > 0.0):
        # The gains beside the guess, and a few above it, from one product: the
        # guess is mostly right or one step off.
        k, nxt, lst, state = hit_walk(x0, x1, lam, k, floor, ceil, g_below, g_ceil)
        if state == 1:
            return row_crossing(kind, x0, x1, x2, c, lam, floor, k, k, g_below, nxt)
        if state == 2:
            return row_crossing(kind, x0, x1, x2, c, lam, k, ceil, k, lst, g_ceil)
        return k, nxt, lst
    return row_crossing(kind, x0, x1, x2, c, lam, floor, ceil, k, g_below, g_ceil)


@njit(cache=True, error_model="numpy")
def count_rows(kind, p0, p1, p2, c, lam, rows, na, a_next, a_last, nb, b_next, b_last,
           out_n, out_next, out_last):
    """Per row in ``rows``: ``out_n = lo + #{k: gain(k) > lam}``, which lies in
    ``[na, nb]``, with the gains at ``out_n`` and ``out_n - 1``.

    The gains cached at the bracket ends (``a_next = gain(na)``, ``a_last =
    gain(na - 1)``, ``b_next``, ``b_last`` likewise; NaN when unknown) settle
    most rows without evaluating anything. Returns ``sum(out_n - na)``.
    """
    total = 0
    aux = pass_constant(kind, lam)
    for j in range(rows.shape[0]):
        i = rows[j]
        an = a_next[i]
        bl = b_last[i]
        if an <= lam:
            k = na[i]
            nxt = an
            lst = a_last[i]
        elif bl > lam:
            k = nb[i]
            nxt = b_next[i]
            lst = bl
        else:
            floor = na[i]
            g_below = a_last[i]
            if an > lam:
                floor += 1
                g_below = an
            ceil = nb[i]
            g_ceil = b_next[i]
            if bl <= lam:
                ceil -= 1
                g_ceil = bl
            k, nxt, lst = row_count(kind, p0[i], p1[i], p2[i], c, lam, aux, floor, ceil,
                                     g_below, g_ceil)
        out_n[i] = k
        out_next[i] = nxt
        out_last[i] = lst
        total += k - na[i]
    return total


@njit(cache=True, error_model="numpy")
def active_rows(na, nb, rows):
    keep = 0
    for j in range(rows.shape[0]):
        i = rows[j]
        if na[i] < nb[i]:
            rows[keep] = i
            keep += 1
    return rows[:keep]


@njit(cache=True, error_model="numpy", inline="always")
def _off_step(g):
    """Whether a closed-form crossing ``g`` is finite and not within rounding of a step,
    so that ``ceil(g)`` is the count (else the gains themselves must decide)."""
    return math.isfinite(g) and abs(g - math.floor(g + 0.5)) > 1e-9 * (1.0 + abs(g))
