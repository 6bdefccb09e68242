"""numba kernels of the prompt-id index (:mod:`.index`). Imported lazily: this module
loads numba.

Open-addressing hash tables with linear probing for sparse int64 ids and for strings
(matched on their code points, exactly), and the direct id -> slot table for dataset
indices. Slots are int64; ``-1`` means "unknown id".
"""

from __future__ import annotations

import numpy as np

from .._jit import njit

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
