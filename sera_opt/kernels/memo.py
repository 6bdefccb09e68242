"""The memo of the closed-form engine (:mod:`sera_opt.kernels.closed`): rows with equal
parameters cross a level at the same count, so a pass over the rows looks each one up
before it computes the crossing. Direct-mapped, indexed by the top bits of a
multiplicative hash of the parameters' bits."""

from __future__ import annotations

import numpy as np

from .._jit import njit

__all__ = ["MEMO_SIZE", "memo_entry", "memo_new", "memo_store"]

# The memo of rows with equal parameters (see _closed_count and memo_new): 64
# entries, indexed by the top bits of a multiplicative hash of the parameters' bits.
MEMO_SIZE = 64


MEMO_SHIFT = np.uint64(58)


MIX = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, error_model="numpy", inline="always")
def memo_new():
    """An empty memo of rows with equal parameters (direct-mapped, ``MEMO_SIZE`` entries of
    the parameters' bits, two integers that must also match, and the value stored), and
    the bit-cast buffers its lookups use."""
    fbuf = np.empty(3, dtype=np.float64)
    return np.full((MEMO_SIZE, 6), -1, dtype=np.int64), fbuf, fbuf.view(np.int64)


@njit(cache=True, error_model="numpy", inline="always")
def memo_entry(memo, x0, x1, x2, u, v, fbuf, ibuf):
    """The memo entry of a row's parameters and ``(u, v)``, and the value it holds for them
    (-1 when it holds none, or another row's)."""
    fbuf[0] = x0
    fbuf[1] = x1
    fbuf[2] = x2
    entry = memo[np.int64(((np.uint64(ibuf[0]) ^ (np.uint64(ibuf[1]) * MIX)
                            ^ np.uint64(ibuf[2])) * MIX) >> MEMO_SHIFT)]
    if (entry[0] == ibuf[0] and entry[1] == ibuf[1] and entry[2] == ibuf[2]
            and entry[3] == u and entry[4] == v):
        return entry, entry[5]
    return entry, np.int64(-1)


@njit(cache=True, error_model="numpy", inline="always")
def memo_store(entry, ibuf, u, v, value):
    """Store ``value`` for the parameters whose bits :func:`memo_entry` left in ``ibuf``."""
    entry[0] = ibuf[0]
    entry[1] = ibuf[1]
    entry[2] = ibuf[2]
    entry[3] = u
    entry[4] = v
    entry[5] = value
