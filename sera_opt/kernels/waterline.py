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

from .._jit import njit
from .rates import rates_from_probs, rates_pass
from .selection import take_beyond
from .waterline_counts import COUNT_BLOCK, block_counts, level_extremes, prompt_bounds, total_below

# Stop narrowing the integer bracket once it holds this many pre-levels (or
# M / 16): selecting among them directly is cheaper than more passes.
_COLLECT_MIN = 2048


# Without a hint, the integer search starts from the waterline of this many prompts.
_HINT_SAMPLE = 256


@njit(cache=True, error_model="numpy")
def linear_solve(rates, lo, hi, uniform, c, extra, hint, hint_slope, hint_active, counts):
    """SERA's greedy on finite positive rates; see :func:`_solve_core` (and what it
    returns)."""
    return _solve_core(rates, lo, hi, uniform, c, extra, hint, hint_slope, hint_active,
                       counts, level_extremes(rates, lo, hi, uniform, c))


# The integer count G(L) below the relaxation's level exceeds the relaxed total by
# about half a rollout per prompt strictly inside its bounds (the ceiling's share),
# give or take the spread of a sum of that many fractional parts, sqrt(active / 12),
# and the curvature of G over the step back to ``extra``, which a linear step does not
# see. The first bracket tried spans _GUESS_SPREAD of those spreads and
# _GUESS_CURVATURE of the step on either side.
_GUESS_SPREAD = 6.0


_GUESS_CURVATURE = 0.05


@njit(cache=True, error_model="numpy")
def _solve_core(rates, lo, hi, uniform, c, extra, hint, hint_slope, hint_active, counts, ext):
    """SERA's greedy: hand out ``extra`` rollouts one at a time to the lowest level.

    Writes ``counts`` (``lo`` plus the increments). Every pre-level strictly below
    the threshold ``T`` (the ``extra``-th smallest pre-level) is taken; ties at
    ``T`` go to the largest rate first (its next level is highest, the
    lexicographically better choice), then to the lowest index.

    With the relaxation's level ``hint``, its slope ``hint_slope`` (``sum 1 / a``
    over the prompts strictly inside their bounds there) and their number
    ``hint_active``, the first bracket of ``T`` is guessed: the relaxed total
    plus half a rollout per active prompt puts ``G`` at ``extra`` a little
    below ``hint``, give or take the spread of the fractional parts. One pass
    (:func:`_collect`) writes the counts at the guess's lower end and collects
    the pre-levels inside it; when the guess brackets ``T`` (it almost always
    does), ``T`` is selected among those and the solve is done.

    Otherwise (no hint, or a guess that missed, whose counts then narrow the
    bracket) ``T`` is bracketed by secant steps (safeguarded by bisection) on
    the step function ``G(L) = #pre-levels < L``, each evaluation one
    read-only pass, from ``hint`` or a subsample's waterline, until the bracket
    holds few pre-levels; one pass then writes the counts at the bracket's lower
    end and collects the pre-levels inside it, among which ``T`` is selected
    exactly by a partition (:func:`_select`). The bracket only decides how much
    is collected: any bracket of ``T`` gives the same counts.

    Returns whether the guessed bracket held (for the tests, which cover both routes).
    """
    n = rates.shape[0]
    lo_l, hi_l, _, total, inv_sum, m_sum = ext
    if extra <= 0 or extra >= total:
        full = extra > 0
        for i in range(n):
            j = 0 if uniform else i
            counts[i] = hi[j] if full else lo[j]
        return False
    hi_l = np.nextafter(hi_l, np.inf)
    g_lo = 0  # nothing lies strictly below the smallest pre-level
    g_hi = total
    target = extra - 0.5
    limit = max(_COLLECT_MIN, n >> 4)
    prev_level = np.nan
    prev_g = 0
    if lo_l < hint < hi_l:
        level = hint
        slope = hint_slope if hint_slope > 0.0 else inv_sum
        if hint_slope > 0.0 and hint_active > 0:
            step = 0.5 * hint_active
            spread = (_GUESS_SPREAD * math.sqrt(hint_active / 12.0) + _GUESS_CURVATURE * step
                      + 2.0)
            centre = hint - step / hint_slope
            a = max(centre - spread / hint_slope, lo_l)
            b = min(centre + spread / hint_slope, hi_l)
            if a < b:
                room = np.int64(4.0 * spread) + 16
                vals = np.empty(room, dtype=np.float64)
                owner = np.empty(room, dtype=np.int64)
                g_a, g_b, got = _collect(rates, lo, hi, uniform, c, a, b, counts, vals, owner)
                if g_a < extra <= g_b and got == g_b - g_a:
                    _select(rates, extra - g_a, vals, owner, got, counts)
                    return True
                # A miss: its two counts narrow the bracket, and the secant starts there.
                for x, g in ((a, g_a), (b, g_b)):
                    if g < extra:
                        if x > lo_l:
                            lo_l = x
                            g_lo = g
                    elif x < hi_l:
                        hi_l = x
                        g_hi = g
                if g_b != g_a:
                    slope = (g_b - g_a) / (b - a)
                prev_level = b
                prev_g = g_b
                level = b + (target - g_b) / slope
                if not (lo_l < level < hi_l):
                    level = 0.5 * (lo_l + hi_l)
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
            guess, sub_slope, _ = _relax_root(r_s, lo_s, hi_s, uniform, c,
                                              extra * sub.shape[0] / n, np.nan,
                                              level_extremes(r_s, lo_s, hi_s, uniform, c))
            if sub_slope > 0.0:
                level = guess
                slope = sub_slope * n / sub.shape[0]
        if not (lo_l < level < hi_l):
            level = 0.5 * (lo_l + hi_l)
    for _ in range(200):
        if g_hi - g_lo <= limit or hi_l <= np.nextafter(lo_l, np.inf):
            break
        g = total_below(rates, lo, hi, uniform, c, level)
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
    size = g_hi - g_lo
    vals = np.empty(size, dtype=np.float64)
    owner = np.empty(size, dtype=np.int64)
    _collect(rates, lo, hi, uniform, c, lo_l, hi_l, counts, vals, owner)
    _select(rates, extra - g_lo, vals, owner, size, counts)
    return False


@njit(cache=True, error_model="numpy")
def _collect(rates, lo, hi, uniform, c, lo_l, hi_l, counts, vals, owner):
    """One pass: the counts at ``lo_l`` into ``counts``, and the pre-levels in ``[lo_l,
    hi_l)`` with their owners into ``vals`` and ``owner`` while they fit. Returns
    ``(G(lo_l), G(hi_l), collected)``; every pre-level in the bracket was collected when
    ``collected == G(hi_l) - G(lo_l)``.

    A prompt's pre-levels rise with its count, so it has one in the bracket exactly when
    the first one not below ``lo_l``, ``a (m_lo + k)``, lies below ``hi_l``; only those
    prompts walk on (the same products the greedy compares)."""
    n = rates.shape[0]
    room = vals.shape[0]
    at_lo = np.empty(COUNT_BLOCK, dtype=np.float64)
    g_lo = 0
    f = 0
    for s in range(0, n, COUNT_BLOCK):
        e = min(s + COUNT_BLOCK, n)
        g_lo += block_counts(rates, lo, hi, uniform, c, lo_l, s, e, at_lo)
        for i in range(s, e):
            j = 0 if uniform else i
            m = lo[j] - c
            cap = hi[j] - lo[j]
            k = np.int64(at_lo[i - s])
            counts[i] = lo[j] + k
            a = rates[i]
            v = a * (m + k)
            while k < cap and v < hi_l:
                if f < room:
                    vals[f] = v
                    owner[f] = i
                f += 1
                k += 1
                v = a * (m + k)
    return g_lo, g_lo + f, min(f, room)


@njit(cache=True, error_model="numpy")
def _select(rates, need, vals, owner, f, counts):
    """Add the greedy's last ``need`` rollouts to ``counts``: the ``need`` smallest of the
    ``f`` collected pre-levels ``vals`` (every pre-level of the bracket, each row's in
    order), ties at the threshold by rate (larger first), then index."""
    threshold = np.partition(vals[:f], need - 1)[need - 1]
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
    strictly inside their bounds, their ``sum m_lo_i`` and their number, the capacity
    of the prompts at their maximum, and the nearest breakpoints ``left <= level <
    right``."""
    slope = 0.0
    act_m = 0.0
    full = 0.0
    active = 0
    left = -np.inf
    right = np.inf
    for i in range(rates.shape[0]):
        m, cap = prompt_bounds(lo, hi, uniform, c, i)
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
            active += 1
            if b0 > left:
                left = b0
            if b1 < right:
                right = b1
        else:
            full += cap
            if b1 > left:
                left = b1
    return slope, act_m, full, active, left, right


@njit(cache=True, error_model="numpy")
def _relax_root(rates, lo, hi, uniform, c, extra, start, ext):
    """The waterline ``L`` with ``sum_i clip(L / a_i - m_lo_i, 0, cap_i) = extra``, from a
    first guess ``start`` (NaN: the all-active root). Returns ``(L, slope, active)``,
    ``slope`` being ``sum 1 / a_i`` over the prompts strictly inside their bounds at
    ``L`` and ``active`` their number.
    ``ext`` is :func:`level_extremes` of these prompts.

    ``F(L) = sum_i x_i(L)`` is piecewise linear. Each read-only pass evaluates the
    piece that contains ``L`` (its active set, slope, and the neighbouring
    breakpoints) and the closed-form root of that piece's line; when the root
    lies inside the piece it is the exact waterline (a combinatorial stopping
    rule, no tolerance). Otherwise the next ``L`` is that root when it lies in
    the bracket, else the bracket's midpoint.
    """
    lo_l, _, hi_l, total, inv_sum, m_sum = ext
    if total == 0 or extra <= 0.0:
        return (lo_l if total > 0 else 0.0), 0.0, 0
    if extra >= total:
        return hi_l, 0.0, 0
    level = start
    if not (lo_l < level < hi_l):
        # Start from the root of the piece where every prompt is active.
        level = (extra + m_sum) / inv_sum
        if not (lo_l < level < hi_l):
            level = 0.5 * (lo_l + hi_l)
    root = level
    slope = 0.0
    active = 0
    for _ in range(400):
        slope, act_m, full, active, left, right = _piece(rates, lo, hi, uniform, c, level)
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
    return root, slope, active


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
    start, _, _ = _relax_root(r_s, lo_s, hi_s, uniform, c, extra * sub.shape[0] / n, np.nan,
                           level_extremes(r_s, lo_s, hi_s, uniform, c))
    return start


@njit(cache=True, error_model="numpy")
def _relax_core(rates, lo, hi, uniform, c, extra, relaxed, ext):
    root, slope, active = _relax_root(rates, lo, hi, uniform, c, extra,
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
    return root, slope, active


@njit(cache=True, error_model="numpy")
def linear_relax(rates, lo, hi, uniform, c, extra, relaxed):
    """The continuous waterline: ``x_i(L) = clip(L / a_i - m_lo_i, 0, cap_i)`` with
    ``sum x = extra``; writes ``relaxed = lo + x`` and returns ``(L, slope, active)``
    (see :func:`_relax_root`)."""
    return _relax_core(rates, lo, hi, uniform, c, extra, relaxed,
                       level_extremes(rates, lo, hi, uniform, c))


@njit(cache=True, error_model="numpy")
def waterline_solve(p, rates, compute_rates, lo, hi, uniform, c, extra, continuous, counts,
                    relaxed):
    """SERA's whole solve in one call: the rates (when ``compute_rates``; written into
    ``rates``), the relaxation (when ``continuous``; into ``relaxed``) and the integer
    counts (into ``counts``), sharing one opening pass. Returns ``(level, zeros, infs,
    bad)``. It stops after the rates when some value is not a probability (``bad``
    positive: the caller reports it) or some prompt has rate 0 or inf (``zeros`` or
    ``infs`` positive: the caller serves the edges first, sera_opt.separable.tiers)."""
    n = rates.shape[0]
    if compute_rates and uniform:
        # One pass: the rates, and the extremes, which scalar bounds make a function of
        # the smallest and largest rate (a positive factor keeps the order).
        zeros, infs, bad, a_min, a_max, inv_sum = rates_pass(p, rates, True)
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
        ext = level_extremes(rates, lo, hi, uniform, c)
    level = np.nan
    slope = 0.0
    active = 0
    if continuous:
        level, slope, active = _relax_core(rates, lo, hi, uniform, c, float(extra), relaxed,
                                           ext)
    _solve_core(rates, lo, hi, uniform, c, extra, level, slope, active, counts, ext)
    return level, 0, 0, 0
