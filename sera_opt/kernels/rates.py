"""The rate kernel ``a = -log(1 - p)``: one compiled pass, with the count of rates that
are 0 and infinite (numba kernels; the bottom of the data path, which
:mod:`sera_opt.problem` imports).
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np

from .._jit import njit


# log 2 in two parts: _LN2_HI keeps 37 significant bits, so that e * _LN2_HI is exact
# for every exponent e of a float, and _LN2_LO is the rest (from a 60-digit log 2).
def _split_ln2() -> tuple[float, float]:
    with localcontext() as ctx:
        ctx.prec = 60
        ln2 = Decimal(2).ln()
    bits = np.array([float(ln2)]).view(np.int64) & ~np.int64((1 << 16) - 1)
    hi = float(bits.view(np.float64)[0])
    return hi, float(ln2 - Decimal(hi))


_LN2_HI, _LN2_LO = _split_ln2()


_SQRT2 = math.sqrt(2.0)


# 2 / (2k + 1), k = 1 .. 10: log(1 + f) = 2 atanh(s) = 2s + s R(s^2), R(z) = sum_k C_k z^k.
(_C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10) = (2.0 / (2 * k + 1) for k in range(1, 11))


_RATE_BLOCK = 256


@njit(cache=True, inline="always", error_model="numpy")
def block_logs(w, e, n):
    """``w[:n] = log(w[:n] 2^e[:n])`` for mantissas ``w`` in ``[1, 2)`` and exponents ``e``
    (floats), within an ulp. No call and no branch, so the loop vectorizes.

    The mantissa is brought into ``[1/sqrt 2, sqrt 2)`` (``f = m - 1`` is then exact),
    ``s = f / (2 + f)`` (``|s| < 0.1716``) and ``log(1 + f) = f - (f^2/2 - s (f^2/2 +
    R))``: the series ``R`` of ``2 atanh s - 2 s`` to the ``s^21`` term (what is left is
    below ``s^23 < 1e-18`` relative) only enters a correction at most a fifth of the
    result, whose leading term ``f`` is exact; ``e log 2`` is added in two parts.
    """
    for j in range(n):
        m = w[j]
        k = e[j]
        big = m > _SQRT2
        m = m * 0.5 if big else m
        k = k + 1.0 if big else k
        f = m - 1.0
        sv = f / (2.0 + f)
        z = sv * sv
        r = z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * (_C6 + z * (
            _C7 + z * (_C8 + z * (_C9 + z * _C10)))))))))
        half_sq = 0.5 * f * f
        w[j] = k * _LN2_HI - ((half_sq - (sv * (half_sq + r) + k * _LN2_LO)) - f)


@njit(cache=True, inline="always", error_model="numpy")
def split_mantissas(vals, exps, n):
    """``vals[:n] = m`` and ``exps[:n] = e`` (floats) with ``vals = m 2^e``, ``m`` in ``[1, 2)``,
    for positive normal floats, read from the float's bits (no call, so the loop
    vectorizes); other inputs give some pair."""
    bits = vals.view(np.int64)
    for j in range(n):
        b = bits[j]
        bits[j] = (b & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000
        exps[j] = ((b >> 52) & 0x7FF) - 1023


@njit(cache=True, error_model="numpy")
def rates_from_probs(p, out):
    """``out = -log(1 - p)`` (Goldberg's form of ``log1p``: ``p log(w) / (w - 1)`` with
    ``w = fl(1 - p)``, and ``p`` where ``w`` rounds to 1): within 2 ulp of the exact
    value, as ``log1p`` is within one.

    One pass, in blocks whose loops hold no call (the log is :func:`block_logs`) and
    vectorize. Returns the numbers of prompts with rate 0 (``p = 0``) and rate inf (``p
    = 1``), and of values that are not probabilities (NaN or outside [0, 1]; their rates
    are meaningless).
    """
    zeros, infs, bad, _, _, _ = rates_pass(p, out, False)
    return zeros, infs, bad


@njit(cache=True, error_model="numpy")
def rates_pass(p, out, extremes):
    """:func:`rates_from_probs`, and with ``extremes`` also the smallest and largest
    rate and ``sum 1 / rate`` (what :func:`level_extremes` needs under scalar bounds; summed
    in four interleaved parts, the same on every machine)."""
    n = p.shape[0]
    logs = np.empty(_RATE_BLOCK, dtype=np.float64)
    exps = np.empty(_RATE_BLOCK, dtype=np.float64)
    zeros = 0
    infs = 0
    bad = 0
    a_min = np.inf
    a_max = -np.inf
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for s in range(0, n, _RATE_BLOCK):
        size = min(_RATE_BLOCK, n - s)
        x_blk = p[s:s + size]
        a_blk = out[s:s + size]
        for t in range(size):
            x = x_blk[t]
            bad += not (0.0 <= x <= 1.0)
            zeros += x == 0.0
            w = 1.0 - x
            infs += w == 0.0
            logs[t] = w
        split_mantissas(logs, exps, size)
        block_logs(logs, exps, size)
        for t in range(size):
            x = x_blk[t]
            w = 1.0 - x
            d = w - 1.0
            a = x * logs[t] / d
            a = x if d == 0.0 else a
            a_blk[t] = np.inf if w == 0.0 else a
        if extremes:
            for t in range(size):
                a = a_blk[t]
                a_min = a if a < a_min else a_min
                a_max = a if a > a_max else a_max
            # Prompt i adds to part i % 4 (blocks start at multiples of 4).
            whole = size & ~3
            for t in range(0, whole, 4):
                s0 += 1.0 / a_blk[t]
                s1 += 1.0 / a_blk[t + 1]
                s2 += 1.0 / a_blk[t + 2]
                s3 += 1.0 / a_blk[t + 3]
            if whole < size:
                s0 += 1.0 / a_blk[whole]
            if whole + 1 < size:
                s1 += 1.0 / a_blk[whole + 1]
            if whole + 2 < size:
                s2 += 1.0 / a_blk[whole + 2]
    return zeros, infs, bad, a_min, a_max, (s0 + s1) + (s2 + s3)
