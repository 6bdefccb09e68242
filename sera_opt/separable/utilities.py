"""Max-sum and min-sum objectives: the peers' utilities and costs (Knapsack RL, HORA,
VIP, GVM) and the alpha-fair family."""

from __future__ import annotations

import math

import numpy as np

from ..exceptions import SeraOptError
from ..kernels import kinds
from ..problem import success_rates, validate_real
from .inputs import as_float_row, check_alpha, probabilities
from .levels import BetaObjective
from .objective import KernelObjective, solve_validated


class _PointProbabilityObjective(KernelObjective):
    """An objective of known probabilities; the kernels read ``p``, ``log p`` and
    ``log(1 - p)`` (0 at the edges, which the kernels treat separately). ``log(1 - p)``
    is minus SERA's rate (:func:`~sera_opt.success_rates`, one compiled pass, about
    twice as fast as numpy's ``log1p`` where that is not vectorized)."""

    def __init__(self, success_probs):
        p = probabilities(success_probs)
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
    kernel_kind = kinds.KNAPSACK


class HitUtility(BetaObjective):
    """HORA's hit utility ``1 - E[(1 - p)^n]`` under ``Beta(alpha, beta)`` (max-sum).

    Its marginal gain ``E[(1 - p)^n p]`` is compared in log space, so that
    easy prompts' tiny gains do not underflow into ties.
    """

    sense = "max-sum"
    kernel_kind = kinds.HIT_UTILITY

    def __init__(self, alpha, beta):
        super().__init__(alpha, beta)


class PointHitUtility(_PointProbabilityObjective):
    """The hit utility ``1 - (1 - p)^n`` for known ``p`` (max-sum): HORA without
    posterior uncertainty. Gains ``(1 - p)^n p`` are compared in log space."""

    sense = "max-sum"
    kernel_kind = kinds.POINT_HIT


class RLOOVariance(KernelObjective):
    """VIP's RLOO cost ``a_i / (n - 1) + gamma log(p_i) n``, ``a_i = p_i (1 - p_i)`` (min-sum).

    ``n = 1`` costs ``inf`` when ``a_i > 0`` (the leave-one-out baseline needs a
    second rollout). ``p = 0`` makes ``log p = -inf``: as in the limit
    ``p -> 0+``, each rollout of such a prompt lowers the cost without bound,
    so it takes rollouts first.
    """

    sense = "min-sum"
    kernel_kind = kinds.RLOO_VARIANCE

    def __init__(self, success_probs, gamma: float = 7e-4):
        p = probabilities(success_probs)
        gamma = validate_real(gamma, "gamma", minimum=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            bonus = 0.0 - gamma * np.log(p) if gamma > 0 else np.zeros_like(p)
        bonus = np.where(np.isnan(bonus), 0.0, bonus)  # gamma = 0 with p = 0
        super().__init__(p * (1.0 - p), bonus)


class InverseCountCost(KernelObjective):
    """GVM's variance proxy ``sum_i W_i / n_i`` (min-sum), ``W_i >= 0``.

    Its continuous minimizer under ``sum n = B`` is ``n_i`` proportional to
    ``sqrt(W_i)`` (Cauchy-Schwarz): GVM-RAFT's rule with ``sqrt(W_i) = G_i /
    sqrt(p_i + alpha / p_i^(beta - 1))``.
    """

    sense = "min-sum"
    kernel_kind = kinds.INVERSE_COUNT

    def __init__(self, weights):
        w = as_float_row(weights, "weights")
        if (w < 0).any():
            i = int(np.flatnonzero(w < 0)[0])
            raise SeraOptError(f"weights must be >= 0, got {w[i]!r} at index {i}.")
        super().__init__(w)


class AlphaFairUtility(KernelObjective):
    """The alpha-fair utility of the attenuation factors (max-sum), docs/theory.md section 8.

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
    kernel_kind = kinds.ALPHA_FAIR
    # alpha = 0, 1, 2 have kernels of their own (closed-form crossings); the rows
    # they read are a and log p (alpha = 0) or a and p (alpha = 1, 2).
    def __init__(self, success_probs, alpha: float = 1.0, offset: int = 0, *, rates=None):
        p = probabilities(success_probs)
        alpha = check_alpha(alpha)
        rates = np.array(success_rates(p) if rates is None else rates, dtype=np.float64)
        self._setup(p, alpha, offset, rates)  # the offset is checked where it is stored

    @classmethod
    def from_problem(cls, problem, alpha: float = 1.0) -> AlphaFairUtility:
        """The utility on a validated :class:`~sera_opt.AllocationProblem`, reading its
        probabilities and cached rates as they are (no second validation or copy)."""
        objective = cls.__new__(cls)
        objective._setup(problem.kernel_probs(), check_alpha(alpha), problem.offset,
                         problem.kernel_rates())
        return objective

    @classmethod
    def of_checked(cls, problem, alpha: float) -> AlphaFairUtility:
        """:meth:`from_problem` for an ``alpha`` that :func:`check_alpha` has already
        returned (a policy's, checked when the policy was built): a session in rounds
        builds one utility per round, and checking the option again was a tenth of a
        round's planning."""
        objective = cls.__new__(cls)
        objective._setup(problem.kernel_probs(), alpha, problem.offset, problem.kernel_rates())
        return objective

    def _setup(self, p, alpha, offset, rates):
        if math.isinf(alpha):
            raise SeraOptError(
                "alpha = inf is SERA's lexicographic max-min: use PointLevels (or the 'sera' "
                "policy) for it."
            )
        self.alpha = alpha
        special = kinds.FAIR_KIND_OF_ALPHA.get(alpha)
        if special is not None:
            with np.errstate(divide="ignore"):
                second = np.log(p) if alpha == 0.0 else p
            super().__init__(rates, second, offset=offset)
            self.kernel_kind = special
        else:
            with np.errstate(divide="ignore"):
                super().__init__(rates, np.log(p), np.full(p.shape, alpha), offset=offset)


def warm_bracket_search() -> None:
    """Compile (or load) the heap's search, ``bracket_solve``, for the argument types of
    the library's own calls (one signature serves every closed-form kind): what the
    background process of :data:`sera_opt.separable.objective.SEARCHES` runs for it."""
    _warm_search(AlphaFairUtility((np.arange(1024) + 0.5) / 1024, alpha=1.0))


def warm_collecting_search() -> None:
    """:func:`warm_bracket_search` for ``collect_solve``, Knapsack's search."""
    _warm_search(KnapsackValue((np.arange(1024) + 0.5) / 1024))


def _warm_search(objective) -> None:
    """Solve 1,024 prompts with bounds 1..64 and 7,168 spare rollouts through
    :func:`~sera_opt.separable.objective.solve_validated` (background compiles off in the
    process that runs it), which calls the objective's search."""
    m = objective.num_prompts
    if objective.kernel_kind not in kinds.CLOSED_FORM_KINDS:
        raise RuntimeError(f"{type(objective).__name__} is not a closed-form kind")
    counts = solve_validated(objective, np.ones(m, dtype=np.int64),
                             np.full(m, 64, dtype=np.int64), 7 * m, np.zeros(4, dtype=np.int64))
    if int(counts.sum()) != 8 * m:
        raise RuntimeError("the search's warm-up counts do not sum to its budget")
