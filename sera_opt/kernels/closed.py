"""The closed-form engine (numba kernels): for the kinds whose row crossing has a closed
form (:data:`~sera_opt.kernels.kinds.CLOSED_FORM_KINDS`) the bracket keeps no per-row
state; each pass recounts every row from its closed form, with a small memo.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from .bracket import COLLECT_MIN, NEWTON_ROUNDS, OVERSHOOT, SUBSAMPLE
from .crossing import row_crossing, settled_start
from .floatkeys import counts_from, float_key, float_key_below, float_unkey
from .gains import gain, pass_constant
from .general import select_spare
from .handout import hand_out, room, water_fill
from .kinds import CLOSED_SUBSAMPLE_FROM, KNAPSACK, STEPWISE_MAX_SPARE
from .memo import memo_entry, memo_new, memo_store
from .selection import kth_largest, pick_ties, take_beyond

_INF = np.inf

__all__ = ["CLOSED_SUBSAMPLE_FROM", "bracket_solve", "closed_counts_sampled_exact",
           "closed_solve", "collect_solve", "stepwise_counts", "strided_subsample"]

#: :func:`closed_solve` narrows a bracket opened on the extremes to at most
#: ``max(HEAP_MIN, M / 8)`` steps before it hands them out from its heap (a pass costs
#: about as much as M / 6 steps handed out).
HEAP_MIN = 64


@njit(cache=True, error_model="numpy", inline="always")
def _closed_crossing(kind, x0, x1, x2, c, lam, aux, floor, ceil):
    """First ``k`` in ``[floor, ceil)`` with ``gain(k) <= lam`` (``ceil`` when none), for
    a kind whose crossing is known in closed form: the closed form where it is not
    within rounding of a step, the exact galloping search otherwise."""
    start, settled = settled_start(kind, x0, x1, x2, c, lam, aux, floor, ceil)
    if settled:
        return start
    k, _, _ = row_crossing(kind, x0, x1, x2, c, lam, floor, ceil, start, np.nan, np.nan)
    return k


@njit(cache=True, error_model="numpy")
def _closed_count(kind, p0, p1, p2, c, lo, hi, lam, ends, slot):
    """``sum_i #{steps of row i with gain > lam}`` in one pass over the parameters; each
    row's count (``lo`` plus its steps above ``lam``) goes to the work row of ``ends``
    (``ends[slot[2]]``) unless ``ends`` has no columns."""
    aux = pass_constant(kind, lam)
    out = ends[slot[2]]
    keep = out.shape[0] > 0
    # Rows whose crossing lies within rounding of a step are settled by evaluating gains.
    # Prompts with equal parameters and bounds (equal estimates: common in training
    # batches) cross at the same step, so those rows are settled once per pass, through
    # a small direct-mapped memo keyed on the parameters' bits.
    memo, fbuf, ibuf = memo_new()
    total = 0
    for i in range(lo.shape[0]):
        k = lo[i]
        if hi[i] > k:
            x0 = p0[i]
            x1 = p1[i]
            x2 = p2[i]
            k, settled = settled_start(kind, x0, x1, x2, c, lam, aux, lo[i], hi[i])
            if not settled:
                entry, known_k = memo_entry(memo, x0, x1, x2, lo[i], hi[i], fbuf, ibuf)
                if known_k >= 0:
                    k = known_k
                else:
                    k, _, _ = row_crossing(kind, x0, x1, x2, c, lam, lo[i], hi[i], k, np.nan,
                                        np.nan)
                    memo_store(entry, ibuf, lo[i], hi[i], k)
            total += k - lo[i]
        if keep:
            out[i] = k
    return total


# numba compiles a function once per literal value it is called with: flags and pass
# limits are therefore passed as typed values (np.bool_, np.int64), not as literals,
# so that each helper compiles once.
_YES = np.bool_(True)
_NO = np.bool_(False)


@njit(cache=True, error_model="numpy")
def _closed_ends(lo, hi, keep, work):
    """Per-row counts at the bracket's ends: ``ends[slot[0]]`` at ``a`` (``lo`` while ``a``
    lies above every gain), ``ends[slot[1]]`` at ``b`` (``hi`` while ``b`` lies below
    them), ``ends[slot[2]]`` the work row a pass writes, and ``known`` whether each end's
    row is up to date. Without ``keep``, no rows (a search that only needs the values).
    The rows are the first three of ``work`` when it has a column per row."""
    m = lo.shape[0] if keep else 0
    if work.shape[0] >= 3 and work.shape[1] == m and m > 0:
        ends = work[:3]
    else:
        ends = np.empty((3, m), dtype=np.int64)
    if keep:
        # Loops, not ``ends[0] = lo``: a broadcasting assignment compiles numba's
        # shape-mismatch error path (string formatting), about a second of first use.
        for i in range(m):
            ends[0, i] = lo[i]
            ends[1, i] = hi[i]
    return ends, np.array([0, 1, 2], dtype=np.int64), np.ones(2, dtype=np.int64)


@njit(cache=True, error_model="numpy", inline="always")
def _record_end(slot, known, side):
    """The work row, just written by a pass, becomes end ``side``'s counts."""
    work = slot[2]
    slot[2] = slot[side]
    slot[side] = work
    known[side] = 1


@njit(cache=True, error_model="numpy")
def strided_subsample(p0, p1, p2, lo, hi, stride):
    """Every ``stride``-th row, whose exact threshold for its share of the budget gives
    the engines their first trial values: the rows' parameters and bounds (copies), their
    capacity ``sum(hi - lo)``, and their share of the rows (``scale``)."""
    sub = np.arange(0, lo.shape[0], stride)
    lo_s = lo[sub].copy()
    hi_s = hi[sub].copy()
    cap_s = 0
    for j in range(sub.shape[0]):
        cap_s += hi_s[j] - lo_s[j]
    return (p0[sub].copy(), p1[sub].copy(), p2[sub].copy(), lo_s, hi_s, cap_s,
            sub.shape[0] / lo.shape[0])


@njit(cache=True, error_model="numpy")
def _closed_extremes(kind, p0, p1, p2, c, lo, hi, spare, total, fbuf, ibuf, stats, ends,
                     slot, known):
    """The opening bracket ``(b, a]`` of a closed-form search and its counts ``C(a)``,
    ``C(b)``: ``a`` the rows' largest gain and ``b`` just below their smallest (two gain
    evaluations a row). Where some gains are -inf (a prompt that can never succeed),
    one count pass just below the smallest finite gain tells on which side of it the
    threshold lies, so that the search never starts from the whole float range. The
    counts at the ends go to ``ends`` (see :func:`_closed_ends`)."""
    top = -_INF
    bottom = _INF
    finite_bottom = _INF
    for i in range(lo.shape[0]):
        if hi[i] > lo[i]:
            g = gain(kind, p0[i], p1[i], p2[i], c, lo[i])
            if g > top:
                top = g
            g = gain(kind, p0[i], p1[i], p2[i], c, hi[i] - 1)
            if g < bottom:
                bottom = g
            if -_INF < g < finite_bottom:
                finite_bottom = g
    key_a = float_key(top, fbuf, ibuf)
    if ends.shape[1] > 0:
        at_a = ends[slot[0]]
        at_b = ends[slot[1]]
        for i in range(lo.shape[0]):
            at_a[i] = lo[i]  # nothing lies above the largest gain
            at_b[i] = hi[i]  # and everything above b, below the smallest
    known[0] = 1
    known[1] = 1
    if bottom > -_INF:
        return key_a, float_key_below(bottom, fbuf, ibuf), 0, total
    key_b = float_key(-_INF, fbuf, ibuf) - 1  # the sentinel: every gain lies above it
    c_a = 0
    c_b = total
    if math.isfinite(finite_bottom) and finite_bottom < top:
        lam = np.nextafter(finite_bottom, -_INF)
        cnt = _closed_count(kind, p0, p1, p2, c, lo, hi, lam, ends, slot)
        stats[0] += 1
        if cnt > spare:
            key_b = float_key(lam, fbuf, ibuf)
            c_b = cnt
            _record_end(slot, known, 1)
        else:
            key_a = float_key(lam, fbuf, ibuf)
            c_a = cnt
            _record_end(slot, known, 0)
    return key_a, key_b, c_a, c_b


@njit(cache=True, error_model="numpy")
def _closed_top(kind, p0, p1, p2, c, lo, hi, value_a, value_b):
    """The largest gain in ``(value_b, value_a]`` (NaN when none): each row's gain at its
    crossing of ``value_a``, its largest gain not above it. One pass, one gain a row."""
    aux = pass_constant(kind, value_a)
    top = np.nan
    for i in range(lo.shape[0]):
        if hi[i] > lo[i]:
            k = _closed_crossing(kind, p0[i], p1[i], p2[i], c, value_a, aux, lo[i], hi[i])
            if k < hi[i]:
                g = gain(kind, p0[i], p1[i], p2[i], c, k)
                if g > value_b and not g <= top:
                    top = g
    return top


@njit(cache=True, error_model="numpy")
def _closed_narrow(kind, p0, p1, p2, c, lo, hi, spare, limit, key_a, key_b, c_a, c_b, fbuf,
                   ibuf, stats, passes, ends, slot, known):
    """Narrow the bracket ``(b, a]``, with ``C(a) <= spare < C(b)``, until it holds at
    most ``limit`` steps or no value lies strictly inside it (or after ``passes``
    passes); each step one read-only pass.

    Steps are regula falsi on the count with the Illinois correction (the end kept twice
    in a row has its miss halved); after two steps that each left more than half the
    bracket's steps, one bisection on the bit order of the value, so that the keys at
    least halve every third step whatever the counts do. After two steps that moved
    neither count (the bracket holds few distinct gains, each many times: tied
    prompts), ``a`` drops onto the largest gain in the bracket and the next value tried
    is the float just below it, which closes the bracket on a tied value at once. Each
    pass's per-row counts become those of the end it replaces (see :func:`_closed_ends`).
    """
    # The bracket's ends, a at index 0 and b at 1: their keys, counts C and misses C - spare.
    keys = np.array([key_a, key_b], dtype=np.int64)
    counts = np.array([c_a, c_b], dtype=np.int64)
    miss = np.array([float(c_a - spare), float(c_b - spare)])
    last = -1  # which end the previous step replaced
    stalls = 0
    flat = 0
    done = 0
    while done < passes:
        key_a, key_b = keys[0], keys[1]
        width = counts[1] - counts[0]
        if width <= limit or key_b >= key_a - 1:
            break
        value_a = float_unkey(key_a, fbuf, ibuf)
        value_b = float_unkey(key_b, fbuf, ibuf) if key_b >= float_key(-_INF, fbuf, ibuf) else -_INF
        lam = np.nan
        if flat >= 2:
            flat = 0
            top = _closed_top(kind, p0, p1, p2, c, lo, hi, value_a, value_b)
            stats[0] += 1
            done += 1
            if top == top and key_b < float_key(top, fbuf, ibuf) <= key_a:
                key_a = keys[0] = float_key(top, fbuf, ibuf)  # no gain in (top, a]: C(top) = C(a)
                lam = np.nextafter(top, -_INF)
        elif stalls < 2 and math.isfinite(value_a) and math.isfinite(value_b) and \
                miss[1] > miss[0]:
            lam = value_a + (value_b - value_a) * (-miss[0]) / (miss[1] - miss[0])
        if not (lam == lam and key_b < float_key(lam, fbuf, ibuf) < key_a):
            if key_b >= key_a - 1:
                break
            lam = float_unkey((key_a >> 1) + (key_b >> 1) + (key_a & key_b & 1), fbuf, ibuf)
            stalls = 0
        cnt = _closed_count(kind, p0, p1, p2, c, lo, hi, lam, ends, slot)
        stats[0] += 1
        done += 1
        moved = cnt != counts[0] and cnt != counts[1]
        side = 0 if cnt <= spare else 1
        _record_end(slot, known, side)
        keys[side] = float_key(lam, fbuf, ibuf)
        counts[side] = cnt
        miss[side] = float(cnt - spare)
        if last == side:
            miss[1 - side] *= 0.5  # Illinois: the end kept twice in a row
        last = side
        stalls = stalls + 1 if 2 * (counts[1] - counts[0]) > width else 0
        flat = 0 if moved else flat + 1
    return keys[0], keys[1], counts[0], counts[1]


@njit(cache=True, error_model="numpy")
def _closed_level(kind, p0, p1, p2, c, lo, hi, spare, fbuf, ibuf):
    """A value near the threshold of ``spare`` rollouts over these rows, from the same
    closed-form search stopped once its bracket holds an eighth of the rows' steps, or
    after eight passes (tied gains do not narrow): a trial value for the full problem,
    so it need not be exact."""
    total = room(lo, hi)
    passes = np.zeros(1, dtype=np.int64)
    ends, slot, known = _closed_ends(lo, hi, _NO, np.empty((3, 0), dtype=np.int64))
    key_a, key_b, c_a, c_b = _closed_extremes(kind, p0, p1, p2, c, lo, hi, spare, total, fbuf,
                                              ibuf, passes, ends, slot, known)
    key_a, key_b, c_a, c_b = _closed_narrow(kind, p0, p1, p2, c, lo, hi, spare,
                                            max(1, lo.shape[0] >> 3), key_a, key_b, c_a,
                                            c_b, fbuf, ibuf, passes, np.int64(8), ends, slot,
                                            known)
    value_a = float_unkey(key_a, fbuf, ibuf)
    value_b = float_unkey(key_b, fbuf, ibuf)
    if math.isfinite(value_a) and math.isfinite(value_b) and c_b > c_a:
        return value_a + (value_b - value_a) * (spare - c_a) / (c_b - c_a)
    return value_a


# The max-sum kinds whose crossings are known in closed form have three entry kernels,
# chosen in Python by the problem (:func:`closed_solve` below ``SUBSAMPLE_FROM`` rows, by
# the spare rollouts; :func:`sera_opt.kernels.kinds.closed_entry` by the rows): numba
# compiles a kernel with every function it can call, so a first call compiles only the
# way of solving it takes. :func:`stepwise_counts` hands a small spare out one rollout at
# a time (a small kernel: the demo's and a small batch's first call compile in about a
# fifth of the bracket search's time); :func:`bracket_solve` searches a bracket for a
# larger spare below ``SUBSAMPLE_FROM`` rows, opened from the rows' extremes or a
# subsample by their number; :func:`closed_counts_sampled_exact` serves the largest
# problems, whose subsample is solved by the general engine.


@njit(cache=True, error_model="numpy")
def stepwise_counts(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out):
    """The counts of :func:`closed_solve` (the same arguments and the same tie rule),
    by handing the ``spare`` rollouts out one at a time: each goes to the row whose next
    step has the largest gain (then fewer rollouts, then the lower index), from a binary
    heap over the rows. Rows' gains do not increase along the row, so the steps leave
    the heap in the order of all steps sorted by that rule, and the first ``spare`` are
    the exact optimum. ``O(M + spare log M)`` gain evaluations and comparisons: for small
    problems about as fast as the bracket search (see ``kinds.STEPWISE_MAX_SPARE``), and
    a small kernel, which numba compiles in a tenth of the bracket search's time.
    ``stats`` and ``work_i`` are not used (the same arguments as the other entries)."""
    total = room(lo, hi)
    if spare <= 0:
        return counts_from(lo, out)
    if spare >= total:
        return counts_from(hi, out)
    counts = counts_from(lo, out)
    hand_out(kind, p0, p1, p2, c, counts, hi, spare)
    return counts


def _subsample_opening(exact: bool, name: str):
    """The opening of a bracket from a strided subsample, solved for its share of the
    budget exactly (``exact``: the general engine, for ``SUBSAMPLE_FROM`` rows and more) or
    by the closed-form search stopped early. ``exact`` is a constant of the kernel (a
    closure variable, so numba drops the branch it does not take and compiles only the
    solver it calls); ``name`` keeps the two apart in the kernel cache."""

    def opening(kind, p0, p1, p2, c, lo, hi, spare, total, stats, ends, slot, known, fbuf,
                ibuf):
        m = lo.shape[0]
        limit = max(COLLECT_MIN, m >> 4)
        # The opening bracket: nothing lies above +inf and everything above the sentinel
        # key below -inf.
        key_a = float_key(_INF, fbuf, ibuf)
        key_b = float_key(-_INF, fbuf, ibuf) - 1
        c_a = 0
        c_b = total
        # Trial values from a strided subsample (one row in sixteen, at most SUBSAMPLE)
        # for its share of the budget, the share corrected after each full pass by the
        # observed miss (a Newton step in budget space): cheaper than the rows' extreme
        # gains, two gain evaluations a row, and a far better first value.
        q0, q1, q2, lo_s, hi_s, cap_s, scale = strided_subsample(
            p0, p1, p2, lo, hi, m // min(SUBSAMPLE, m >> 4))
        share = spare * scale
        sub_stats = np.zeros(3, dtype=np.int64)
        for _ in range(NEWTON_ROUNDS):
            if c_b - c_a <= limit or key_b >= key_a - 1:
                break
            target = np.int64(round(share))
            if target <= 0 or target >= cap_s:
                break
            if exact:
                # Exact: with tied gains its threshold is one of the tied values, which
                # the full bracket then closes on at once.
                _, lam = select_spare(kind, q0, q1, q2, c, lo_s, hi_s, target, False, 0.0,
                                      sub_stats, np.empty(0, dtype=np.int64))
            else:
                lam = _closed_level(kind, q0, q1, q2, c, lo_s, hi_s, target, fbuf, ibuf)
            stats[3] += 1
            kl = float_key(lam, fbuf, ibuf)
            if not (lam == lam and key_b < kl < key_a):
                break
            cnt = _closed_count(kind, p0, p1, p2, c, lo, hi, lam, ends, slot)
            stats[0] += 1
            if cnt <= spare:
                key_a = kl
                c_a = cnt
                _record_end(slot, known, 0)
            else:
                key_b = kl
                c_b = cnt
                _record_end(slot, known, 1)
            share += OVERSHOOT * (spare - cnt) * scale
        if key_a == float_key(_INF, fbuf, ibuf) or key_b < float_key(-_INF, fbuf, ibuf):
            # The subsample left an end open (e.g. its level was -inf): close it on the
            # rows' extremes rather than bisect the whole float range.
            # Values only: which per-row counts the merged ends have is not tracked here,
            # so the last pass finds them again.
            none, none_slot, _ = _closed_ends(lo, hi, _NO, np.empty((3, 0), dtype=np.int64))
            top_a, top_b, top_ca, top_cb = _closed_extremes(kind, p0, p1, p2, c, lo, hi,
                                                            spare, total, fbuf, ibuf, stats,
                                                            none, none_slot, known)
            known[0] = 0
            known[1] = 0
            if top_a < key_a:
                key_a = top_a
                c_a = top_ca
            if top_b > key_b:
                key_b = top_b
                c_b = top_cb
        return key_a, key_b, c_a, c_b

    opening.__name__ = opening.__qualname__ = name
    opening.__doc__ = (
        "The bracket ``(b, a]`` and its counts, opened from a strided subsample solved for "
        "its share of the budget "
        + ("exactly by the general engine." if exact else
           "by the closed-form search stopped early."))
    return njit(cache=True, error_model="numpy")(opening)


_opened_by_level = _subsample_opening(False, "_opened_by_level")
_opened_exactly = _subsample_opening(True, "_opened_exactly")


@njit(cache=True, error_model="numpy")
def closed_counts_sampled_exact(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out):
    """:func:`closed_solve` for ``SUBSAMPLE_FROM`` rows and more: the bracket opened from a
    strided subsample solved exactly for its share of the budget by the general engine,
    narrowed, and the gains left inside it collected and selected (the same arguments and
    the same tie rule)."""
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    total = room(lo, hi)
    if spare <= 0:
        return counts_from(lo, out)
    if spare >= total:
        return counts_from(hi, out)
    ends, slot, known = _closed_ends(lo, hi, _YES, work_i)
    key_a, key_b, c_a, c_b = _opened_exactly(kind, p0, p1, p2, c, lo, hi, spare, total, stats,
                                             ends, slot, known, fbuf, ibuf)
    return _closed_finish(kind, p0, p1, p2, c, lo, hi, spare, stats, out, key_a, key_b,
                          c_a, c_b, ends, slot, known, fbuf, ibuf)


def closed_solve(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out):
    """The counts of the max-sum kinds whose crossings are known in closed form, below
    ``SUBSAMPLE_FROM`` rows (exact at any size; the same arguments and tie rule as every
    entry kernel): up to ``STEPWISE_MAX_SPARE`` spare rollouts by
    :func:`stepwise_counts`, more by :func:`bracket_solve`.

    Chosen here in Python rather than inside one kernel, because numba compiles a kernel
    with everything it can call: a first call with a small spare (the demo, a small
    batch) then compiles the one-at-a-time kernel alone, about a fifth of the bracket
    search's compile time. Beyond it, Knapsack goes to :func:`collect_solve` (see
    :func:`~sera_opt.kernels.kinds.search_entry`). (The objectives go one step further
    for a first call with a larger spare:
    :meth:`sera_opt.separable.objective.SeparableObjective._solve_rows` calls
    :func:`stepwise_counts` while a background process compiles the search.)"""
    if spare <= STEPWISE_MAX_SPARE:
        return stepwise_counts(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out)
    if kind == KNAPSACK:
        return collect_solve(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out)
    return bracket_solve(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out)


@njit(cache=True, error_model="numpy", inline="always")
def _small_opening(kind, p0, p1, p2, c, lo, hi, spare, total, stats, work_i):
    """The searches' state (the ends' per-row counts, see :func:`_closed_ends`, and the
    bit-cast buffers) and their opening bracket below ``SUBSAMPLE_FROM`` rows: from the
    rows' extreme gains below ``CLOSED_SUBSAMPLE_FROM`` rows, else from a strided
    subsample solved for its share of the budget by the closed-form search stopped
    early. Returns ``((key_a, key_b, c_a, c_b), (ends, slot, known), (fbuf, ibuf))``."""
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    ends, slot, known = _closed_ends(lo, hi, _YES, work_i)
    if lo.shape[0] < CLOSED_SUBSAMPLE_FROM:
        bracket = _closed_extremes(kind, p0, p1, p2, c, lo, hi, spare, total, fbuf, ibuf,
                                   stats, ends, slot, known)
    else:
        bracket = _opened_by_level(kind, p0, p1, p2, c, lo, hi, spare, total, stats, ends,
                                   slot, known, fbuf, ibuf)
    return bracket, (ends, slot, known), (fbuf, ibuf)


@njit(cache=True, error_model="numpy")
def collect_solve(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out):
    """:func:`bracket_solve`'s search with the finish of the largest problems' kernel: the
    gains left in the bracket are collected once (rows with equal parameters sharing
    them) and selected, instead of handed out from a heap that evaluates one gain per
    step. :func:`closed_solve` calls it for Knapsack, whose gain costs two exponentials
    (the same arguments, tie rule and edge cases as :func:`bracket_solve`). An entry of
    its own, so that neither search compiles the other's finish."""
    total = room(lo, hi)
    if spare <= 0:
        return counts_from(lo, out)
    if spare >= total:
        return counts_from(hi, out)
    (key_a, key_b, c_a, c_b), (ends, slot, known), (fbuf, ibuf) = _small_opening(
        kind, p0, p1, p2, c, lo, hi, spare, total, stats, work_i)
    return _closed_finish(kind, p0, p1, p2, c, lo, hi, spare, stats, out, key_a, key_b, c_a,
                          c_b, ends, slot, known, fbuf, ibuf)


@njit(cache=True, error_model="numpy")
def bracket_solve(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out):
    """The bracket search for max-sum kinds whose crossings are known in closed form,
    below ``SUBSAMPLE_FROM`` rows (exact at any size and spare; :func:`closed_solve`
    calls it for more than ``STEPWISE_MAX_SPARE`` spare rollouts).

    The bracket ``(b, a]`` with ``C(a) <= spare <=
    C(b)`` is opened from the rows' extreme gains (below ``CLOSED_SUBSAMPLE_FROM`` rows)
    or from a strided subsample solved for its share of the budget; regula falsi on the
    count (alternating with bisection on the bit order of the value) narrows it, each
    step one pass that keeps its per-row counts for the end it becomes; then the steps
    left in the bracket are handed out one at a time from a heap over the rows it holds,
    in the order of all steps sorted by gain (ties: fewer rollouts first, then the lower
    index), or water-filled by that tie rule where the bracket closed on one tied value
    (every gain in it equal). ``stats`` (int64, length 4) receives (count passes, gains
    evaluated in the bracket, 0, subsample solves); ``work_i`` (int64, (4, M)) holds the
    per-row state when it has M columns and ``out`` (int64, (M,)) the counts when it has
    M entries.
    Like every entry, it gives ``lo`` for ``spare <= 0`` and ``hi`` for ``spare >=
    sum(hi - lo)``.
    """
    m = lo.shape[0]
    total = room(lo, hi)
    if spare <= 0:
        return counts_from(lo, out)
    if spare >= total:
        return counts_from(hi, out)
    (key_a, key_b, c_a, c_b), (ends, slot, known), (fbuf, ibuf) = _small_opening(
        kind, p0, p1, p2, c, lo, hi, spare, total, stats, work_i)
    # From the extremes, narrowed further than the collecting finish needs: a step handed
    # out from the heap costs a gain and a sift, several times a row's share of a count
    # pass. A subsample's opening leaves a bracket of a few hundred steps at 1,024 rows, and
    # with tied estimates (posterior means of a few rollouts) narrowing it further takes
    # passes that cost more than the heap saves.
    limit = (max(HEAP_MIN, m >> 3) if m < CLOSED_SUBSAMPLE_FROM
             else max(COLLECT_MIN, m >> 4))
    key_a, key_b, c_a, c_b = _closed_narrow(kind, p0, p1, p2, c, lo, hi, spare, limit, key_a,
                                            key_b, c_a, c_b, fbuf, ibuf, stats, np.int64(200),
                                            ends, slot, known)
    starts, stops = _end_counts(kind, p0, p1, p2, c, lo, hi, key_a, key_b, ends, slot, known,
                                fbuf, ibuf)
    need = spare - c_a
    held = 0
    for i in range(m):
        held += max(stops[i] - starts[i], 0)
    if not 0 <= need <= held:
        # C(a) <= spare <= C(b) holds by construction; handing out more than the bracket
        # holds would take steps outside it.
        raise RuntimeError("separable engine: the closed-form bracket does not hold the "
                           "threshold")
    if key_b >= key_a - 1:
        # A plateau: every gain in the bracket equals value_a, so the tie rule alone
        # orders them (a batch of equal estimates, such as a first plan's).
        stats[1] = 0
        return water_fill(starts, stops, need, out)
    counts = counts_from(starts, out)
    if need == 0:
        return counts
    # The steps left in the bracket, in the order of all steps sorted by gain.
    evaluated = hand_out(kind, p0, p1, p2, c, counts, stops, need)
    stats[1] = evaluated
    return counts


@njit(cache=True, error_model="numpy", inline="always")
def _end_counts(kind, p0, p1, p2, c, lo, hi, key_a, key_b, ends, slot, known, fbuf, ibuf):
    """The per-row counts at the bracket's ends ``a`` and ``b``: kept from the passes, else
    found again (one pass)."""
    m = lo.shape[0]
    value_a = float_unkey(key_a, fbuf, ibuf)
    value_b = float_unkey(key_b, fbuf, ibuf) if key_b >= float_key(-_INF, fbuf, ibuf) else -_INF
    below_all = key_b < float_key(-_INF, fbuf, ibuf)
    starts = ends[slot[0]]
    stops = ends[slot[1]]
    if known[0] == 0 or known[1] == 0:
        aux_a = pass_constant(kind, value_a)
        aux_b = pass_constant(kind, value_b)
        for i in range(m):
            if hi[i] > lo[i]:
                if known[0] == 0:
                    starts[i] = _closed_crossing(kind, p0[i], p1[i], p2[i], c, value_a,
                                                 aux_a, lo[i], hi[i])
                if known[1] == 0:
                    stops[i] = hi[i] if below_all else _closed_crossing(
                        kind, p0[i], p1[i], p2[i], c, value_b, aux_b, lo[i], hi[i])
            else:
                starts[i] = lo[i]
                stops[i] = lo[i]
    return starts, stops


@njit(cache=True, error_model="numpy")
def _closed_finish(kind, p0, p1, p2, c, lo, hi, spare, stats, out, key_a, key_b, c_a, c_b,
                   ends, slot, known, fbuf, ibuf):
    """From an opened bracket ``(b, a]`` to the counts: narrow it to at most
    ``max(COLLECT_MIN, M / 16)`` steps, collect the gains inside and select the remaining
    ones exactly (see :func:`closed_solve`)."""
    m = lo.shape[0]
    limit = max(COLLECT_MIN, m >> 4)
    key_a, key_b, c_a, c_b = _closed_narrow(kind, p0, p1, p2, c, lo, hi, spare, limit, key_a,
                                            key_b, c_a, c_b, fbuf, ibuf, stats, np.int64(200), ends,
                                            slot, known)
    starts, stops = _end_counts(kind, p0, p1, p2, c, lo, hi, key_a, key_b, ends, slot, known,
                                fbuf, ibuf)
    n_bracket = c_b - c_a
    if key_b >= key_a - 1 and n_bracket > limit:
        # A plateau: every gain in the bracket equals value_a, so the tie rule alone
        # orders them; water-fill by count instead of collecting them.
        held = 0
        for i in range(m):
            held += max(stops[i] - starts[i], 0)
        if not 0 <= spare - c_a <= held:
            # As below: the bracket's per-row steps must hold what is left to hand out.
            raise RuntimeError("separable engine: the closed-form bracket does not hold "
                               "the threshold")
        return water_fill(starts, stops, spare - c_a, out)
    # Counts at a (all gains > a taken) and the gains in (b, a].
    counts = counts_from(starts, out)
    n_collect = 0
    for i in range(m):
        n_collect += max(stops[i] - starts[i], 0)
    vals = np.empty(n_collect, dtype=np.float64)
    owner = np.empty(n_collect, dtype=np.int64)
    step = np.empty(n_collect, dtype=np.int64)
    # Rows with equal parameters and the same steps in the bracket have the same gains:
    # copied from the first such row (a memo as in _closed_count), not evaluated again.
    memo, fbuf, ibuf = memo_new()
    e = 0
    for i in range(m):
        k0 = starts[i]
        k1 = stops[i]
        if k0 < k1:
            entry, first = memo_entry(memo, p0[i], p1[i], p2[i], k0, k1, fbuf, ibuf)
            same = first >= 0
            if not same:
                memo_store(entry, ibuf, k0, k1, e)
            for k in range(k0, k1):
                if same:
                    vals[e] = vals[first + k - k0]
                else:
                    vals[e] = gain(kind, p0[i], p1[i], p2[i], c, k)
                owner[e] = i
                step[e] = k
                e += 1
    stats[1] = e
    need = spare - c_a
    if need == 0:
        return counts
    if not 0 < need <= e:
        # C(a) <= spare <= C(b) holds by construction; selecting beyond the collected
        # gains would read past them.
        raise RuntimeError("separable engine: the closed-form bracket does not hold the "
                           "threshold")
    threshold = kth_largest(vals[:e].copy(), need)
    above, band = take_beyond(vals, e, threshold, owner, counts, True)
    left = need - above
    if left == 0:
        return counts
    nxt = np.zeros(e, dtype=np.float64)
    pick_ties(band, left, nxt, step, owner, False, counts)
    return counts
