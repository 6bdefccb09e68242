"""numba kernels of the waterline solver. Imported lazily: this module loads numba.

The kernels work on prompts whose level grows linearly with a positive finite
rate: the level after ``m`` effective rollouts is ``rates[i] * m``. A prompt
starts at ``m_lo = lo - c`` (>= 1) effective rollouts and may take ``cap = hi -
lo`` more. Its k-th extra rollout (k = 0 .. cap-1) is handed out at the
*pre-level* ``rates[i] * (m_lo + k)``: the level it has before it.

Bounds are either one entry per prompt or, with ``uniform=True``, a single
entry (index 0) shared by every prompt, so that the common case of scalar
bounds reads one array per pass instead of three.

Each pass over the prompts either only *counts* (read-only, no full-size
writes) or writes the result; the search keeps no per-prompt state between
passes. The prompts whose count differs between the two ends of the final
bracket are few (at most ``max(_COLLECT_MIN, M / 16)`` pre-levels), and one
pass writes the counts at the lower end and collects those pre-levels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# Stop narrowing the integer bracket once it holds this many pre-levels (or
# M / 16): selecting among them directly is cheaper than more passes.
_COLLECT_MIN = 2048


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


@njit(cache=True, error_model="numpy")
def rates_from_probs(p, out):
    """``out = -log(1 - p)`` (Goldberg's form of ``log1p``: ``p log(w) / (w - 1)`` with
    ``w = fl(1 - p)``, within an ulp of ``log1p``, and ``p`` where ``w`` rounds to 1).

    One pass, with ``math.log`` (several times faster than ``log1p``). Returns the
    numbers of prompts with rate 0 (``p = 0``) and rate inf (``p = 1``), and of values
    that are not probabilities (NaN or outside [0, 1]; their rates are meaningless).
    """
    zeros, infs, bad, _, _, _ = _rates_pass(p, out, False)
    return zeros, infs, bad


@njit(cache=True, error_model="numpy")
def _rates_pass(p, out, extremes):
    """:func:`rates_from_probs`, and with ``extremes`` also the smallest and largest
    rate and ``sum 1 / rate`` (what :func:`_extremes` needs under scalar bounds)."""
    zeros = 0
    infs = 0
    bad = 0
    a_min = np.inf
    a_max = -np.inf
    inv_sum = 0.0
    for i in range(p.shape[0]):
        x = p[i]
        if not (0.0 <= x <= 1.0):
            bad += 1
        w = 1.0 - x
        d = w - 1.0
        if d == 0.0:
            a = x
            if x == 0.0:
                zeros += 1
        elif w == 0.0:
            a = np.inf
            infs += 1
        else:
            a = x * math.log(w) / d
        out[i] = a
        if extremes:
            a_min = min(a_min, a)
            a_max = max(a_max, a)
            inv_sum += 1.0 / a
    return zeros, infs, bad, a_min, a_max, inv_sum


@njit(cache=True, inline="always", error_model="numpy")
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


@njit(cache=True, error_model="numpy")
def count_below(rates, m_lo, cap, level, out):
    """Per prompt, how many pre-levels lie strictly below ``level``; returns the total."""
    total = 0
    for i in range(rates.shape[0]):
        k = _count_one(rates[i], m_lo[i], cap[i], level)
        out[i] = k
        total += k
    return total


@njit(cache=True, inline="always", error_model="numpy")
def _bounds(lo, hi, uniform, c, i):
    """``(m_lo, cap)`` of prompt ``i``."""
    j = 0 if uniform else i
    return lo[j] - c, hi[j] - lo[j]


# Without a hint, the integer search starts from the waterline of this many prompts.
_HINT_SAMPLE = 256

# Prompts are counted in blocks of _BLOCK. A first loop, which the compiler
# vectorizes, takes each count from one division and a ceiling and settles it with
# one step each way of the products that the one-at-a-time greedy compares (the
# quotient is off by less than one step while it is below _EXACT_STEP); a second
# loop sums the block. Only a block holding a larger quotient is recounted one
# prompt at a time (:func:`_count_one`).
_BLOCK = 256
_EXACT_STEP = 2.0**50


@njit(cache=True, error_model="numpy")
def _settled_count(a, m, cap, level):
    """:func:`_count_one` for ``m``, ``cap`` given as floats, in straight-line code; exact
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
def _block_counts(rates, lo, hi, uniform, c, level, s, e, out):
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
            out[i - s] = _count_one(rates[i], lo[j] - c, hi[j] - lo[j], level)
    return _block_sum(out, e - s)


@njit(cache=True, error_model="numpy")
def _total_below(rates, lo, hi, uniform, c, level):
    """``G(level)``, the number of pre-levels strictly below ``level`` (one read-only pass)."""
    n = rates.shape[0]
    buf = np.empty(_BLOCK, dtype=np.float64)
    total = 0
    for s in range(0, n, _BLOCK):
        total += _block_counts(rates, lo, hi, uniform, c, level, s, min(s + _BLOCK, n), buf)
    return total


@njit(cache=True, error_model="numpy")
def _extremes(rates, lo, hi, uniform, c):
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
        m, cap = _bounds(lo, hi, uniform, c, i)
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


@njit(cache=True, error_model="numpy")
def linear_solve(rates, lo, hi, uniform, c, extra, hint, hint_slope, counts):
    """SERA's greedy on finite positive rates; see :func:`_solve_core`."""
    _solve_core(rates, lo, hi, uniform, c, extra, hint, hint_slope, counts,
                _extremes(rates, lo, hi, uniform, c))


@njit(cache=True, error_model="numpy")
def _solve_core(rates, lo, hi, uniform, c, extra, hint, hint_slope, counts, ext):
    """SERA's greedy: hand out ``extra`` rollouts one at a time to the lowest level.

    Writes ``counts`` (``lo`` plus the increments). Every pre-level strictly below
    the threshold ``T`` (the ``extra``-th smallest pre-level) is taken; ties at
    ``T`` go to the largest rate first (its next level is highest, the
    lexicographically better choice), then to the lowest index.

    ``T`` is bracketed by secant steps (safeguarded by bisection) on the step
    function ``G(L) = #pre-levels < L``, each evaluation one read-only pass, from
    ``hint`` (the continuous waterline, with ``hint_slope`` its slope ``sum 1 / a``
    over the prompts strictly inside their bounds, when known) or the relaxation's
    all-active root, until the bracket holds few pre-levels; one pass then writes
    the counts at the bracket's lower end and collects the pre-levels inside it,
    among which ``T`` is selected exactly by a partition (:func:`_collect_select`).
    """
    n = rates.shape[0]
    lo_l, hi_l, _, total, inv_sum, m_sum = ext
    if extra <= 0 or extra >= total:
        full = extra > 0
        for i in range(n):
            j = 0 if uniform else i
            counts[i] = hi[j] if full else lo[j]
        return
    hi_l = np.nextafter(hi_l, np.inf)
    g_lo = 0  # nothing lies strictly below the smallest pre-level
    g_hi = total
    target = extra - 0.5
    limit = max(_COLLECT_MIN, n >> 4)
    if lo_l < hint < hi_l:
        level = hint
        slope = hint_slope if hint_slope > 0.0 else inv_sum
    else:
        level = (target + m_sum) / inv_sum
        slope = inv_sum
        if n >= 4 * _HINT_SAMPLE:
            # Without the relaxation, the waterline of a strided subsample for its
            # share of the budget is a far better start than the all-active root.
            stride = n // _HINT_SAMPLE
            sub = np.arange(0, n, stride)
            lo_s = lo if uniform else lo[sub]
            hi_s = hi if uniform else hi[sub]
            r_s = rates[sub]
            guess, sub_slope = _relax_root(r_s, lo_s, hi_s, uniform, c,
                                           extra * sub.shape[0] / n, np.nan,
                                           _extremes(r_s, lo_s, hi_s, uniform, c))
            if sub_slope > 0.0:
                level = guess
                slope = sub_slope * n / sub.shape[0]
        if not (lo_l < level < hi_l):
            level = 0.5 * (lo_l + hi_l)
    prev_level = np.nan
    prev_g = 0
    for _ in range(200):
        if g_hi - g_lo <= limit or hi_l <= np.nextafter(lo_l, np.inf):
            break
        g = _total_below(rates, lo, hi, uniform, c, level)
        if g < extra:
            lo_l = level
            g_lo = g
        else:
            hi_l = level
            g_hi = g
        if prev_level == prev_level and g != prev_g and level != prev_level:
            slope = (g - prev_g) / (level - prev_level)
        prev_level = level
        prev_g = g
        nxt = level + (target - g) / slope if slope > 0.0 else 0.5 * (lo_l + hi_l)
        if not (lo_l < nxt < hi_l):
            nxt = 0.5 * (lo_l + hi_l)
            if not (lo_l < nxt < hi_l):
                break
        level = nxt
    _collect_select(rates, lo, hi, uniform, c, extra, lo_l, hi_l, g_lo, g_hi - g_lo, counts)


@njit(cache=True, error_model="numpy")
def _collect_select(rates, lo, hi, uniform, c, extra, lo_l, hi_l, g_lo, size, counts):
    """The greedy's counts from a bracket ``[lo_l, hi_l)`` of its threshold, with
    ``g_lo = G(lo_l) < extra <= G(hi_l) = g_lo + size``: one pass writes the counts at
    ``lo_l`` and collects the ``size`` pre-levels in the bracket with their owners, and
    ``T`` is selected among those."""
    n = rates.shape[0]
    # One slot of slack: each prompt writes its first pre-level in the bracket before
    # knowing whether it has one (no branch to mispredict).
    vals = np.empty(size + 1, dtype=np.float64)
    owner = np.empty(size + 1, dtype=np.int64)
    at_lo = np.empty(_BLOCK, dtype=np.float64)
    at_hi = np.empty(_BLOCK, dtype=np.float64)
    f = 0
    for s in range(0, n, _BLOCK):
        e = min(s + _BLOCK, n)
        _block_counts(rates, lo, hi, uniform, c, lo_l, s, e, at_lo)
        _block_counts(rates, lo, hi, uniform, c, hi_l, s, e, at_hi)
        for i in range(s, e):
            j = 0 if uniform else i
            m = lo[j] - c
            k0 = np.int64(at_lo[i - s])
            inside = np.int64(at_hi[i - s]) - k0
            counts[i] = lo[j] + k0
            a = rates[i]
            vals[f] = a * (m + k0)
            owner[f] = i
            for k in range(1, inside):
                vals[f + k] = a * (m + k0 + k)
                owner[f + k] = i
            f += inside
    need = extra - g_lo
    threshold = np.partition(vals[:f], need - 1)[need - 1]
    # Take every collected pre-level below the threshold (they are each row's next ones,
    # in order); ties at the threshold by rate (larger first), then index.
    taken, band = take_beyond(vals, f, threshold, owner, counts, False)
    remaining = need - taken
    if remaining == 0:
        return
    ties = owner[band]
    if remaining < ties.shape[0]:
        # Stable sort on -rate keeps index order among equal rates (owners are in
        # index order, and a row has at most one pre-level at a given value).
        order = np.argsort(-rates[ties], kind="mergesort")
        ties = ties[order[:remaining]]
    for i in ties:
        counts[i] += 1


@njit(cache=True, error_model="numpy")
def _piece(rates, lo, hi, uniform, c, level):
    """The piece of ``F(L) = sum_i clip(L / a_i - m_lo_i, 0, cap_i)`` that contains
    ``level``, in one read-only pass: its slope ``sum 1 / a_i`` over the prompts
    strictly inside their bounds, their ``sum m_lo_i``, the capacity of the prompts at
    their maximum, and the nearest breakpoints ``left <= level < right``."""
    slope = 0.0
    act_m = 0.0
    full = 0.0
    left = -np.inf
    right = np.inf
    for i in range(rates.shape[0]):
        m, cap = _bounds(lo, hi, uniform, c, i)
        if cap == 0:
            continue
        a = rates[i]
        b0 = a * m
        b1 = a * (m + cap)
        if level < b0:
            if b0 < right:
                right = b0
        elif level < b1:
            slope += 1.0 / a
            act_m += m
            if b0 > left:
                left = b0
            if b1 < right:
                right = b1
        else:
            full += cap
            if b1 > left:
                left = b1
    return slope, act_m, full, left, right


@njit(cache=True, error_model="numpy")
def _relax_root(rates, lo, hi, uniform, c, extra, start, ext):
    """The waterline ``L`` with ``sum_i clip(L / a_i - m_lo_i, 0, cap_i) = extra``, from a
    first guess ``start`` (NaN: the all-active root). Returns ``(L, slope)``, ``slope``
    being ``sum 1 / a_i`` over the prompts strictly inside their bounds at ``L``.
    ``ext`` is :func:`_extremes` of these prompts.

    ``F(L) = sum_i x_i(L)`` is piecewise linear. Each read-only pass evaluates the
    piece that contains ``L`` (its active set, slope, and the neighbouring
    breakpoints) and the closed-form root of that piece's line; when the root
    lies inside the piece it is the exact waterline (a combinatorial stopping
    rule, no tolerance). Otherwise the next ``L`` is that root when it lies in
    the bracket, else the bracket's midpoint.
    """
    lo_l, _, hi_l, total, inv_sum, m_sum = ext
    if total == 0 or extra <= 0.0:
        return (lo_l if total > 0 else 0.0), 0.0
    if extra >= total:
        return hi_l, 0.0
    level = start
    if not (lo_l < level < hi_l):
        # Start from the root of the piece where every prompt is active.
        level = (extra + m_sum) / inv_sum
        if not (lo_l < level < hi_l):
            level = 0.5 * (lo_l + hi_l)
    root = level
    slope = 0.0
    for _ in range(400):
        slope, act_m, full, left, right = _piece(rates, lo, hi, uniform, c, level)
        value = slope * level - act_m + full
        if slope > 0.0:
            root = (extra - full + act_m) / slope
            if left <= root <= right:
                break
        elif value == extra:
            root = level
            break
        if value < extra:
            lo_l = level
        else:
            hi_l = level
        if slope > 0.0 and lo_l < root < hi_l:
            level = root
        else:
            nxt = 0.5 * (lo_l + hi_l)
            if not (lo_l < nxt < hi_l):
                root = level
                break
            level = nxt
    return root, slope


# From this many prompts on, the waterline of a strided subsample (a quarter of the
# prompts, at most _SUBSAMPLE) for its share of the budget is the first guess: the
# full passes then start inside or next to the right piece.
_SUBSAMPLE_FROM = 1024
_SUBSAMPLE = 4096


@njit(cache=True, error_model="numpy")
def _relax_start(rates, lo, hi, uniform, c, extra):
    n = rates.shape[0]
    if n < _SUBSAMPLE_FROM:
        return np.nan
    stride = max(4, n // _SUBSAMPLE)
    sub = np.arange(0, n, stride)
    lo_s = lo if uniform else lo[sub]
    hi_s = hi if uniform else hi[sub]
    r_s = rates[sub]
    start, _ = _relax_root(r_s, lo_s, hi_s, uniform, c, extra * sub.shape[0] / n, np.nan,
                           _extremes(r_s, lo_s, hi_s, uniform, c))
    return start


@njit(cache=True, error_model="numpy")
def _relax_core(rates, lo, hi, uniform, c, extra, relaxed, ext):
    root, slope = _relax_root(rates, lo, hi, uniform, c, extra,
                              _relax_start(rates, lo, hi, uniform, c, extra), ext)
    for i in range(rates.shape[0]):
        j = 0 if uniform else i
        m = lo[j] - c
        cap = hi[j] - lo[j]
        if cap > 0:
            v = root / rates[i] - m
            relaxed[i] = lo[j] + min(max(v, 0.0), cap)
        else:
            relaxed[i] = lo[j]
    return root, slope


@njit(cache=True, error_model="numpy")
def linear_relax(rates, lo, hi, uniform, c, extra, relaxed):
    """The continuous waterline: ``x_i(L) = clip(L / a_i - m_lo_i, 0, cap_i)`` with
    ``sum x = extra``; writes ``relaxed = lo + x`` and returns ``(L, slope)`` (see
    :func:`_relax_root`)."""
    return _relax_core(rates, lo, hi, uniform, c, extra, relaxed,
                       _extremes(rates, lo, hi, uniform, c))


@njit(cache=True, error_model="numpy")
def waterline_solve(p, rates, compute_rates, lo, hi, uniform, c, extra, continuous, counts,
                    relaxed):
    """SERA's whole solve in one call: the rates (when ``compute_rates``; written into
    ``rates``), the relaxation (when ``continuous``; into ``relaxed``) and the integer
    counts (into ``counts``), sharing one opening pass. Returns ``(level, zeros, infs,
    bad)``. It stops after the rates when some value is not a probability (``bad``
    positive: the caller reports it) or some prompt has rate 0 or inf (``zeros`` or
    ``infs`` positive: the caller serves the edges first, sera_opt.solvers._tiers)."""
    n = rates.shape[0]
    if compute_rates and uniform:
        # One pass: the rates, and the extremes, which scalar bounds make a function of
        # the smallest and largest rate (a positive factor keeps the order).
        zeros, infs, bad, a_min, a_max, inv_sum = _rates_pass(p, rates, True)
        if zeros > 0 or infs > 0 or bad > 0:
            return np.nan, zeros, infs, bad
        m = lo[0] - c
        cap = hi[0] - lo[0]
        if cap > 0:
            ext = (a_min * m, a_max * (m + cap - 1), a_max * (m + cap), n * cap, inv_sum,
                   float(n * m))
        else:
            ext = (np.inf, -np.inf, -np.inf, 0, 0.0, 0.0)
    else:
        if compute_rates:
            zeros, infs, bad = rates_from_probs(p, rates)
            if zeros > 0 or infs > 0 or bad > 0:
                return np.nan, zeros, infs, bad
        ext = _extremes(rates, lo, hi, uniform, c)
    level = np.nan
    slope = 0.0
    if continuous:
        level, slope = _relax_core(rates, lo, hi, uniform, c, float(extra), relaxed, ext)
    _solve_core(rates, lo, hi, uniform, c, extra, level, slope, counts, ext)
    return level, 0, 0, 0
