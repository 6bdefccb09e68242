"""The plain greedy: one rollout at a time, in pure Python. Slow and obviously correct."""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from ..problem import AllocationProblem
from ..result import Allocation
from .base import Solver, register_solver

__all__ = ["GreedySolver", "greedy_counts", "level_key"]


def level_key(rate: float, m: int) -> tuple[float, int]:
    """Order key of a prompt's level ``rate * m`` with the limit order at p = 0 and p = 1.

    ``p = 0`` (rate 0) ranks below every positive level and ``p = 1`` (rate inf)
    above every finite one; within each, by ``m``.
    """
    if rate == 0.0:
        return (0.0, m)
    if math.isinf(rate):
        return (math.inf, m)
    return (rate * m, 0)


def greedy_counts(problem: AllocationProblem) -> np.ndarray:
    """Start every prompt at its minimum, then repeatedly give one rollout to the
    prompt with the lowest level among those below their maximum.

    Ties go to the larger rate (its next level is the higher one), then to the
    lower index.
    """
    rates = problem.rates.tolist()
    counts = problem.min_rollouts.tolist()
    hi = problem.max_rollouts.tolist()
    c = problem.offset
    heap = [
        (*level_key(rates[i], counts[i] - c), -rates[i], i)
        for i in range(len(counts))
        if counts[i] < hi[i]
    ]
    heapq.heapify(heap)
    for _ in range(problem.spare_budget):
        *_, i = heapq.heappop(heap)
        counts[i] += 1
        if counts[i] < hi[i]:
            heapq.heappush(heap, (*level_key(rates[i], counts[i] - c), -rates[i], i))
    return np.asarray(counts, dtype=np.int64)


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
    integer = True
    exact = True

    def _solve(self, problem: AllocationProblem) -> Allocation:
        start = time.perf_counter()
        counts = greedy_counts(problem)
        return Allocation.from_counts(problem, counts, solver=self.name,
                                      wall_time=time.perf_counter() - start)
