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

import math

import numpy as np
from .._jit import njit

from ._waterline_kernels import split_mantissas, take_beyond

# (SERA's own levels a_i (n - c) run on the waterline kernels, _waterline_kernels.py.)
BETA_LEVELS = 1  # max-min of -log E[(1 - p)^(n - c)], Beta      (sera-bayes)
KNAPSACK = 2  # max sum (1 - p^n - (1-p)^n) p (1-p)^2             (Knapsack RL)
HIT_UTILITY = 3  # max sum 1 - E[(1 - p)^n], Beta (log gains)      (HORA)
RLOO_VARIANCE = 4  # min sum a/(n - 1) + gamma log(p) n              (VIP)
INVERSE_COUNT = 5  # min sum W / n                                   (GVM)
POINT_HIT = 6  # max sum 1 - (1 - p)^n, point estimate (log gains)   (HORA, known p)
ALPHA_FAIR = 7  # max sum U_alpha(1 - (1 - p)^(n - c)) (log gains)    (sera-fair)
# The same objective at alpha = 0, 1, 2, where the crossing of a gain value is known in
# closed form (so a count pass evaluates no gain): x0 = a, x1 = log p (alpha = 0) or p.
FAIR_SUM = 8  # alpha = 0: sum of the factors
FAIR_LOG = 9  # alpha = 1: sum of log factors (proportional fairness)
FAIR_INVERSE = 10  # alpha = 2: minus the sum of inverse factors

# Collect the bracket's gains once it holds at most this many (or M / 8).
_COLLECT_MIN = 2048
# Below this many prompts the opening bracket comes from the rows' extremes;
# above it, from a subsample of _SUBSAMPLE rows.
_SUBSAMPLE_FROM = 32768
_SUBSAMPLE = 4096
# The closed-form kinds start from a subsample (one row in sixteen) from this many rows
# on; below, from the rows' extreme gains.
_CLOSED_SUBSAMPLE_FROM = 512
# Newton rounds on the subsample's share, and how far each overshoots the
# observed miss (so the bracket closes from both sides).
_NEWTON_ROUNDS = 4
_OVERSHOOT = 1.25

_INF = np.inf
# Beta levels with at most this many effective rollouts use the exact product.
_PRODUCT_MAX = 64
_SIGN_FLIP = np.int64(0x7FFFFFFFFFFFFFFF)
# The memo of rows with equal parameters (see _closed_count and _memo_new): 64
# entries, indexed by the top bits of a multiplicative hash of the parameters' bits.
_MEMO_SIZE = 64
_MEMO_SHIFT = np.uint64(58)
_MIX = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, error_model="numpy")
def _key(x, fbuf, ibuf):
    """Monotone map of a float64 (not NaN) to int64: x < y iff key(x) < key(y).

    ``fbuf`` and ``ibuf`` are one float64 and its int64 view (a bit cast).
    """
    fbuf[0] = x
    b = ibuf[0]
    if b < 0:
        b = b ^ _SIGN_FLIP
    return b


@njit(cache=True, error_model="numpy")
def _unkey(k, fbuf, ibuf):
    b = k
    if b < 0:
        b = b ^ _SIGN_FLIP
    ibuf[0] = b
    return fbuf[0]


@njit(cache=True, error_model="numpy")
def _key_below(x, fbuf, ibuf):
    """Key of the largest float numerically below ``x`` (not NaN, above -inf).

    Not ``_key(x) - 1``: below ``0.0`` that is ``-0.0``, which equals ``0.0``, so a
    bracket end put there would not lie below a gain of 0.
    """
    return _key(np.nextafter(x, -_INF), fbuf, ibuf)


@njit(cache=True, error_model="numpy", inline="always")
def _counts_from(src, out):
    """A copy of ``src`` as the counts returned: in ``out`` when it has ``src``'s length
    (memory from numpy, see :func:`solve`), else a new array."""
    if out.shape[0] != src.shape[0]:
        return src.copy()
    out[:] = src
    return out


@njit(cache=True, error_model="numpy")
def prepare(kind, p0, p1, p2, exact):
    """Write the third parameter row into ``p2`` and return it: for the Beta kinds the
    log-gamma ratio ``lgamma(alpha + beta) - lgamma(beta)``, plus ``log alpha`` for the hit
    utility (the log of its gains' constant: ``gain(k) = p2 + lgamma(beta + k) -
    lgamma(alpha + beta + k + 1)``); 0 where ``alpha`` or ``beta`` is 0, and for the
    other kinds.

    The Beta kinds' gains read this row only beyond ``_PRODUCT_MAX`` effective rollouts
    (below, they take the product of ratios); below, only the guess of a count pass reads
    it. Without ``exact`` the log-gamma ratio is the guess's own approximation ``alpha
    log(beta + max(alpha - 1, 0) / 2)``, and the logs are :func:`_approx_logs` (within
    1e-9; no log-gamma, no libm call), valid for solves whose bounds keep every gain
    evaluated below that limit (the caller checks). ``p2`` comes from the caller (numpy),
    for the reason given in :func:`solve`.
    """
    m = p0.shape[0]
    if not (kind == BETA_LEVELS or kind == HIT_UTILITY):
        p2[:] = 0.0
        return p2
    hit = kind == HIT_UTILITY
    if not exact:
        # In blocks, through the guess's approximate log (no libm call, so the loops
        # vectorize): a guess needs no more than that.
        logs_b = np.empty(_LOG_BLOCK, dtype=np.float64)
        logs_a = np.empty(_LOG_BLOCK, dtype=np.float64)
        scratch = np.empty(_LOG_BLOCK, dtype=np.float64)
        for start in range(0, m, _LOG_BLOCK):
            n = min(_LOG_BLOCK, m - start)
            for j in range(n):
                a = p0[start + j]
                logs_b[j] = p1[start + j] + 0.5 * max(a - 1.0, 0.0)
                logs_a[j] = a
            _approx_logs(logs_b, n, scratch)
            if hit:
                _approx_logs(logs_a, n, scratch)
            for j in range(n):
                i = start + j
                a = p0[i]
                if a > 0.0 and p1[i] > 0.0:
                    x = a * logs_b[j]
                    p2[i] = x + logs_a[j] if hit else x
                else:
                    p2[i] = 0.0
        return p2
    # Posteriors of one strength share alpha + beta (pseudo-counts s p, s (1 - p)):
    # its log-gamma is computed again only when it changes.
    last_sum = np.nan
    lgamma_sum = np.nan
    for i in range(m):
        a = p0[i]
        b = p1[i]
        if a > 0.0 and b > 0.0:
            ab = a + b
            if ab != last_sum:
                last_sum = ab
                lgamma_sum = math.lgamma(ab)
            x = lgamma_sum - math.lgamma(b)
            p2[i] = x + math.log(a) if hit else x
        else:
            p2[i] = 0.0
    return p2


_LOG_BLOCK = 256
_SQRT2 = 1.4142135623730951
_LN2 = 0.6931471805599453


@njit(cache=True, error_model="numpy")
def _approx_logs(vals, n, scratch):
    """Replace ``vals[:n]`` by an approximation of their logs, for guesses only: within
    1e-9 (absolute) of ``log`` for positive normal floats; other inputs (0, subnormals,
    inf, NaN) give some value, finite or not, that a guess may take.

    ``log x = e log 2 + log m`` with ``x = m 2^e``, ``m`` in ``[1/sqrt 2, sqrt 2)``, and
    ``log m = 2 atanh t``, ``t = (m - 1) / (m + 1)``, ``|t| < 0.172``, to the ``t^9``
    term (the rest is below ``2 t^11 / (11 (1 - t^2)) < 1e-9``). The exponent and the
    mantissa come from the float's bits (:func:`~._waterline_kernels.split_mantissas`, shared
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
_EXP_MAX = 700.0


@njit(cache=True, error_model="numpy")
def _approx_exps(vals, n, scratch):
    """Replace ``vals[:n]`` (each within ``[-_EXP_MAX, _EXP_MAX]``) by an approximation of
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
def _log_beta_moment(a, b, lgamma_ratio, m):
    """``log E[(1 - p)^m]`` for ``p ~ Beta(a, b)``, ``a, b > 0``, ``m >= 0``.

    Up to ``_PRODUCT_MAX`` the product of ratios ``(b + j) / (a + b + j)``:
    accurate to a few ulps (a log-gamma difference loses digits to
    cancellation), so that values equal in exact arithmetic come out equal to
    about 1e-15, and cheaper than two log-gammas for small ``m``. Beyond, the
    log-gamma difference (``lgamma_ratio = lgamma(a + b) - lgamma(b)``).
    """
    if m <= _PRODUCT_MAX:
        acc, q = _ratio_product(a, b, m)
        return acc + math.log(q)
    return lgamma_ratio + _lgamma_diff(b + m, a)


@njit(cache=True, error_model="numpy", inline="always")
def _ratio_step(a, b, j, acc, q):
    """The product of ratios of :func:`_log_beta_moment` times ``(b + j) / (a + b + j)``,
    as ``(acc, q)``: the log of what was rescaled away, and the rest (rescaled below
    1e-280 so that it never underflows)."""
    q *= (b + j) / (a + b + j)
    if q < 1e-280:
        acc += math.log(q)
        q = 1.0
    return acc, q


@njit(cache=True, error_model="numpy", inline="always")
def _ratio_product(a, b, m):
    """``prod_{j < m} (b + j) / (a + b + j)`` as :func:`_ratio_step`'s ``(acc, q)``. Every
    product of ratios goes through these two, so that products to the same ``m`` are the
    same sequence of operations, bit for bit."""
    acc = 0.0
    q = 1.0
    for j in range(m):
        acc, q = _ratio_step(a, b, j, acc, q)
    return acc, q


# From this argument on, lgamma(x) - lgamma(x + a) is formed from Stirling's series:
# the two log-gammas (of order x log x) cancel to an absolute error of ulp(x log x)
# (relative 1e-13 at x = 1e3, 1e-9 at 1e7, and above 1 beyond 1e14, where it
# breaks the rows' monotonicity); the series is accurate to 1e-16 from here on.
_STIRLING_FROM = 1e3


@njit(cache=True, error_model="numpy")
def _lgamma_diff(x, a):
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
def _fair_log_gain(a, logp, alpha, m):
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

    Edges (THEORY.md section 8): ``p = 0`` (``a = 0``) has ``w = 0`` at every
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
def _softplus(t):
    """``log(1 + exp(t))`` without overflow or loss of small values."""
    if t > 36.0:
        return t + math.exp(-t)
    if t < -36.0:
        return math.exp(t)
    return math.log1p(math.exp(t))


@njit(cache=True, error_model="numpy")
def _fair_guess(a, logp, alpha, c, lam):
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
        return c + _softplus(-z) / a
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
    return c + _softplus(-s) / a - 0.5


@njit(cache=True, error_model="numpy")
def _closed_form(kind):
    """Whether this kind's crossings are known in closed form for every row, so that
    :func:`_solve_closed` serves it: the alpha-fair kinds at alpha = 0, 1, 2, the point
    hit utility (its log gain ``k log(1 - p) + log p`` is linear in ``k``), VIP's and
    GVM's costs (a gain ``a / ((k - 1) k) + b`` or ``W / (k (k + 1))`` crosses a value
    at the root of a quadratic), and Knapsack, whose crossings are certified by bounds
    (:func:`_knapsack_count`) all but near a step."""
    return (kind == FAIR_SUM or kind == FAIR_LOG or kind == FAIR_INVERSE or kind == POINT_HIT
            or kind == KNAPSACK or kind == RLOO_VARIANCE or kind == INVERSE_COUNT)


@njit(cache=True, error_model="numpy")
def _exact_guess(kind, x2):
    """Whether :func:`_guess` is the exact crossing (up to rounding) for this kind."""
    if (kind == FAIR_SUM or kind == FAIR_LOG or kind == FAIR_INVERSE or kind == POINT_HIT
            or kind == INVERSE_COUNT):
        return True
    return kind == ALPHA_FAIR and (x2 == 0.0 or x2 == 1.0)


@njit(cache=True, error_model="numpy")
def _pass_constant(kind, lam):
    """What a count pass at ``lam`` computes once instead of once per row."""
    if kind == FAIR_LOG:
        return math.exp(-lam)
    if kind == FAIR_INVERSE:
        return math.exp(-lam)
    if kind == KNAPSACK:
        return math.log(lam) if lam > 0.0 else np.nan
    return 0.0


@njit(cache=True, error_model="numpy")
def _knapsack_count(x0, x1, x2, log_lam, floor, ceil):
    """The count of a Knapsack row at ``lam = exp(log_lam)`` where bounds on its gain
    settle it with room to spare, else -1 (then gains must be evaluated).

    With ``q = 1 - p`` the gain is ``p q^2 (q p^k + p q^k)``, that is ``D(k) (1 +
    rho^(k - 1))`` with the larger term ``D(k) = C r^k`` (``r = max(p, q)``) and
    ``rho = min(p, q) / r``. The crossing ``D(g) = lam`` is in closed form, from the
    logs the row already holds, so ``log gain(k) - log lam = (g - k) |log r| +
    log1p(rho^(k - 1))``, with the log1p bounded on both sides without a log. Every
    ``k <= g - 1`` has a gain above ``lam``; from ``ceil(g)`` on, a step whose gain is
    certified above ``lam`` is passed, and the first one certified at or below it is
    the count (at most three steps). Each test keeps a margin far above the rounding
    of the gain's evaluation (``tol``, in log space), so the count is the one an
    evaluation gives; a row within the margin returns -1. ``floor - 1`` lies above
    ``lam`` and ``ceil`` at or below it (the bracket).
    """
    if not (0.0 < x0 < 1.0) or not (log_lam > -650.0):
        return np.int64(-1)
    if x0 >= 0.5:
        log_r = x1
        log_c = x1 + 3.0 * x2
        log_rho = x2 - x1
    else:
        log_r = x2
        log_c = 2.0 * (x1 + x2)
        log_rho = x1 - x2
    if not (log_r < 0.0):
        return np.int64(-1)
    g = (log_lam - log_c) / log_r
    if not (abs(g) < 1e15):
        return np.int64(-1)
    if g <= floor:
        k = floor
    elif g >= ceil:
        k = ceil
    else:
        k = np.int64(math.ceil(g))
    tol = 1e-12 * (1.0 + abs(log_lam) + abs(log_c) + (abs(k) + 4.0) * (abs(x1) + abs(x2)))
    if k > floor and (g - (k - 1)) * -log_r <= tol:
        return np.int64(-1)
    for _ in range(3):
        if k >= ceil:
            return k
        d = (k - g) * -log_r  # log lam - log D(k)
        t = (k - 1) * -log_rho
        if t >= 0.0 and d > (1.0 + 1e-12) / (1.0 + t * (1.0 + t * (0.5 + t / 6.0))) + tol:
            # rho^(k - 1) = exp(-t) <= 1 / (1 + t + t^2 / 2 + t^3 / 6), which bounds the
            # log1p above: settled without the exponential.
            return k
        x = math.exp((k - 1) * log_rho)
        # 2 x / (2 + x) <= log1p(x) <= x (6 + x) / (6 + 4 x) for x >= 0.
        if d > x * (6.0 + x) / (6.0 + 4.0 * x) * (1.0 + 1e-12) + tol:
            return k
        if not (d < 2.0 * x / (2.0 + x) * (1.0 - 1e-12) - tol):
            return np.int64(-1)
        k += 1
    return np.int64(-1)


@njit(cache=True, error_model="numpy")
def _fair_log_crossing(a, p, c, lam, inv_g):
    """Exact ``c + m`` where ``log r(m) = lam`` for alpha = 1 (see :func:`_fair_guess`):
    ``a m = log1p(p exp(-lam))``, with ``inv_g = exp(-lam)``."""
    if a == 0.0:
        return -_INF
    if a == _INF:
        return c + 1.0
    x = p * inv_g
    if x < 1e300:
        # log1p(x) in Goldberg's form: log (vectorized, several times faster than
        # log1p) of w = fl(1 + x), corrected by x / (w - 1); within an ulp of log1p.
        w = 1.0 + x
        if w == 1.0:
            return c + x / a
        return c + (math.log(w) * x / (w - 1.0)) / a
    return c + _softplus(math.log(p) - lam) / a


@njit(cache=True, error_model="numpy")
def _fair_inverse_crossing(a, p, c, lam, inv_g):
    """Exact ``c + m`` where the alpha = 2 gain ``1/w(m) - 1/w(m + 1) = exp(lam)``.

    With ``u = exp(-a m)`` and ``q = 1 - p`` the gain is ``p u / ((1 - u)(1 - q u))``;
    equal to ``G = exp(lam)`` at the root in (0, 1) of ``G q u^2 - (G (1 + q) + p) u +
    G = 0``, taken in the cancellation-free form ``u = 2 / ((1 + q) + p H + sqrt(p^2 +
    2 p (1 + q) H + p^2 H^2))`` with ``H = 1 / G = inv_g``.
    """
    if a == 0.0:
        return -_INF
    if a == _INF:
        return c + 1.0
    q = 1.0 - p
    ph = p * inv_g
    if ph > 1e150:
        # u ~ 1 / (p H): log u = lam - log p, to within a relative 1 / (p H).
        return c + (math.log(p) - lam) / a
    u = 2.0 / ((1.0 + q) + ph + math.sqrt(p * p + 2.0 * (1.0 + q) * ph + ph * ph))
    return c - math.log(u) / a


@njit(cache=True, error_model="numpy")
def gain(kind, x0, x1, x2, c, k):
    """Gain of prompt's step ``k -> k + 1`` (see the module docstring)."""
    if kind == BETA_LEVELS:
        m = k - c
        if m <= 0 or x0 == 0.0:
            return 0.0
        if x1 == 0.0:
            return -_INF
        return _log_beta_moment(x0, x1, x2, m)
    if kind == KNAPSACK:
        if x0 == 0.0:
            return 0.0
        if x0 == 1.0:
            # p = 1 prompts take leftover budget only after p = 0 prompts.
            return -1.0
        q = 1.0 - x0
        return x0 * q * q * (q * math.exp(k * x1) + x0 * math.exp(k * x2))
    if kind == HIT_UTILITY:
        if x0 == 0.0:
            return -_INF
        if x1 == 0.0:
            return 0.0 if k == 0 else -_INF
        if k > _PRODUCT_MAX:
            # x2 = log(a) + lgamma(a + b) - lgamma(b) (see prepare).
            return x2 + _lgamma_diff(x1 + k, x0) - math.log(x0 + x1 + k)
        acc, q = _ratio_product(x0, x1, k)
        return _hit_log(acc, q, x0 / (x0 + x1 + k))
    if kind == RLOO_VARIANCE:
        if k <= 1:
            return _INF if x0 > 0.0 else x1
        return x0 / (float(k - 1) * float(k)) + x1
    if kind == ALPHA_FAIR:
        return _fair_log_gain(x0, x1, x2, k - c)
    if kind == FAIR_SUM:
        return _fair_log_gain(x0, x1, 0.0, k - c)
    if kind == FAIR_LOG or kind == FAIR_INVERSE:
        if x0 == 0.0:
            return -_INF
        return _fair_log_gain(x0, math.log(x1), 1.0 if kind == FAIR_LOG else 2.0, k - c)
    if kind == POINT_HIT:
        # log of (1 - p)^k p, with x1 = log p and x2 = log(1 - p).
        if x0 == 0.0:
            return -_INF
        if x0 == 1.0:
            return 0.0 if k == 0 else -_INF
        return k * x2 + x1
    # INVERSE_COUNT
    if x0 == 0.0:
        return 0.0
    if k <= 0:
        return _INF
    return x0 / (float(k) * float(k + 1))


@njit(cache=True, error_model="numpy", inline="always")
def _hit_log(acc, q, r):
    """The hit utility's log gain ``acc + log(q) + log(r)`` (``q`` the product of
    :func:`_log_beta_moment` rescaled into ``acc``, ``r = a / (a + b + k)``), with one log
    where ``q r`` does not underflow."""
    t = q * r
    if t >= 1e-290:
        return acc + math.log(t)
    return acc + math.log(q) + math.log(r)


@njit(cache=True, error_model="numpy")
def _hit_walk(x0, x1, lam, k, floor, ceil, g_below, g_ceil):
    """A count pass's search on a hit utility row from its guess ``k`` (``floor < k <
    ceil``, ``k <= _PRODUCT_MAX``, ``x0, x1 > 0``), with one product of ratios walked
    upward: the product to ``j`` is the same sequence of operations as the first ``j``
    steps of the product to ``j + 1``, so each gain is bit for bit :func:`gain`'s.

    The walk keeps the product to ``k - 2`` as it passes: a guess one step high (the
    crossing at ``k - 1``) then costs one log, as one step low does.

    Returns ``(k', gain(k'), gain(k' - 1), state)``: ``state`` 0 when ``k'`` is the first
    step in ``[floor, ceil)`` with a gain at or below ``lam`` (``ceil`` when none; its
    gain is ``g_ceil``; ``gain(floor - 1)`` is ``g_below``); 1 when ``gain(k')`` is at or
    below ``lam`` and the crossing may lie lower still (``k' = k - 2 >= floor``,
    ``gain(k' - 1)`` unknown); 2 when the walk stopped above ``lam`` after a few steps
    or at the end of the product (the search goes on from ``k'``, whose gain is
    unknown).
    """
    if k - 1 > floor:
        acc, q = _ratio_product(x0, x1, k - 2)
        acc_1, q_1 = _ratio_step(x0, x1, k - 2, acc, q)
    else:
        acc, q = 0.0, 1.0
        acc_1, q_1 = _ratio_product(x0, x1, k - 1)
    j = k - 1
    before = _hit_log(acc_1, q_1, x0 / (x0 + x1 + j))
    if before <= lam:
        if j == floor:
            return j, before, g_below, 0
        lower = _hit_log(acc, q, x0 / (x0 + x1 + (j - 1)))
        if lower > lam:
            return j, before, lower, 0
        return j - 1, lower, np.nan, 1
    acc = acc_1
    q = q_1
    stop = min(k + 4, _PRODUCT_MAX + 1)
    while True:
        acc, q = _ratio_step(x0, x1, j, acc, q)
        j += 1
        if j == ceil:
            return j, g_ceil, before, 0
        if j == stop:
            return j, np.nan, before, 2
        g = _hit_log(acc, q, x0 / (x0 + x1 + j))
        if g <= lam:
            return j, g, before, 0
        before = g


@njit(cache=True, error_model="numpy")
def _guess(kind, x0, x1, x2, c, lam):
    """Approximate first ``k`` with ``gain(k) <= lam`` (any float; clamped by the caller)."""
    if kind == BETA_LEVELS:
        if x0 == 0.0:
            return _INF if lam < 0.0 else -_INF
        if x1 == 0.0:
            return -_INF
        # Gamma(x) / Gamma(x + a) ~ (x + (a - 1) / 2) ** -a.
        e = (x2 - lam) / x0
        if e > 700.0:
            return _INF
        return c + math.exp(e) - x1 - 0.5 * (x0 - 1.0)
    if kind == KNAPSACK:
        if x0 == 0.0:
            return _INF if lam < 0.0 else -_INF
        if x0 == 1.0:
            return _INF if lam < -1.0 else -_INF
        if lam <= 0.0:
            return _INF
        q = 1.0 - x0
        if x0 >= 0.5:
            coef = x0 * q * q * q
            lb = x1
        else:
            coef = x0 * x0 * q * q
            lb = x2
        return math.log(lam / coef) / lb
    if kind == HIT_UTILITY:
        if x0 == 0.0:
            return -_INF
        if x1 == 0.0:
            return 1.0 if lam < 0.0 else 0.0
        # gain(k) ~ x2 - (a + 1) log(b + k + a / 2), with x2 as in prepare.
        e = (x2 - lam) / (x0 + 1.0)
        if e > 700.0:
            return _INF
        return math.exp(e) - x1 - 0.5 * x0
    if kind == RLOO_VARIANCE:
        d = lam - x1
        if x0 == 0.0:
            return _INF if d < 0.0 else -_INF
        if d <= 0.0:
            return _INF
        return 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * x0 / d))
    if kind == ALPHA_FAIR:
        return _fair_guess(x0, x1, x2, c, lam)
    if kind == FAIR_SUM:
        return _fair_guess(x0, x1, 0.0, c, lam)
    if kind == FAIR_LOG:
        return _fair_log_crossing(x0, x1, c, lam, math.exp(-lam))
    if kind == FAIR_INVERSE:
        return _fair_inverse_crossing(x0, x1, c, lam, math.exp(-lam))
    if kind == POINT_HIT:
        if x0 == 0.0:
            return -_INF
        if x0 == 1.0:
            return 1.0 if lam < 0.0 else 0.0
        return (lam - x1) / x2
    # INVERSE_COUNT
    if x0 == 0.0:
        return _INF if lam < 0.0 else -_INF
    if lam <= 0.0:
        return _INF
    return 0.5 * (math.sqrt(1.0 + 4.0 * x0 / lam) - 1.0)



@njit(cache=True, error_model="numpy", inline="always")
def _guessed_start(kind, x0, x1, x2, c, lam, aux, floor, ceil):
    """The guessed (real) crossing ``g`` of ``gain(k) = lam`` and the integer start of the
    search it gives, clamped to ``[floor, ceil]`` (``floor`` where ``g`` is NaN)."""
    if kind == FAIR_LOG:
        g = _fair_log_crossing(x0, x1, c, lam, aux)
    elif kind == FAIR_INVERSE:
        g = _fair_inverse_crossing(x0, x1, c, lam, aux)
    else:
        g = _guess(kind, x0, x1, x2, c, lam)
    return g, _clamped_start(g, floor, ceil)


@njit(cache=True, error_model="numpy", inline="always")
def _clamped_start(g, floor, ceil):
    """The integer start of a search from the guessed crossing ``g``: ``ceil(g)`` clamped
    to ``[floor, ceil]`` (``floor`` where ``g`` is NaN)."""
    if g != g or g <= floor:
        return floor
    if g >= ceil:
        return ceil
    return np.int64(math.ceil(g))


@njit(cache=True, error_model="numpy", inline="always")
def _settled_start(kind, x0, x1, x2, c, lam, aux, floor, ceil):
    """``(k, settled)``: the count of a row whose crossing of ``lam`` is known without
    evaluating a gain (``settled``), else the start of the galloping search."""
    if kind == KNAPSACK:
        k = _knapsack_count(x0, x1, x2, aux, floor, ceil)
        if k >= 0:
            return k, True
    g, start = _guessed_start(kind, x0, x1, x2, c, lam, aux, floor, ceil)
    if kind == RLOO_VARIANCE:
        # The root reads d = lam - b, rounded to 1.2e-16 max(|lam|, |b|): where that is
        # below 1.2e-11 d, it moves the root by less than 6e-12 relative, and evaluating a
        # gain errs by less than 5e-11 d, far inside the margin of _off_step (a root 1e-9
        # off a step puts the gains beside it 2e-9 d from lam).
        return start, _off_step(g) and max(abs(lam), abs(x1)) < 1e5 * (lam - x1)
    return start, _exact_guess(kind, x2) and _off_step(g)


@njit(cache=True, error_model="numpy")
def _crossing(kind, x0, x1, x2, c, lam, floor, ceil, start, g_below, g_ceil):
    """First ``k`` in ``[floor, ceil)`` with ``gain(k) <= lam``, else ``ceil``.

    Galloping search from ``start``, exact for non-increasing rows whatever
    the quality of ``start``. ``g_below = gain(floor - 1)`` and ``g_ceil =
    gain(ceil)`` are passed in (NaN when unknown). Returns ``(k, gain(k),
    gain(k - 1))`` (the gains NaN when unknown).
    """
    if start < floor:
        start = floor
    elif start > ceil:
        start = ceil
    bottom = floor - 1
    g_bot = g_below
    top = ceil
    g_top = g_ceil
    # pred(k): k == ceil or gain(k) <= lam; false below the answer, true from it.
    g_start = g_ceil if start == ceil else gain(kind, x0, x1, x2, c, start)
    if start == ceil or g_start <= lam:
        top = start
        g_top = g_start
        step = 1
        while True:
            cand = top - step
            if cand < floor:
                break
            g = gain(kind, x0, x1, x2, c, cand)
            if g <= lam:
                top = cand
                g_top = g
                step *= 2
            else:
                bottom = cand
                g_bot = g
                break
    else:
        bottom = start
        g_bot = g_start
        step = 1
        while True:
            cand = bottom + step
            if cand >= ceil:
                break
            g = gain(kind, x0, x1, x2, c, cand)
            if g <= lam:
                top = cand
                g_top = g
                break
            bottom = cand
            g_bot = g
            step *= 2
    while top - bottom > 1:
        mid = bottom + (top - bottom) // 2
        g = gain(kind, x0, x1, x2, c, mid)
        if g <= lam:
            top = mid
            g_top = g
        else:
            bottom = mid
            g_bot = g
    return top, g_top, g_bot


@njit(cache=True, error_model="numpy", inline="always")
def _row_count(kind, x0, x1, x2, c, lam, aux, floor, ceil, g_below, g_ceil):
    """A row's count at ``lam`` when it lies in ``[floor, ceil]`` (``gain(floor - 1) =
    g_below > lam``, ``gain(ceil) = g_ceil``), with the gains at it and one below, as
    :func:`_crossing` returns them."""
    k, settled = _settled_start(kind, x0, x1, x2, c, lam, aux, floor, ceil)
    if settled:
        # The crossing is known in closed form and is not within rounding of a step:
        # the count is settled without evaluating a gain (unknown gains are cached as
        # NaN, except the bracket ends already known).
        return (k, g_ceil if k == ceil else np.nan, g_below if k == floor else np.nan)
    return _row_search(kind, x0, x1, x2, c, lam, floor, ceil, k, g_below, g_ceil)


@njit(cache=True, error_model="numpy", inline="always")
def _row_search(kind, x0, x1, x2, c, lam, floor, ceil, k, g_below, g_ceil):
    """:func:`_row_count`'s search from the start ``k`` (in ``[floor, ceil]``)."""
    if (kind == HIT_UTILITY and floor < k < ceil and k <= _PRODUCT_MAX
            and x0 > 0.0 and x1 > 0.0):
        # The gains beside the guess, and a few above it, from one product: the
        # guess is mostly right or one step off.
        k, nxt, lst, state = _hit_walk(x0, x1, lam, k, floor, ceil, g_below, g_ceil)
        if state == 1:
            return _crossing(kind, x0, x1, x2, c, lam, floor, k, k, g_below, nxt)
        if state == 2:
            return _crossing(kind, x0, x1, x2, c, lam, k, ceil, k, lst, g_ceil)
        return k, nxt, lst
    return _crossing(kind, x0, x1, x2, c, lam, floor, ceil, k, g_below, g_ceil)


@njit(cache=True, error_model="numpy")
def _count(kind, p0, p1, p2, c, lam, rows, na, a_next, a_last, nb, b_next, b_last,
           out_n, out_next, out_last):
    """Per row in ``rows``: ``out_n = lo + #{k: gain(k) > lam}``, which lies in
    ``[na, nb]``, with the gains at ``out_n`` and ``out_n - 1``.

    The gains cached at the bracket ends (``a_next = gain(na)``, ``a_last =
    gain(na - 1)``, ``b_next``, ``b_last`` likewise; NaN when unknown) settle
    most rows without evaluating anything. Returns ``sum(out_n - na)``.
    """
    total = 0
    aux = _pass_constant(kind, lam)
    for j in range(rows.shape[0]):
        i = rows[j]
        an = a_next[i]
        bl = b_last[i]
        if an <= lam:
            k = na[i]
            nxt = an
            lst = a_last[i]
        elif bl > lam:
            k = nb[i]
            nxt = b_next[i]
            lst = bl
        else:
            floor = na[i]
            g_below = a_last[i]
            if an > lam:
                floor += 1
                g_below = an
            ceil = nb[i]
            g_ceil = b_next[i]
            if bl <= lam:
                ceil -= 1
                g_ceil = bl
            k, nxt, lst = _row_count(kind, p0[i], p1[i], p2[i], c, lam, aux, floor, ceil,
                                     g_below, g_ceil)
        out_n[i] = k
        out_next[i] = nxt
        out_last[i] = lst
        total += k - na[i]
    return total


@njit(cache=True, error_model="numpy")
def _active(na, nb, rows):
    keep = 0
    for j in range(rows.shape[0]):
        i = rows[j]
        if na[i] < nb[i]:
            rows[keep] = i
            keep += 1
    return rows[:keep]


@njit(cache=True, error_model="numpy")
def _sift_down_min(a, start, end, root):
    # Min-heap on a[start:end] rooted at `start` (heap offsets relative to it);
    # sifts the entry at offset `root` down.
    n = end - start
    while True:
        child = 2 * root + 1
        if child >= n:
            return
        if child + 1 < n and a[start + child + 1] < a[start + child]:
            child += 1
        if a[start + child] < a[start + root]:
            t = a[start + child]
            a[start + child] = a[start + root]
            a[start + root] = t
            root = child
        else:
            return


@njit(cache=True, error_model="numpy")
def _kth_largest(a, r):
    """The ``r``-th largest value of ``a`` (1-based); reorders ``a``.

    Three-way quickselect (median-of-three pivots, so runs of equal values
    are cheap), falling back after 64 rounds to a size-r heap over the rest,
    so the worst case stays O(N log N).
    """
    lo = 0
    hi = a.shape[0] - 1
    target = r - 1
    for _ in range(64):
        if lo >= hi:
            return a[lo]
        mid = lo + (hi - lo) // 2
        x, y, z = a[lo], a[mid], a[hi]
        if x > y:
            x, y = y, x
        if y > z:
            y = z
            if x > y:
                y = x
        pivot = y
        lt = lo
        i = lo
        gt = hi
        while i <= gt:
            v = a[i]
            if v > pivot:
                a[i] = a[lt]
                a[lt] = v
                lt += 1
                i += 1
            elif v < pivot:
                a[i] = a[gt]
                a[gt] = v
                gt -= 1
            else:
                i += 1
        if target < lt:
            hi = lt - 1
        elif target <= gt:
            return pivot
        else:
            lo = gt + 1
    # Keep the (target - lo + 1) largest of a[lo:hi+1] in a min-heap.
    size = target - lo + 1
    for s in range(size // 2 - 1, -1, -1):
        _sift_down_min(a, lo, lo + size, s)
    for i in range(lo + size, hi + 1):
        if a[i] > a[lo]:
            a[lo] = a[i]
            _sift_down_min(a, lo, lo + size, 0)
    return a[lo]


@njit(cache=True, error_model="numpy")
def _tie_before(e, f, nxt, step, owner, maxmin):
    """Tie order: (max-min) lower next gain, i.e. higher next level; then fewer
    rollouts so far; then the lower index."""
    if maxmin and nxt[e] != nxt[f]:
        return nxt[e] < nxt[f]
    if step[e] != step[f]:
        return step[e] < step[f]
    return owner[e] < owner[f]


@njit(cache=True, error_model="numpy")
def _pick_ties(band, left, nxt, step, owner, maxmin, counts):
    """Hand ``left`` rollouts to the tied steps ``band`` (row-major order, each
    row's tied steps contiguous) one at a time, always to the best row head
    by the tie order; a row's next tied step becomes its head. A binary heap,
    O(T log T)."""
    n = band.shape[0]
    heap = np.empty(n, dtype=np.int64)
    size = 0
    for j in range(n):
        if j == 0 or owner[band[j - 1]] != owner[band[j]]:
            # push j
            heap[size] = j
            pos = size
            size += 1
            while pos > 0:
                parent = (pos - 1) // 2
                if _tie_before(band[heap[pos]], band[heap[parent]], nxt, step, owner, maxmin):
                    t = heap[pos]
                    heap[pos] = heap[parent]
                    heap[parent] = t
                    pos = parent
                else:
                    break
    for _ in range(left):
        top = heap[0]
        counts[owner[band[top]]] += 1
        nxt_pos = top + 1
        if nxt_pos < n and owner[band[nxt_pos]] == owner[band[top]]:
            heap[0] = nxt_pos
        else:
            size -= 1
            heap[0] = heap[size]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= size:
                break
            if child + 1 < size and _tie_before(band[heap[child + 1]], band[heap[child]], nxt,
                                                step, owner, maxmin):
                child += 1
            if _tie_before(band[heap[child]], band[heap[pos]], nxt, step, owner, maxmin):
                t = heap[pos]
                heap[pos] = heap[child]
                heap[child] = t
                pos = child
            else:
                break


# Bracket state: integers (ca, cb, key_a, key_b, side, passes) and floats
# (f_a, f_b) in two small arrays; per row the counts at both ends and the gains
# cached around them; ``rows`` lists the rows with na < nb.
_CA, _CB, _KEY_A, _KEY_B, _SIDE, _PASSES = 0, 1, 2, 3, 4, 5


@njit(cache=True, error_model="numpy")
def _init_state(kind, p0, p1, p2, c, lo, hi, extremes, lazy, work_i, work_f, work_g):
    """Bracket (b, a] = (sentinel, +inf]; with ``extremes``, narrowed at once to
    the rows' extreme gains (one evaluation at each end of every row).

    The per-row state lives in ``work_i`` (int64, 4 rows: the active rows, the counts
    at both ends, a pass's counts), ``work_f`` (float64, 4 rows: the gains cached at
    both ends) and ``work_g`` (float64, 2 rows: a pass's gains) when they have a column
    per row (see :func:`solve`), else in arrays allocated here. With ``lazy`` the ends'
    per-row values are left unwritten: :func:`_first_pass` or :func:`_open_ends` writes
    them."""
    m = lo.shape[0]
    if work_i.shape[1] != m or work_f.shape[1] != m or work_g.shape[1] != m:
        work_i = np.empty((4, m), dtype=np.int64)
        work_f = np.empty((4, m), dtype=np.float64)
        work_g = np.empty((2, m), dtype=np.float64)
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    total = 0
    rows = work_i[0]
    na = work_i[1]
    nb = work_i[2]
    work_n = work_i[3]
    a_next = work_f[0]
    a_last = work_f[1]
    b_next = work_f[2]
    b_last = work_f[3]
    if not lazy:
        _open_ends(lo, hi, na, a_next, a_last, nb, b_next, b_last)
    r = 0
    for i in range(m):
        if hi[i] > lo[i]:
            rows[r] = i
            r += 1
            total += hi[i] - lo[i]
    rows = rows[:r]
    st_i = np.zeros(6, dtype=np.int64)
    st_i[_CB] = total
    st_i[_KEY_A] = _key(_INF, fbuf, ibuf)
    st_i[_KEY_B] = _key(-_INF, fbuf, ibuf) - 1  # sentinel: below every gain
    if extremes and r > 0:
        _bound_ends(kind, p0, p1, p2, c, lo, hi, st_i, rows, na, a_next, nb, b_last)
    st_f = np.zeros(2, dtype=np.float64)
    return st_i, st_f, rows, na, a_next, a_last, nb, b_next, b_last, work_n, work_g


@njit(cache=True, error_model="numpy")
def _open_ends(lo, hi, na, a_next, a_last, nb, b_next, b_last):
    """The opening bracket's per-row values: every row at ``lo`` at the upper end, at
    ``hi`` at the lower one."""
    for i in range(lo.shape[0]):
        na[i] = lo[i]
        nb[i] = hi[i]
        a_next[i] = np.nan
        a_last[i] = _INF  # everything below lo is taken at any value
        b_next[i] = -_INF  # nothing from hi on is ever taken
        b_last[i] = np.nan


@njit(cache=True, error_model="numpy")
def _bound_ends(kind, p0, p1, p2, c, lo, hi, st_i, rows, na, a_next, nb, b_last):
    """Replace an open end of the bracket by the rows' extreme gain.

    At a = +inf every row sits at lo, and nothing lies above the largest
    ``gain(lo)``; at the sentinel every row sits at hi, and everything lies
    above the value just below the smallest ``gain(hi - 1)``.
    """
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    open_a = st_i[_KEY_A] == _key(_INF, fbuf, ibuf)
    open_b = st_i[_KEY_B] == _key(-_INF, fbuf, ibuf) - 1
    top = -_INF
    bottom = _INF
    for j in range(rows.shape[0]):
        i = rows[j]
        if open_a:
            g = a_next[i]
            if g != g:
                g = gain(kind, p0[i], p1[i], p2[i], c, lo[i])
                a_next[i] = g
            if g > top:
                top = g
        if open_b:
            g = b_last[i]
            if g != g:
                g = gain(kind, p0[i], p1[i], p2[i], c, hi[i] - 1)
                b_last[i] = g
            if g < bottom:
                bottom = g
    if open_a and rows.shape[0] > 0:
        st_i[_KEY_A] = _key(top, fbuf, ibuf)
    if open_b and rows.shape[0] > 0 and bottom > -_INF:
        st_i[_KEY_B] = _key_below(bottom, fbuf, ibuf)


@njit(cache=True, error_model="numpy", inline="always")
def _moved_end(st_i, st_f, spare, kl, cnt):
    """Record a pass's count ``cnt`` at the value of key ``kl`` as the bracket end it
    replaces; True when that is the upper end ``a``."""
    st_i[_PASSES] += 1
    if cnt <= spare:
        st_i[_KEY_A] = kl
        st_i[_CA] = cnt
        st_f[0] = float(spare - cnt)
        if st_i[_SIDE] == 1:
            st_f[1] *= 0.5
        st_i[_SIDE] = 1
        return True
    st_i[_KEY_B] = kl
    st_i[_CB] = cnt
    st_f[1] = float(spare - cnt)
    if st_i[_SIDE] == -1:
        st_f[0] *= 0.5
    st_i[_SIDE] = -1
    return False


@njit(cache=True, error_model="numpy")
def _try_pass(kind, p0, p1, p2, c, spare, lam, st_i, st_f, rows, na, a_next, a_last, nb,
              b_next, b_last, w_n, w_g):
    """Count at ``lam`` and move the bracket end it replaces; returns the new
    ``rows`` and the count (-1 if ``lam`` is not strictly inside the bracket)."""
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    if lam != lam:
        return rows, np.int64(-1)
    kl = _key(lam, fbuf, ibuf)
    if not (st_i[_KEY_B] < kl < st_i[_KEY_A]):
        return rows, np.int64(-1)
    w_next = w_g[0]
    w_last = w_g[1]
    cnt = st_i[_CA] + _count(kind, p0, p1, p2, c, lam, rows, na, a_next, a_last, nb,
                             b_next, b_last, w_n, w_next, w_last)
    if _moved_end(st_i, st_f, spare, kl, cnt):
        _keep_rows(rows, w_n, w_next, w_last, na, a_next, a_last)
    else:
        _keep_rows(rows, w_n, w_next, w_last, nb, b_next, b_last)
    return _active(na, nb, rows), cnt


@njit(cache=True, error_model="numpy")
def _first_pass(kind, p0, p1, p2, c, spare, lam, lo, hi, st_i, st_f, rows, na, a_next,
                a_last, nb, b_next, b_last):
    """The first count pass from the opening bracket ``(sentinel, +inf]`` (every row
    between ``lo`` and ``hi``; :func:`_init_state` with ``lazy``): the counts as
    :func:`_try_pass` gives them, but read from the bounds and written straight into
    the end they become (the other end gets its opening values), instead of reading the
    opening state, writing a pass's arrays and copying them.

    ``lam`` must lie strictly inside the opening bracket. The counts and their gains go
    into ``na, a_next, a_last`` and the lower end's opening values into ``nb, b_next,
    b_last``; returns ``(upper, cnt)``, ``upper`` False when the count lands on the
    lower end (then :func:`_lower_first` swaps the ends).
    """
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    kl = _key(lam, fbuf, ibuf)
    aux = _pass_constant(kind, lam)
    m = lo.shape[0]
    total = 0
    hit = kind == HIT_UTILITY
    # The hit utility's guesses, a block at a time through the approximate exponential
    # (a guess only sets where a search starts): off the chain each row's search waits on.
    guesses = np.empty(_LOG_BLOCK, dtype=np.float64)
    scratch = np.empty(_LOG_BLOCK, dtype=np.float64)
    for start in range(0, m, _LOG_BLOCK):
        n = min(_LOG_BLOCK, m - start)
        if hit:
            for j in range(n):
                i = start + j
                e = (p2[i] - lam) / (p0[i] + 1.0)
                guesses[j] = min(max(e, -_EXP_MAX), _EXP_MAX) if e == e else 0.0
            _approx_exps(guesses, n, scratch)
        for j in range(n):
            i = start + j
            floor = lo[i]
            ceil = hi[i]
            if floor < ceil:
                x0 = p0[i]
                x1 = p1[i]
                if hit and x0 > 0.0 and x1 > 0.0:
                    # As _guess, with the block's exponential (of an exponent clipped to
                    # _EXP_MAX, which starts at ceil as _guess's inf does).
                    k = _clamped_start(guesses[j] - x1 - 0.5 * x0, floor, ceil)
                    k, nxt, lst = _row_search(kind, x0, x1, p2[i], c, lam, floor, ceil, k,
                                              _INF, -_INF)
                else:
                    k, nxt, lst = _row_count(kind, x0, x1, p2[i], c, lam, aux, floor, ceil,
                                             _INF, -_INF)
                total += k - floor
            else:
                k = floor
                nxt = np.nan
                lst = _INF
            na[i] = k
            a_next[i] = nxt
            a_last[i] = lst
            nb[i] = ceil
            b_next[i] = -_INF
            b_last[i] = np.nan
    cnt = st_i[_CA] + total
    return _moved_end(st_i, st_f, spare, kl, cnt), cnt


@njit(cache=True, error_model="numpy")
def _lower_first(lo, hi, na, a_next, a_last, b_next, b_last):
    """After a first pass whose count lands on the lower end, with the ends' arrays
    traded (``b_*`` now hold the counts): the upper end's opening values, and the lower
    end's for rows without room."""
    for i in range(lo.shape[0]):
        na[i] = lo[i]
        a_next[i] = np.nan
        a_last[i] = _INF
        if lo[i] == hi[i]:
            b_next[i] = -_INF
            b_last[i] = np.nan


@njit(cache=True, error_model="numpy", inline="always")
def _keep_rows(rows, w_n, w_next, w_last, n, nxt, last):
    """Copy the working counts and cached gains of ``rows`` into one bracket end's."""
    for j in range(rows.shape[0]):
        i = rows[j]
        n[i] = w_n[i]
        nxt[i] = w_next[i]
        last[i] = w_last[i]


@njit(cache=True, error_model="numpy")
def _settled(st_i, spare, limit):
    return (st_i[_CA] == spare or st_i[_CB] - st_i[_CA] <= limit
            or st_i[_KEY_B] >= st_i[_KEY_A] - 1)


@njit(cache=True, error_model="numpy")
def _narrow(kind, p0, p1, p2, c, lo, hi, spare, limit, st_i, st_f, rows, na, a_next, a_last,
            nb, b_next, b_last, w_n, w_g):
    """Regula falsi (Illinois) alternating with bisection on the bit order of
    the gain value, until the bracket holds at most ``limit`` gains."""
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    _bound_ends(kind, p0, p1, p2, c, lo, hi, st_i, rows, na, a_next, nb, b_last)
    st_f[0] = float(spare - st_i[_CA])
    st_f[1] = float(spare - st_i[_CB])
    for it in range(400):
        if _settled(st_i, spare, limit):
            break
        key_a = st_i[_KEY_A]
        key_b = st_i[_KEY_B]
        lam = np.nan
        va = _unkey(key_a, fbuf, ibuf)
        vb = _unkey(key_b, fbuf, ibuf) if key_b >= _key(-_INF, fbuf, ibuf) else -_INF
        f_a = st_f[0]
        f_b = st_f[1]
        if it % 2 == 0 and math.isfinite(va) and math.isfinite(vb) and f_a != f_b:
            lam = va + (vb - va) * f_a / (f_a - f_b)
            if lam == lam:
                kl = _key(lam, fbuf, ibuf)
                if not (key_b < kl < key_a):
                    lam = np.nan
        if lam != lam:
            # Floor average without int64 overflow; strictly inside the bracket.
            lam = _unkey((key_a >> 1) + (key_b >> 1) + (key_a & key_b & 1), fbuf, ibuf)
        rows, _ = _try_pass(kind, p0, p1, p2, c, spare, lam, st_i, st_f, rows, na, a_next,
                            a_last, nb, b_next, b_last, w_n, w_g)
    return rows


@njit(cache=True, error_model="numpy")
def _finish(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, limit, st_i, rows, na,
            a_next, a_last, nb, b_next, b_last, out):
    """Select the remaining ``spare - ca`` gains from the bracket (b, a]."""
    m = na.shape[0]
    if maxmin and tie_rtol > 0.0:
        rows = _widen(kind, p0, p1, p2, c, lo, hi, tie_rtol, st_i, na, a_next, a_last, nb,
                      b_next, b_last)
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    value_a = _unkey(st_i[_KEY_A], fbuf, ibuf)
    need = spare - st_i[_CA]
    if need == 0:
        return _counts_from(na, out), value_a
    n_bracket = st_i[_CB] - st_i[_CA]
    if st_i[_KEY_B] >= st_i[_KEY_A] - 1 and n_bracket > max(limit, m):
        # Every gain in the bracket equals value_a: a plateau of constant
        # rows. Serve it by (k, index): the largest K with
        # sum_i clip(K - na_i, 0, nb_i - na_i) <= need, then one more each in
        # index order.
        k_high = np.int64(0)
        k_low = na[rows[0]]
        for j in range(rows.shape[0]):
            i = rows[j]
            if na[i] < k_low:
                k_low = na[i]
            if nb[i] > k_high:
                k_high = nb[i]
        while k_low < k_high:
            mid = k_low + (k_high - k_low + 1) // 2
            s = 0
            for j in range(rows.shape[0]):
                i = rows[j]
                s += min(max(mid - na[i], 0), nb[i] - na[i])
            if s <= need:
                k_low = mid
            else:
                k_high = mid - 1
        counts = _counts_from(na, out)
        used = 0
        for j in range(rows.shape[0]):
            i = rows[j]
            add = min(max(k_low - na[i], 0), nb[i] - na[i])
            counts[i] += add
            used += add
        for j in range(rows.shape[0]):
            if used == need:
                break
            i = rows[j]
            if na[i] <= k_low and counts[i] == k_low and k_low < nb[i]:
                counts[i] += 1
                used += 1
        return counts, value_a
    # Collect the gains in the bracket and select the need-th largest.
    vals = np.empty(n_bracket, dtype=np.float64)
    owner = np.empty(n_bracket, dtype=np.int64)
    step = np.empty(n_bracket, dtype=np.int64)
    e = 0
    for j in range(rows.shape[0]):
        i = rows[j]
        for k in range(na[i], nb[i]):
            if k == na[i] and a_next[i] == a_next[i]:
                g = a_next[i]
            elif k == nb[i] - 1 and b_last[i] == b_last[i]:
                g = b_last[i]
            else:
                g = gain(kind, p0[i], p1[i], p2[i], c, k)
            vals[e] = g
            owner[e] = i
            step[e] = k
            e += 1
    threshold = _kth_largest(vals.copy(), need)
    # Max-min levels within tie_rtol (relative) of the threshold count as tied:
    # equal in exact arithmetic, apart by rounding.
    width = 0.0
    if maxmin and tie_rtol > 0.0 and math.isfinite(threshold):
        width = tie_rtol * abs(threshold)
    upper = threshold + width
    lower = threshold - width
    counts = _counts_from(na, out)
    above = 0
    n_band = 0
    for e in range(n_bracket):
        if vals[e] > upper:
            counts[owner[e]] += 1
            above += 1
        elif vals[e] >= lower:
            n_band += 1
    left = need - above
    band = np.empty(n_band, dtype=np.int64)
    t = 0
    for e in range(n_bracket):
        if lower <= vals[e] <= upper:
            band[t] = e
            t += 1
    if left == n_band:
        for t in range(n_band):
            counts[owner[band[t]]] += 1
        return counts, threshold
    nxt = np.zeros(n_bracket, dtype=np.float64)
    if maxmin:
        for t in range(n_band):
            e = band[t]
            i = owner[e]
            if step[e] + 1 < nb[i]:
                nxt[e] = vals[e + 1]
            elif nb[i] < hi[i] and b_next[i] == b_next[i]:
                nxt[e] = b_next[i]
            else:
                # The cache holds -inf at hi (nothing is taken there); the
                # tie rule needs the real next level.
                nxt[e] = gain(kind, p0[i], p1[i], p2[i], c, step[e] + 1)
    _pick_ties(band, left, nxt, step, owner, maxmin, counts)
    return counts, threshold


@njit(cache=True, error_model="numpy")
def _widen(kind, p0, p1, p2, c, lo, hi, tie_rtol, st_i, na, a_next, a_last, nb, b_next,
           b_last):
    """Before collecting, move both bracket ends out by ``2 tie_rtol`` (relative)
    so that every gain within the tie tolerance of the threshold is collected
    rather than already taken or left out. Returns the new active rows."""
    m = lo.shape[0]
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    va = _unkey(st_i[_KEY_A], fbuf, ibuf)
    if math.isfinite(va):
        top = va + 2.0 * tie_rtol * abs(va)
        if top > va:
            for i in range(m):
                if na[i] <= lo[i]:
                    continue
                g = a_last[i]
                if g != g:
                    g = gain(kind, p0[i], p1[i], p2[i], c, na[i] - 1)
                if g > top:
                    continue
                k, g_k, g_km1 = _crossing(kind, p0[i], p1[i], p2[i], c, top, lo[i], na[i],
                                          na[i] - 1, _INF, a_next[i])
                st_i[_CA] -= na[i] - k
                na[i] = k
                a_next[i] = g_k
                a_last[i] = g_km1
            st_i[_KEY_A] = _key(top, fbuf, ibuf)
    if st_i[_KEY_B] >= _key(-_INF, fbuf, ibuf):
        vb = _unkey(st_i[_KEY_B], fbuf, ibuf)
        if math.isfinite(vb):
            bottom = vb - 2.0 * tie_rtol * abs(vb)
            if bottom < vb:
                for i in range(m):
                    if nb[i] >= hi[i]:
                        continue
                    g = b_next[i]
                    if g != g:
                        g = gain(kind, p0[i], p1[i], p2[i], c, nb[i])
                    if g <= bottom:
                        continue
                    k, g_k, g_km1 = _crossing(kind, p0[i], p1[i], p2[i], c, bottom, nb[i] + 1,
                                              hi[i], nb[i] + 1, g, -_INF)
                    st_i[_CB] += k - nb[i]
                    nb[i] = k
                    b_next[i] = g_k
                    b_last[i] = g_km1
                st_i[_KEY_B] = _key(bottom, fbuf, ibuf)
    rows = np.empty(m, dtype=np.int64)
    r = 0
    for i in range(m):
        if na[i] < nb[i]:
            rows[r] = i
            r += 1
    return rows[:r]


@njit(cache=True, error_model="numpy")
def _select(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, stats, out):
    """Counts of the ``spare`` largest gains (ties as in the module docstring),
    opening on the rows' extreme gains.

    Returns ``(counts, threshold)``: at most ``spare`` gains lie strictly
    above ``threshold`` and at least ``spare`` at or above it. ``stats``
    receives (passes, gains collected, rows active at the end).
    """
    total = 0
    for i in range(lo.shape[0]):
        total += hi[i] - lo[i]
    if spare <= 0:
        return _counts_from(lo, out), _INF
    if spare >= total:
        return _counts_from(hi, out), -_INF
    limit = max(_COLLECT_MIN, lo.shape[0] >> 3)
    st_i, st_f, rows, na, a_next, a_last, nb, b_next, b_last, w_n, w_g = _init_state(
        kind, p0, p1, p2, c, lo, hi, True, False, np.empty((4, 0), dtype=np.int64),
        np.empty((4, 0), dtype=np.float64), np.empty((2, 0), dtype=np.float64))
    rows = _narrow(kind, p0, p1, p2, c, lo, hi, spare, limit, st_i, st_f, rows, na, a_next,
                   a_last, nb, b_next, b_last, w_n, w_g)
    stats[0] += st_i[_PASSES]
    stats[1] = st_i[_CB] - st_i[_CA]
    stats[2] = rows.shape[0]
    return _finish(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, limit, st_i, rows, na,
                   a_next, a_last, nb, b_next, b_last, out)


@njit(cache=True, error_model="numpy", inline="always")
def _closed_crossing(kind, x0, x1, x2, c, lam, aux, floor, ceil):
    """First ``k`` in ``[floor, ceil)`` with ``gain(k) <= lam`` (``ceil`` when none), for
    a kind whose crossing is known in closed form: the closed form where it is not
    within rounding of a step, the exact galloping search otherwise."""
    start, settled = _settled_start(kind, x0, x1, x2, c, lam, aux, floor, ceil)
    if settled:
        return start
    k, _, _ = _crossing(kind, x0, x1, x2, c, lam, floor, ceil, start, np.nan, np.nan)
    return k


@njit(cache=True, error_model="numpy", inline="always")
def _memo_new():
    """An empty memo of rows with equal parameters (direct-mapped, ``_MEMO_SIZE`` entries of
    the parameters' bits, two integers that must also match, and the value stored), and
    the bit-cast buffers its lookups use."""
    fbuf = np.empty(3, dtype=np.float64)
    return np.full((_MEMO_SIZE, 6), -1, dtype=np.int64), fbuf, fbuf.view(np.int64)


@njit(cache=True, error_model="numpy", inline="always")
def _memo_entry(memo, x0, x1, x2, u, v, fbuf, ibuf):
    """The memo entry of a row's parameters and ``(u, v)``, and the value it holds for them
    (-1 when it holds none, or another row's)."""
    fbuf[0] = x0
    fbuf[1] = x1
    fbuf[2] = x2
    entry = memo[np.int64(((np.uint64(ibuf[0]) ^ (np.uint64(ibuf[1]) * _MIX)
                            ^ np.uint64(ibuf[2])) * _MIX) >> _MEMO_SHIFT)]
    if (entry[0] == ibuf[0] and entry[1] == ibuf[1] and entry[2] == ibuf[2]
            and entry[3] == u and entry[4] == v):
        return entry, entry[5]
    return entry, np.int64(-1)


@njit(cache=True, error_model="numpy", inline="always")
def _memo_store(entry, ibuf, u, v, value):
    """Store ``value`` for the parameters whose bits :func:`_memo_entry` left in ``ibuf``."""
    entry[0] = ibuf[0]
    entry[1] = ibuf[1]
    entry[2] = ibuf[2]
    entry[3] = u
    entry[4] = v
    entry[5] = value


@njit(cache=True, error_model="numpy", inline="always")
def _off_step(g):
    """Whether a closed-form crossing ``g`` is finite and not within rounding of a step,
    so that ``ceil(g)`` is the count (else the gains themselves must decide)."""
    return math.isfinite(g) and abs(g - math.floor(g + 0.5)) > 1e-9 * (1.0 + abs(g))


@njit(cache=True, error_model="numpy")
def _closed_count(kind, p0, p1, p2, c, lo, hi, lam, ends, slot):
    """``sum_i #{steps of row i with gain > lam}`` in one pass over the parameters; each
    row's count (``lo`` plus its steps above ``lam``) goes to the work row of ``ends``
    (``ends[slot[2]]``) unless ``ends`` has no columns."""
    aux = _pass_constant(kind, lam)
    out = ends[slot[2]]
    keep = out.shape[0] > 0
    # Rows whose crossing lies within rounding of a step are settled by evaluating gains.
    # Prompts with equal parameters and bounds (equal estimates: common in training
    # batches) cross at the same step, so those rows are settled once per pass, through
    # a small direct-mapped memo keyed on the parameters' bits.
    memo, fbuf, ibuf = _memo_new()
    total = 0
    for i in range(lo.shape[0]):
        k = lo[i]
        if hi[i] > k:
            x0 = p0[i]
            x1 = p1[i]
            x2 = p2[i]
            k, settled = _settled_start(kind, x0, x1, x2, c, lam, aux, lo[i], hi[i])
            if not settled:
                entry, known_k = _memo_entry(memo, x0, x1, x2, lo[i], hi[i], fbuf, ibuf)
                if known_k >= 0:
                    k = known_k
                else:
                    k, _, _ = _crossing(kind, x0, x1, x2, c, lam, lo[i], hi[i], k, np.nan,
                                        np.nan)
                    _memo_store(entry, ibuf, lo[i], hi[i], k)
            total += k - lo[i]
        if keep:
            out[i] = k
    return total


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
        ends[0] = lo
        ends[1] = hi
    return ends, np.array([0, 1, 2], dtype=np.int64), np.ones(2, dtype=np.int64)


@njit(cache=True, error_model="numpy")
def _record_end(slot, known, side):
    """The work row, just written by a pass, becomes end ``side``'s counts."""
    work = slot[2]
    slot[2] = slot[side]
    slot[side] = work
    known[side] = 1


@njit(cache=True, error_model="numpy")
def _strided_subsample(p0, p1, p2, lo, hi, stride):
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
    key_a = _key(top, fbuf, ibuf)
    if ends.shape[1] > 0:
        ends[slot[0]] = lo  # nothing lies above the largest gain
        ends[slot[1]] = hi  # and everything above b, below the smallest
    known[:] = 1
    if bottom > -_INF:
        return key_a, _key_below(bottom, fbuf, ibuf), 0, total
    key_b = _key(-_INF, fbuf, ibuf) - 1  # the sentinel: every gain lies above it
    c_a = 0
    c_b = total
    if math.isfinite(finite_bottom) and finite_bottom < top:
        lam = np.nextafter(finite_bottom, -_INF)
        cnt = _closed_count(kind, p0, p1, p2, c, lo, hi, lam, ends, slot)
        stats[0] += 1
        if cnt > spare:
            key_b = _key(lam, fbuf, ibuf)
            c_b = cnt
            _record_end(slot, known, 1)
        else:
            key_a = _key(lam, fbuf, ibuf)
            c_a = cnt
            _record_end(slot, known, 0)
    return key_a, key_b, c_a, c_b


@njit(cache=True, error_model="numpy")
def _closed_top(kind, p0, p1, p2, c, lo, hi, value_a, value_b):
    """The largest gain in ``(value_b, value_a]`` (NaN when none): each row's gain at its
    crossing of ``value_a``, its largest gain not above it. One pass, one gain a row."""
    aux = _pass_constant(kind, value_a)
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
        value_a = _unkey(key_a, fbuf, ibuf)
        value_b = _unkey(key_b, fbuf, ibuf) if key_b >= _key(-_INF, fbuf, ibuf) else -_INF
        lam = np.nan
        if flat >= 2:
            flat = 0
            top = _closed_top(kind, p0, p1, p2, c, lo, hi, value_a, value_b)
            stats[0] += 1
            done += 1
            if top == top and key_b < _key(top, fbuf, ibuf) <= key_a:
                key_a = keys[0] = _key(top, fbuf, ibuf)  # no gain in (top, a]: C(top) = C(a)
                lam = np.nextafter(top, -_INF)
        elif stalls < 2 and math.isfinite(value_a) and math.isfinite(value_b) and \
                miss[1] > miss[0]:
            lam = value_a + (value_b - value_a) * (-miss[0]) / (miss[1] - miss[0])
        if not (lam == lam and key_b < _key(lam, fbuf, ibuf) < key_a):
            if key_b >= key_a - 1:
                break
            lam = _unkey((key_a >> 1) + (key_b >> 1) + (key_a & key_b & 1), fbuf, ibuf)
            stalls = 0
        cnt = _closed_count(kind, p0, p1, p2, c, lo, hi, lam, ends, slot)
        stats[0] += 1
        done += 1
        moved = cnt != counts[0] and cnt != counts[1]
        side = 0 if cnt <= spare else 1
        _record_end(slot, known, side)
        keys[side] = _key(lam, fbuf, ibuf)
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
    total = 0
    for i in range(lo.shape[0]):
        total += hi[i] - lo[i]
    passes = np.zeros(1, dtype=np.int64)
    ends, slot, known = _closed_ends(lo, hi, False, np.empty((3, 0), dtype=np.int64))
    key_a, key_b, c_a, c_b = _closed_extremes(kind, p0, p1, p2, c, lo, hi, spare, total, fbuf,
                                              ibuf, passes, ends, slot, known)
    key_a, key_b, c_a, c_b = _closed_narrow(kind, p0, p1, p2, c, lo, hi, spare,
                                            max(1, lo.shape[0] >> 3), key_a, key_b, c_a,
                                            c_b, fbuf, ibuf, passes, 8, ends, slot, known)
    value_a = _unkey(key_a, fbuf, ibuf)
    value_b = _unkey(key_b, fbuf, ibuf)
    if math.isfinite(value_a) and math.isfinite(value_b) and c_b > c_a:
        return value_a + (value_b - value_a) * (spare - c_a) / (c_b - c_a)
    return value_a


@njit(cache=True, error_model="numpy")
def _solve_closed(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out):
    """The engine for max-sum kinds whose crossings are known in closed form.

    Above ``_CLOSED_SUBSAMPLE_FROM`` rows, a strided subsample searched the same way
    gives the first trial values (below, the rows' extreme gains open the bracket);
    regula falsi on the count (alternating with bisection on the bit order of the
    value) narrows the bracket ``(b, a]`` with ``C(a) <= spare <= C(b)``, each step one
    pass that keeps its per-row counts for the end it becomes (the only per-row state);
    then the gains in the bracket are collected (no crossing is found again) and the
    remaining ones selected exactly (ties: fewer rollouts first, then the lower index).
    """
    m = lo.shape[0]
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    limit = max(_COLLECT_MIN, m >> 4)
    total = 0
    for i in range(m):
        total += hi[i] - lo[i]
    # The opening bracket: nothing lies above +inf and everything above the sentinel
    # key below -inf.
    key_a = _key(_INF, fbuf, ibuf)
    key_b = _key(-_INF, fbuf, ibuf) - 1
    c_a = 0
    c_b = total
    ends, slot, known = _closed_ends(lo, hi, True, work_i)
    if m < _CLOSED_SUBSAMPLE_FROM:
        key_a, key_b, c_a, c_b = _closed_extremes(kind, p0, p1, p2, c, lo, hi, spare, total,
                                                  fbuf, ibuf, stats, ends, slot, known)
    else:
        # Trial values from a strided subsample (one row in sixteen, at most _SUBSAMPLE)
        # for its share of the budget, the share corrected after each full pass by the
        # observed miss (a Newton step in budget space): cheaper than the rows' extreme
        # gains, two gain evaluations a row, and a far better first value.
        q0, q1, q2, lo_s, hi_s, cap_s, scale = _strided_subsample(
            p0, p1, p2, lo, hi, m // min(_SUBSAMPLE, m >> 4))
        share = spare * scale
        sub_stats = np.zeros(3, dtype=np.int64)
        for _ in range(_NEWTON_ROUNDS):
            if c_b - c_a <= limit or key_b >= key_a - 1:
                break
            target = np.int64(round(share))
            if target <= 0 or target >= cap_s:
                break
            if m >= _SUBSAMPLE_FROM:
                # Exact: with tied gains its threshold is one of the tied values, which
                # the full bracket then closes on at once.
                _, lam = _select(kind, q0, q1, q2, c, lo_s, hi_s, target, False, 0.0,
                                 sub_stats, np.empty(0, dtype=np.int64))
            else:
                lam = _closed_level(kind, q0, q1, q2, c, lo_s, hi_s, target, fbuf, ibuf)
            stats[3] += 1
            kl = _key(lam, fbuf, ibuf)
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
            share += _OVERSHOOT * (spare - cnt) * scale
        if key_a == _key(_INF, fbuf, ibuf) or key_b < _key(-_INF, fbuf, ibuf):
            # The subsample left an end open (e.g. its level was -inf): close it on the
            # rows' extremes rather than bisect the whole float range.
            # Values only: which per-row counts the merged ends have is not tracked here,
            # so the last pass finds them again.
            none, none_slot, _ = _closed_ends(lo, hi, False, np.empty((3, 0), dtype=np.int64))
            top_a, top_b, top_ca, top_cb = _closed_extremes(kind, p0, p1, p2, c, lo, hi,
                                                            spare, total, fbuf, ibuf, stats,
                                                            none, none_slot, known)
            known[:] = 0
            if top_a < key_a:
                key_a = top_a
                c_a = top_ca
            if top_b > key_b:
                key_b = top_b
                c_b = top_cb
    key_a, key_b, c_a, c_b = _closed_narrow(kind, p0, p1, p2, c, lo, hi, spare, limit, key_a,
                                            key_b, c_a, c_b, fbuf, ibuf, stats, 200, ends,
                                            slot, known)
    value_a = _unkey(key_a, fbuf, ibuf)
    value_b = _unkey(key_b, fbuf, ibuf) if key_b >= _key(-_INF, fbuf, ibuf) else -_INF
    below_all = key_b < _key(-_INF, fbuf, ibuf)
    # The per-row counts at both ends: kept from the passes, else found again (one pass).
    starts = ends[slot[0]]
    stops = ends[slot[1]]
    if known[0] == 0 or known[1] == 0:
        aux_a = _pass_constant(kind, value_a)
        aux_b = _pass_constant(kind, value_b)
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
        return _water_fill(starts, stops, spare - c_a, out)
    # Counts at a (all gains > a taken) and the gains in (b, a].
    counts = _counts_from(starts, out)
    n_collect = 0
    for i in range(m):
        n_collect += max(stops[i] - starts[i], 0)
    vals = np.empty(n_collect, dtype=np.float64)
    owner = np.empty(n_collect, dtype=np.int64)
    step = np.empty(n_collect, dtype=np.int64)
    # Rows with equal parameters and the same steps in the bracket have the same gains:
    # copied from the first such row (a memo as in _closed_count), not evaluated again.
    memo, fbuf, ibuf = _memo_new()
    e = 0
    for i in range(m):
        k0 = starts[i]
        k1 = stops[i]
        if k0 < k1:
            entry, first = _memo_entry(memo, p0[i], p1[i], p2[i], k0, k1, fbuf, ibuf)
            same = first >= 0
            if not same:
                _memo_store(entry, ibuf, k0, k1, e)
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
    threshold = _kth_largest(vals[:e].copy(), need)
    above, band = take_beyond(vals, e, threshold, owner, counts, True)
    left = need - above
    if left == 0:
        return counts
    nxt = np.zeros(e, dtype=np.float64)
    _pick_ties(band, left, nxt, step, owner, False, counts)
    return counts


@njit(cache=True, error_model="numpy")
def _water_fill(starts, stops, left, out):
    """``starts`` plus ``left`` steps taken one at a time from the tied ranges
    ``[starts_i, stops_i)``, the row with the fewest rollouts first, then the lower
    index (the tie rule of sums)."""
    m = starts.shape[0]
    counts = _counts_from(starts, out)
    k_low = np.int64(0)
    k_high = np.int64(0)
    first = True
    for i in range(m):
        if stops[i] > starts[i]:
            if first or starts[i] < k_low:
                k_low = starts[i]
            if first or stops[i] > k_high:
                k_high = stops[i]
            first = False
    while k_low < k_high:
        mid = k_low + (k_high - k_low + 1) // 2
        s = 0
        for i in range(m):
            s += min(max(mid - starts[i], 0), stops[i] - starts[i])
        if s <= left:
            k_low = mid
        else:
            k_high = mid - 1
    used = 0
    for i in range(m):
        add = min(max(k_low - starts[i], 0), stops[i] - starts[i])
        counts[i] += add
        used += add
    for i in range(m):
        if used == left:
            break
        if counts[i] == k_low and k_low < stops[i] and starts[i] <= k_low:
            counts[i] += 1
            used += 1
    return counts


#: The kinds that :func:`_closed_form` sends to the closed-form engine, for callers that
#: choose the entry kernel in Python (:func:`solve_closed` compiles that engine alone).
CLOSED_FORM_KINDS = frozenset({FAIR_SUM, FAIR_LOG, FAIR_INVERSE, POINT_HIT, KNAPSACK,
                               RLOO_VARIANCE, INVERSE_COUNT})


@njit(cache=True, error_model="numpy")
def solve_closed(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out):
    """:func:`solve` for a kind of :data:`CLOSED_FORM_KINDS`, with the same arguments but
    ``maxmin``, ``tie_rtol``, ``work_f`` and ``work_g`` (which the closed-form engine does
    not read). Its own entry so that a first call compiles the closed-form engine only,
    not the general one beside it (about a third of the default policy's compile time)."""
    m = lo.shape[0]
    total = 0
    for i in range(m):
        total += hi[i] - lo[i]
    if spare <= 0:
        return _counts_from(lo, out)
    if spare >= total:
        return _counts_from(hi, out)
    return _solve_closed(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out)


@njit(cache=True, error_model="numpy")
def solve(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, stats, work_i, work_f, work_g,
          out):
    """Exact counts for ``spare`` rollouts over rows ``[lo, hi)`` (see module docstring).

    ``work_i`` (int64, shape (4, M)), ``work_f`` (float64, (4, M)) and ``work_g``
    (float64, (2, M)) hold the per-row state when they have M columns (else it is
    allocated here): allocated by numpy, which asks the kernel for transparent huge
    pages, the first writes to that state cost a fraction of what they cost in memory
    that numba allocates (``work_i`` also holds the closed-form engine's counts). The
    counts are written into ``out`` (int64, shape (M,)) likewise, when it has M entries.

    For large ``M`` the first trial values come from a strided subsample of
    ``_SUBSAMPLE`` rows solved exactly for its share of the budget; after each
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
        return _counts_from(lo, out)
    if spare >= total:
        return _counts_from(hi, out)
    if _closed_form(kind):
        return _solve_closed(kind, p0, p1, p2, c, lo, hi, spare, stats, work_i, out)
    if m < _SUBSAMPLE_FROM:
        counts, _ = _select(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, stats, out)
        return counts
    limit = max(_COLLECT_MIN, m >> 3)
    q0, q1, q2, lo_s, hi_s, cap_s, scale = _strided_subsample(p0, p1, p2, lo, hi,
                                                              m // _SUBSAMPLE)
    # The ends' per-row values are written by the first pass (or, without one, below).
    st_i, st_f, rows, na, a_next, a_last, nb, b_next, b_last, w_n, w_g = _init_state(
        kind, p0, p1, p2, c, lo, hi, False, True, work_i, work_f, work_g)
    fbuf = np.empty(1, dtype=np.float64)
    ibuf = fbuf.view(np.int64)
    opened = False
    share = spare * scale
    sub_stats = np.zeros(3, dtype=np.int64)
    for _ in range(_NEWTON_ROUNDS):
        if _settled(st_i, spare, limit):
            break
        target = np.int64(round(share))
        if target <= 0 or target >= cap_s:
            break
        _, lam = _select(kind, q0, q1, q2, c, lo_s, hi_s, target, maxmin, 0.0, sub_stats,
                         np.empty(0, dtype=np.int64))
        stats[3] += 1
        if opened:
            rows, cnt = _try_pass(kind, p0, p1, p2, c, spare, lam, st_i, st_f, rows, na,
                                  a_next, a_last, nb, b_next, b_last, w_n, w_g)
            if cnt < 0:
                break
        else:
            if lam != lam or not (st_i[_KEY_B] < _key(lam, fbuf, ibuf) < st_i[_KEY_A]):
                break
            upper, cnt = _first_pass(kind, p0, p1, p2, c, spare, lam, lo, hi, st_i, st_f,
                                     rows, na, a_next, a_last, nb, b_next, b_last)
            if not upper:
                na, a_next, a_last, nb, b_next, b_last = nb, b_next, b_last, na, a_next, a_last
                _lower_first(lo, hi, na, a_next, a_last, b_next, b_last)
            rows = _active(na, nb, rows)
            opened = True
        share += _OVERSHOOT * (spare - cnt) * scale
    if not opened:
        _open_ends(lo, hi, na, a_next, a_last, nb, b_next, b_last)
    rows = _narrow(kind, p0, p1, p2, c, lo, hi, spare, limit, st_i, st_f, rows, na, a_next,
                   a_last, nb, b_next, b_last, w_n, w_g)
    stats[0] += st_i[_PASSES]
    stats[1] = st_i[_CB] - st_i[_CA]
    stats[2] = rows.shape[0]
    counts, _ = _finish(kind, p0, p1, p2, c, lo, hi, spare, maxmin, tie_rtol, limit, st_i,
                        rows, na, a_next, a_last, nb, b_next, b_last, out)
    return counts


@njit(cache=True, error_model="numpy")
def _fair_utility(a, alpha, m):
    """``U_alpha(w)`` at ``w = 1 - exp(-a m)``; ``-inf`` at ``w = 0`` for ``alpha >= 1``,
    and ``-inf`` too where ``-w^(1 - alpha) / (alpha - 1)`` is below the float range."""
    if a == 0.0 or m <= 0:
        return -_INF if alpha >= 1.0 else 0.0
    log_w = 0.0 if a == _INF else _log1mexp(a * m)
    if alpha == 1.0:
        return log_w
    return math.exp((1.0 - alpha) * log_w) / (1.0 - alpha)


@njit(cache=True, error_model="numpy")
def gains_at(kind, p0, p1, p2, c, counts):
    """Per-prompt gain of the step ``counts[i] -> counts[i] + 1``."""
    m = counts.shape[0]
    out = np.empty(m, dtype=np.float64)
    for i in range(m):
        out[i] = gain(kind, p0[i], p1[i], p2[i], c, counts[i])
    return out


@njit(cache=True, error_model="numpy")
def values(kind, p0, p1, p2, c, counts):
    """Per-prompt objective terms at ``counts``: levels (max-min kinds), utilities
    (max-sum kinds) or costs (min-sum kinds)."""
    m = counts.shape[0]
    out = np.empty(m, dtype=np.float64)
    for i in range(m):
        n = counts[i]
        x0 = p0[i]
        x1 = p1[i]
        x2 = p2[i]
        if kind == BETA_LEVELS:
            out[i] = 0.0 - gain(kind, x0, x1, x2, c, n)
        elif kind == KNAPSACK:
            if x0 == 0.0 or x0 == 1.0:
                out[i] = 0.0
            else:
                q = 1.0 - x0
                # 1 - p^n - (1-p)^n, without cancellation when both are small.
                hit = -math.expm1(n * x1) - math.exp(n * x2)
                out[i] = hit * x0 * q * q
        elif kind == HIT_UTILITY:
            if x0 == 0.0:
                out[i] = 0.0
            elif x1 == 0.0:
                out[i] = 1.0 if n >= 1 else 0.0
            else:
                # The third row holds log(a) + the log-gamma ratio (see prepare); the
                # ratio itself is computed afresh where the moment needs it.
                ratio = (math.lgamma(x0 + x1) - math.lgamma(x1) if n > _PRODUCT_MAX
                         else 0.0)
                out[i] = -math.expm1(_log_beta_moment(x0, x1, ratio, n))
        elif kind == ALPHA_FAIR:
            out[i] = _fair_utility(x0, x2, n - c)
        elif kind == FAIR_SUM or kind == FAIR_LOG or kind == FAIR_INVERSE:
            out[i] = _fair_utility(x0, 0.0 if kind == FAIR_SUM else (
                1.0 if kind == FAIR_LOG else 2.0), n - c)
        elif kind == POINT_HIT:
            if x0 == 0.0 or n <= 0:
                out[i] = 0.0
            elif x0 == 1.0:
                out[i] = 1.0
            else:
                out[i] = -math.expm1(n * x2)
        elif kind == RLOO_VARIANCE:
            # x1 = -gamma log p, so the linear term is -x1 * n.
            lin = -x1 * n if x1 != 0.0 else 0.0
            if x0 == 0.0:
                out[i] = lin
            elif n <= 1:
                out[i] = _INF
            else:
                out[i] = x0 / (n - 1.0) + lin
        else:
            if x0 == 0.0:
                out[i] = 0.0
            else:
                out[i] = x0 / n
    return out
