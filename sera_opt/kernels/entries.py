"""numba kernels of the separable engine. Imported lazily: this module loads numba.

Every objective the engine serves is written as *rows of marginal gains*:
prompt ``i`` starts at ``lo_i`` rollouts and its step ``k -> k + 1``
(``lo_i <= k < hi_i``) has gain ``g_i(k)``, non-increasing in ``k``. Handing
out ``S = budget - sum(lo)`` rollouts one at a time to the largest available
gain is exact for all three objective shapes:

* maximize ``sum_i u_i(n_i)`` with ``u_i`` concave: ``g_i(k) = u_i(k + 1) - u_i(k)``;
* minimize ``sum_i f_i(n_i)`` with ``f_i`` convex: ``g_i(k) = f_i(k) - f_i(k + 1)``;
* lexicographic max-min of increasing levels ``l_i(n)``: ``g_i(k) = -l_i(k)``
  (the prompt with the lowest level takes the next rollout).

The one-at-a-time greedy takes exactly the ``S`` largest gains over all rows
(row prefixes, because rows are non-increasing). The kernels find that set
directly: a bracket ``(b, a]`` on the gain value with ``#{g > a} <= S <=
#{g > b}``, narrowed by passes that count, per row, the gains above a value
(a closed-form guess of the row's crossing, then a galloping search that
settles it exactly with the gain function itself; the gains at both bracket
ends are cached per row, so later passes evaluate only rows whose count
moves), until few gains remain in the bracket; those are collected and the
``S``-th largest is selected. For large ``M`` a strided subsample of the rows,
solved exactly for its share of the budget, supplies the trial values (a
Newton step in budget space after each full pass).

All kernels use ``error_model="numpy"`` (a division by zero gives inf, as the
gain formulas expect) and ``cache=True``.

Ties at the final threshold: for max-min objectives the step whose *next*
level is highest goes first (the lexicographically better choice); then, for
every objective, the lower current count ``k``, then the lower prompt index.
Tied steps are handed out one at a time (a heap over the rows), so each row
still takes a prefix, and rows with a constant gain share spare rollouts
round-robin. For max-min objectives a relative tolerance (``tie_rtol``) can
widen "tied" to levels equal up to rounding.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from .bracket import (
    CA,
    CB,
    COLLECT_MIN,
    KEY_A,
    KEY_B,
    NEWTON_ROUNDS,
    OVERSHOOT,
    PASSES,
    SUBSAMPLE,
    bracket_settled,
    first_pass,
    init_state,
    lower_first,
    narrow_bracket,
    open_ends,
    try_pass,
)
from .closed import strided_subsample
from .crossing import active_rows
from .floatkeys import counts_from, float_key
from .general import finish_bracket, select_spare
from .kinds import SUBSAMPLE_FROM


@njit(cache=True, error_model="numpy")
def solve(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, stats, work_i, work_f, work_g,
          out):
    """Exact counts for ``spare`` rollouts over rows ``[lo, hi)`` (see module docstring).

    ``work_i`` (int64, shape (4, M)), ``work_f`` (float64, (4, M)) and ``work_g``
    (float64, (2, M)) hold the per-row state when they have M columns (else it is
    allocated here): allocated by numpy, which asks the kernel for transparent huge
    pages, the first writes to that state cost a fraction of what they cost in memory
    that numba allocates. The counts are written into ``out`` (int64, shape (M,))
    likewise, when it has M entries.

    Every kind is solved here by the general engine; the kinds of
    :data:`~sera_opt.kernels.kinds.CLOSED_FORM_KINDS` are solved faster by the entries of
    :mod:`sera_opt.kernels.closed`, which callers choose in Python
    (:func:`~sera_opt.kernels.kinds.closed_entry`) so that this kernel does not compile
    that engine beside its own.

    For large ``M`` the first trial values come from a strided subsample of
    ``SUBSAMPLE`` rows solved exactly for its share of the budget; after each
    full pass the share is corrected by the observed miss (a Newton step in
    budget space, overshooting slightly so the bracket closes from both
    sides). Each full pass after the first evaluates gains only in rows whose
    count moves. ``stats`` (int64, length 4) receives (full passes, gains
    collected, rows active at the end, subsample solves).
    """
    m = lo.shape[0]
    total = 0
    for i in range(m):
        total += hi[i] - lo[i]
    if spare <= 0:
        return counts_from(lo, out)
    if spare >= total:
        return counts_from(hi, out)
    if m < SUBSAMPLE_FROM:
        counts, _ = select_spare(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, stats, out)
        return counts
    limit = max(COLLECT_MIN, m >> 3)
    q0, q1, q2, lo_s, hi_s, cap_s, scale = strided_subsample(p0, p1, p2, lo, hi,
                                                              m // SUBSAMPLE)
    # The ends' per-row values are written by the first pass (or, without one, below).
    st_i, st_f, rows, na, a_next, a_last, nb, b_next, b_last, w_n, w_g = init_state(
        kind, p0, p1, p2, c, lo, hi, False, True, work_i, work_f, work_g)
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    opened = False
    share = spare * scale
    sub_stats = np.zeros(3, dtype=np.int64)
    for _ in range(NEWTON_ROUNDS):
        if bracket_settled(st_i, spare, limit):
            break
        target = np.int64(round(share))
        if target <= 0 or target >= cap_s:
            break
        _, lam = select_spare(kind, q0, q1, q2, c, lo_s, hi_s, target, maxmin, 0.0, sub_stats,
                         np.empty(0, dtype=np.int64))
        stats[3] += 1
        if opened:
            rows, cnt = try_pass(kind, p0, p1, p2, c, spare, lam, st_i, st_f, rows, na,
                                  a_next, a_last, nb, b_next, b_last, w_n, w_g)
            if cnt < 0:
                break
        else:
            if lam != lam or not (st_i[KEY_B] < float_key(lam, fbuf, ibuf) < st_i[KEY_A]):
                break
            upper, cnt = first_pass(kind, p0, p1, p2, c, spare, lam, lo, hi, st_i, st_f,
                                     rows, na, a_next, a_last, nb, b_next, b_last)
            if not upper:
                na, a_next, a_last, nb, b_next, b_last = nb, b_next, b_last, na, a_next, a_last
                lower_first(lo, hi, na, a_next, a_last, b_next, b_last)
            rows = active_rows(na, nb, rows)
            opened = True
        share += OVERSHOOT * (spare - cnt) * scale
    if not opened:
        open_ends(lo, hi, na, a_next, a_last, nb, b_next, b_last)
    rows = narrow_bracket(kind, p0, p1, p2, c, lo, hi, spare, limit, st_i, st_f, rows, na, a_next,
                   a_last, nb, b_next, b_last, w_n, w_g)
    stats[0] += st_i[PASSES]
    stats[1] = st_i[CB] - st_i[CA]
    stats[2] = rows.shape[0]
    counts, _ = finish_bracket(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, limit, st_i,
                        rows, na, a_next, a_last, nb, b_next, b_last, out)
    return counts
