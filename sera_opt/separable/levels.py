"""Max-min objectives: SERA's levels at known probabilities (:class:`PointLevels`) and
the expected factor's levels under Beta posteriors (:class:`BetaLevels`)."""

from __future__ import annotations

import math

import numpy as np

from .. import _jit
from ..kernels.kinds import BETA_LEVELS, PRODUCT_MAX
from ..problem import success_rates
from .inputs import probabilities, validate_beta_posterior
from .objective import KernelObjective, SeparableObjective


class PointLevels(SeparableObjective):
    """SERA's levels ``a_i (n - c)`` with ``a_i = -log(1 - p_i)`` (max-min).

    Solved by the waterline kernels (SERA's fast path). ``p = 0`` (level 0
    whatever ``n``) and ``p = 1`` (infinite level) are ranked by the limit order
    of :mod:`~sera_opt.separable.tiers`: the first take spare rollouts first, the
    second last.

    Parameters
    ----------
    success_probs : array_like
        Success probabilities in [0, 1].
    offset : {0, 1}
    rates : ndarray, optional
        ``-log(1 - p)`` if already computed (an :class:`~sera_opt.AllocationProblem`
        caches it).
    """

    sense = "max-min"

    def __init__(self, success_probs, offset: int = 0, *, rates=None):
        p = probabilities(success_probs)
        super().__init__(p.shape[0], offset)
        self.rates = np.asarray(success_rates(p) if rates is None else rates, dtype=np.float64)
        self.hint = math.nan

    @classmethod
    def from_problem(cls, problem, *, hint: float = math.nan) -> PointLevels:
        """SERA's levels of a validated :class:`~sera_opt.AllocationProblem`, sharing its
        cached rates. ``hint``, a level near the answer (the continuous waterline), only
        speeds the search up."""
        objective = cls.__new__(cls)
        # What SeparableObjective.__init__ checks, the problem has validated.
        objective._m = problem.num_prompts
        objective.offset = problem.offset
        objective.rates = problem.rates
        objective.hint = float(hint)
        return objective

    def terms(self, counts) -> np.ndarray:
        m = self._counts(counts) - self.offset
        with np.errstate(invalid="ignore"):
            levels = self.rates * m
        # inf * 0 is NaN; a prompt with no effective rollouts has level 0.
        return np.where(m > 0, levels, 0.0)

    def gains(self, counts) -> np.ndarray:
        return -self.terms(counts)

    def edges(self):
        return self.rates == 0, np.isinf(self.rates)

    def _solve_rows(self, idx, lo, hi, spare, stats) -> np.ndarray:
        return lo + linear_fill(self.rates[idx], lo - self.offset, hi - lo, spare, self.hint)


def linear_fill(rates, m_lo, cap, extra, hint=math.nan) -> np.ndarray:
    """Increments of SERA's greedy on finite positive rates (the waterline kernels)."""
    from ..kernels.waterline import linear_solve

    lo = np.ascontiguousarray(m_lo, dtype=np.int64)  # offset 0: lo is m_lo itself
    hi = lo + np.ascontiguousarray(cap, dtype=np.int64)
    counts = np.empty(lo.shape[0], dtype=np.int64)
    linear_solve(np.ascontiguousarray(rates, dtype=np.float64), lo, hi, False, 0, int(extra),
                 float(hint), 0.0, 0, counts)
    return counts - lo


class BetaObjective(KernelObjective):
    """A Beta posterior's kernel rows: ``alpha``, ``beta`` and ``lgamma(alpha + beta) -
    lgamma(beta)`` (plus ``log alpha`` for the hit utility, whose count passes' guess reads
    that sum). The gains read that log-gamma row only beyond ``PRODUCT_MAX``
    effective rollouts, and a count pass's guess reads it at any count; so a solve whose
    bounds keep every gain below that limit gets the guess's approximation instead (in
    vectorized arithmetic, against a log-gamma a prompt), and the exact row is prepared when first needed
    (a solve with larger bounds, :meth:`gains`, :meth:`terms`)."""

    def __init__(self, alpha, beta, offset: int = 0):
        a, b = validate_beta_posterior(alpha, beta)
        super().__init__(a, b, offset=offset)
        self._p2 = None
        self._p2_guess = None

    @classmethod
    def of_checked(cls, alpha: np.ndarray, beta: np.ndarray, offset: int = 0):
        """The objective of a posterior that :func:`validate_beta_posterior` has passed,
        or one derived from such a posterior that still holds what it checks (float64
        rows, finite, ``>= 0``, ``alpha + beta > 0``; more failures keep all of it): a
        session in rounds builds one per round from the posterior it checked when it
        started, and checking it again was a tenth of a round's planning."""
        objective = cls.__new__(cls)
        KernelObjective.__init__(objective, alpha, beta, offset=offset)
        objective._p2 = None
        objective._p2_guess = None
        return objective

    def _prepared(self, exact: bool) -> np.ndarray:
        kernels = _jit.kernels("sera_opt.kernels.gains")
        return kernels.prepare(self.kernel_kind, self._p0, self._p1, np.empty_like(self._p0), exact)

    def kernel_params(self):
        if self._p2 is None:
            self._p2 = self._prepared(True)
        return self._p0, self._p1, self._p2

    def _solve_params(self, hi: np.ndarray):
        if self._p2 is not None or hi.size == 0:
            return self.kernel_params()
        # Gains are evaluated at counts up to hi (the tie rule reads the next one).
        effective = int(hi.max()) - (self.offset if self.kernel_kind == BETA_LEVELS else 0)
        if effective > PRODUCT_MAX:
            return self.kernel_params()
        if self._p2_guess is None:
            self._p2_guess = self._prepared(False)
        return self._p0, self._p1, self._p2_guess


class BetaLevels(BetaObjective):
    """Levels of the expected factor under a Beta posterior (max-min).

    ``l_i(n) = -log E[(1 - p_i)^(n - c)]`` with ``p_i ~ Beta(alpha_i, beta_i)``,
    so that ``E[w_c(p_i, n)] = 1 - exp(-l_i(n))``. The expectation is the product
    ``prod_{j < m} (beta + j) / (alpha + beta + j)``, evaluated through
    log-gamma. ``l_i`` is increasing in ``n`` (strictly when ``alpha_i > 0``)
    and, for a point mass, reduces to SERA's ``a_i (n - c)``. A point mass at
    ``p = 0`` (``alpha = 0``) or ``p = 1`` (``beta = 0``) is ranked by the limit
    order of :mod:`~sera_opt.separable.tiers`, as in SERA.
    """

    sense = "max-min"
    kernel_kind = BETA_LEVELS
    _tie_rtol = 1e-10

    def edges(self):
        return self._p0 == 0, self._p1 == 0


def expected_factors(alpha, beta, counts, offset: int = 0) -> np.ndarray:
    """``E[w_c(p, n)]`` for ``p ~ Beta(alpha, beta)``, elementwise (float64).

    ``alpha = 0`` is a point mass at ``p = 0`` (factor 0) and ``beta = 0`` one
    at ``p = 1`` (factor 1 once ``n > c``).
    """
    a, b = validate_beta_posterior(alpha, beta)
    levels = BetaLevels(a, b, offset=offset).terms(np.asarray(counts, dtype=np.int64))
    return -np.expm1(-levels)
