"""The general engine's last step (numba kernels): collect the gains left inside the
bracket and hand out the last spare rollouts by the tie rules, widening the bracket
for max-min ties up to a relative tolerance.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from .bracket import CA, CB, COLLECT_MIN, KEY_A, KEY_B, PASSES, init_state, narrow_bracket
from .crossing import row_crossing
from .floatkeys import counts_from, float_key, float_unkey
from .gains import gain
from .selection import kth_largest, pick_ties

_INF = np.inf

@njit(cache=True, error_model="numpy")
def finish_bracket(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, limit, st_i, rows, na,
            a_next, a_last, nb, b_next, b_last, out):
    """Select the remaining ``spare - ca`` gains from the bracket (b, a]."""
    m = na.shape[0]
    if maxmin and tie_rtol > 0.0:
        rows = _widen(kind, p0, p1, p2, c, lo, hi, tie_rtol, st_i, na, a_next, a_last, nb,
                      b_next, b_last)
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    value_a = float_unkey(st_i[KEY_A], fbuf, ibuf)
    need = spare - st_i[CA]
    if need == 0:
        return counts_from(na, out), value_a
    n_bracket = st_i[CB] - st_i[CA]
    if st_i[KEY_B] >= st_i[KEY_A] - 1 and n_bracket > max(limit, m):
        # Every gain in the bracket equals value_a: a plateau of constant
        # rows. Serve it by (k, index): the largest K with
        # sum_i clip(K - na_i, 0, nb_i - na_i) <= need, then one more each in
        # index order.
        k_high = np.int64(0)
        k_low = na[rows[0]]
        for j in range(rows.shape[0]):
            i = rows[j]
            if na[i] < k_low:
                k_low = na[i]
            if nb[i] > k_high:
                k_high = nb[i]
        while k_low < k_high:
            mid = k_low + (k_high - k_low + 1) // 2
            s = 0
            for j in range(rows.shape[0]):
                i = rows[j]
                s += min(max(mid - na[i], 0), nb[i] - na[i])
            if s <= need:
                k_low = mid
            else:
                k_high = mid - 1
        counts = counts_from(na, out)
        used = 0
        for j in range(rows.shape[0]):
            i = rows[j]
            add = min(max(k_low - na[i], 0), nb[i] - na[i])
            counts[i] += add
            used += add
        for j in range(rows.shape[0]):
            if used == need:
                break
            i = rows[j]
            if na[i] <= k_low and counts[i] == k_low and k_low < nb[i]:
                counts[i] += 1
                used += 1
        return counts, value_a
    # Collect the gains in the bracket and select the need-th largest.
    vals = np.empty(n_bracket, dtype=np.float64)
    owner = np.empty(n_bracket, dtype=np.int64)
    step = np.empty(n_bracket, dtype=np.int64)
    e = 0
    for j in range(rows.shape[0]):
        i = rows[j]
        for k in range(na[i], nb[i]):
            if k == na[i] and a_next[i] == a_next[i]:
                g = a_next[i]
            elif k == nb[i] - 1 and b_last[i] == b_last[i]:
                g = b_last[i]
            else:
                g = gain(kind, p0[i], p1[i], p2[i], c, k)
            vals[e] = g
            owner[e] = i
            step[e] = k
            e += 1
    threshold = kth_largest(vals.copy(), need)
    # Max-min levels within tie_rtol (relative) of the threshold count as tied:
    # equal in exact arithmetic, apart by rounding.
    width = 0.0
    if maxmin and tie_rtol > 0.0 and math.isfinite(threshold):
        width = tie_rtol * abs(threshold)
    upper = threshold + width
    lower = threshold - width
    counts = counts_from(na, out)
    above = 0
    n_band = 0
    for e in range(n_bracket):
        if vals[e] > upper:
            counts[owner[e]] += 1
            above += 1
        elif vals[e] >= lower:
            n_band += 1
    left = need - above
    band = np.empty(n_band, dtype=np.int64)
    t = 0
    for e in range(n_bracket):
        if lower <= vals[e] <= upper:
            band[t] = e
            t += 1
    if left == n_band:
        for t in range(n_band):
            counts[owner[band[t]]] += 1
        return counts, threshold
    nxt = np.zeros(n_bracket, dtype=np.float64)
    if maxmin:
        for t in range(n_band):
            e = band[t]
            i = owner[e]
            if step[e] + 1 < nb[i]:
                nxt[e] = vals[e + 1]
            elif nb[i] < hi[i] and b_next[i] == b_next[i]:
                nxt[e] = b_next[i]
            else:
                # The cache holds -inf at hi (nothing is taken there); the
                # tie rule needs the real next level.
                nxt[e] = gain(kind, p0[i], p1[i], p2[i], c, step[e] + 1)
    pick_ties(band, left, nxt, step, owner, maxmin, counts)
    return counts, threshold


@njit(cache=True, error_model="numpy")
def _widen(kind, p0, p1, p2, c, lo, hi, tie_rtol, st_i, na, a_next, a_last, nb, b_next,
           b_last):
    """Before collecting, move both bracket ends out by ``2 tie_rtol`` (relative)
    so that every gain within the tie tolerance of the threshold is collected
    rather than already taken or left out. Returns the new active rows."""
    m = lo.shape[0]
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    va = float_unkey(st_i[KEY_A], fbuf, ibuf)
    if math.isfinite(va):
        top = va + 2.0 * tie_rtol * abs(va)
        if top > va:
            for i in range(m):
                if na[i] <= lo[i]:
                    continue
                g = a_last[i]
                if g != g:
                    g = gain(kind, p0[i], p1[i], p2[i], c, na[i] - 1)
                if g > top:
                    continue
                k, g_k, g_km1 = row_crossing(kind, p0[i], p1[i], p2[i], c, top, lo[i], na[i],
                                          na[i] - 1, _INF, a_next[i])
                st_i[CA] -= na[i] - k
                na[i] = k
                a_next[i] = g_k
                a_last[i] = g_km1
            st_i[KEY_A] = float_key(top, fbuf, ibuf)
    if st_i[KEY_B] >= float_key(-_INF, fbuf, ibuf):
        vb = float_unkey(st_i[KEY_B], fbuf, ibuf)
        if math.isfinite(vb):
            bottom = vb - 2.0 * tie_rtol * abs(vb)
            if bottom < vb:
                for i in range(m):
                    if nb[i] >= hi[i]:
                        continue
                    g = b_next[i]
                    if g != g:
                        g = gain(kind, p0[i], p1[i], p2[i], c, nb[i])
                    if g <= bottom:
                        continue
                    k, g_k, g_km1 = row_crossing(kind, p0[i], p1[i], p2[i], c, bottom, nb[i] + 1,
                                              hi[i], nb[i] + 1, g, -_INF)
                    st_i[CB] += k - nb[i]
                    nb[i] = k
                    b_next[i] = g_k
                    b_last[i] = g_km1
                st_i[KEY_B] = float_key(bottom, fbuf, ibuf)
    rows = np.empty(m, dtype=np.int64)
    r = 0
    for i in range(m):
        if na[i] < nb[i]:
            rows[r] = i
            r += 1
    return rows[:r]


@njit(cache=True, error_model="numpy")
def select_spare(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, stats, out):
    """Counts of the ``spare`` largest gains (ties as in the module docstring),
    opening on the rows' extreme gains.

    Returns ``(counts, threshold)``: at most ``spare`` gains lie strictly
    above ``threshold`` and at least ``spare`` at or above it. ``stats``
    receives (passes, gains collected, rows active at the end).
    """
    total = 0
    for i in range(lo.shape[0]):
        total += hi[i] - lo[i]
    if spare <= 0:
        return counts_from(lo, out), _INF
    if spare >= total:
        return counts_from(hi, out), -_INF
    limit = max(COLLECT_MIN, lo.shape[0] >> 3)
    st_i, st_f, rows, na, a_next, a_last, nb, b_next, b_last, w_n, w_g = init_state(
        kind, p0, p1, p2, c, lo, hi, True, False, np.empty((4, 0), dtype=np.int64),
        np.empty((4, 0), dtype=np.float64), np.empty((2, 0), dtype=np.float64))
    rows = narrow_bracket(kind, p0, p1, p2, c, lo, hi, spare, limit, st_i, st_f, rows, na, a_next,
                   a_last, nb, b_next, b_last, w_n, w_g)
    stats[0] += st_i[PASSES]
    stats[1] = st_i[CB] - st_i[CA]
    stats[2] = rows.shape[0]
    return finish_bracket(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, limit, st_i, rows, na,
                   a_next, a_last, nb, b_next, b_last, out)
