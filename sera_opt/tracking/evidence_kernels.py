"""numba kernels of the Beta evidence table (:mod:`.evidence`). Imported lazily: this
module loads numba.

The per-rollout update with lazy decay, the reads, and the moments of the fitted prior
kept incrementally, with per-prompt expiry events when evidence decays below the fit's
thresholds. Slots are int64, ``-1`` means "unknown id"; decay factors ``decay ** k``
are read from a table computed by numpy (``powers[k]``), so every factor is
bit-identical to the one numpy's ``decay ** k`` gives; past the end of a *complete*
table (one that reached 0) the factor is 0.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit

# Layout of the fit's float accumulators (Neumaier pairs: value, compensation).
SUM_S = 0  # decayed successes over all prompts
SUM_N = 2  # decayed rollouts over all prompts
SUM_R = 4  # sum of (r_i - shift) over prompts with n_i >= 1, r_i = s_i / n_i
SUM_R2 = 6  # sum of (r_i - shift)^2 over the same prompts
SUM_G = 8  # sum of phi_i / n_i over the same prompts (1 / n_i in the base step's frame)
# Integer counters.
COUNT_SEEN = 0  # prompts with n_i >= 1 now
COUNT_TWO = 1  # prompts with n_i >= 2 now
NOT_LINKED = -1
# Rows of the evidence table: evidence.ROW (successes, failures,
# last_step, scratch = trials << 32 | successes of the current batch).
_TRIAL = np.int64(1 << 32)
_LOW = np.int64(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _kadd(acc, i, x):
    # Neumaier's compensated sum: terms added and later removed bit for bit
    # leave an error of a few ulps of the running value, however many there were.
    s = acc[i]
    t = s + x
    if abs(s) >= abs(x):
        acc[i + 1] += (s - t) + x
    else:
        acc[i + 1] += (x - t) + s
    acc[i] = t


@njit(cache=True, inline="always")
def _factor(powers, complete, k):
    if k < powers.size:
        return powers[k]
    return 0.0


@njit(cache=True, inline="always")
def _frame(powers, last, base):
    # phi = decay ** (last - base): the factor that expresses 1 / n_i at the
    # base step; a function of (last, base) only, so a term added at one
    # update is removed bit for bit at a later one.
    if last >= base:
        return powers[last - base]
    return 1.0 / powers[base - last]


@njit(cache=True, inline="always")
def _seen_terms(s, f, shift):
    n = s + f
    r = s / n - shift
    return n, r, r * r


@njit(cache=True, inline="always")
def _push(node, step, due, events, heads, pool):
    """Schedule ``node`` at ``step``: one entry pushed on its bucket's chain.

    ``events`` is (entries, 3): node, due step, next entry. Entries are never
    unlinked: a node rescheduled or dropped simply gets another ``due``, and
    the stale entry is discarded when its bucket comes up. ``pool`` holds the
    head of the free list and the number of entries in use; the caller
    guarantees free entries.
    """
    e = pool[0]
    pool[0] = events[e, 2]
    pool[1] += 1
    b = step & (heads.size - 1)
    events[e, 0] = node
    events[e, 1] = step
    events[e, 2] = heads[b]
    heads[b] = e
    due[node] = step


@njit(cache=True, inline="always")
def _free(e, events, pool):
    events[e, 2] = pool[0]
    pool[0] = e
    pool[1] -= 1


@njit(cache=True)
def refile_events(due, events, heads, pool):
    """Rebuild the calendar from ``due`` alone: drops every stale entry.

    Used when the pool runs short of free entries (O(entries + nodes),
    amortized against the pushes that filled it) or the ring of buckets grows.
    """
    heads[:] = -1
    entries = events.shape[0]
    for e in range(entries):
        events[e, 2] = e + 1 if e + 1 < entries else -1
    pool[0] = 0 if entries else -1
    pool[1] = 0
    for node in range(due.size):
        if due[node] != NOT_LINKED:
            _push(node, due[node], due, events, heads, pool)


@njit(cache=True, inline="always")
def _holds(s, f, thr, powers, complete, k):
    """1 if decayed evidence k steps after its last touch is >= thr, 0 if not, -1 unknown."""
    if k < powers.size:
        p = powers[k]
    elif complete:
        p = 0.0
    else:
        return -1
    # The same expression as the fit's reference: s * p + f * p.
    return 1 if s * p + f * p >= thr else 0


@njit(cache=True)
def expiry_offset(s, f, thr, k0, powers, complete, inv_log):
    """First k > k0 at which ``s * d^k + f * d^k < thr`` (given it holds at k0).

    Returns (k, exact). Where the factor table ends before the evidence falls
    below ``thr`` (a table that is not complete), returns the last k the
    table covers with ``exact = False``: a re-check point, not an expiry.
    """
    n = s + f
    guess = int(math.log(n / thr) * inv_log) + 1
    k = max(k0 + 1, guess)
    if k > powers.size:
        k = powers.size
    while k - 1 > k0 and _holds(s, f, thr, powers, complete, k - 1) == 0:
        k -= 1
    while True:
        state = _holds(s, f, thr, powers, complete, k)
        if state == 0:
            return k, True
        if state < 0:
            return k - 1, False
        k += 1


@njit(cache=True, inline="always")
def _schedule(node, s, f, thr, last, k0, powers, complete, inv_log, due, events, heads, pool):
    k, _ = expiry_offset(s, f, thr, k0, powers, complete, inv_log)
    _push(node, last + k, due, events, heads, pool)


@njit(cache=True, inline="always")
def _nadd(total, comp, x):
    # _kadd on scalars (kept in registers by the update's loops); same arithmetic.
    t = total + x
    if abs(total) >= abs(x):
        comp += (total - t) + x
    else:
        comp += (x - t) + total
    return t, comp


_UPDATE_DOC = """One update at step ``t``: decay, accumulate the batch, keep the fit's moments.

Evidence is decayed lazily: a prompt's stored (s, f) are its values at its
last touch, and the first rollout of a prompt in this batch brings them to
step ``t`` (``s * decay**k``) before the batch's successes and failures
are added, exactly as ``s * scale + wins`` in one vectorized step would.
The pass over the rollouts touches one 32-byte record per rollout (it is
bound by memory latency: little else happens in it); the second pass
finishes each distinct prompt, taking its old terms out of the fit's
moments and putting its new ones in, in first-occurrence order or, when
the batch touches at least an eighth of all slots, in slot order (a
sequential scan is then cheaper than random access). With decay the old
terms leave in the first pass, before (s, f) are scaled. ``touched`` is scratch (one entry per
rollout). Returns the number of distinct prompts.

``update_evidence`` is the kernel for a tracker without decay, ``update_evidence_decayed``
the one with it (:func:`_update_entry`)."""


def _update_entry(decay_one: bool, name: str):
    """The update kernel for evidence without decay (``decay_one``) or with it: a constant
    of the kernel (a closure variable), so that numba drops the branches it does not take
    and the kernel without decay compiles no expiry calendar, sort or decay factors."""
    decayed = not decay_one

    def kernel(slots, wins, t, size, rows, touched, decay, powers, complete, inv_log, fit,
               sums, counts, base, shift, due, events, heads, pool):
        if decayed:
            sums[SUM_S] *= decay
            sums[SUM_S + 1] *= decay
            sums[SUM_N] *= decay
            sums[SUM_N + 1] *= decay
            if fit:
                _expire(t, rows, powers, complete, inv_log, sums, counts, base, shift, due,
                        events, heads, pool)
        rs, rc = sums[SUM_R], sums[SUM_R + 1]
        qs, qc = sums[SUM_R2], sums[SUM_R2 + 1]
        gs, gc = sums[SUM_G], sums[SUM_G + 1]
        seen_count = counts[COUNT_SEEN]
        two_count = counts[COUNT_TWO]
        touched_count = 0
        for j in range(slots.size):
            slot = slots[j]
            row = rows[np.uint64(slot)]
            if row.last_step != t:
                s = row.successes
                f = row.failures
                last = row.last_step
                if decayed and fit:
                    # The prompt's terms as of its last touch leave the moments (without
                    # decay they leave in the second pass, where (s, f) are still as stored).
                    # Membership now is the fit's own predicate, evaluated here from the
                    # record in cache; the calendar agrees with it (events due now have run),
                    # and the second pass rewrites both nodes' due steps, which makes their
                    # old entries stale.
                    if _holds(s, f, 1.0, powers, complete, t - last) == 1:
                        n, r, r2 = _seen_terms(s, f, shift)
                        seen_count -= 1
                        rs, rc = _nadd(rs, rc, -r)
                        qs, qc = _nadd(qs, qc, -r2)
                        gs, gc = _nadd(gs, gc, -(_frame(powers, last, base) / n))
                        if _holds(s, f, 2.0, powers, complete, t - last) == 1:
                            two_count -= 1
                if decayed:
                    scale = _factor(powers, complete, t - last)
                    row.successes = s * scale
                    row.failures = f * scale
                row.last_step = t
                row.scratch = 0
                touched[touched_count] = slot
                touched_count += 1
            # Trials in the high 32 bits, successes in the low ones: one add per rollout.
            row.scratch += _TRIAL | wins[j]
        scan = 8 * touched_count >= size
        total_wins = 0
        phi = _frame(powers, t, base) if decayed else 1.0
        for q in range(size if scan else touched_count):
            slot = q if scan else touched[q]
            row = rows[np.uint64(slot)]
            if scan and row.last_step != t:
                continue
            trials = row.scratch >> 32
            wins_q = row.scratch & _LOW
            total_wins += wins_q
            w = float(wins_q)
            s = row.successes
            f = row.failures
            if decay_one and fit and s + f >= 1.0:
                n, r, r2 = _seen_terms(s, f, shift)
                seen_count -= 1
                rs, rc = _nadd(rs, rc, -r)
                qs, qc = _nadd(qs, qc, -r2)
                gs, gc = _nadd(gs, gc, -(1.0 / n))
                if n >= 2.0:
                    two_count -= 1
            s = s + w
            f = f + (trials - w)
            row.successes = s
            row.failures = f
            if fit:
                # ... and the new terms enter (n = s + f >= 1: each got a rollout now).
                n, r, r2 = _seen_terms(s, f, shift)
                seen_count += 1
                rs, rc = _nadd(rs, rc, r)
                qs, qc = _nadd(qs, qc, r2)
                gs, gc = _nadd(gs, gc, phi / n)
                if n >= 2.0:
                    two_count += 1
                if decayed:
                    _schedule(2 * slot, s, f, 1.0, t, 0, powers, complete, inv_log, due, events,
                              heads, pool)
                    if n >= 2.0:
                        _schedule(2 * slot + 1, s, f, 2.0, t, 0, powers, complete, inv_log, due,
                                  events, heads, pool)
                    else:
                        due[2 * slot + 1] = NOT_LINKED
        if fit:
            sums[SUM_R], sums[SUM_R + 1] = rs, rc
            sums[SUM_R2], sums[SUM_R2 + 1] = qs, qc
            sums[SUM_G], sums[SUM_G + 1] = gs, gc
            counts[COUNT_SEEN] = seen_count
            counts[COUNT_TWO] = two_count
        _kadd(sums, SUM_S, float(total_wins))
        _kadd(sums, SUM_N, float(slots.size))
        return touched_count

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = _UPDATE_DOC
    return njit(cache=True)(kernel)


update_evidence = _update_entry(True, "update_evidence")
update_evidence_decayed = _update_entry(False, "update_evidence_decayed")


@njit(cache=True)
def _expire(t, rows, powers, complete, inv_log, sums, counts, base, shift, due, events, heads,
            pool):
    """Process the events due at step ``t``: prompts whose decayed evidence left a threshold.

    The bucket's live entries for ``t`` are processed in node order (not in
    the chain's order), so the moments' rounding depends only on the state,
    and a tracker restored from a checkpoint continues bit for bit. Entries
    for later laps of the ring stay; stale ones are freed.
    """
    bucket = t & (heads.size - 1)
    count = 0
    e = heads[bucket]
    while e >= 0:
        if events[e, 1] == t and due[events[e, 0]] == t:
            count += 1
        e = events[e, 2]
    nodes = np.empty(count, dtype=np.int64)
    count = 0
    kept = -1
    e = heads[bucket]
    while e >= 0:
        following = events[e, 2]
        node = events[e, 0]
        step = events[e, 1]
        if step == t and due[node] == t:
            nodes[count] = node
            count += 1
            _free(e, events, pool)
        elif step > t and due[node] == step:
            events[e, 2] = kept
            kept = e
        else:
            _free(e, events, pool)
        e = following
    heads[bucket] = kept
    nodes.sort()
    for i in range(count):
        node = nodes[i]
        if i > 0 and node == nodes[i - 1]:
            continue  # scheduled twice for the same step: one event
        slot = node >> 1
        kind = node & 1
        thr = 1.0 if kind == 0 else 2.0
        row = rows[slot]
        s = row.successes
        f = row.failures
        last = row.last_step
        if _holds(s, f, thr, powers, complete, t - last) == 1:
            # A re-check point (the factor table was shorter then): reschedule.
            _schedule(node, s, f, thr, last, t - last, powers, complete, inv_log, due, events,
                      heads, pool)
            continue
        due[node] = NOT_LINKED
        if kind == 0:
            n, r, r2 = _seen_terms(s, f, shift)
            counts[COUNT_SEEN] -= 1
            _kadd(sums, SUM_R, -r)
            _kadd(sums, SUM_R2, -r2)
            _kadd(sums, SUM_G, -(_frame(powers, last, base) / n))
        else:
            counts[COUNT_TWO] -= 1


@njit(cache=True)
def rebase_inverse_sum(rows, base, powers, due, events, sums):
    """Recompute the sum of 1 / n_i over the seen prompts in the frame of a new base step.

    The seen prompts are the live calendar entries of the n >= 1 nodes, so this
    costs O(entries), not O(prompts); they are summed in slot order, so the
    result depends only on the state.
    """
    count = 0
    for e in range(events.shape[0]):
        node = events[e, 0]
        if node & 1 == 0 and due[node] != NOT_LINKED and events[e, 1] == due[node]:
            count += 1
    nodes = np.empty(count, dtype=np.int64)
    count = 0
    for e in range(events.shape[0]):
        node = events[e, 0]
        if node & 1 == 0 and due[node] != NOT_LINKED and events[e, 1] == due[node]:
            nodes[count] = node
            count += 1
    nodes.sort()
    sums[SUM_G] = 0.0
    sums[SUM_G + 1] = 0.0
    for i in range(count):
        if i > 0 and nodes[i] == nodes[i - 1]:
            continue
        row = rows[nodes[i] >> 1]
        _kadd(sums, SUM_G, _frame(powers, row.last_step, base) / (row.successes + row.failures))


@njit(cache=True)
def rebuild_fit(rows, size, t, base, shift, decay_one, powers, complete, inv_log, sums,
                magnitudes, counts, link, due, events, heads, pool):
    """The fit's moments at step ``t`` from scratch (and, with ``link``, every event:
    ``due`` all -1, ``heads`` all -1 and the pool free on entry).

    ``shift`` NaN means: centre the rates on the pooled mean found here.
    Writes ``sums`` (Neumaier pairs, same layout as the update's), the sums of
    the terms' magnitudes (for error bounds) and the counts; returns the shift.
    """
    for i in range(sums.size):
        sums[i] = 0.0
    for i in range(magnitudes.size):
        magnitudes[i] = 0.0
    counts[COUNT_SEEN] = 0
    counts[COUNT_TWO] = 0
    for i in range(size):
        row = rows[i]
        scale = 1.0 if decay_one else _factor(powers, complete, t - row.last_step)
        s = row.successes * scale
        n = s + row.failures * scale
        _kadd(sums, SUM_S, s)
        _kadd(sums, SUM_N, n)
        magnitudes[0] += s
        magnitudes[1] += n
    if math.isnan(shift):
        shift = (sums[SUM_S] + sums[SUM_S + 1] + 0.5) / (sums[SUM_N] + sums[SUM_N + 1] + 1.0)
    for i in range(size):
        row = rows[i]
        s = row.successes
        f = row.failures
        last = row.last_step
        k = t - last
        if decay_one:
            seen = s + f >= 1.0
            two = s + f >= 2.0
        else:
            seen = _holds(s, f, 1.0, powers, complete, k) == 1
            two = _holds(s, f, 2.0, powers, complete, k) == 1
        if seen:
            n, r, r2 = _seen_terms(s, f, shift)
            g = (1.0 if decay_one else _frame(powers, last, base)) / n
            counts[COUNT_SEEN] += 1
            _kadd(sums, SUM_R, r)
            _kadd(sums, SUM_R2, r2)
            _kadd(sums, SUM_G, g)
            magnitudes[2] += abs(r)
            magnitudes[3] += r2
            magnitudes[4] += g
            if link and not decay_one:
                _schedule(2 * i, s, f, 1.0, last, k, powers, complete, inv_log, due, events,
                          heads, pool)
        if two:
            counts[COUNT_TWO] += 1
            if link and not decay_one:
                _schedule(2 * i + 1, s, f, 2.0, last, k, powers, complete, inv_log, due,
                          events, heads, pool)
    return shift


@njit(cache=True)
def read_evidence(slots, t, rows, decay_one, powers, complete, out_s, out_f):
    """Decayed (successes, failures) at step ``t``; 0 for unknown slots (-1)."""
    for j in range(slots.size):
        slot = slots[j]
        if slot < 0:
            out_s[j] = 0.0
            out_f[j] = 0.0
        else:
            row = rows[np.uint64(slot)]
            if decay_one:
                out_s[j] = row.successes
                out_f[j] = row.failures
            else:
                scale = _factor(powers, complete, t - row.last_step)
                out_s[j] = row.successes * scale
                out_f[j] = row.failures * scale


@njit(cache=True)
def posterior_means(slots, t, rows, decay_one, powers, complete, alpha0, beta0, lowest, highest,
                    out):
    """``(alpha0 + s) / ((alpha0 + s) + (beta0 + f))`` held inside [lowest, highest]."""
    for j in range(slots.size):
        slot = slots[j]
        if slot < 0:
            s = 0.0
            f = 0.0
        else:
            row = rows[np.uint64(slot)]
            if decay_one:
                s = row.successes
                f = row.failures
            else:
                scale = _factor(powers, complete, t - row.last_step)
                s = row.successes * scale
                f = row.failures * scale
        alpha = alpha0 + s
        mean = alpha / (alpha + (beta0 + f))
        # np.clip's order: the lower bound first, then the upper one.
        if mean < lowest:
            mean = lowest
        if mean > highest:
            mean = highest
        out[j] = mean
