"""One exact engine for separable integer allocation problems.

Every allocation rule in sera_opt other than uniform chooses integer counts
``n_i`` with ``sum_i n_i = B`` and ``lo_i <= n_i <= hi_i`` to optimize a
*separable* objective of one of three shapes:

* ``"max-min"``: lexicographically maximize the sorted levels ``l_i(n_i)``,
  each increasing in ``n`` (SERA, and SERA on expected factors);
* ``"max-sum"``: maximize ``sum_i u_i(n_i)``, each ``u_i`` concave in ``n``
  (Knapsack RL, HORA);
* ``"min-sum"``: minimize ``sum_i f_i(n_i)``, each ``f_i`` convex in ``n``
  (VIP, GVM).

For all three, handing out the spare budget ``B - sum(lo)`` one rollout at a
time to the best marginal step (the largest utility gain, the largest cost
reduction, or the lowest current level) is exact: with one budget constraint
and concave separable terms, the greedy's ``S`` steps are the ``S`` largest
marginal gains, and no other feasible allocation collects more. The engine
(:func:`solve_separable`) finds those ``S`` gains without walking through
them: it brackets the gain threshold, counts per prompt how many gains lie
above a trial value (a closed-form guess of the crossing per prompt, settled
exactly by a galloping search on the gain itself), narrows the bracket with
regula falsi and bisection, and selects among the few gains left. A strided
subsample solved first gives the opening bracket when ``M`` is large. Cost:
``O(M log(hi - lo))`` for the first pass, ``O(M)`` plus the moving rows for
each later one, and a selection among at most ``max(65536, M / 8)`` collected
gains; the kernels are compiled with numba.

Ties at the final threshold (THEORY.md leaves them open): for max-min the
step whose next level is highest goes first (lexicographically better), then
for every shape the prompt with fewer rollouts so far, then the lower index.
Prompts whose steps all have the same gain thus share spare rollouts evenly.
For :class:`BetaLevels`, levels within ``1e-10`` (relative) of the threshold
count as tied: levels that agree in exact arithmetic (two posteriors with the
same mean, at one effective rollout) differ by rounding, and rounding must not
decide a lexicographic optimum.

Each objective below is a small class that states its per-prompt terms; a
new objective needs its gain (and, for speed, a guess of where its gains
cross a value) in ``_separable_kernels.py``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ..exceptions import InfeasibleBudgetError, SeraOptError
from ..problem import validate_offset

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
]

SENSES = ("max-min", "max-sum", "min-sum")


def _as_float_row(values, name: str, m: int | None = None) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise SeraOptError(f"{name} must be a 1-D array of numbers: {exc}") from exc
    if arr.ndim != 1:
        raise SeraOptError(f"{name} must be 1-D (one entry per prompt), got shape {arr.shape}.")
    if m is not None and arr.shape[0] != m:
        raise SeraOptError(f"{name} must have one entry per prompt ({m}), got {arr.shape[0]}.")
    if np.isnan(arr).any():
        raise SeraOptError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}.")
    return np.ascontiguousarray(arr)


def validate_beta_posterior(alpha, beta, m: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check Beta posterior parameters: finite, ``>= 0``, ``alpha + beta > 0``.

    ``alpha = 0`` stands for a point mass at ``p = 0`` and ``beta = 0`` for one
    at ``p = 1`` (the limits of the Beta family).
    """
    a = _as_float_row(alpha, "posterior alpha", m)
    b = _as_float_row(beta, "posterior beta", a.shape[0])
    for name, arr in (("alpha", a), ("beta", b)):
        bad = ~np.isfinite(arr) | (arr < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise SeraOptError(
                f"posterior {name} must be finite and >= 0; got {arr[i]!r} at index {i}. "
                f"Pass Beta parameters, e.g. from sera_opt.SuccessTracker.posterior()."
            )
    both = (a == 0) & (b == 0)
    if both.any():
        i = int(np.flatnonzero(both)[0])
        raise SeraOptError(
            f"posterior alpha and beta are both 0 at index {i}: that is no distribution; "
            f"give at least one of them a positive value."
        )
    return a, b


class SeparableObjective:
    """A separable objective in the form :func:`solve_separable` solves.

    Attributes
    ----------
    sense : {"max-min", "max-sum", "min-sum"}
    num_prompts : int
    """

    sense: ClassVar[str]
    _kind: ClassVar[int]
    # Max-min only: levels this close (relative) to the final threshold count as
    # tied, so that the tie rule, not rounding, decides between them.
    _tie_rtol: ClassVar[float] = 0.0

    def __init__(self, p0: np.ndarray, p1: np.ndarray | None = None, offset: int = 0):
        # Fresh writable copies: numba compiles a separate specialization for
        # read-only arrays, which would double the compile time.
        self._p0 = np.array(p0, dtype=np.float64, order="C")
        self._p1 = (np.zeros_like(self._p0) if p1 is None
                    else np.array(p1, dtype=np.float64, order="C"))
        self.offset = validate_offset(offset)
        self._p2 = None

    @property
    def num_prompts(self) -> int:
        return int(self._p0.shape[0])

    def _params(self):
        if self._p2 is None:
            from . import _separable_kernels as kernels

            self._p2 = kernels.prepare(self._kind, self._p0, self._p1)
        return self._p0, self._p1, self._p2

    def terms(self, counts) -> np.ndarray:
        """Per-prompt terms at integer ``counts``: levels, utilities or costs (float64)."""
        from . import _separable_kernels as kernels

        n = np.array(counts, dtype=np.int64, order="C")
        if n.shape != (self.num_prompts,):
            raise SeraOptError(f"counts must have shape ({self.num_prompts},), got {n.shape}.")
        return kernels.values(self._kind, *self._params(), self.offset, n)

    def value(self, counts) -> float:
        """The objective: ``min`` of the levels, or the ``sum`` of the terms."""
        t = self.terms(counts)
        return float(t.min() if self.sense == "max-min" else t.sum())

    def solve(self, budget, min_rollouts, max_rollouts, **options) -> np.ndarray:
        """Shorthand for :func:`solve_separable` on this objective."""
        return solve_separable(self, budget, min_rollouts, max_rollouts, **options)


class PointLevels(SeparableObjective):
    """SERA's levels ``a_i (n - c)`` with ``a_i = -log(1 - p_i)`` (max-min).

    ``p = 0`` (level 0 whatever ``n``) ranks below every other prompt and so
    takes spare rollouts first; ``p = 1`` (infinite level) ranks last.
    """

    sense = "max-min"
    _kind = 0

    def __init__(self, success_probs, offset: int = 0):
        p = _as_float_row(success_probs, "success_probs")
        with np.errstate(divide="ignore"):
            super().__init__(-np.log1p(-p), offset=offset)


class BetaLevels(SeparableObjective):
    """Levels of the expected factor under a Beta posterior (max-min).

    ``l_i(n) = -log E[(1 - p_i)^(n - c)]`` with ``p_i ~ Beta(alpha_i, beta_i)``,
    so that ``E[w_c(p_i, n)] = 1 - exp(-l_i(n))``. The expectation is the product
    ``prod_{j < m} (beta + j) / (alpha + beta + j)``, evaluated through
    log-gamma. ``l_i`` is increasing in ``n`` (strictly when ``alpha_i > 0``)
    and, for a point mass, reduces to SERA's ``a_i (n - c)``.
    """

    sense = "max-min"
    _kind = 1
    _tie_rtol = 1e-10

    def __init__(self, alpha, beta, offset: int = 0):
        a, b = validate_beta_posterior(alpha, beta)
        super().__init__(a, b, offset=offset)


class _PointProbabilityObjective(SeparableObjective):
    """An objective of known probabilities; the kernels read ``log p`` and
    ``log(1 - p)`` (0 at the edges, which the kernels treat separately)."""

    def __init__(self, success_probs):
        p = _as_float_row(success_probs, "success_probs")
        inner = (p > 0) & (p < 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.where(inner, np.log(p), 0.0)
            logq = np.where(inner, np.log1p(-p), 0.0)
        super().__init__(p, logp)
        self._p2 = np.array(logq, dtype=np.float64, order="C")


class KnapsackValue(_PointProbabilityObjective):
    """Knapsack RL's value ``V(n, p) = (1 - p^n - (1-p)^n) p (1-p)^2`` (max-sum).

    Prompts with ``p = 0`` or ``p = 1`` have ``V = 0``; leftover budget goes to
    ``p = 0`` prompts (evenly) before ``p = 1`` prompts.
    """

    sense = "max-sum"
    _kind = 2


class HitUtility(SeparableObjective):
    """HORA's hit utility ``1 - E[(1 - p)^n]`` under ``Beta(alpha, beta)`` (max-sum).

    Its marginal gain ``E[(1 - p)^n p]`` is compared in log space, so that
    easy prompts' tiny gains do not underflow into ties.
    """

    sense = "max-sum"
    _kind = 3

    def __init__(self, alpha, beta):
        a, b = validate_beta_posterior(alpha, beta)
        super().__init__(a, b)


class PointHitUtility(_PointProbabilityObjective):
    """The hit utility ``1 - (1 - p)^n`` for known ``p`` (max-sum): HORA without
    posterior uncertainty. Gains ``(1 - p)^n p`` are compared in log space."""

    sense = "max-sum"
    _kind = 6


class RLOOVariance(SeparableObjective):
    """VIP's RLOO cost ``a_i / (n - 1) + gamma log(p_i) n``, ``a_i = p_i (1 - p_i)`` (min-sum).

    ``n = 1`` costs ``inf`` when ``a_i > 0`` (the leave-one-out baseline needs a
    second rollout). ``p = 0`` makes ``log p = -inf``: as in the limit
    ``p -> 0+``, each rollout of such a prompt lowers the cost without bound,
    so it takes rollouts first.
    """

    sense = "min-sum"
    _kind = 4

    def __init__(self, success_probs, gamma: float = 7e-4):
        p = _as_float_row(success_probs, "success_probs")
        gamma = float(gamma)
        if not np.isfinite(gamma) or gamma < 0:
            raise SeraOptError(f"gamma must be finite and >= 0, got {gamma!r}.")
        with np.errstate(divide="ignore"):
            bonus = 0.0 - gamma * np.log(p) if gamma > 0 else np.zeros_like(p)
        bonus = np.where(np.isnan(bonus), 0.0, bonus)  # gamma = 0 with p = 0
        super().__init__(p * (1.0 - p), bonus)


class InverseCountCost(SeparableObjective):
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


class AlphaFairUtility(SeparableObjective):
    """The alpha-fair utility of the attenuation factors (max-sum), THEORY.md section 8.

    Maximizes ``sum_i U_alpha(w_c(p_i, n_i))`` with ``U_alpha(w) = w^(1 - alpha) /
    (1 - alpha)`` (``log w`` at ``alpha = 1``) and ``w_c(p, n) = 1 - (1 - p)^(n - c)``.
    Every term is concave in ``n`` for ``alpha >= 0``, so the engine's greedy is
    exact. Gains are compared in log space (see ``_fair_log_gain``), so a large
    ``alpha`` neither overflows nor turns distinct gains into ties.

    ``alpha = 0`` sums the factors; ``alpha -> inf`` tends to SERA's max-min (the
    limit itself is :class:`PointLevels`). Edges: ``p = 0`` gains nothing from any
    rollout (for ``alpha >= 1`` its utility is ``-inf`` at every count), ``p = 1``
    nothing after its first effective rollout; both keep their minimum unless
    everything else is full. Counts must be at least ``c + 1`` (the first
    effective rollout), which :class:`~sera_opt.AllocationProblem` guarantees.
    """

    sense = "max-sum"
    _kind = 7
    _SPECIAL: ClassVar[dict[float, int]] = {0.0: 8, 1.0: 9, 2.0: 10}

    def __init__(self, success_probs, alpha: float = 1.0, offset: int = 0):
        p = _as_float_row(success_probs, "success_probs")
        alpha = _check_alpha(alpha)
        if math.isinf(alpha):
            raise SeraOptError(
                "alpha = inf is SERA's lexicographic max-min: use PointLevels (or the 'sera' "
                "policy) for it."
            )
        with np.errstate(divide="ignore"):
            rates = -np.log1p(-p)
        self.alpha = alpha
        # alpha = 0, 1, 2 have kernels of their own whose count passes need no gain
        # evaluation (closed-form crossings); other alpha share the general kernel.
        if alpha in self._SPECIAL:
            self._kind = self._SPECIAL[alpha]
            with np.errstate(divide="ignore"):
                second = np.log(p) if alpha == 0.0 else p
            super().__init__(rates, second, offset=offset)
            self._p2 = self._p1  # unread by these kernels; aliased to avoid an allocation
        else:
            with np.errstate(divide="ignore"):
                super().__init__(rates, np.log(p), offset=offset)
            self._p2 = np.full(self._p0.shape, alpha, dtype=np.float64)


def _check_alpha(alpha) -> float:
    """``alpha`` as a float in ``[0, inf]``, or a :class:`SeraOptError` that says why not."""
    if isinstance(alpha, (bool, np.bool_)):
        raise SeraOptError(f"alpha must be a number >= 0 (or inf), got {alpha!r}.")
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise SeraOptError(f"alpha must be a number >= 0 (or inf), got {alpha!r}.") from None
    if not value >= 0:  # also NaN
        raise SeraOptError(
            f"alpha must be >= 0 (0 sums the factors, 1 is proportional fairness, inf is "
            f"SERA's max-min), got {alpha!r}."
        )
    return value


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
    return np.array(arr, dtype=np.int64, order="C")  # writable copy (see SeparableObjective)


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
    from . import _separable_kernels as kernels

    if not isinstance(objective, SeparableObjective):
        raise SeraOptError(
            f"objective must be a SeparableObjective, got {type(objective).__name__}."
        )
    m = objective.num_prompts
    lo = _bounds(min_rollouts, "min_rollouts", m)
    hi = _bounds(max_rollouts, "max_rollouts", m)
    if (lo < 0).any() or (hi < lo).any():
        raise SeraOptError("bounds must satisfy 0 <= min_rollouts <= max_rollouts.")
    budget = int(budget)
    lo_total, hi_total = int(lo.sum()), int(hi.sum())
    if not lo_total <= budget <= hi_total:
        raise InfeasibleBudgetError(
            f"budget={budget} must lie in [sum(min_rollouts), sum(max_rollouts)] = "
            f"[{lo_total}, {hi_total}]."
        )
    p0, p1, p2 = objective._params()
    return kernels.solve(objective._kind, p0, p1, p2, objective.offset, lo, hi,
                         budget - lo_total, objective.sense == "max-min", objective._tie_rtol,
                         np.zeros(4, dtype=np.int64) if stats is None else stats)
