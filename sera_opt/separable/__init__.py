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
  prompt at any level; the waterline kernels ((:mod:`sera_opt.kernels.waterline`)) locate
  the threshold with a few O(M) passes. This is the fast path SERA runs on.
* **Objectives with a numba gain kernel** (every other built-in objective)
  run the threshold search of :mod:`sera_opt.kernels.entries`: a bracket on the gain
  value narrowed by counting passes (a closed-form guess of each row's
  crossing, settled exactly by a galloping search on the gain itself, or, where
  the crossing is known in closed form, by no gain evaluation at all), then a
  selection among the few gains left.
* **Any other objective** (a user's subclass that defines :meth:`gains` and
  :meth:`terms` in numpy) runs the same threshold search written in numpy:
  bisection on the gain value with a vectorized binary search per prompt.
  Slower, and exact by the same argument; it also serves as the slow reference
  of the tests.

Ties at the final threshold (docs/theory.md section 3 breaks them only for
max-min; the rule here covers every shape): for max-min the step whose next
level is highest goes first (lexicographically better), then for every shape
the prompt with fewer rollouts so far, then the lower index.
Prompts whose steps all have the same gain thus share spare rollouts evenly.
For :class:`BetaLevels`, levels within ``1e-10`` (relative) of the threshold
count as tied: levels that agree in exact arithmetic differ by rounding, and
rounding must not decide a lexicographic optimum.

Max-min objectives can have prompts whose level is 0 or infinite at every
count (``p = 0`` or ``p = 1``); where the plain order cannot rank them, the
limit order of :mod:`sera_opt.separable.tiers` does, in one place for every
max-min solver.

A new separable objective is one subclass of :class:`SeparableObjective`
(its ``sense``, :meth:`gains` and :meth:`terms`); a policy that allocates by
it is one :class:`~sera_opt.policies.SeparablePolicy` subclass naming it.
"""

from .inputs import check_alpha, validate_beta_posterior
from .levels import BetaLevels, PointLevels, expected_factors
from .objective import SENSES, SeparableObjective, solve_separable
from .utilities import (
    AlphaFairUtility,
    HitUtility,
    InverseCountCost,
    KnapsackValue,
    PointHitUtility,
    RLOOVariance,
)

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
    "expected_factors",
]
