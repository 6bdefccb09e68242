"""The plain greedy: one rollout at a time, in pure Python. Slow and obviously correct."""

from __future__ import annotations

import heapq
import time

import numpy as np

from ..problem import AllocationProblem
from ..result import Allocation
from ..separable import PointLevels, tiers
from .base import Solver, register_solver

__all__ = ["GreedySolver", "greedy_counts", "greedy_increments"]


def greedy_increments(rates, m_lo, cap, extra: int) -> np.ndarray:
    """Start every prompt at ``m_lo`` effective rollouts, then repeatedly give one
    rollout to the prompt with the lowest level ``rate * m`` among those with
    room left. Ties go to the larger rate (its next level is the higher one),
    then to the lower index. ``rates`` are finite and positive."""
    rates = [float(r) for r in rates]
    level = [int(m) for m in m_lo]
    room = [int(c) for c in cap]
    inc = [0] * len(rates)
    heap = [(rates[i] * level[i], -rates[i], i) for i in range(len(rates)) if room[i] > 0]
    heapq.heapify(heap)
    for _ in range(extra):
        _, _, i = heapq.heappop(heap)
        inc[i] += 1
        if inc[i] < room[i]:
            heapq.heappush(heap, (rates[i] * (level[i] + inc[i]), -rates[i], i))
    return np.asarray(inc, dtype=np.int64)


def greedy_counts(problem: AllocationProblem) -> np.ndarray:
    """SERA's integer optimum by the one-at-a-time greedy, with the edge order of
    :mod:`sera_opt.separable.tiers`."""
    rates = problem.rates
    lo = problem.min_rollouts
    m_lo = lo - problem.offset
    cap = problem.max_rollouts - lo

    def finite(idx, take):
        return greedy_increments(rates[idx], m_lo[idx], cap[idx], take)

    return lo + tiers.fill_tiers(m_lo, cap, problem.spare_budget, rates == 0, np.isinf(rates),
                                  finite)


@register_solver
class GreedySolver(Solver):
    """One rollout at a time to the lowest level: the reference for the fast solvers.

    Solves the same problem as the waterline solver::

        lexicographically maximize  sort_i( a_i (n_i - c) )
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer,

    in O((B - sum lo) log M) with a binary heap, in pure Python.
    """

    name = "greedy"
    preference = 2
    exact = True

    def _solve(self, problem: AllocationProblem) -> Allocation:
        start = time.perf_counter()
        counts = greedy_counts(problem)
        return Allocation(problem, counts, solver=self.name,
                          wall_time=time.perf_counter() - start,
                          objective=PointLevels.from_problem(problem))
