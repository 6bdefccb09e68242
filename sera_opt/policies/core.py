"""The core policies: SERA and uniform allocation."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..problem import AllocationProblem
from ..result import Allocation
from ..solvers.base import get_solver
from .base import AllocationPolicy, register_policy

__all__ = ["SERAPolicy", "UniformPolicy", "uniform_counts"]


@register_policy
class SERAPolicy(AllocationPolicy):
    """Scale-Equalized Rollout Allocation.

    Lexicographically maximizes the sorted attenuation factors
    ``w_c(p_i, n_i) = 1 - (1 - p_i) ** (n_i - c)`` subject to
    ``sum_i n_i = budget`` and the per-prompt bounds (THEORY.md section 3).

    Parameters
    ----------
    solver : str, Solver or callable, default "waterline"
        Which solver computes the allocation (see :func:`sera_opt.available_solvers`).
    min_rollouts, max_rollouts, offset
        See :class:`AllocationPolicy`.
    max_ratio : float or None, default 4
        Cap used when no ``max_rollouts`` is given: ``ceil(max_ratio * budget / M)``
        rollouts per prompt. Max-min is ruled by the hardest prompts; with no cap,
        prompts whose estimated p is near 0 absorb the budget while the others
        stay at the minimum, which aligns the batch gradient *worse* than uniform
        allocation (THEORY.md section 5; docs/benchmarks.md, alignment). Posterior
        means from :class:`sera_opt.SuccessTracker` make SERA less sensitive to
        the cap, but not immune: prompts that fail on every visit drive their
        posterior mean towards 0 too, and in the hard maze configuration SERA
        then loses to uniform allocation (docs/benchmarks.md, maze). ``None``
        removes the cap.
    **solver_options
        Passed to the solver (e.g. ``continuous=False`` for "waterline").
    """

    name = "sera"
    preference = 0
    default_max_ratio = 4.0
    offset_sensitive = True

    def __init__(self, solver="waterline", *, min_rollouts=None, max_rollouts=None,
                 offset: int = 0, max_ratio=default_max_ratio, **solver_options: Any):
        super().__init__(min_rollouts=min_rollouts, max_rollouts=max_rollouts, offset=offset,
                         max_ratio=max_ratio)
        self.solver = get_solver(solver)
        self.solver_options = solver_options

    def _allocate(self, problem: AllocationProblem) -> Allocation:
        return self.solver.solve(problem, **self.solver_options)

    def _options(self) -> dict[str, Any]:
        return {"solver": self.solver.name, **super()._options(), **self.solver_options}


def uniform_counts(problem: AllocationProblem) -> np.ndarray:
    """Counts as even as the budget and bounds allow.

    Raises every prompt to a common count ``T`` (clipped to its bounds), the
    largest ``T`` the budget affords, then gives one more to the first prompts
    in index order that can take it until the budget is spent.
    """
    lo, hi, budget = problem.min_rollouts, problem.max_rollouts, problem.budget
    low, high = int(lo.min()), int(hi.max())
    # Largest T with sum(clip(T, lo, hi)) <= budget, by integer bisection.
    while low < high:
        mid = (low + high + 1) // 2
        if int(np.clip(mid, lo, hi).sum()) <= budget:
            low = mid
        else:
            high = mid - 1
    counts = np.clip(low, lo, hi).astype(np.int64)
    remainder = budget - int(counts.sum())
    if remainder:
        can_take = np.flatnonzero(counts < hi)[:remainder]
        counts[can_take] += 1
    return counts


@register_policy
class UniformPolicy(AllocationPolicy):
    """Uniform allocation (MaxRL, GRPO): ``n_i = budget / M``.

    When ``budget`` is not a multiple of ``M`` the remainder goes one rollout
    each to the first prompts in index order; per-prompt bounds are respected
    (counts are as even as they allow).
    """

    name = "uniform"
    preference = 1

    def _allocate(self, problem: AllocationProblem) -> Allocation:
        start = time.perf_counter()
        counts = uniform_counts(problem)
        return Allocation.from_counts(problem, counts, solver=self.name,
                                      wall_time=time.perf_counter() - start)
