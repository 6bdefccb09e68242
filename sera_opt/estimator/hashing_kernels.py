"""numba kernels of the sparse-id hashing rounds on CPU, and of the histogram of their
codes. Imported lazily: this module loads numba.

They compute exactly what the torch ops of :mod:`.hashing` compute
(the same multipliers, buckets, table layout, ranks and loser order; see
there), in three passes over a round's rollouts (scatter, gather, finish)
without the temporaries that separate torch ops need. A round after the first
reads its losers' ids and outcomes as compact arrays (gathered once through their
indices for the second round, written by the previous round's finishing pass for
later ones), so its scatter and gather read them in order, and writes their codes in
place through ``rows``. No loop has
data-dependent control flow or a loop-carried dependence on a table read, so
the random accesses of consecutive rollouts overlap.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(cache=True, nogil=True)
def scatter_round(ids, multiplier, bits, table):  # pragma: no cover - compiled
    """``table[bucket(id)] = z(id)`` for the round's ids, the last one winning; -1 before."""
    shift = np.uint64(64 - bits)
    up = np.uint64(bits)
    for i in range(ids.shape[0]):
        y = np.uint64(ids[i]) * multiplier
        table[y >> shift] = np.int64(y << up)


@njit(cache=True, nogil=True)
def rank_round(table, bits):  # pragma: no cover - compiled
    """Number the occupied buckets in bucket order (rank in the low bits); return the count."""
    mask = (np.int64(1) << bits) - 1
    rank = 0
    for b in range(table.shape[0]):
        # Branch-free (occupancy is random): an empty entry stays -1 | 0.
        is_occupied = np.int64((table[b] & mask) == 0)
        table[b] |= rank * is_occupied
        rank += is_occupied
    return rank


@njit(cache=True, nogil=True)
def gather_round(ids, multiplier, bits, table, found):  # pragma: no cover - compiled
    """``found[i] = table[bucket(id)] ^ z(id)`` for the round's i-th id: the rank of its
    bucket if the id won it, else a value with high bits set.

    Kept apart from :func:`finish_round`: a loop this short keeps many more
    independent table reads in flight than one that also does the arithmetic. The
    XOR is the exception: it saves the finishing pass a read of the ids.
    """
    shift = np.uint64(64 - bits)
    up = np.uint64(bits)
    for i in range(found.shape[0]):
        y = np.uint64(ids[i]) * multiplier
        found[i] = table[y >> shift] ^ np.int64(y << up)


@njit(cache=True, nogil=True)
def finish_round(ids, success, rows, subset, bits, found, first_slot, codes, lost_ids,
                 lost_success):  # pragma: no cover - compiled
    """Codes ``2 * (first_slot + rank) + success`` of the winners; the losers' rollout
    indices, in order, into the front of ``found``, and their ids and outcomes into the
    fronts of ``lost_ids`` and ``lost_success`` (the next round's compact input). Returns
    the number of losers. Empty ``lost_ids`` and ``lost_success`` ask for the indices
    only (and then the ids are not read).

    ``ids`` and ``success`` are the round's own, in order: every rollout's (the first
    round) or the previous round's losers' (``subset``, with ``rows`` their rollout
    indices, where their codes are written). ``found[i]``, from :func:`gather_round`, is
    the rank of the winner's bucket when the id won it, else a value with high bits
    set. The losers' codes are left as garbage for the next round. Each loser is
    written at or before the entry just read, and unconditionally (the count moves by 0
    or 1), so the loop has no data-dependent branch and needs no flags array or second
    pass. Indices are unsigned: numba then emits no test for negative (wrapped) ones.
    """
    up = np.uint64(bits)
    keep = lost_ids.shape[0] > 0
    num_lost = np.uint64(0)
    for i in range(found.shape[0]):
        j = np.uint64(rows[i]) if subset else np.uint64(i)
        s = success[i]
        rank = np.uint64(found[i])
        bad = np.uint64((rank >> up) != 0)
        codes[j] = 2 * (first_slot + np.int64(rank)) + s
        found[num_lost] = np.int64(j)
        if keep:
            lost_ids[num_lost] = ids[i]
            lost_success[num_lost] = s
        num_lost += bad
    return np.int64(num_lost)


@njit(cache=True, nogil=True)
def take_rows(ids, success, rows, taken_ids, taken_success):  # pragma: no cover - compiled
    """``taken_ids[i] = ids[rows[i]]`` and ``taken_success[i] = success[rows[i]]``."""
    for i in range(rows.shape[0]):
        j = np.uint64(rows[i])
        taken_ids[i] = ids[j]
        taken_success[i] = success[j]


@njit(cache=True, nogil=True)
def histogram(codes, table):  # pragma: no cover - compiled
    """``table[c] += 1`` for every code ``c``, with ``table`` a power of two long.

    The rounds' codes lie below ``2 * num_slots`` by construction; the index is
    masked all the same, so that no code, whatever its value, writes outside the
    table. Unlike ``torch.bincount`` this reads the codes once (no pass for their
    minimum and maximum).
    """
    mask = np.uint64(table.shape[0] - 1)
    for i in range(codes.shape[0]):
        table[np.uint64(codes[i]) & mask] += 1
