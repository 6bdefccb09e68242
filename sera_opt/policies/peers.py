"""The peers' allocation rules (docs/theory.md section 7), each solved exactly.

Every rule here is a separable problem over integer counts with one budget
constraint, and :mod:`sera_opt.separable` solves each one exactly
(its integer optimum, not a rounding of a relaxation), in ``O(M log M)``.
The papers' own solvers (a dense dynamic program; SLSQP) are far slower and
are not reproduced. Where a paper leaves an edge case open, the docstring
says what is done.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..exceptions import SeraOptError
from ..problem import AllocationProblem, owned_read_only, refuse_masked, validate_real
from ..separable import (
    HitUtility,
    InverseCountCost,
    KnapsackValue,
    PointHitUtility,
    RLOOVariance,
)
from .base import SeparablePolicy
from .bayes import PosteriorPolicy
from .registry import register_policy

__all__ = ["KnapsackPolicy", "VIPPolicy", "HORAPolicy", "GVMPolicy", "gvm_weights"]


@register_policy
class KnapsackPolicy(SeparablePolicy):
    """Knapsack RL (Li et al. 2025, arXiv 2509.25849): budget as a knapsack.

    Solves::

        maximize    sum_i V(n_i, p_i),  V(n, p) = (1 - p^n - (1 - p)^n) p (1 - p)^2
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer,

    the probability that a prompt's group has both outcomes (a non-zero
    gradient) times the paper's information gain ``p (1 - p)^2``. ``V`` is
    concave in ``n``, so the greedy on marginal gains is exact; the paper's
    dynamic program reaches the same optimum.

    Defaults as in the paper: at least 2 and at most 128 rollouts. Prompts
    with ``p = 0`` or ``p = 1`` have ``V = 0`` and keep the minimum; budget
    left once every other prompt is at its maximum goes to the ``p = 0``
    prompts (evenly), then to the ``p = 1`` prompts. Ties between equal
    marginal gains: fewer rollouts first, then the lower index.
    ``Allocation.objective_value`` is ``sum_i V(n_i, p_i)``.
    """

    name = "knapsack"
    preference = 10
    default_min_rollouts = 2
    default_max_rollouts = 128

    def objective(self, problem: AllocationProblem):
        return KnapsackValue(problem.success_probs)


@register_policy
class VIPPolicy(SeparablePolicy):
    """VIP (Nguyen et al., ICLR 2026, arXiv 2602.01601), its RLOO variance rule.

    Solves::

        minimize    sum_i a_i / (n_i - 1) + gamma log(p_i) n_i,   a_i = p_i (1 - p_i)
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer,

    the predicted variance of the RLOO gradient plus the paper's bonus for
    rollouts on hard prompts. Each term is convex in ``n``; the continuous
    solution is ``n_i(mu) = clip(1 + sqrt(a_i / (mu + gamma log p_i)), lo, hi)``
    and the engine returns the exact integer optimum.

    VIP predicts ``p_i`` with a Gaussian process over prompt embeddings; here
    the caller's ``success_probs`` (for example a
    :class:`sera_opt.SuccessTracker` estimate) stand in for that prediction.
    Defaults as in the paper: ``gamma = 7e-4``, 4 to 32 rollouts. Edges:
    ``n = 1`` costs ``inf`` when ``a_i > 0`` (leave-one-out needs two);
    ``p = 1`` has cost 0 and keeps its minimum; ``p = 0`` makes ``log p =
    -inf``, so as in the limit ``p -> 0+`` it takes rollouts first (and the
    objective is ``-inf``): feed estimates, never raw zeros. Ties: fewer
    rollouts first, then the lower index. ``Allocation.objective_value`` is the
    minimized sum.

    Parameters
    ----------
    gamma : float, default 7e-4
        Weight of the ``log(p) n`` term (>= 0).
    min_rollouts, max_rollouts, offset
        See :class:`AllocationPolicy`.
    """

    name = "vip"
    preference = 11
    option_names = ("gamma",)
    default_min_rollouts = 4
    default_max_rollouts = 32

    def __init__(self, gamma: float = 7e-4, **bounds: Any):
        super().__init__(**bounds)
        self.gamma = validate_real(gamma, "gamma", minimum=0.0)

    def objective(self, problem: AllocationProblem):
        return RLOOVariance(problem.success_probs, self.gamma)


@register_policy
class HORAPolicy(PosteriorPolicy):
    """HORA (arXiv 2605.07114): the expected hit utility, summed.

    Solves::

        maximize    sum_i (1 - E[(1 - p_i)^n_i]),   p_i ~ Beta(alpha_i, beta_i)
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer,

    the expected number of prompts whose group holds at least one success:
    SERA's factor (with ``c = 0``) summed instead of equalized. Each term is
    concave in ``n`` (its gain ``E[(1 - p)^n p]`` shrinks), so the greedy is
    exact. The posterior comes from ``posterior=(alpha, beta)`` or, without
    one, from ``success_probs`` with ``prior_strength`` pseudo-counts (see
    :class:`PosteriorPolicy`; ``inf`` uses ``1 - (1 - p_i)^n_i`` itself).

    Edges: ``p = 0`` for sure adds nothing and ``p = 1`` is hit by its first
    rollout; both keep their minimum unless everything else is full. Ties:
    fewer rollouts first, then the lower index. ``Allocation.objective_value`` is
    the expected number of hit prompts and ``Allocation.factors`` the
    expected attenuation factors ``E[w_c(p_i, n_i)]`` for the policy's offset.
    """

    name = "hora"
    preference = 12

    def objective(self, problem: AllocationProblem, posterior=None):
        if posterior is None:
            return PointHitUtility(problem.success_probs)
        return HitUtility(*posterior)


def gvm_weights(success_probs, gradient_norms=None, *, alpha: float = 1e-3,
                beta: float = 2.0) -> np.ndarray:
    """GVM-RAFT's allocation weights ``G_i / sqrt(p_i + alpha / p_i^(beta - 1))``.

    Limits at the edges: ``p = 0`` gives weight 0 when ``beta > 1`` (the
    denominator is infinite) and ``inf`` when ``beta < 1`` and ``G > 0``; a
    zero gradient norm gives weight 0.
    """
    p = np.asarray(success_probs, dtype=np.float64)
    g = np.ones_like(p) if gradient_norms is None else np.asarray(gradient_norms, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = p + alpha * np.power(p, 1.0 - beta)
        w = g / np.sqrt(denom)
    return np.where(g == 0, 0.0, w)


@register_policy
class GVMPolicy(SeparablePolicy):
    """GVM-RAFT (Yao et al. 2025, arXiv 2505.02391): gradient-variance-minimizing counts.

    The paper allocates ``n_i`` proportional to ``w_i = G_i / sqrt(p_i + alpha
    / p_i^(beta - 1))``, with ``G_i`` a per-prompt gradient norm, and rounds
    the result preserving the sum. That proportional rule is the continuous
    minimizer of the variance bound ``sum_i w_i^2 / n_i`` under ``sum_i n_i =
    B`` (Cauchy-Schwarz); this policy returns its exact integer minimizer
    within the bounds, i.e. the rounding that loses least of the paper's own
    objective. Solves::

        minimize    sum_i w_i^2 / n_i
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer.

    Defaults as in the paper: ``alpha = 1e-3``, ``beta = 2``. Gradient norms
    come from ``allocate(..., gradient_norms=G)`` (the declared extra input),
    else from the constructor, else are 1 for every prompt. Edges: see
    :func:`gvm_weights` (``p = 0`` keeps the minimum under the default
    ``beta``). Ties: fewer rollouts first, then the lower index.
    ``Allocation.objective_value`` is the minimized sum.

    Parameters
    ----------
    alpha, beta : float
        The paper's regularizer of small success probabilities.
    gradient_norms : array_like, optional
        Default ``G_i`` (>= 0, finite), used when ``allocate`` gets none.
    min_rollouts, max_rollouts, offset
        See :class:`AllocationPolicy`.
    """

    name = "gvm"
    preference = 13
    option_names = ("alpha", "beta", "gradient_norms")
    extra_inputs = frozenset({"gradient_norms"})

    def __init__(self, alpha: float = 1e-3, beta: float = 2.0, *, gradient_norms=None,
                 **bounds: Any):
        super().__init__(**bounds)
        self.alpha = validate_real(alpha, "alpha", minimum=0.0)
        self.beta = validate_real(beta, "beta")
        self.gradient_norms = (None if gradient_norms is None
                               else _check_norms(gradient_norms, None))

    def objective(self, problem: AllocationProblem, gradient_norms=None):
        norms = self.gradient_norms if gradient_norms is None else gradient_norms
        if norms is not None:
            norms = _check_norms(norms, problem.num_prompts)
        w = gvm_weights(problem.success_probs, norms, alpha=self.alpha, beta=self.beta)
        return InverseCountCost(w * w)


def _check_norms(gradient_norms, m: int | None) -> np.ndarray:
    refuse_masked(gradient_norms, "gradient_norms")
    raw = np.asarray(gradient_norms)
    if raw.dtype.kind not in "fiu":
        raise SeraOptError(
            f"gradient_norms must be numbers (one norm per prompt), got dtype {raw.dtype}"
            f"{' (True is not read as 1)' if raw.dtype == np.bool_ else ''}."
        )
    g = raw.astype(np.float64, copy=False)
    if g.ndim != 1 or (m is not None and g.shape[0] != m):
        raise SeraOptError(
            f"gradient_norms must be 1-D with one entry per prompt"
            f"{'' if m is None else f' ({m})'}, got shape {g.shape}."
        )
    bad = ~np.isfinite(g) | (g < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SeraOptError(
            f"gradient_norms must be finite and >= 0, got {g[i]!r} at index {i}."
        )
    # Kept by the policy or its objective: its own copy, never the caller's buffer
    # (nor a flag set on it).
    return owned_read_only(g)
