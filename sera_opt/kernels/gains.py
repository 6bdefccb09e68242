"""Per-kind gain functions of the separable engine (numba kernels): the parameter
rows (:func:`prepare`), the gain of one step, closed-form guesses of where a row's
gains cross a value, and the objective's terms (:func:`values`).
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from .betamath import (
    LOG_BLOCK,
    approx_logs,
    fair_guess,
    fair_log_gain,
    fair_utility,
    lgamma_diff,
    log_beta_moment,
    ratio_product,
    ratio_step,
    softplus,
)
from .kinds import (
    ALPHA_FAIR,
    BETA_LEVELS,
    FAIR_INVERSE,
    FAIR_LOG,
    FAIR_SUM,
    HIT_UTILITY,
    INVERSE_COUNT,
    KNAPSACK,
    POINT_HIT,
    PRODUCT_MAX,
    RLOO_VARIANCE,
)

_INF = np.inf

@njit(cache=True, error_model="numpy")
def prepare(kind, p0, p1, p2, exact):
    """Write the third parameter row into ``p2`` and return it: for the Beta kinds the
    log-gamma ratio ``lgamma(alpha + beta) - lgamma(beta)``, plus ``log alpha`` for the hit
    utility (the log of its gains' constant: ``gain(k) = p2 + lgamma(beta + k) -
    lgamma(alpha + beta + k + 1)``); 0 where ``alpha`` or ``beta`` is 0, and for the
    other kinds.

    The Beta kinds' gains read this row only beyond ``PRODUCT_MAX`` effective rollouts
    (below, they take the product of ratios); below, only the guess of a count pass reads
    it. Without ``exact`` the log-gamma ratio is the guess's own approximation ``alpha
    log(beta + max(alpha - 1, 0) / 2)``, and the logs are :func:`approx_logs` (within
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
        logs_b = np.empty(LOG_BLOCK, dtype=np.float64)
        logs_a = np.empty(LOG_BLOCK, dtype=np.float64)
        scratch = np.empty(LOG_BLOCK, dtype=np.float64)
        for start in range(0, m, LOG_BLOCK):
            n = min(LOG_BLOCK, m - start)
            for j in range(n):
                a = p0[start + j]
                logs_b[j] = p1[start + j] + 0.5 * max(a - 1.0, 0.0)
                logs_a[j] = a
            approx_logs(logs_b, n, scratch)
            if hit:
                approx_logs(logs_a, n, scratch)
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


@njit(cache=True, error_model="numpy")
def closed_form(kind):
    """Whether this kind's crossings are known in closed form for every row, so that
    :func:`closed_solve` serves it: the alpha-fair kinds at alpha = 0, 1, 2, the point
    hit utility (its log gain ``k log(1 - p) + log p`` is linear in ``k``), VIP's and
    GVM's costs (a gain ``a / ((k - 1) k) + b`` or ``W / (k (k + 1))`` crosses a value
    at the root of a quadratic), and Knapsack, whose crossings are certified by bounds
    (:func:`knapsack_count`) all but near a step."""
    return (kind == FAIR_SUM or kind == FAIR_LOG or kind == FAIR_INVERSE or kind == POINT_HIT
            or kind == KNAPSACK or kind == RLOO_VARIANCE or kind == INVERSE_COUNT)


@njit(cache=True, error_model="numpy")
def exact_guess(kind, x2):
    """Whether :func:`crossing_guess` is the exact crossing (up to rounding) for this kind."""
    if (kind == FAIR_SUM or kind == FAIR_LOG or kind == FAIR_INVERSE or kind == POINT_HIT
            or kind == INVERSE_COUNT):
        return True
    return kind == ALPHA_FAIR and (x2 == 0.0 or x2 == 1.0)


@njit(cache=True, error_model="numpy")
def pass_constant(kind, lam):
    """What a count pass at ``lam`` computes once instead of once per row."""
    if kind == FAIR_LOG:
        return math.exp(-lam)
    if kind == FAIR_INVERSE:
        return math.exp(-lam)
    if kind == KNAPSACK:
        return math.log(lam) if lam > 0.0 else np.nan
    return 0.0


@njit(cache=True, error_model="numpy")
def knapsack_count(x0, x1, x2, log_lam, floor, ceil):
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
def fair_log_crossing(a, p, c, lam, inv_g):
    """Exact ``c + m`` where ``log r(m) = lam`` for alpha = 1 (see :func:`fair_guess`):
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
    return c + softplus(math.log(p) - lam) / a


@njit(cache=True, error_model="numpy")
def fair_inverse_crossing(a, p, c, lam, inv_g):
    """Exact ``c + m`` where the alpha = 2 gain ``1/w(m) - 1/w(m + 1) = exp(lam)``.

    With ``u = exp(-a m)`` and ``q = 1 - p`` the gain is ``p u / ((1 - u)(1 - q u))``;
    equal to ``G = exp(lam)`` at the root in (0, 1) of ``G q u^2 - (G (1 + q) + p) u +
    G = 0``, ``u = 2 / ((1 + q) + p H + sqrt(p^2 + 2 p (1 + q) H + p^2 H^2))`` with ``H =
    1 / G = inv_g``, and ``-log u`` taken without cancellation (below).
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
    # -log u = log1p(x / 2) with x = ph + sqrt(D) - p, D = p^2 + 2 (1 + q) ph + ph^2, and
    # sqrt(D) - p formed as (D - p^2) / (sqrt(D) + p): every term is positive, so a step
    # near the first (u near 1, a large lam) keeps its digits; log(u) of u = 2 / (1 + q +
    # ph + sqrt(D)) lost them to cancellation and put such a step's crossing a count off.
    grow = 2.0 * (1.0 + q) * ph + ph * ph
    root = math.sqrt(p * p + grow)
    half = 0.5 * ((1.0 + q) + ph + root)  # 1 / u
    if half >= 2.0:
        return c + math.log(half) / a  # u <= 1/2: log keeps its digits
    x = 0.5 * (ph + grow / (root + p))
    # log1p(x) in Goldberg's form, as in fair_log_crossing (log is several times faster).
    w = 1.0 + x
    if w == 1.0:
        return c + x / a
    return c + (math.log(w) * x / (w - 1.0)) / a


@njit(cache=True, error_model="numpy")
def gain(kind, x0, x1, x2, c, k):
    """Gain of prompt's step ``k -> k + 1`` (see the module docstring)."""
    if kind == BETA_LEVELS:
        m = k - c
        if m <= 0 or x0 == 0.0:
            return 0.0
        if x1 == 0.0:
            return -_INF
        return log_beta_moment(x0, x1, x2, m)
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
        if k > PRODUCT_MAX:
            # x2 = log(a) + lgamma(a + b) - lgamma(b) (see prepare).
            return x2 + lgamma_diff(x1 + k, x0) - math.log(x0 + x1 + k)
        acc, q = ratio_product(x0, x1, k)
        return _hit_log(acc, q, x0 / (x0 + x1 + k))
    if kind == RLOO_VARIANCE:
        if k <= 1:
            return _INF if x0 > 0.0 else x1
        return x0 / (float(k - 1) * float(k)) + x1
    if kind == ALPHA_FAIR:
        return fair_log_gain(x0, x1, x2, k - c)
    if kind == FAIR_SUM:
        return fair_log_gain(x0, x1, 0.0, k - c)
    if kind == FAIR_LOG or kind == FAIR_INVERSE:
        if x0 == 0.0:
            return -_INF
        return fair_log_gain(x0, math.log(x1), 1.0 if kind == FAIR_LOG else 2.0, k - c)
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
    :func:`log_beta_moment` rescaled into ``acc``, ``r = a / (a + b + k)``), with one log
    where ``q r`` does not underflow."""
    t = q * r
    if t >= 1e-290:
        return acc + math.log(t)
    return acc + math.log(q) + math.log(r)


@njit(cache=True, error_model="numpy")
def hit_walk(x0, x1, lam, k, floor, ceil, g_below, g_ceil):
    """A count pass's search on a hit utility row from its guess ``k`` (``floor < k <
    ceil``, ``k <= PRODUCT_MAX``, ``x0, x1 > 0``), with one product of ratios walked
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
        acc, q = ratio_product(x0, x1, k - 2)
        acc_1, q_1 = ratio_step(x0, x1, k - 2, acc, q)
    else:
        acc, q = 0.0, 1.0
        acc_1, q_1 = ratio_product(x0, x1, k - 1)
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
    stop = min(k + 4, PRODUCT_MAX + 1)
    while True:
        acc, q = ratio_step(x0, x1, j, acc, q)
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
def crossing_guess(kind, x0, x1, x2, c, lam):
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
        return fair_guess(x0, x1, x2, c, lam)
    if kind == FAIR_SUM:
        return fair_guess(x0, x1, 0.0, c, lam)
    if kind == FAIR_LOG:
        return fair_log_crossing(x0, x1, c, lam, math.exp(-lam))
    if kind == FAIR_INVERSE:
        return fair_inverse_crossing(x0, x1, c, lam, math.exp(-lam))
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
                ratio = (math.lgamma(x0 + x1) - math.lgamma(x1) if n > PRODUCT_MAX
                         else 0.0)
                out[i] = -math.expm1(log_beta_moment(x0, x1, ratio, n))
        elif kind == ALPHA_FAIR:
            out[i] = fair_utility(x0, x2, n - c)
        elif kind == FAIR_SUM or kind == FAIR_LOG or kind == FAIR_INVERSE:
            out[i] = fair_utility(x0, 0.0 if kind == FAIR_SUM else (
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
