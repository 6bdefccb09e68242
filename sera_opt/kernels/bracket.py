"""The general engine's bracket on the gain value (numba kernels): its state, the first
passes that open it, and the narrowing (Illinois steps on the count, bisection on the
float keys when those stall) until few gains remain inside.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from .betamath import EXP_MAX, LOG_BLOCK, approx_exps
from .crossing import active_rows, clamped_start, count_rows, row_count, row_search
from .floatkeys import float_key, float_key_below, float_unkey
from .gains import gain, pass_constant
from .kinds import HIT_UTILITY

_INF = np.inf

# Collect the bracket's gains once it holds at most this many (or M / 8).
COLLECT_MIN = 2048


# From kinds.SUBSAMPLE_FROM prompts on, the opening bracket comes from a subsample of
# SUBSAMPLE rows; below, from the rows' extremes.
SUBSAMPLE = 4096


# Newton rounds on the subsample's share, and how far each overshoots the
# observed miss (so the bracket closes from both sides).
NEWTON_ROUNDS = 4


OVERSHOOT = 1.25


# Bracket state: integers (ca, cb, key_a, key_b, side, passes) and floats
# (f_a, f_b) in two small arrays; per row the counts at both ends and the gains
# cached around them; ``rows`` lists the rows with na < nb.
CA, CB, KEY_A, KEY_B, _SIDE, PASSES = 0, 1, 2, 3, 4, 5


@njit(cache=True, error_model="numpy")
def init_state(kind, p0, p1, p2, c, lo, hi, extremes, lazy, work_i, work_f, work_g):
    """Bracket (b, a] = (sentinel, +inf]; with ``extremes``, narrowed at once to
    the rows' extreme gains (one evaluation at each end of every row).

    The per-row state lives in ``work_i`` (int64, 4 rows: the active rows, the counts
    at both ends, a pass's counts), ``work_f`` (float64, 4 rows: the gains cached at
    both ends) and ``work_g`` (float64, 2 rows: a pass's gains) when they have a column
    per row (see :func:`solve`), else in arrays allocated here. With ``lazy`` the ends'
    per-row values are left unwritten: :func:`first_pass` or :func:`open_ends` writes
    them."""
    m = lo.shape[0]
    if work_i.shape[1] != m or work_f.shape[1] != m or work_g.shape[1] != m:
        work_i = np.empty((4, m), dtype=np.int64)
        work_f = np.empty((4, m), dtype=np.float64)
        work_g = np.empty((2, m), dtype=np.float64)
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    total = 0
    rows = work_i[0]
    na = work_i[1]
    nb = work_i[2]
    work_n = work_i[3]
    a_next = work_f[0]
    a_last = work_f[1]
    b_next = work_f[2]
    b_last = work_f[3]
    if not lazy:
        open_ends(lo, hi, na, a_next, a_last, nb, b_next, b_last)
    r = 0
    for i in range(m):
        if hi[i] > lo[i]:
            rows[r] = i
            r += 1
            total += hi[i] - lo[i]
    rows = rows[:r]
    st_i = np.zeros(6, dtype=np.int64)
    st_i[CB] = total
    st_i[KEY_A] = float_key(_INF, fbuf, ibuf)
    st_i[KEY_B] = float_key(-_INF, fbuf, ibuf) - 1  # sentinel: below every gain
    if extremes and r > 0:
        _bound_ends(kind, p0, p1, p2, c, lo, hi, st_i, rows, na, a_next, nb, b_last)
    st_f = np.zeros(2, dtype=np.float64)
    return st_i, st_f, rows, na, a_next, a_last, nb, b_next, b_last, work_n, work_g


@njit(cache=True, error_model="numpy")
def open_ends(lo, hi, na, a_next, a_last, nb, b_next, b_last):
    """The opening bracket's per-row values: every row at ``lo`` at the upper end, at
    ``hi`` at the lower one."""
    for i in range(lo.shape[0]):
        na[i] = lo[i]
        nb[i] = hi[i]
        a_next[i] = np.nan
        a_last[i] = _INF  # everything below lo is taken at any value
        b_next[i] = -_INF  # nothing from hi on is ever taken
        b_last[i] = np.nan


@njit(cache=True, error_model="numpy")
def _bound_ends(kind, p0, p1, p2, c, lo, hi, st_i, rows, na, a_next, nb, b_last):
    """Replace an open end of the bracket by the rows' extreme gain.

    At a = +inf every row sits at lo, and nothing lies above the largest
    ``gain(lo)``; at the sentinel every row sits at hi, and everything lies
    above the value just below the smallest ``gain(hi - 1)``.
    """
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    open_a = st_i[KEY_A] == float_key(_INF, fbuf, ibuf)
    open_b = st_i[KEY_B] == float_key(-_INF, fbuf, ibuf) - 1
    top = -_INF
    bottom = _INF
    for j in range(rows.shape[0]):
        i = rows[j]
        if open_a:
            g = a_next[i]
            if g != g:
                g = gain(kind, p0[i], p1[i], p2[i], c, lo[i])
                a_next[i] = g
            if g > top:
                top = g
        if open_b:
            g = b_last[i]
            if g != g:
                g = gain(kind, p0[i], p1[i], p2[i], c, hi[i] - 1)
                b_last[i] = g
            if g < bottom:
                bottom = g
    if open_a and rows.shape[0] > 0:
        st_i[KEY_A] = float_key(top, fbuf, ibuf)
    if open_b and rows.shape[0] > 0 and bottom > -_INF:
        st_i[KEY_B] = float_key_below(bottom, fbuf, ibuf)


@njit(cache=True, error_model="numpy", inline="always")
def _moved_end(st_i, st_f, spare, kl, cnt):
    """Record a pass's count ``cnt`` at the value of key ``kl`` as the bracket end it
    replaces; True when that is the upper end ``a``."""
    st_i[PASSES] += 1
    if cnt <= spare:
        st_i[KEY_A] = kl
        st_i[CA] = cnt
        st_f[0] = float(spare - cnt)
        if st_i[_SIDE] == 1:
            st_f[1] *= 0.5
        st_i[_SIDE] = 1
        return True
    st_i[KEY_B] = kl
    st_i[CB] = cnt
    st_f[1] = float(spare - cnt)
    if st_i[_SIDE] == -1:
        st_f[0] *= 0.5
    st_i[_SIDE] = -1
    return False


@njit(cache=True, error_model="numpy")
def try_pass(kind, p0, p1, p2, c, spare, lam, st_i, st_f, rows, na, a_next, a_last, nb,
              b_next, b_last, w_n, w_g):
    """Count at ``lam`` and move the bracket end it replaces; returns the new
    ``rows`` and the count (-1 if ``lam`` is not strictly inside the bracket)."""
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    if lam != lam:
        return rows, np.int64(-1)
    kl = float_key(lam, fbuf, ibuf)
    if not (st_i[KEY_B] < kl < st_i[KEY_A]):
        return rows, np.int64(-1)
    w_next = w_g[0]
    w_last = w_g[1]
    cnt = st_i[CA] + count_rows(kind, p0, p1, p2, c, lam, rows, na, a_next, a_last, nb,
                             b_next, b_last, w_n, w_next, w_last)
    if _moved_end(st_i, st_f, spare, kl, cnt):
        _keep_rows(rows, w_n, w_next, w_last, na, a_next, a_last)
    else:
        _keep_rows(rows, w_n, w_next, w_last, nb, b_next, b_last)
    return active_rows(na, nb, rows), cnt


@njit(cache=True, error_model="numpy")
def first_pass(kind, p0, p1, p2, c, spare, lam, lo, hi, st_i, st_f, rows, na, a_next,
                a_last, nb, b_next, b_last):
    """The first count pass from the opening bracket ``(sentinel, +inf]`` (every row
    between ``lo`` and ``hi``; :func:`init_state` with ``lazy``): the counts as
    :func:`try_pass` gives them, but read from the bounds and written straight into
    the end they become (the other end gets its opening values), instead of reading the
    opening state, writing a pass's arrays and copying them.

    ``lam`` must lie strictly inside the opening bracket. The counts and their gains go
    into ``na, a_next, a_last`` and the lower end's opening values into ``nb, b_next,
    b_last``; returns ``(upper, cnt)``, ``upper`` False when the count lands on the
    lower end (then :func:`lower_first` swaps the ends).
    """
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    kl = float_key(lam, fbuf, ibuf)
    aux = pass_constant(kind, lam)
    m = lo.shape[0]
    total = 0
    hit = kind == HIT_UTILITY
    # The hit utility's guesses, a block at a time through the approximate exponential
    # (a guess only sets where a search starts): off the chain each row's search waits on.
    guesses = np.empty(LOG_BLOCK, dtype=np.float64)
    scratch = np.empty(LOG_BLOCK, dtype=np.float64)
    for start in range(0, m, LOG_BLOCK):
        n = min(LOG_BLOCK, m - start)
        if hit:
            for j in range(n):
                i = start + j
                e = (p2[i] - lam) / (p0[i] + 1.0)
                guesses[j] = min(max(e, -EXP_MAX), EXP_MAX) if e == e else 0.0
            approx_exps(guesses, n, scratch)
        for j in range(n):
            i = start + j
            floor = lo[i]
            ceil = hi[i]
            if floor < ceil:
                x0 = p0[i]
                x1 = p1[i]
                if hit and x0 > 0.0 and x1 > 0.0:
                    # As crossing_guess, with the block's exponential (of an exponent clipped to
                    # EXP_MAX, which starts at ceil as crossing_guess's inf does).
                    k = clamped_start(guesses[j] - x1 - 0.5 * x0, floor, ceil)
                    k, nxt, lst = row_search(kind, x0, x1, p2[i], c, lam, floor, ceil, k,
                                              _INF, -_INF)
                else:
                    k, nxt, lst = row_count(kind, x0, x1, p2[i], c, lam, aux, floor, ceil,
                                             _INF, -_INF)
                total += k - floor
            else:
                k = floor
                nxt = np.nan
                lst = _INF
            na[i] = k
            a_next[i] = nxt
            a_last[i] = lst
            nb[i] = ceil
            b_next[i] = -_INF
            b_last[i] = np.nan
    cnt = st_i[CA] + total
    return _moved_end(st_i, st_f, spare, kl, cnt), cnt


@njit(cache=True, error_model="numpy")
def lower_first(lo, hi, na, a_next, a_last, b_next, b_last):
    """After a first pass whose count lands on the lower end, with the ends' arrays
    traded (``b_*`` now hold the counts): the upper end's opening values, and the lower
    end's for rows without room."""
    for i in range(lo.shape[0]):
        na[i] = lo[i]
        a_next[i] = np.nan
        a_last[i] = _INF
        if lo[i] == hi[i]:
            b_next[i] = -_INF
            b_last[i] = np.nan


@njit(cache=True, error_model="numpy", inline="always")
def _keep_rows(rows, w_n, w_next, w_last, n, nxt, last):
    """Copy the working counts and cached gains of ``rows`` into one bracket end's."""
    for j in range(rows.shape[0]):
        i = rows[j]
        n[i] = w_n[i]
        nxt[i] = w_next[i]
        last[i] = w_last[i]


@njit(cache=True, error_model="numpy")
def bracket_settled(st_i, spare, limit):
    return (st_i[CA] == spare or st_i[CB] - st_i[CA] <= limit
            or st_i[KEY_B] >= st_i[KEY_A] - 1)


@njit(cache=True, error_model="numpy")
def narrow_bracket(kind, p0, p1, p2, c, lo, hi, spare, limit, st_i, st_f, rows, na, a_next, a_last,
            nb, b_next, b_last, w_n, w_g):
    """Regula falsi (Illinois) alternating with bisection on the bit order of
    the gain value, until the bracket holds at most ``limit`` gains."""
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    _bound_ends(kind, p0, p1, p2, c, lo, hi, st_i, rows, na, a_next, nb, b_last)
    st_f[0] = float(spare - st_i[CA])
    st_f[1] = float(spare - st_i[CB])
    for it in range(400):
        if bracket_settled(st_i, spare, limit):
            break
        key_a = st_i[KEY_A]
        key_b = st_i[KEY_B]
        lam = np.nan
        va = float_unkey(key_a, fbuf, ibuf)
        vb = float_unkey(key_b, fbuf, ibuf) if key_b >= float_key(-_INF, fbuf, ibuf) else -_INF
        f_a = st_f[0]
        f_b = st_f[1]
        if it % 2 == 0 and math.isfinite(va) and math.isfinite(vb) and f_a != f_b:
            lam = va + (vb - va) * f_a / (f_a - f_b)
            if lam == lam:
                kl = float_key(lam, fbuf, ibuf)
                if not (key_b < kl < key_a):
                    lam = np.nan
        if lam != lam:
            # Floor average without int64 overflow; strictly inside the bracket.
            lam = float_unkey((key_a >> 1) + (key_b >> 1) + (key_a & key_b & 1), fbuf, ibuf)
        rows, _ = try_pass(kind, p0, p1, p2, c, spare, lam, st_i, st_f, rows, na, a_next,
                            a_last, nb, b_next, b_last, w_n, w_g)
    return rows
