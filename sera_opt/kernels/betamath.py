"""Beta-posterior and alpha-fair mathematics of the gain kernels (numba kernels): log
Beta moments, log-gamma differences, block logs and exps, and the alpha-fair gains
and their first guesses.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from .kinds import PRODUCT_MAX
from .rates import split_mantissas

_INF = np.inf

LOG_BLOCK = 256


_SQRT2 = 1.4142135623730951


_LN2 = 0.6931471805599453


@njit(cache=True, error_model="numpy")
def approx_logs(vals, n, scratch):
    """Replace ``vals[:n]`` by an approximation of their logs, for guesses only: within
    1e-9 (absolute) of ``log`` for positive normal floats; other inputs (0, subnormals,
    inf, NaN) give some value, finite or not, that a guess may take.

    ``log x = e log 2 + log m`` with ``x = m 2^e``, ``m`` in ``[1/sqrt 2, sqrt 2)``, and
    ``log m = 2 atanh t``, ``t = (m - 1) / (m + 1)``, ``|t| < 0.172``, to the ``t^9``
    term (the rest is below ``2 t^11 / (11 (1 - t^2)) < 1e-9``). The exponent and the
    mantissa come from the float's bits (:func:`~sera_opt.kernels.rates.split_mantissas`, shared
    with the rates pass, whose log is full precision), so the loops hold no call and
    vectorize.
    """
    split_mantissas(vals, scratch, n)
    for j in range(n):
        mant = vals[j]
        e = scratch[j]
        if mant > _SQRT2:
            mant *= 0.5
            e += 1.0
        t = (mant - 1.0) / (mant + 1.0)
        t2 = t * t
        vals[j] = e * _LN2 + 2.0 * t * (1.0 + t2 * (1.0 / 3.0 + t2 * (
            0.2 + t2 * (1.0 / 7.0 + t2 * (1.0 / 9.0)))))


_LOG2E = 1.4426950408889634


EXP_MAX = 700.0


@njit(cache=True, error_model="numpy")
def approx_exps(vals, n, scratch):
    """Replace ``vals[:n]`` (each within ``[-EXP_MAX, EXP_MAX]``) by an approximation of
    their exponentials, for guesses only: within 1e-10 (relative) of ``exp``.

    ``exp x = 2^j 2^f`` with ``j = floor(x log2 e)``, ``2^f = exp(u)``, ``u = f log 2`` in
    ``[0, log 2)``, to the ``u^11`` term (the rest is below ``u^12 / 12! < 3e-11``); ``2^j``
    is written into the float's exponent bits, so the loops hold no call and vectorize.
    """
    bits = scratch.view(np.int64)
    for j in range(n):
        y = vals[j] * _LOG2E
        whole = math.floor(y)
        bits[j] = (np.int64(whole) + 1023) << 52
        vals[j] = (y - whole) * _LN2
    for j in range(n):
        u = vals[j]
        poly = 1.0 + u * (1.0 + u * (1.0 / 2.0 + u * (1.0 / 6.0 + u * (1.0 / 24.0 + u * (
            1.0 / 120.0 + u * (1.0 / 720.0 + u * (1.0 / 5040.0 + u * (1.0 / 40320.0 + u * (
                1.0 / 362880.0 + u * (1.0 / 3628800.0 + u * (1.0 / 39916800.0)))))))))))
        vals[j] = poly * scratch[j]


@njit(cache=True, error_model="numpy")
def log_beta_moment(a, b, lgamma_ratio, m):
    """``log E[(1 - p)^m]`` for ``p ~ Beta(a, b)``, ``a, b > 0``, ``m >= 0``.

    Up to ``PRODUCT_MAX`` the product of ratios ``(b + j) / (a + b + j)``:
    accurate to a few ulps (a log-gamma difference loses digits to
    cancellation), so that values equal in exact arithmetic come out equal to
    about 1e-15, and cheaper than two log-gammas for small ``m``. Beyond, the
    log-gamma difference (``lgamma_ratio = lgamma(a + b) - lgamma(b)``).
    """
    if m <= PRODUCT_MAX:
        acc, q = ratio_product(a, b, m)
        return acc + math.log(q)
    return lgamma_ratio + lgamma_diff(b + m, a)


@njit(cache=True, error_model="numpy", inline="always")
def ratio_step(a, b, j, acc, q):
    """The product of ratios of :func:`log_beta_moment` times ``(b + j) / (a + b + j)``,
    as ``(acc, q)``: the log of what was rescaled away, and the rest (rescaled below
    1e-280 so that it never underflows)."""
    q *= (b + j) / (a + b + j)
    if q < 1e-280:
        acc += math.log(q)
        q = 1.0
    return acc, q


@njit(cache=True, error_model="numpy", inline="always")
def ratio_product(a, b, m):
    """``prod_{j < m} (b + j) / (a + b + j)`` as :func:`ratio_step`'s ``(acc, q)``. Every
    product of ratios goes through these two, so that products to the same ``m`` are the
    same sequence of operations, bit for bit."""
    acc = 0.0
    q = 1.0
    for j in range(m):
        acc, q = ratio_step(a, b, j, acc, q)
    return acc, q


# From this argument on, lgamma(x) - lgamma(x + a) is formed from Stirling's series:
# the two log-gammas (of order x log x) cancel to an absolute error of ulp(x log x)
# (relative 1e-13 at x = 1e3, 1e-9 at 1e7, and above 1 beyond 1e14, where it
# breaks the rows' monotonicity); the series is accurate to 1e-16 from here on.
_STIRLING_FROM = 1e3


@njit(cache=True, error_model="numpy")
def lgamma_diff(x, a):
    """``lgamma(x) - lgamma(x + a)`` for ``x > 0``, ``a >= 0``, accurate for large ``x``.

    Stirling: ``lgamma(z) = (z - 1/2) log z - z + log(2 pi) / 2 + 1 / (12 z) -
    1 / (360 z^3) + ...``; writing ``log(x + a) = log x + log1p(a / x)`` removes the
    cancellation: ``-a log x - (x + a - 1/2) log1p(a / x) + a`` plus the
    difference of the ``1 / (12 z) - 1 / (360 z^3)`` terms, with a truncation error
    below ``1 / (1260 x^5)``.
    """
    if x < _STIRLING_FROM:
        return math.lgamma(x) - math.lgamma(x + a)
    y = x + a
    tail = (1.0 / x - 1.0 / y) / 12.0 - (1.0 / (x * x * x) - 1.0 / (y * y * y)) / 360.0
    return -a * math.log(x) - (x + a - 0.5) * math.log1p(a / x) + a + tail


@njit(cache=True, error_model="numpy")
def _log1mexp(y):
    """``log(1 - exp(-y))`` for ``y > 0``, accurate for small and large ``y``
    (the two-branch rule of Maechler, "Accurately computing log(1 - exp(-|a|))")."""
    if y <= 0.6931471805599453:
        return math.log(-math.expm1(-y))
    return math.log1p(-math.exp(-y))


@njit(cache=True, error_model="numpy")
def fair_log_gain(a, logp, alpha, m):
    """A strictly increasing function of the alpha-fair gain ``U(w(m + 1)) - U(w(m))``
    of the factor ``w(m) = 1 - exp(-a m)`` after ``m`` effective rollouts: its log,
    except at ``alpha = 1`` (below).

    With ``w0 = w(m)``, ``w(m + 1) - w0 = p exp(-a m)`` exactly, so the ratio
    ``r = (w(m + 1) - w0) / w0`` has ``log r = log p - a m - log w0`` and the gain is
    ``w0^(1 - alpha) expm1((1 - alpha) log1p(r)) / (1 - alpha)``. Its log is
    formed without any power of ``w0``, so a large ``alpha`` neither overflows nor
    turns distinct gains into ties, and ``log r`` is kept in log space, so solved
    prompts (``r`` far below the smallest float) keep distinct gains.

    * ``alpha = 0``: ``log(p (1 - p)^m) = log p - a m`` (linear in ``m``);
    * ``alpha = 1``: the gain ``log1p(r)`` is increasing in ``r``, so ``log r`` is
      returned: it orders (and ties) steps exactly as the gain does;
    * ``alpha = 2``: ``log(1/w0 - 1/w(m + 1)) = log r - log w0 - log1p(r)``.

    Edges (docs/theory.md section 8): ``p = 0`` (``a = 0``) has ``w = 0`` at every
    count and gains nothing (``-inf``); ``p = 1`` (``a = inf``) has ``w = 1``
    from its first effective rollout on. The first effective rollout (``m =
    0``) is worth ``+inf`` for ``alpha >= 1`` (``U(0) = -inf``).
    """
    if a == 0.0 or m < 0:
        return -_INF
    if alpha == 0.0:
        if a == _INF:
            return logp if m == 0 else -_INF
        return logp - a * m
    if m == 0:
        if alpha >= 1.0:
            return _INF
        # U(w(1)) - U(0) = p^(1 - alpha) / (1 - alpha)
        return (1.0 - alpha) * logp - math.log(1.0 - alpha)
    if a == _INF:
        return -_INF
    y = a * m
    log_w0 = _log1mexp(y)
    log_r = logp - y - log_w0
    if alpha == 1.0:
        return log_r
    # log1p(r) = r (1 - r / 2 + ...); below exp(-40) the correction is under 1e-17.
    d = math.exp(log_r)
    if log_r > -40.0:
        d = math.log1p(d)
    if alpha == 2.0:
        return log_r - log_w0 - d
    t = (1.0 - alpha) * d
    if t == 0.0:
        # expm1(t) / (1 - alpha) = d to first order, and d underflowed: log d = log r.
        return (1.0 - alpha) * log_w0 + log_r
    return (1.0 - alpha) * log_w0 + math.log(math.expm1(t) / (1.0 - alpha))


@njit(cache=True, error_model="numpy")
def softplus(t):
    """``log(1 + exp(t))`` without overflow or loss of small values."""
    if t > 36.0:
        return t + math.exp(-t)
    if t < -36.0:
        return math.exp(t)
    return math.log1p(math.exp(t))


@njit(cache=True, error_model="numpy")
def fair_guess(a, logp, alpha, c, lam):
    """The ``m`` (as ``c + m``) where the alpha-fair step's gain crosses ``lam``.

    Exact for ``alpha = 0`` (``log p - a m = lam``) and ``alpha = 1`` (``log r(m) =
    log p + logit(exp(-a m)) = lam``, so ``a m = softplus(log p - lam)``). Other
    ``alpha``: the midpoint rule ``gain(m) ~ U'(w(m + 1/2)) p exp(-a m)`` gives, in
    ``u = exp(-a (m + 1/2))``, ``log u - alpha log(1 - u) = lam - log p - a / 2``,
    solved in closed form at ``alpha = 2`` and by Newton steps on ``logit(u)``
    otherwise; it lands within one step of the crossing.
    """
    if a == 0.0:
        return -_INF
    if a == _INF:
        return c + 1.0
    z = lam - logp
    if alpha == 0.0:
        return c - z / a
    if alpha == 1.0:
        return c + softplus(-z) / a
    zeta = z - 0.5 * a
    if alpha == 2.0:
        # u / (1 - u)^2 = E: u = 2E / (2E + 1 + sqrt(4E + 1)).
        if zeta > 700.0:
            return c - 0.5  # u ~ 1 - 1/sqrt(E): essentially no rollout
        big_e = math.exp(zeta)
        u = 2.0 * big_e / (2.0 * big_e + 1.0 + math.sqrt(4.0 * big_e + 1.0))
        if u <= 0.0:
            return c + (-zeta) / a - 0.5
        return c - math.log(u) / a - 0.5
    s = zeta / alpha if zeta > 0.0 else zeta
    for _ in range(4):
        if s > 0.0:
            e = math.exp(-s)
            lp = math.log1p(e)
            log_u = -lp
            log_1mu = -s - lp
            u = 1.0 / (1.0 + e)
        else:
            e = math.exp(s)
            lp = math.log1p(e)
            log_u = s - lp
            log_1mu = -lp
            u = e / (1.0 + e)
        s -= (log_u - alpha * log_1mu - zeta) / ((1.0 - u) + alpha * u)
    return c + softplus(-s) / a - 0.5


@njit(cache=True, error_model="numpy")
def fair_utility(a, alpha, m):
    """``U_alpha(w)`` at ``w = 1 - exp(-a m)``; ``-inf`` at ``w = 0`` for ``alpha >= 1``,
    and ``-inf`` too where ``-w^(1 - alpha) / (alpha - 1)`` is below the float range."""
    if a == 0.0 or m <= 0:
        return -_INF if alpha >= 1.0 else 0.0
    log_w = 0.0 if a == _INF else _log1mexp(a * m)
    if alpha == 1.0:
        return log_w
    return math.exp((1.0 - alpha) * log_w) / (1.0 - alpha)
