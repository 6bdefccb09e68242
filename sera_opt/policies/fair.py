"""The alpha-fair family of allocations: SERA's max-min as its limit (docs/theory.md section 8)."""

from __future__ import annotations

import math

from ..problem import AllocationProblem
from ..separable import AlphaFairUtility, PointLevels, check_alpha
from .base import DEFAULT_MAX_RATIO, SeparablePolicy
from .registry import register_policy

__all__ = ["SERAFairPolicy"]


@register_policy
class SERAFairPolicy(SeparablePolicy):
    """Alpha-fair allocation of the attenuation factors: between HORA's sum and SERA's max-min.

    Solves, exactly in integers::

        maximize    sum_i U_alpha(w_c(p_i, n_i)),   U_alpha(w) = w^(1 - alpha) / (1 - alpha)
                                                    (log w for alpha = 1)
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer,

    with ``w_c(p, n) = 1 - (1 - p)^(n - c)``. Every term is concave in ``n``, so
    the separable engine's greedy on marginal gains is exact for every
    ``alpha >= 0``; gains are compared in log space.

    * ``alpha = 0`` maximizes the sum of the factors (HORA's objective on point
      estimates, for the policy's offset).
    * ``alpha = 1`` (proportional fairness, the policy's default alpha): where a prompt's level
      ``a_i (n - c)`` is small, one more rollout gains about
      ``log((n + 1 - c) / (n - c))`` whatever ``a_i``, so unsolved prompts share
      the spare budget evenly and none is pinned at the cap, while solved
      prompts stay at the minimum.
    * ``alpha -> inf`` tends to SERA's lexicographic max-min; ``alpha=inf`` *is*
      it (the ``"sera"`` policy's counts, through the waterline kernels).

    Edges: a prompt with ``p = 0`` has factor 0 whatever its count and gains
    nothing from rollouts (for ``alpha >= 1`` its utility is ``-inf`` at every
    count): it keeps its minimum unless every other prompt is full, the
    opposite of max-min, which gives it the cap (and so does ``alpha=inf``).
    ``p = 1`` keeps its minimum likewise. Ties between equal gains: fewer
    rollouts first, then the lower index.

    ``Allocation.objective`` is the :class:`~sera_opt.separable.AlphaFairUtility`
    (``PointLevels`` at ``alpha=inf``); ``Allocation.objective_value`` the maximized
    sum (``-inf`` for ``alpha >= 1`` when some ``p = 0``).

    Parameters
    ----------
    alpha : float, default 1
        Fairness, ``>= 0``; ``inf`` is SERA's max-min.
    min_rollouts, max_rollouts, offset
        See :class:`AllocationPolicy`.
    max_ratio : float or None, default 4
        Cap used when no ``max_rollouts`` is given, as for :class:`SERAPolicy`.
    active_threshold : float or None, default None
        Switch off the prompts without a useful chance of a mixed group, by the
        authors' active-set rule, as for :class:`SERAPolicy` (``min_rollouts=0`` is
        ``active_threshold=0.05``); each probe of the rule solves this policy's
        objective on the prompts it keeps.
    """

    name = "sera-fair"
    preference = 2
    option_names = ("alpha",)
    default_max_ratio = DEFAULT_MAX_RATIO
    active_set_capable = True
    offset_sensitive = True
    # A round solves its objective over the prompts without a success, in the count of
    # the round: its counts follow the expected scales (docs/theory.md section 9).
    round_mode = "scale"

    def __init__(self, alpha: float = 1.0, **bounds):
        super().__init__(**bounds)
        self.alpha = check_alpha(alpha)

    def objective(self, problem: AllocationProblem):
        if math.isinf(self.alpha):
            return PointLevels.from_problem(problem)
        return AlphaFairUtility.from_problem(problem, self.alpha)

    def round_objective(self, problem: AllocationProblem, **inputs):
        """:meth:`objective` of a round (:meth:`start_rounds`), with the ``alpha`` checked
        when the policy was built rather than once per round."""
        if math.isinf(self.alpha):
            return PointLevels.from_problem(problem)
        return AlphaFairUtility.of_checked(problem, self.alpha)
