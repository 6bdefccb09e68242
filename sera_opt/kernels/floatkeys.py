"""Order-preserving integer keys of floats (numba kernels).

A float's bit pattern, with the sign bit flipped into two's-complement order, sorts
like the float itself; the bracket searches key their ends this way so that
"strictly above" and "the next float below" are integer operations.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit

_INF = np.inf

_SIGN_FLIP = np.int64(0x7FFFFFFFFFFFFFFF)


@njit(cache=True, error_model="numpy")
def float_key(x, fbuf, ibuf):
    """Monotone map of a float64 (not NaN) to int64: x < y iff key(x) < key(y).

    ``fbuf`` and ``ibuf`` are one float64 and its int64 view (a bit cast).
    """
    fbuf[0] = x
    b = ibuf[0]
    if b < 0:
        b = b ^ _SIGN_FLIP
    return b


@njit(cache=True, error_model="numpy")
def float_unkey(k, fbuf, ibuf):
    b = k
    if b < 0:
        b = b ^ _SIGN_FLIP
    ibuf[0] = b
    return fbuf[0]


@njit(cache=True, error_model="numpy")
def float_key_below(x, fbuf, ibuf):
    """Key of the largest float numerically below ``x`` (not NaN, above -inf).

    Not ``float_key(x) - 1``: below ``0.0`` that is ``-0.0``, which equals ``0.0``, so a
    bracket end put there would not lie below a gain of 0.
    """
    return float_key(np.nextafter(x, -_INF), fbuf, ibuf)


@njit(cache=True, error_model="numpy", inline="always")
def counts_from(src, out):
    """A copy of ``src`` as the counts returned: in ``out`` when it has ``src``'s length
    (memory from numpy, see :func:`solve`), else a new array."""
    if out.shape[0] != src.shape[0]:
        return src.copy()
    for i in range(src.shape[0]):  # not ``out[:] = src``: see closed._closed_ends
        out[i] = src[i]
    return out
