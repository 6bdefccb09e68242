"""The one exact engine for separable integer allocation problems.

Every allocation rule in sera_opt chooses integer counts ``n_i`` with
``sum_i n_i = B`` and ``lo_i <= n_i <= hi_i`` to optimize a *separable*
objective of one of three shapes:

* ``"max-min"``: lexicographically maximize the sorted levels ``l_i(n_i)``,
  each increasing in ``n`` (SERA, and SERA on expected factors);
* ``"max-sum"``: maximize ``sum_i u_i(n_i)``, each ``u_i`` concave in ``n``
  (the alpha-fair family, Knapsack RL, HORA);
* ``"min-sum"``: minimize ``sum_i f_i(n_i)``, each ``f_i`` convex in ``n``
  (VIP, GVM).

For all three, handing out the spare budget ``B - sum(lo)`` one rollout at a
time to the best marginal step (the largest utility gain, the largest cost
reduction, or the lowest current level) is exact: with one budget constraint
and concave separable terms, the greedy's ``S`` steps are the ``S`` largest
marginal gains, and no other feasible allocation collects more. The engine
finds those ``S`` gains without walking through them, in one of three ways:

* **SERA's linear levels** (:class:`PointLevels`) have a closed-form count per
  prompt at any level; the waterline kernels (``_waterline_kernels.py``) locate
  the threshold with a few O(M) passes. This is the fast path SERA runs on.
* **Objectives with a numba gain kernel** (every other built-in objective)
  run the threshold search of ``_separable_kernels.py``: a bracket on the gain
  value narrowed by counting passes (a closed-form guess of each row's
  crossing, settled exactly by a galloping search on the gain itself, or, where
  the crossing is known in closed form, by no gain evaluation at all), then a
  selection among the few gains left.
* **Any other objective** (a user's subclass that defines :meth:`gains` and
  :meth:`terms` in numpy) runs the same threshold search written in numpy:
  bisection on the gain value with a vectorized binary search per prompt.
  Slower, and exact by the same argument; it also serves as the slow reference
  of the tests.

Ties at the final threshold (THEORY.md leaves them open): for max-min the
step whose next level is highest goes first (lexicographically better), then
for every shape the prompt with fewer rollouts so far, then the lower index.
Prompts whose steps all have the same gain thus share spare rollouts evenly.
For :class:`BetaLevels`, levels within ``1e-10`` (relative) of the threshold
count as tied: levels that agree in exact arithmetic differ by rounding, and
rounding must not decide a lexicographic optimum.

Max-min objectives can have prompts whose level is 0 or infinite at every
count (``p = 0`` or ``p = 1``); where the plain order cannot rank them, the
limit order of :mod:`sera_opt.solvers._tiers` does, in one place for every
max-min solver.

A new separable objective is one subclass of :class:`SeparableObjective`
(its ``sense``, :meth:`gains` and :meth:`terms`); a policy that allocates by
it is one :class:`~sera_opt.policies.SeparablePolicy` subclass naming it.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from .. import _jit
from ..exceptions import InfeasibleBudgetError, SeraOptError, SolverError
from ..problem import (
    MAX_BUDGET,
    _exact_sum,
    refuse_masked,
    success_rates,
    validate_count,
    validate_offset,
    validate_real,
)
from . import _tiers

__all__ = [
    "SeparableObjective",
    "PointLevels",
    "BetaLevels",
    "KnapsackValue",
    "HitUtility",
    "PointHitUtility",
    "RLOOVariance",
    "InverseCountCost",
    "AlphaFairUtility",
    "solve_separable",
    "validate_beta_posterior",
    "check_alpha",
]

SENSES = ("max-min", "max-sum", "min-sum")
# The numpy engine materializes tied max-min steps to order them; past this many
# it refuses rather than exhaust memory.
_MAX_TIED_STEPS = 10**7


def _as_float_row(values, name: str, m: int | None = None) -> np.ndarray:
    refuse_masked(values, name)
    try:
        raw = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise SeraOptError(f"{name} must be a 1-D array of numbers: {exc}") from exc
    if raw.dtype.kind not in "fiu":
        what = "booleans (True is not read as 1)" if raw.dtype == np.bool_ else \
            f"dtype {raw.dtype}"
        raise SeraOptError(f"{name} must be a 1-D array of numbers, got {what}.")
    arr = raw.astype(np.float64, copy=False)
    if arr.ndim != 1:
        raise SeraOptError(f"{name} must be 1-D (one entry per prompt), got shape {arr.shape}.")
    if m is not None and arr.shape[0] != m:
        raise SeraOptError(f"{name} must have one entry per prompt ({m}), got {arr.shape[0]}.")
    # The minimum is NaN where any entry is (a reduction, no temporary the size of the row).
    if arr.size and np.isnan(arr.min()):
        raise SeraOptError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}.")
    return arr


def _probabilities(success_probs) -> np.ndarray:
    p = _as_float_row(success_probs, "success_probs")
    if p.size and not (p.min() >= 0 and p.max() <= 1):
        i = int(np.flatnonzero((p < 0) | (p > 1))[0])
        raise SeraOptError(
            f"success_probs must lie in [0, 1], got {p[i]!r} at index {i}; sera_opt does not "
            f"clip them."
        )
    return p


def validate_beta_posterior(alpha, beta, m: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check Beta posterior parameters: finite, ``>= 0``, ``alpha + beta > 0``.

    ``alpha = 0`` stands for a point mass at ``p = 0`` and ``beta = 0`` for one
    at ``p = 1`` (the limits of the Beta family).
    """
    a = _as_float_row(alpha, "posterior alpha", m)
    b = _as_float_row(beta, "posterior beta", a.shape[0])
    if not a.size:
        return a, b
    # Reductions first (no temporaries the size of the rows); the masks only to name
    # the first bad entry.
    for name, arr in (("alpha", a), ("beta", b)):
        if arr.min() >= 0 and arr.max() < np.inf:
            continue
        bad = ~np.isfinite(arr) | (arr < 0)
        i = int(np.flatnonzero(bad)[0])
        raise SeraOptError(
            f"posterior {name} must be finite and >= 0; got {arr[i]!r} at index {i}. "
            f"Pass Beta parameters, e.g. from sera_opt.SuccessTracker.posterior()."
        )
    if a.min() > 0 or b.min() > 0:
        return a, b
    both = (a == 0) & (b == 0)
    if both.any():
        i = int(np.flatnonzero(both)[0])
        raise SeraOptError(
            f"posterior alpha and beta are both 0 at index {i}: that is no distribution; "
            f"give at least one of them a positive value."
        )
    return a, b


def check_alpha(alpha) -> float:
    """The fairness ``alpha`` as a float in ``[0, inf]``, or a :class:`SeraOptError`."""
    return validate_real(alpha, "alpha", minimum=0.0, allow_inf=True,
                         meaning="0 sums the factors, 1 is proportional fairness, inf is SERA's "
                                 "max-min")


# ---------------------------------------------------------------------- objectives
class SeparableObjective:
    """A separable objective over integer counts, in the form the engine solves.

    A subclass sets :attr:`sense` and implements :meth:`gains` and :meth:`terms`
    (vectorized over prompts, in numpy); :meth:`edges` is optional for max-min
    objectives. That is all a new objective needs: :meth:`solve` (and
    :func:`solve_separable`) then return its exact integer optimum. The
    built-in objectives also carry a numba kernel, which makes them fast.

    Parameters
    ----------
    num_prompts : int
        ``M``.
    offset : {0, 1}
        The estimator offset ``c`` the objective is defined with (0 when it
        does not depend on one).

    Attributes
    ----------
    sense : {"max-min", "max-sum", "min-sum"}
    """

    sense: ClassVar[str]
    # Set by built-in objectives: the numba kernel's id and its three rows of
    # per-prompt parameters (see _separable_kernels.py); None uses the numpy engine.
    _kind: ClassVar[int | None] = None
    # Max-min only: levels this close (relative) to the final threshold count as
    # tied, so that the tie rule, not rounding, decides between them.
    _tie_rtol: ClassVar[float] = 0.0

    def __init__(self, num_prompts: int, offset: int = 0):
        if getattr(self, "sense", None) not in SENSES:
            raise SeraOptError(
                f"{type(self).__name__}.sense must be one of {SENSES}, got "
                f"{getattr(self, 'sense', None)!r}."
            )
        self._m = int(num_prompts)
        self.offset = validate_offset(offset)

    @property
    def num_prompts(self) -> int:
        return self._m

    def gains(self, counts) -> np.ndarray:
        """Marginal gain of each prompt's step ``counts[i] -> counts[i] + 1`` (float64).

        ``u_i(k + 1) - u_i(k)`` for max-sum, ``f_i(k) - f_i(k + 1)`` for min-sum,
        ``-l_i(k)`` for max-min (the lowest level goes first); non-increasing in
        ``k`` for every prompt. Must accept any count at or above the prompt's
        minimum (also one step past its maximum). Any strictly increasing
        function of the gain may be returned instead (the engine only compares).
        """
        if self._kind is None:
            raise NotImplementedError(f"{type(self).__name__} must implement gains(counts).")
        kernels = _jit.kernels("sera_opt.solvers._separable_kernels")

        return kernels.gains_at(self._kind, *self._params(), self.offset, self._counts(counts))

    def terms(self, counts) -> np.ndarray:
        """Per-prompt terms at integer ``counts``: levels, utilities or costs (float64)."""
        if self._kind is None:
            raise NotImplementedError(f"{type(self).__name__} must implement terms(counts).")
        kernels = _jit.kernels("sera_opt.solvers._separable_kernels")

        return kernels.values(self._kind, *self._params(), self.offset, self._counts(counts))

    def edges(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Max-min only: masks of the prompts whose level is 0 (resp. infinite) at every
        count, which the limit order of :mod:`~sera_opt.solvers._tiers` ranks. None: none."""
        return None

    def value(self, counts) -> float:
        """The objective: ``min`` of the levels, or the ``sum`` of the terms."""
        t = self.terms(counts)
        return float(t.min() if self.sense == "max-min" else t.sum())

    def solve(self, budget, min_rollouts, max_rollouts, *, stats=None) -> np.ndarray:
        """Shorthand for :func:`solve_separable` on this objective (the same arguments)."""
        return solve_separable(self, budget, min_rollouts, max_rollouts, stats=stats)

    # ------------------------------------------------------------ internals
    def _counts(self, counts) -> np.ndarray:
        n = np.array(counts, dtype=np.int64, order="C")
        if n.shape != (self.num_prompts,):
            raise SeraOptError(f"counts must have shape ({self.num_prompts},), got {n.shape}.")
        return n

    def _params(self):
        return self._p0, self._p1, self._p2

    def _solve_params(self, hi: np.ndarray):
        """The parameter rows a solve with upper bounds ``hi`` reads."""
        return self._params()

    def _solve_rows(self, idx, lo, hi, spare, stats) -> np.ndarray:
        """Counts for the rows ``idx`` (a slice or index array) with bounds ``lo``, ``hi``
        (already restricted to them) and ``spare`` rollouts above ``sum(lo)``."""
        if self._kind is not None:
            kernels = _jit.kernels("sera_opt.solvers._separable_kernels")
            p0, p1, p2 = (np.ascontiguousarray(x[idx]) for x in self._solve_params(hi))
            # The engine's per-row state and the counts, from numpy: it asks the kernel
            # for transparent huge pages, so that first writing 10^6 rows of state takes
            # about half the time it takes in memory numba allocates (numba allocates them
            # below this size).
            m = lo.shape[0] if lo.shape[0] >= _NUMPY_STATE_FROM else 0
            if self._kind in kernels.CLOSED_FORM_KINDS:
                return kernels.solve_closed(self._kind, p0, p1, p2, self.offset, lo, hi, spare,
                                            stats, np.empty((4, m), dtype=np.int64),
                                            np.empty(m, dtype=np.int64))
            return kernels.solve(self._kind, p0, p1, p2, self.offset, lo, hi, spare,
                                 self.sense == "max-min", self._tie_rtol, stats,
                                 np.empty((4, m), dtype=np.int64), np.empty((4, m)),
                                 np.empty((2, m)), np.empty(m, dtype=np.int64))
        return _numpy_select(self, idx, lo, hi, spare)


#: From this many prompts on, the kernels' per-row state is allocated by numpy.
_NUMPY_STATE_FROM = 1 << 16


class _KernelObjective(SeparableObjective):
    """A built-in objective: its parameters as three float64 rows for the numba kernel."""

    def __init__(self, p0: np.ndarray, p1: np.ndarray | None = None,
                 p2: np.ndarray | None = None, offset: int = 0):
        super().__init__(p0.shape[0], offset)
        # Writable C-contiguous rows: numba compiles a separate specialization for
        # read-only arrays, which would double the compile time.
        self._p0 = np.require(p0, dtype=np.float64, requirements=("C", "W"))
        self._p1 = (self._p0 if p1 is None
                    else np.require(p1, dtype=np.float64, requirements=("C", "W")))
        self._p2 = (self._p1 if p2 is None
                    else np.require(p2, dtype=np.float64, requirements=("C", "W")))


class PointLevels(SeparableObjective):
    """SERA's levels ``a_i (n - c)`` with ``a_i = -log(1 - p_i)`` (max-min).

    Solved by the waterline kernels (SERA's fast path). ``p = 0`` (level 0
    whatever ``n``) and ``p = 1`` (infinite level) are ranked by the limit order
    of :mod:`~sera_opt.solvers._tiers`: the first take spare rollouts first, the
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
        p = _probabilities(success_probs)
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
        return lo + _linear_fill(self.rates[idx], lo - self.offset, hi - lo, spare, self.hint)


def _linear_fill(rates, m_lo, cap, extra, hint=math.nan) -> np.ndarray:
    """Increments of SERA's greedy on finite positive rates (the waterline kernels)."""
    from ._waterline_kernels import linear_solve

    lo = np.ascontiguousarray(m_lo, dtype=np.int64)  # offset 0: lo is m_lo itself
    hi = lo + np.ascontiguousarray(cap, dtype=np.int64)
    counts = np.empty(lo.shape[0], dtype=np.int64)
    linear_solve(np.ascontiguousarray(rates, dtype=np.float64), lo, hi, False, 0, int(extra),
                 float(hint), 0.0, 0, counts)
    return counts - lo


class _BetaObjective(_KernelObjective):
    """A Beta posterior's kernel rows: ``alpha``, ``beta`` and ``lgamma(alpha + beta) -
    lgamma(beta)`` (plus ``log alpha`` for the hit utility, whose count passes' guess reads
    that sum). The gains read that log-gamma row only beyond ``_PRODUCT_MAX``
    effective rollouts, and a count pass's guess reads it at any count; so a solve whose
    bounds keep every gain below that limit gets the guess's approximation instead (in
    vectorized arithmetic, against a log-gamma a prompt), and the exact row is prepared when first needed
    (a solve with larger bounds, :meth:`gains`, :meth:`terms`)."""

    def __init__(self, alpha, beta, offset: int = 0):
        a, b = validate_beta_posterior(alpha, beta)
        super().__init__(a, b, offset=offset)
        self._p2 = None
        self._p2_guess = None

    def _prepared(self, exact: bool) -> np.ndarray:
        kernels = _jit.kernels("sera_opt.solvers._separable_kernels")
        return kernels.prepare(self._kind, self._p0, self._p1, np.empty_like(self._p0), exact)

    def _params(self):
        if self._p2 is None:
            self._p2 = self._prepared(True)
        return self._p0, self._p1, self._p2

    def _solve_params(self, hi: np.ndarray):
        kernels = _jit.kernels("sera_opt.solvers._separable_kernels")
        if self._p2 is not None or hi.size == 0:
            return self._params()
        # Gains are evaluated at counts up to hi (the tie rule reads the next one).
        effective = int(hi.max()) - (self.offset if self._kind == kernels.BETA_LEVELS else 0)
        if effective > kernels._PRODUCT_MAX:
            return self._params()
        if self._p2_guess is None:
            self._p2_guess = self._prepared(False)
        return self._p0, self._p1, self._p2_guess


class BetaLevels(_BetaObjective):
    """Levels of the expected factor under a Beta posterior (max-min).

    ``l_i(n) = -log E[(1 - p_i)^(n - c)]`` with ``p_i ~ Beta(alpha_i, beta_i)``,
    so that ``E[w_c(p_i, n)] = 1 - exp(-l_i(n))``. The expectation is the product
    ``prod_{j < m} (beta + j) / (alpha + beta + j)``, evaluated through
    log-gamma. ``l_i`` is increasing in ``n`` (strictly when ``alpha_i > 0``)
    and, for a point mass, reduces to SERA's ``a_i (n - c)``. A point mass at
    ``p = 0`` (``alpha = 0``) or ``p = 1`` (``beta = 0``) is ranked by the limit
    order of :mod:`~sera_opt.solvers._tiers`, as in SERA.
    """

    sense = "max-min"
    _kind = 1
    _tie_rtol = 1e-10

    def edges(self):
        return self._p0 == 0, self._p1 == 0


class _PointProbabilityObjective(_KernelObjective):
    """An objective of known probabilities; the kernels read ``p``, ``log p`` and
    ``log(1 - p)`` (0 at the edges, which the kernels treat separately). ``log(1 - p)``
    is minus SERA's rate (:func:`~sera_opt.success_rates`, one compiled pass, about
    twice as fast as numpy's ``log1p`` where that is not vectorized)."""

    def __init__(self, success_probs):
        p = _probabilities(success_probs)
        inner = (p > 0) & (p < 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.where(inner, np.log(p), 0.0)
        logq = success_rates(p)
        np.negative(logq, out=logq)
        logq[~inner] = 0.0
        super().__init__(p, logp, logq)


class KnapsackValue(_PointProbabilityObjective):
    """Knapsack RL's value ``V(n, p) = (1 - p^n - (1-p)^n) p (1-p)^2`` (max-sum).

    Prompts with ``p = 0`` or ``p = 1`` have ``V = 0``; leftover budget goes to
    ``p = 0`` prompts (evenly) before ``p = 1`` prompts.
    """

    sense = "max-sum"
    _kind = 2


class HitUtility(_BetaObjective):
    """HORA's hit utility ``1 - E[(1 - p)^n]`` under ``Beta(alpha, beta)`` (max-sum).

    Its marginal gain ``E[(1 - p)^n p]`` is compared in log space, so that
    easy prompts' tiny gains do not underflow into ties.
    """

    sense = "max-sum"
    _kind = 3

    def __init__(self, alpha, beta):
        super().__init__(alpha, beta)


class PointHitUtility(_PointProbabilityObjective):
    """The hit utility ``1 - (1 - p)^n`` for known ``p`` (max-sum): HORA without
    posterior uncertainty. Gains ``(1 - p)^n p`` are compared in log space."""

    sense = "max-sum"
    _kind = 6


class RLOOVariance(_KernelObjective):
    """VIP's RLOO cost ``a_i / (n - 1) + gamma log(p_i) n``, ``a_i = p_i (1 - p_i)`` (min-sum).

    ``n = 1`` costs ``inf`` when ``a_i > 0`` (the leave-one-out baseline needs a
    second rollout). ``p = 0`` makes ``log p = -inf``: as in the limit
    ``p -> 0+``, each rollout of such a prompt lowers the cost without bound,
    so it takes rollouts first.
    """

    sense = "min-sum"
    _kind = 4

    def __init__(self, success_probs, gamma: float = 7e-4):
        p = _probabilities(success_probs)
        gamma = validate_real(gamma, "gamma", minimum=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            bonus = 0.0 - gamma * np.log(p) if gamma > 0 else np.zeros_like(p)
        bonus = np.where(np.isnan(bonus), 0.0, bonus)  # gamma = 0 with p = 0
        super().__init__(p * (1.0 - p), bonus)


class InverseCountCost(_KernelObjective):
    """GVM's variance proxy ``sum_i W_i / n_i`` (min-sum), ``W_i >= 0``.

    Its continuous minimizer under ``sum n = B`` is ``n_i`` proportional to
    ``sqrt(W_i)`` (Cauchy-Schwarz): GVM-RAFT's rule with ``sqrt(W_i) = G_i /
    sqrt(p_i + alpha / p_i^(beta - 1))``.
    """

    sense = "min-sum"
    _kind = 5

    def __init__(self, weights):
        w = _as_float_row(weights, "weights")
        if (w < 0).any():
            i = int(np.flatnonzero(w < 0)[0])
            raise SeraOptError(f"weights must be >= 0, got {w[i]!r} at index {i}.")
        super().__init__(w)


class AlphaFairUtility(_KernelObjective):
    """The alpha-fair utility of the attenuation factors (max-sum), THEORY.md section 8.

    Maximizes ``sum_i U_alpha(w_c(p_i, n_i))`` with ``U_alpha(w) = w^(1 - alpha) /
    (1 - alpha)`` (``log w`` at ``alpha = 1``) and ``w_c(p, n) = 1 - (1 - p)^(n - c)``.
    Every term is concave in ``n`` for ``alpha >= 0``, so the engine's greedy is
    exact. Gains are compared in log space (see ``_fair_log_gain``), so a large
    ``alpha`` neither overflows nor turns distinct gains into ties; at ``alpha`` =
    0, 1 and 2 each prompt's crossing of a gain value is known in closed form, so
    the counting passes evaluate no gain at all.

    ``alpha = 0`` sums the factors; ``alpha -> inf`` tends to SERA's max-min (the
    limit itself is :class:`PointLevels`). Edges: ``p = 0`` gains nothing from any
    rollout (for ``alpha >= 1`` its utility is ``-inf`` at every count), ``p = 1``
    nothing after its first effective rollout; both keep their minimum unless
    everything else is full. Counts must be at least ``c + 1`` (the first
    effective rollout), which :class:`~sera_opt.AllocationProblem` guarantees.

    Parameters
    ----------
    success_probs : array_like
    alpha : float, default 1
        ``>= 0`` and finite.
    offset : {0, 1}
    rates : ndarray, optional
        ``-log(1 - p)`` if already computed.
    """

    sense = "max-sum"
    _kind = 7
    # alpha = 0, 1, 2 have kernels of their own (closed-form crossings); the rows
    # they read are a and log p (alpha = 0) or a and p (alpha = 1, 2).
    _SPECIAL: ClassVar[dict[float, int]] = {0.0: 8, 1.0: 9, 2.0: 10}

    def __init__(self, success_probs, alpha: float = 1.0, offset: int = 0, *, rates=None):
        p = _probabilities(success_probs)
        alpha = check_alpha(alpha)
        rates = np.array(success_rates(p) if rates is None else rates, dtype=np.float64)
        self._setup(p, alpha, offset, rates)  # the offset is checked where it is stored

    @classmethod
    def from_problem(cls, problem, alpha: float = 1.0) -> AlphaFairUtility:
        """The utility on a validated :class:`~sera_opt.AllocationProblem`, reading its
        probabilities and cached rates as they are (no second validation or copy)."""
        objective = cls.__new__(cls)
        objective._setup(problem.success_probs, check_alpha(alpha), problem.offset,
                         problem._rates_and_edges()[3])
        return objective

    def _setup(self, p, alpha, offset, rates):
        if math.isinf(alpha):
            raise SeraOptError(
                "alpha = inf is SERA's lexicographic max-min: use PointLevels (or the 'sera' "
                "policy) for it."
            )
        self.alpha = alpha
        special = self._SPECIAL.get(alpha)
        if special is not None:
            with np.errstate(divide="ignore"):
                second = np.log(p) if alpha == 0.0 else p
            super().__init__(rates, second, offset=offset)
            self._kind = special
        else:
            with np.errstate(divide="ignore"):
                super().__init__(rates, np.log(p), np.full(p.shape, alpha), offset=offset)


# ---------------------------------------------------------------------- the engine
def _bounds(value, name: str, m: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(
            arr == np.round(arr)
        ):
            arr = arr.astype(np.int64)
        else:
            raise SeraOptError(f"{name} must hold whole numbers of rollouts, got {value!r}.")
    arr = np.broadcast_to(arr.astype(np.int64), (m,)) if arr.ndim == 0 else arr
    if arr.shape != (m,):
        raise SeraOptError(f"{name} must be a scalar or have shape ({m},), got {arr.shape}.")
    if arr.size and (arr.max() > MAX_BUDGET or arr.min() < 0):
        raise SeraOptError(f"{name} must lie in [0, 2**53].")
    return np.array(arr, dtype=np.int64, order="C")  # writable copy (see _KernelObjective)


def solve_separable(objective: SeparableObjective, budget: int, min_rollouts,
                    max_rollouts, *, stats=None) -> np.ndarray:
    """Exact integer counts for a separable objective under one budget.

    Parameters
    ----------
    objective : SeparableObjective
        The per-prompt terms and the sense (max-min, max-sum or min-sum).
    budget : int
        ``B``; the counts sum to it exactly.
    min_rollouts, max_rollouts : int or array_like of int
        Per-prompt bounds ``lo_i <= n_i <= hi_i``.
    stats : ndarray of int64, shape (4,), optional
        Receives the kernel engine's work (full passes, gains collected, rows
        active at the end, subsample solves).

    Returns
    -------
    ndarray of int64
        Optimal counts (lexicographically max-min optimal for ``"max-min"``),
        with the tie rules of :mod:`sera_opt.solvers.separable`.

    Raises
    ------
    InfeasibleBudgetError
        When ``budget`` lies outside ``[sum(lo), sum(hi)]``.
    """
    if not isinstance(objective, SeparableObjective):
        raise SeraOptError(
            f"objective must be a SeparableObjective, got {type(objective).__name__}."
        )
    m = objective.num_prompts
    lo = _bounds(min_rollouts, "min_rollouts", m)
    hi = _bounds(max_rollouts, "max_rollouts", m)
    if (hi < lo).any():
        raise SeraOptError("bounds must satisfy 0 <= min_rollouts <= max_rollouts.")
    budget = validate_count(budget, "budget")
    lo_total, hi_total = _exact_sum(lo), _exact_sum(hi)
    if not lo_total <= budget <= hi_total:
        raise InfeasibleBudgetError(
            f"budget={budget} must lie in [sum(min_rollouts), sum(max_rollouts)] = "
            f"[{lo_total}, {hi_total}]."
        )
    return _solve(objective, lo, hi, budget - lo_total,
                  np.zeros(4, dtype=np.int64) if stats is None else stats)


def _solve(objective: SeparableObjective, lo: np.ndarray, hi: np.ndarray, spare: int,
           stats: np.ndarray) -> np.ndarray:
    """:func:`solve_separable` on validated int64 bounds and ``spare = B - sum(lo)``."""
    edges = objective.edges() if objective.sense == "max-min" else None
    if edges is None:
        return objective._solve_rows(slice(None), lo, hi, spare, stats)

    def finite(idx, take):
        return objective._solve_rows(idx, lo[idx], hi[idx], take, stats) - lo[idx]

    return lo + _tiers.fill_tiers(lo - objective.offset, hi - lo, spare, *edges, finite)


# ---------------------------------------------------------------------- numpy engine
def _numpy_select(objective: SeparableObjective, idx, lo: np.ndarray, hi: np.ndarray,
                  spare: int) -> np.ndarray:
    """The engine in numpy, for objectives that only define :meth:`gains`.

    Bisection on the gain value (in the order of the float bit patterns, so at
    most 64 rounds), each round counting per prompt the gains above the trial
    value with a vectorized binary search over the count. The threshold found
    is the ``spare``-th largest gain; ties at it follow the module's tie rule.
    """
    rows = np.arange(objective.num_prompts)[idx]
    full_lo = np.zeros(objective.num_prompts, dtype=np.int64)
    full_lo[rows] = lo

    def gain_at(k: np.ndarray) -> np.ndarray:
        full = full_lo.copy()
        full[rows] = k
        g = np.asarray(objective.gains(full), dtype=np.float64)
        if g.shape != (objective.num_prompts,):
            raise SolverError(
                f"{type(objective).__name__}.gains returned shape {g.shape}, expected "
                f"({objective.num_prompts},)."
            )
        return g[rows]

    total = _exact_sum(hi - lo)
    if spare <= 0:
        return lo.copy()
    if spare >= total:
        return hi.copy()
    lo_total = _exact_sum(lo)

    sentinel = _float_key(-math.inf) - 1  # a key below every gain value

    def count(k: int) -> np.ndarray:
        # First step in [lo, hi] whose gain is <= the value of key k (hi when none):
        # lo + #{gains above it}, per prompt, by a vectorized binary search.
        if k == sentinel:
            return hi.copy()
        lam = _float_unkey(k)
        left, right = lo.copy(), hi.copy()
        active = left < right
        while active.any():
            mid = np.where(active, (left + right) // 2, lo)
            g = gain_at(mid)
            if np.isnan(g[active]).any():
                raise SolverError(f"{type(objective).__name__}.gains returned NaN.")
            above = g > lam
            left = np.where(active & above, mid + 1, left)
            right = np.where(active & ~above, mid, right)
            active = left < right
        return left

    key_hi, key_lo = _float_key(math.inf), sentinel
    while key_hi - key_lo > 1:
        mid = key_lo + (key_hi - key_lo) // 2
        if _exact_sum(count(mid)) - lo_total <= spare:
            key_hi = mid
        else:
            key_lo = mid
    above, at_or_above = count(key_hi), count(key_hi - 1)
    left = spare - (_exact_sum(above) - lo_total)
    if left == 0:
        return above
    start, stop = above, at_or_above  # tied steps of row j: k in [start_j, stop_j)
    if objective.sense != "max-min":
        return start + _tiers.even_increments(start, stop - start, left)
    # Max-min: the tied step whose next level is highest (next gain lowest) first.
    n_tied = _exact_sum(stop - start)
    if n_tied > _MAX_TIED_STEPS:
        raise SolverError(
            f"{n_tied} steps of {type(objective).__name__} tie at the threshold; the numpy "
            f"engine orders at most {_MAX_TIED_STEPS}. Give the objective edges() for "
            f"constant levels."
        )
    owner = np.repeat(np.arange(len(lo)), stop - start)
    step = start[owner] + (np.arange(n_tied) - np.repeat(np.cumsum(stop - start) - (stop - start),
                                                          stop - start))
    nxt = np.empty(n_tied)
    # Evaluate each tied step's next gain one layer of steps at a time.
    for layer in range(int((stop - start).max())):
        sel = step - start[owner] == layer
        k = start.copy()
        k[owner[sel]] = step[sel] + 1
        nxt[sel] = gain_at(k)[owner[sel]]
    order = np.lexsort((owner, step, nxt))
    counts = start.copy()
    np.add.at(counts, owner[order[:left]], 1)
    return counts


def _float_key(x: float) -> int:
    """Monotone map of a float64 to an int: ``x < y`` iff ``key(x) < key(y)``."""
    bits = int(np.array(x, dtype=np.float64).view(np.int64))
    return bits if bits >= 0 else -(bits & 0x7FFFFFFFFFFFFFFF) - 1


def _float_unkey(k: int) -> float:
    bits = k if k >= 0 else (-(k + 1)) | (1 << 63)
    return float(np.array(bits & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).view(np.float64))
