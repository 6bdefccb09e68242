"""The waterline solver: closed-form relaxation plus exact integer allocation (numba)."""

from __future__ import annotations

import time

import numpy as np

from ..problem import AllocationProblem
from ..result import Allocation
from ._tiers import fill_tiers
from .base import Solver, register_solver

__all__ = ["WaterlineSolver", "continuous_waterline", "integer_waterline"]


def continuous_waterline(problem: AllocationProblem) -> tuple[np.ndarray, float]:
    """Solve the continuous relaxation of SERA.

    Finds the level ``L*`` with ``sum_i clip(c + L* / a_i, lo_i, hi_i) = B`` and
    returns ``(counts, L*)``. ``sum_i n_i(L)`` is piecewise linear; the solver
    locates the piece that contains the root and solves that piece's line in
    closed form, so the result is exact up to one rounding of the final
    division (no tolerance loop). Prompts with ``p = 0`` / ``p = 1`` follow the
    limit order described in :mod:`sera_opt.solvers._tiers`.
    """
    from ._waterline_kernels import continuous_fill

    return fill_tiers(problem, continuous_fill, continuous=True)


def integer_waterline(problem: AllocationProblem, hint: float = float("nan")) -> np.ndarray:
    """The lexicographically max-min optimal integer counts (exact).

    Equal to handing out the spare budget one rollout at a time to the prompt
    with the lowest current level among those below their maximum (ties: the
    prompt with the larger rate ``a_i`` first, then the lower index), but
    computed by locating the greedy's final level threshold directly: O(M)
    per pass, a few passes. ``hint``, the continuous waterline level, is a
    good starting point for that search (it only affects speed).
    """
    from ._waterline_kernels import integer_fill

    def fill(rates, m_lo, cap, extra):
        return integer_fill(rates, m_lo, cap, extra, hint)

    counts, _ = fill_tiers(problem, fill)
    return counts


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
    integer = True
    exact = True
    requires = ("numba",)
    options = frozenset({"continuous"})

    def _solve(self, problem: AllocationProblem, continuous: bool = True) -> Allocation:
        start = time.perf_counter()
        relaxed, level = continuous_waterline(problem) if continuous else (None, None)
        # The integer threshold lies just below the relaxation's level.
        counts = integer_waterline(problem, float("nan") if level is None else level)
        elapsed = time.perf_counter() - start
        return Allocation.from_counts(problem, counts, solver=self.name, wall_time=elapsed,
                                      continuous=relaxed, waterline=level)
