"""The waterline solver: closed-form relaxation plus exact integer allocation (numba).

This is SERA's fast path in the separable engine: the objective is
:class:`~sera_opt.solvers.separable.PointLevels`, the edges go through
:mod:`~sera_opt.solvers._tiers`, and the ordinary prompts through the waterline
kernels.
"""

from __future__ import annotations

import time

import numpy as np

from ..problem import AllocationProblem
from ..result import Allocation
from . import _tiers
from .base import Solver, register_solver
from .separable import PointLevels, _solve

__all__ = ["WaterlineSolver", "continuous_waterline", "integer_waterline"]


def continuous_waterline(problem: AllocationProblem) -> tuple[np.ndarray, float]:
    """Solve the continuous relaxation of SERA.

    Finds the level ``L*`` with ``sum_i clip(c + L* / a_i, lo_i, hi_i) = B`` and
    returns ``(counts, L*)``. ``sum_i n_i(L)`` is piecewise linear; the solver
    locates the piece that contains the root and solves that piece's line in
    closed form, so the result is exact up to one rounding of the final
    division (no tolerance loop). Prompts with ``p = 0`` / ``p = 1`` follow the
    limit order of :mod:`sera_opt.solvers._tiers`.
    """
    from ._waterline_kernels import continuous_fill

    rates = problem.rates
    lo, c = problem.min_rollouts, problem.offset
    m_lo = lo - c
    cap = problem.max_rollouts - lo

    def finite(idx, take):
        return continuous_fill(np.ascontiguousarray(rates[idx]), np.ascontiguousarray(m_lo[idx]),
                               np.ascontiguousarray(cap[idx]), float(take))

    def lowest_level():
        # With no spare budget every level at or below the lowest one solves the
        # relaxation; report the lowest.
        return float(PointLevels.from_problem(problem).terms(lo).min())

    level, inc = _tiers.fill_tiers(m_lo, cap, problem.spare_budget, rates == 0, np.isinf(rates),
                                   finite, continuous=True, finite_level=lowest_level)
    return lo + inc, float(level)


def integer_waterline(problem: AllocationProblem, hint: float = float("nan")) -> np.ndarray:
    """The lexicographically max-min optimal integer counts (exact).

    Equal to handing out the spare budget one rollout at a time to the prompt
    with the lowest current level among those below their maximum (ties: the
    prompt with the larger rate ``a_i`` first, then the lower index), but
    computed by locating the greedy's final level threshold directly: O(M)
    per pass, a few passes. ``hint``, the continuous waterline level, is a
    good starting point for that search (it only affects speed).
    """
    objective = PointLevels.from_problem(problem, hint=hint)
    lo = problem.min_rollouts
    return _solve(objective, lo, problem.max_rollouts, problem.spare_budget,
                  np.zeros(4, dtype=np.int64))


@register_solver
class WaterlineSolver(Solver):
    """Closed-form waterline with exact integer rounding (the default).

    Solves::

        lexicographically maximize  sort_i( a_i (n_i - c) )
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer,

    with ``a_i = -log(1 - p_i)``: the attenuation factors
    ``w_c(p_i, n_i) = 1 - exp(-a_i (n_i - c))`` are as equal as the budget allows,
    the smallest first. Also returns the continuous relaxation
    ``n_i(L*) = clip(c + L* / a_i, lo_i, hi_i)`` and its level ``L*``.

    Options
    -------
    continuous : bool, default True
        Also compute the continuous relaxation (``Allocation.continuous`` and
        ``.waterline``); ``False`` skips it for speed.
    """

    name = "waterline"
    preference = 0
    exact = True
    relaxation = True
    requires = ("numba",)
    options = frozenset({"continuous"})

    def _solve(self, problem: AllocationProblem, continuous: bool = True) -> Allocation:
        start = time.perf_counter()
        relaxed, level = continuous_waterline(problem) if continuous else (None, None)
        # The integer threshold lies just below the relaxation's level.
        counts = integer_waterline(problem, float("nan") if level is None else level)
        elapsed = time.perf_counter() - start
        return Allocation._trusted(problem, counts, solver=self.name, wall_time=elapsed,
                                   objective=PointLevels.from_problem(problem),
                                   continuous=relaxed, waterline=level)
