"""numba kernels of the success tracker. Imported lazily: this module loads numba.

Two families:

* prompt-id index (``_prompt_index``): open-addressing hash tables with linear
  probing for sparse int64 ids and for strings (matched on their code points,
  exactly), and the direct id -> slot table for dataset indices;
* Beta evidence (``_beta_evidence``): the per-rollout update with lazy decay,
  the reads, and the moments of the fitted prior kept incrementally, with
  per-prompt expiry events when evidence decays below the fit's thresholds.

Conventions shared with the Python side: slots are int64, ``-1`` means
"unknown id"; decay factors ``decay ** k`` are read from a table computed by
numpy (``powers[k]``), so every factor is bit-identical to the one numpy's
``decay ** k`` gives; past the end of a *complete* table (one that reached 0)
the factor is 0.
"""

from __future__ import annotations

import math

import numpy as np
from ._jit import njit

# ---------------------------------------------------------------------------- hashing

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_U1 = np.uint64(1)
_U2 = np.uint64(2)
# Ids handled per block by the lookups (see str_lookup).
_BLOCK = 256


@njit(cache=True, inline="always")
def _mix64(x):
    # splitmix64's finalizer: every input bit reaches every output bit, so
    # structured ids (arange * stride, small offsets) spread over the table.
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@njit(cache=True)
def int_hash_lookup(table, ids, out):
    """Slots of ``ids`` in an interleaved (key, slot) table; -1 where absent.

    In blocks: the table lines of a block are touched first (independent
    loads whose misses overlap), then probed in cache. Returns (number
    absent, a value of no meaning).
    """
    mask = np.uint64((table.size >> 1) - 1)
    n = ids.size
    # Unsigned positions: numba then emits no test-and-fix for negative indices.
    start = np.empty(_BLOCK, dtype=np.uint64)
    missing = 0
    touch = np.int64(0)
    for b0 in range(0, n, _BLOCK):
        b1 = min(n, b0 + _BLOCK)
        for j in range(b0, b1):
            h = _mix64(np.uint64(ids[j])) & mask
            start[j - b0] = h
            touch ^= table[_U2 * h + _U1]
        for j in range(b0, b1):
            key = ids[j]
            h = start[j - b0]
            while True:
                slot = table[_U2 * h + _U1]
                if slot < 0:
                    out[j] = -1
                    missing += 1
                    break
                if table[_U2 * h] == key:
                    out[j] = slot
                    break
                h = (h + _U1) & mask
    return missing, touch


@njit(cache=True, inline="always")
def _int_hash_put(table, mask, key, slot):
    h = _mix64(np.uint64(key)) & mask
    while table[_U2 * h + _U1] >= 0:
        if table[_U2 * h] == key:
            return table[_U2 * h + _U1]
        h = (h + _U1) & mask
    table[_U2 * h] = key
    table[_U2 * h + _U1] = slot
    return slot


@njit(cache=True)
def int_hash_insert(table, keys, size, ids, slots):
    """Give the ids whose slot is -1 a slot (first occurrence order); returns the new size.

    The caller guarantees capacity: ``keys`` and the table (load <= 1/2) hold
    ``size`` plus every missing id.
    """
    mask = np.uint64((table.size >> 1) - 1)
    for j in range(ids.size):
        if slots[j] >= 0:
            continue
        slot = _int_hash_put(table, mask, ids[j], size)
        if slot == size:
            keys[size] = ids[j]
            size += 1
        slots[j] = slot
    return size


@njit(cache=True)
def int_hash_build(table, keys, size):
    """Fill an empty table with ``keys[:size]`` (slot = position)."""
    mask = np.uint64((table.size >> 1) - 1)
    for i in range(size):
        _int_hash_put(table, mask, keys[i], i)


@njit(cache=True)
def first_outside(ids, n):
    """Position of the first id outside ``0..n-1``, or -1."""
    for j in range(ids.size):
        if ids[j] < 0 or ids[j] >= n:
            return j
    return -1


@njit(cache=True)
def direct_lookup(table, ids, out):
    """Slots from a direct id -> slot table; -1 for absent or out-of-range ids.

    Returns (number absent, smallest id, largest id).
    """
    missing = 0
    lo = np.int64(0)
    hi = np.int64(-1)
    n = table.size
    for j in range(ids.size):
        key = ids[j]
        if j == 0 or key < lo:
            lo = key
        if j == 0 or key > hi:
            hi = key
        slot = table[np.uint64(key)] if 0 <= key < n else -1
        out[j] = slot
        if slot < 0:
            missing += 1
    return missing, lo, hi


@njit(cache=True)
def direct_insert(table, keys, size, ids, slots):
    """Direct-table counterpart of :func:`int_hash_insert` (ids within the table)."""
    for j in range(ids.size):
        if slots[j] >= 0:
            continue
        key = ids[j]
        slot = table[key]
        if slot < 0:
            slot = size
            table[key] = slot
            keys[size] = key
            size += 1
        slots[j] = slot
    return size


@njit(cache=True, inline="always")
def _row_length(rows, j):
    # numpy pads fixed-width strings with NUL code points: the id ends at the
    # last non-NUL one (numpy's own string semantics).
    w = rows.shape[1]
    while w > 0 and rows[j, w - 1] == 0:
        w -= 1
    return w


@njit(cache=True, inline="always")
def _row_hash(rows, j, length):
    h = _FNV_OFFSET
    for w in range(length):
        h = (h ^ np.uint64(rows[j, w])) * _FNV_PRIME
    return _mix64(h ^ np.uint64(length))


@njit(cache=True, inline="always")
def _row_equals(rows, j, length, buf, start, stop):
    if stop - start != length:
        return False
    for w in range(length):
        if rows[j, w] != buf[start + w]:
            return False
    return True


@njit(cache=True)
def str_lookup(table, offsets, buf, rows, out, lengths):
    """Slots of the strings ``rows`` (code points, one id per row); -1 where absent.

    ``table`` interleaves (hash, slot) pairs (slot -1: empty). Each id is
    matched on its hash and then on every code point, so distinct ids never
    share a slot. Every access is a likely cache miss and each depends on the
    previous one (table, then offsets, then code points), so ids are handled
    in blocks, one short loop per access: the misses of a block overlap, and
    the comparison finds its code points in cache. Writes each row's length;
    returns (number absent, a value of no meaning).
    """
    mask = np.uint64((table.size >> 1) - 1)
    n = rows.shape[0]
    hashes = np.empty(_BLOCK, dtype=np.uint64)
    probe = np.empty(_BLOCK, dtype=np.int64)
    start = np.empty(_BLOCK, dtype=np.int64)
    stop = np.empty(_BLOCK, dtype=np.int64)
    missing = 0
    touch = np.uint32(0)
    for b0 in range(0, n, _BLOCK):
        b1 = min(n, b0 + _BLOCK)
        for j in range(b0, b1):
            length = _row_length(rows, j)
            lengths[j] = length
            hashes[j - b0] = _row_hash(rows, j, length)
        for j in range(b0, b1):
            touch ^= np.uint32(table[2 * np.int64(hashes[j - b0] & mask)] & 1)
        for j in range(b0, b1):
            hv = hashes[j - b0]
            key = np.int64(hv)
            h = np.int64(hv & mask)
            while table[2 * h + 1] >= 0 and table[2 * h] != key:
                h = np.int64((np.uint64(h) + np.uint64(1)) & mask)
            probe[j - b0] = h
        for j in range(b0, b1):
            slot = table[2 * probe[j - b0] + 1]
            if slot >= 0:
                start[j - b0] = offsets[slot]
                stop[j - b0] = offsets[slot + 1]
        for j in range(b0, b1):
            if table[2 * probe[j - b0] + 1] >= 0 and stop[j - b0] > start[j - b0]:
                touch ^= buf[start[j - b0]]
        for j in range(b0, b1):
            h = probe[j - b0]
            slot = table[2 * h + 1]
            if slot >= 0 and not _row_equals(rows, j, lengths[j], buf, start[j - b0],
                                             stop[j - b0]):
                # Two ids share the 64-bit hash: keep probing with full comparisons.
                key = table[2 * h]
                while True:
                    h = np.int64((np.uint64(h) + np.uint64(1)) & mask)
                    slot = table[2 * h + 1]
                    if slot < 0 or (table[2 * h] == key and _row_equals(
                            rows, j, lengths[j], buf, offsets[slot], offsets[slot + 1])):
                        break
            out[j] = slot
            if slot < 0:
                missing += 1
    # The touches only warm the cache; returning them keeps them from being optimized away.
    return missing, touch


@njit(cache=True)
def str_insert(table, offsets, buf, size, rows, lengths, slots):
    """Give the rows whose slot is -1 a slot (first occurrence order); returns the new size.

    The caller guarantees capacity of the table (load <= 1/2), ``offsets`` and
    ``buf`` (the code points of every missing row).
    """
    mask = np.uint64((table.size >> 1) - 1)
    for j in range(rows.shape[0]):
        if slots[j] >= 0:
            continue
        length = lengths[j]
        hv = _row_hash(rows, j, length)
        key = np.int64(hv)
        h = np.int64(hv & mask)
        slot = -1
        while table[2 * h + 1] >= 0:
            cand = table[2 * h + 1]
            if table[2 * h] == key and _row_equals(rows, j, length, buf, offsets[cand],
                                                   offsets[cand + 1]):
                slot = cand
                break
            h = np.int64((np.uint64(h) + np.uint64(1)) & mask)
        if slot < 0:
            slot = size
            table[2 * h] = key
            table[2 * h + 1] = slot
            start = offsets[slot]
            for w in range(length):
                buf[start + w] = rows[j, w]
            offsets[slot + 1] = start + length
            size += 1
        slots[j] = slot
    return size


@njit(cache=True)
def str_rehash(old, table):
    """Move every (hash, slot) entry of ``old`` into the empty, larger ``table``."""
    mask = np.uint64((table.size >> 1) - 1)
    for e in range(old.size >> 1):
        if old[2 * e + 1] < 0:
            continue
        h = np.int64(np.uint64(old[2 * e]) & mask)
        while table[2 * h + 1] >= 0:
            h = np.int64((np.uint64(h) + np.uint64(1)) & mask)
        table[2 * h] = old[2 * e]
        table[2 * h + 1] = old[2 * e + 1]


@njit(cache=True)
def str_build(table, offsets, buf, size):
    """Fill an empty string table with the stored ids ``0..size-1`` (the lookup's hash)."""
    mask = np.uint64((table.size >> 1) - 1)
    for i in range(size):
        h = _FNV_OFFSET
        start = offsets[i]
        length = offsets[i + 1] - start
        for w in range(length):
            h = (h ^ np.uint64(buf[start + w])) * _FNV_PRIME
        hv = _mix64(h ^ np.uint64(length))
        e = np.int64(hv & mask)
        while table[2 * e + 1] >= 0:
            e = np.int64((np.uint64(e) + np.uint64(1)) & mask)
        table[2 * e] = np.int64(hv)
        table[2 * e + 1] = i


@njit(cache=True)
def str_unpack(offsets, buf, size, width, out):
    """The stored ids as fixed-width code-point rows (``out``: (size, width), zeroed)."""
    for i in range(size):
        start = offsets[i]
        for w in range(offsets[i + 1] - start):
            out[i, w] = buf[start + w]


@njit(cache=True)
def str_pack(rows, lengths, offsets, buf):
    """Concatenate rows of code points (``lengths[i]`` each) into ``buf`` / ``offsets``."""
    pos = 0
    for i in range(rows.shape[0]):
        offsets[i] = pos
        for w in range(lengths[i]):
            buf[pos + w] = rows[i, w]
        pos += lengths[i]
    offsets[rows.shape[0]] = pos


@njit(cache=True)
def row_lengths(rows, out):
    for j in range(rows.shape[0]):
        out[j] = _row_length(rows, j)


# ---------------------------------------------------------------------------- evidence

# Layout of the fit's float accumulators (Neumaier pairs: value, compensation).
SUM_S = 0  # decayed successes over all prompts
SUM_N = 2  # decayed rollouts over all prompts
SUM_R = 4  # sum of (r_i - shift) over prompts with n_i >= 1, r_i = s_i / n_i
SUM_R2 = 6  # sum of (r_i - shift)^2 over the same prompts
SUM_G = 8  # sum of phi_i / n_i over the same prompts (1 / n_i in the base step's frame)
NUM_SUMS = 10
# Integer counters.
COUNT_SEEN = 0  # prompts with n_i >= 1 now
COUNT_TWO = 1  # prompts with n_i >= 2 now
NOT_LINKED = -1
# Rows of the evidence table: _beta_evidence.ROW (successes, failures,
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


@njit(cache=True)
def update_evidence(slots, wins, t, size, rows, touched, decay, decay_one, powers, complete,
                    inv_log, fit, sums, counts, base, shift, due, events, heads, pool):
    """One update at step ``t``: decay, accumulate the batch, keep the fit's moments.

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
    """
    if not decay_one:
        sums[SUM_S] *= decay
        sums[SUM_S + 1] *= decay
        sums[SUM_N] *= decay
        sums[SUM_N + 1] *= decay
        if fit:
            _expire(t, rows, powers, complete, inv_log, sums, counts, base, shift, due, events,
                    heads, pool)
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
            if fit and not decay_one:
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
            if not decay_one:
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
    phi = 1.0 if decay_one else _frame(powers, t, base)
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
        if fit and decay_one and s + f >= 1.0:
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
            if not decay_one:
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
