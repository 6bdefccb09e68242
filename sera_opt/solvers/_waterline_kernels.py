"""numba kernels of the waterline solver. Imported lazily: this module loads numba.

All kernels work on one *tier* of prompts whose level grows linearly with a
positive finite rate: the level after ``m`` effective rollouts is
``rates[i] * m``. A prompt starts at ``m = m_lo[i]`` (>= 1) and may take
``cap[i]`` more rollouts. Its k-th extra rollout (k = 0 .. cap-1) is handed out
at the *pre-level* ``rates[i] * (m_lo[i] + k)``: the level it has before it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Stop narrowing the integer bracket once it holds this many pre-levels (or
# fewer): selecting among them directly is cheaper than more passes.
_COLLECT_MIN = 2048


@njit(cache=True, inline="always")
def _count_one(a, m, c, level):
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


@njit(cache=True)
def count_below(rates, m_lo, cap, level, out):
    """Per prompt, how many pre-levels lie strictly below ``level``; returns the total."""
    total = 0
    for i in range(rates.shape[0]):
        k = _count_one(rates[i], m_lo[i], cap[i], level)
        out[i] = k
        total += k
    return total


@njit(cache=True)
def count_below_slope(rates, m_lo, cap, level, out):
    """:func:`count_below`, plus the slope of its continuous relaxation at ``level``.

    The slope is ``sum 1 / a_i`` over prompts strictly between their bounds:
    the Newton step that locates the threshold uses it.
    """
    total = 0
    slope = 0.0
    for i in range(rates.shape[0]):
        k = _count_one(rates[i], m_lo[i], cap[i], level)
        if 0 < k < cap[i]:
            slope += 1.0 / rates[i]
        out[i] = k
        total += k
    return total, slope


@njit(cache=True)
def integer_fill(rates, m_lo, cap, extra, hint=np.nan):
    """Hand out ``extra`` rollouts one at a time to the lowest current level.

    Returns the per-prompt increments of the greedy: every pre-level strictly
    below the threshold ``T`` (the ``extra``-th smallest pre-level) is taken;
    ties at ``T`` go to the largest rate first (its next level is highest, the
    lexicographically better choice), then to the lowest index.

    ``T`` is bracketed by Newton steps (safeguarded by bisection) on the step
    function ``G(L) = #pre-levels < L``, each evaluation one O(M) pass, from
    ``hint`` (the continuous waterline, when known) or the relaxation's
    all-active root, until the bracket holds few pre-levels; those are
    collected and ``T`` selected exactly with a partition.
    """
    n = rates.shape[0]
    inc = np.zeros(n, dtype=np.int64)
    if extra <= 0:
        return inc
    lo = np.inf
    hi = -np.inf
    total = 0
    for i in range(n):
        if cap[i] > 0:
            first = rates[i] * m_lo[i]
            last = rates[i] * (m_lo[i] + cap[i] - 1)
            if first < lo:
                lo = first
            if last > hi:
                hi = last
            total += cap[i]
    if extra >= total:
        for i in range(n):
            inc[i] = cap[i]
        return inc
    hi = np.nextafter(hi, np.inf)
    g_lo = 0  # nothing lies strictly below the smallest pre-level
    g_hi = total
    target = extra - 0.5
    limit = max(_COLLECT_MIN, n >> 4)
    work = np.empty(n, dtype=np.int64)
    if lo < hint < hi:
        level = hint
    else:
        # Root of the relaxation if every prompt were strictly inside its bounds.
        inv_sum = 0.0
        m_sum = 0.0
        for i in range(n):
            if cap[i] > 0:
                inv_sum += 1.0 / rates[i]
                m_sum += m_lo[i]
        level = (target + m_sum) / inv_sum
        if not (lo < level < hi):
            level = 0.5 * (lo + hi)
    for _ in range(200):
        if g_hi - g_lo <= limit or hi <= np.nextafter(lo, np.inf):
            break
        g, slope = count_below_slope(rates, m_lo, cap, level, work)
        if g < extra:
            lo = level
            g_lo = g
        else:
            hi = level
            g_hi = g
        # Newton step on the count, safeguarded by the bracket.
        nxt = level + (target - g) / slope if slope > 0.0 else 0.5 * (lo + hi)
        if not (lo < nxt < hi):
            nxt = 0.5 * (lo + hi)
            if not (lo < nxt < hi):
                break
        level = nxt
    # Collect the pre-levels in [lo, hi) and select the one ranked `need`.
    cnt_lo = np.empty(n, dtype=np.int64)
    count_below(rates, m_lo, cap, lo, cnt_lo)
    count_below(rates, m_lo, cap, hi, work)
    vals = np.empty(g_hi - g_lo, dtype=np.float64)
    j = 0
    for i in range(n):
        for k in range(cnt_lo[i], work[i]):
            vals[j] = rates[i] * (m_lo[i] + k)
            j += 1
    need = extra - g_lo
    threshold = np.partition(vals, need - 1)[need - 1]
    taken = count_below(rates, m_lo, cap, threshold, inc)
    remaining = extra - taken
    # Ties exactly at the threshold: the prompts whose next pre-level equals it.
    ties = np.empty(n, dtype=np.int64)
    t = 0
    for i in range(n):
        if inc[i] < cap[i] and rates[i] * (m_lo[i] + inc[i]) == threshold:
            ties[t] = i
            t += 1
    ties = ties[:t]
    if remaining < t:
        # Stable sort on -rate keeps index order among equal rates.
        order = np.argsort(-rates[ties], kind="mergesort")
        ties = ties[order[:remaining]]
    for i in ties:
        inc[i] += 1
    return inc


@njit(cache=True)
def continuous_fill(rates, m_lo, cap, extra):
    """Continuous waterline on one tier: ``x_i(L) = clip(L / a_i - m_lo_i, 0, cap_i)``, ``sum x = extra``.

    ``F(L) = sum_i x_i(L)`` is piecewise linear. Each pass evaluates the piece
    that contains ``L`` (its active set, slope, and the neighbouring
    breakpoints) and the closed-form root of that piece's line; when the root
    lies inside the piece it is the exact waterline (a combinatorial stopping
    rule, no tolerance). Otherwise the next ``L`` is that root when it lies in
    the bracket, else the bracket's midpoint.

    Returns ``(L, x)``.
    """
    n = rates.shape[0]
    x = np.zeros(n, dtype=np.float64)
    lo = np.inf
    hi = -np.inf
    total = 0.0
    inv_sum = 0.0
    m_sum = 0.0
    for i in range(n):
        if cap[i] > 0:
            b0 = rates[i] * m_lo[i]
            b1 = rates[i] * (m_lo[i] + cap[i])
            if b0 < lo:
                lo = b0
            if b1 > hi:
                hi = b1
            total += cap[i]
            inv_sum += 1.0 / rates[i]
            m_sum += m_lo[i]
    if total == 0.0 or extra <= 0.0:
        return (lo if total > 0.0 else 0.0), x
    if extra >= total:
        for i in range(n):
            x[i] = cap[i]
        return hi, x
    # Start from the root of the piece where every prompt is active.
    level = (extra + m_sum) / inv_sum
    if not (lo < level < hi):
        level = 0.5 * (lo + hi)
    root = level
    for _ in range(400):
        slope = 0.0
        act_m = 0.0
        full = 0.0
        left = -np.inf
        right = np.inf
        for i in range(n):
            if cap[i] == 0:
                continue
            b0 = rates[i] * m_lo[i]
            b1 = rates[i] * (m_lo[i] + cap[i])
            if level < b0:
                if b0 < right:
                    right = b0
            elif level < b1:
                slope += 1.0 / rates[i]
                act_m += m_lo[i]
                if b0 > left:
                    left = b0
                if b1 < right:
                    right = b1
            else:
                full += cap[i]
                if b1 > left:
                    left = b1
        value = slope * level - act_m + full
        if slope > 0.0:
            root = (extra - full + act_m) / slope
            if left <= root <= right:
                break
        elif value == extra:
            root = level
            break
        if value < extra:
            lo = level
        else:
            hi = level
        if slope > 0.0 and lo < root < hi:
            level = root
        else:
            nxt = 0.5 * (lo + hi)
            if not (lo < nxt < hi):
                root = level
                break
            level = nxt
    for i in range(n):
        if cap[i] > 0:
            v = root / rates[i] - m_lo[i]
            x[i] = min(max(v, 0.0), cap[i])
    return root, x
