"""The waterline solver: closed-form relaxation plus exact integer allocation (numba).

This is SERA's fast path in the separable engine: the objective is
:class:`~sera_opt.separable.PointLevels`. When no prompt has ``p = 0``
or ``p = 1`` (the common case) the kernels run once over all prompts, with
scalar bounds passed as scalars; otherwise the edges go through
:mod:`~sera_opt.separable.tiers` and the kernels serve the ordinary prompts.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .. import _jit
from ..exceptions import SeraOptError
from ..problem import MAX_BUDGET, AllocationProblem, owned_read_only
from ..result import Allocation
from ..separable import PointLevels, tiers
from .base import Solver, register_solver

__all__ = ["WaterlineSolver", "allocate_batch", "continuous_waterline", "integer_waterline"]


def _kernels():
    return _jit.kernels("sera_opt.kernels.waterline")


# One-entry bound arrays of the kernels, by value: a batch loop asks for the same
# few bounds on every call. The kernels only read them; read-only, like the per-prompt bounds a
# problem holds, so that both kinds of bounds share one compiled specialization.
_SCALAR_BOUNDS: dict[int, np.ndarray] = {}


def _scalar_bound(value: int) -> np.ndarray:
    arr = _SCALAR_BOUNDS.get(value)
    if arr is None:
        if len(_SCALAR_BOUNDS) >= 256:
            _SCALAR_BOUNDS.clear()
        arr = _SCALAR_BOUNDS[value] = np.array([value], dtype=np.int64)
        arr.setflags(write=False)
    return arr


def _kernel_bounds(problem: AllocationProblem):
    """``(lo, hi, uniform)`` as the kernels take them: one entry each when uniform."""
    if problem.uniform_bounds:
        lo, hi = problem.stored_bounds
        return _scalar_bound(lo), _scalar_bound(hi), True
    return (np.ascontiguousarray(problem.min_rollouts), np.ascontiguousarray(problem.max_rollouts),
            False)


def continuous_waterline(problem: AllocationProblem) -> tuple[np.ndarray, float]:
    """Solve the continuous relaxation of SERA.

    Finds the level ``L*`` with ``sum_i clip(c + L* / a_i, lo_i, hi_i) = B`` and
    returns ``(counts, L*)``. ``sum_i n_i(L)`` is piecewise linear; the solver
    locates the piece that contains the root and solves that piece's line in
    closed form, so the result is exact up to one rounding of the final
    division (no tolerance loop). Prompts with ``p = 0`` / ``p = 1`` follow the
    limit order of :mod:`sera_opt.separable.tiers`.
    """
    counts, level, _, _ = _relax(problem)
    return counts, level


def _relax(problem: AllocationProblem) -> tuple[np.ndarray, float, float, int]:
    """:func:`continuous_waterline`, the slope of ``sum_i n_i(L)`` at ``L*`` and the number
    of prompts strictly inside their bounds there (0, 0 when some prompt is at an edge)."""
    linear_relax = _kernels().linear_relax
    rates = problem.rates
    c = problem.offset
    if not problem.has_edges:
        lo, hi, uniform = _kernel_bounds(problem)
        relaxed = np.empty(problem.num_prompts, dtype=np.float64)
        level, slope, active = linear_relax(rates, lo, hi, uniform, c,
                                            float(problem.spare_budget), relaxed)
        return relaxed, float(level), float(slope), int(active)
    lo = problem.min_rollouts
    m_lo = lo - c
    cap = problem.max_rollouts - lo

    def finite(idx, take):
        lo_t = np.ascontiguousarray(lo[idx])
        out = np.empty(lo_t.shape[0], dtype=np.float64)
        level, _, _ = linear_relax(np.ascontiguousarray(rates[idx]), lo_t,
                                   np.ascontiguousarray(problem.max_rollouts[idx]), False, c,
                                   float(take), out)
        return level, out - lo_t

    def lowest_level():
        # With no spare budget every level at or below the lowest one solves the
        # relaxation; report the lowest.
        return float(PointLevels.from_problem(problem).terms(lo).min())

    level, inc = tiers.fill_tiers(m_lo, cap, problem.spare_budget, rates == 0, np.isinf(rates),
                                   finite, continuous=True, finite_level=lowest_level)
    return lo + inc, float(level), 0.0, 0


def integer_waterline(problem: AllocationProblem, hint: float = math.nan,
                      hint_slope: float = 0.0, hint_active: int = 0) -> np.ndarray:
    """The lexicographically max-min optimal integer counts (exact).

    Equal to handing out the spare budget one rollout at a time to the prompt
    with the lowest current level among those below their maximum (ties: the
    prompt with the larger rate ``a_i`` first, then the lower index), but
    computed by locating the greedy's final level threshold directly: O(M)
    per pass, a few passes. ``hint``, the continuous waterline level (and
    ``hint_slope``, the relaxation's slope there, and ``hint_active``, the number of
    prompts strictly inside their bounds there), is a good starting point for that
    search (it only affects speed).
    """
    linear_solve = _kernels().linear_solve
    if not problem.has_edges:
        lo, hi, uniform = _kernel_bounds(problem)
        counts = np.empty(problem.num_prompts, dtype=np.int64)
        linear_solve(problem.rates, lo, hi, uniform, problem.offset, problem.spare_budget,
                     float(hint), float(hint_slope), int(hint_active), counts)
        return counts
    objective = PointLevels.from_problem(problem, hint=hint)
    from ..separable.objective import solve_validated

    return solve_validated(objective, *problem.kernel_bounds(), problem.spare_budget,
                           np.zeros(4, dtype=np.int64))


def _one_call(p, rates, compute_rates: bool, lo, hi, uniform: bool, offset: int, spare: int,
              continuous: bool):
    """:func:`waterline_solve` with its output arrays: ``(counts, relaxed, level, zeros,
    infs, bad)``, ``relaxed`` and ``level`` None without ``continuous``."""
    m = rates.shape[0]
    counts = np.empty(m, dtype=np.int64)
    relaxed = np.empty(m if continuous else 0, dtype=np.float64)
    level, zeros, infs, bad = _kernels().waterline_solve(
        p, rates, compute_rates, lo, hi, uniform, offset, spare, continuous, counts, relaxed)
    if not continuous:
        return counts, None, None, zeros, infs, bad
    return counts, relaxed, float(level), zeros, infs, bad


def _fused(problem: AllocationProblem, continuous: bool):
    """The common case in one compiled call (rates, relaxation, counts); None when some
    prompt has p = 0 or p = 1, which the tiered path serves."""
    cached = problem.__dict__.get("_rates_cache")
    if cached is not None and (cached[1] or cached[2]):
        return None
    if cached is None:
        p = np.ascontiguousarray(problem.success_probs, dtype=np.float64)
        rates = np.empty(problem.num_prompts, dtype=np.float64)
    else:
        p = rates = cached[3]  # the writable array behind the read-only view
    counts, relaxed, level, zeros, infs, _ = _one_call(
        p, rates, cached is None, *_kernel_bounds(problem), problem.offset,
        problem.spare_budget, continuous)
    if cached is None:
        problem.cache_rates(rates, zeros, infs)
    if zeros or infs:
        return None
    return counts, relaxed, level


def allocate_batch(p, budget, lo, hi, offset: int, continuous: bool):
    """SERA's allocation of the common batch in one compiled call: ``p`` a C-contiguous
    1-D float64 array, ``budget`` and the bounds Python ints (``hi`` None: no cap), no
    prompt at ``p = 0`` or ``1``. The probabilities are validated in the pass that
    computes their rates, and the problem is built from what that pass found.

    Returns the :class:`~sera_opt.Allocation` that ``WaterlineSolver`` gives on
    ``AllocationProblem(p, budget, lo, hi, offset)``, or None when the inputs fall
    outside this case or are invalid: the general path then runs, and reports bad
    input with its fix.
    """
    start = time.perf_counter()
    m = p.shape[0]
    capped = hi is not None
    if not (type(budget) is int and type(lo) is int and m > 0 and 1 + offset <= lo and
            lo * m <= budget <= MAX_BUDGET):
        return None
    if not capped:
        hi = lo + (budget - lo * m)
    elif not (type(hi) is int and lo <= hi <= MAX_BUDGET and budget <= hi * m):
        return None
    # The problem's own read-only copy (the caller may reuse p); the kernels are
    # compiled for that layout.
    view = owned_read_only(p)
    rates = np.empty(m, dtype=np.float64)
    counts, relaxed, level, zeros, infs, bad = _one_call(
        view, rates, True, _scalar_bound(lo), _scalar_bound(hi), True, offset, budget - lo * m,
        continuous)
    if zeros or infs or bad:
        return None
    problem = AllocationProblem.from_validated(view, budget, lo, hi, offset, capped, rates)
    return Allocation.from_solver_counts(problem, counts, solver=WaterlineSolver.name,
                               wall_time=time.perf_counter() - start,
                               objective=PointLevels.from_problem(problem),
                               continuous=relaxed, waterline=level)


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

    def check_options(self, options, *, stacklevel: int = 2):
        known = super().check_options(options, stacklevel=stacklevel + 1)
        if "continuous" in known and not isinstance(known["continuous"], (bool, np.bool_)):
            raise SeraOptError(
                f"the waterline solver's option continuous is True or False (whether to "
                f"compute the continuous relaxation too), got {known['continuous']!r}."
            )
        return known

    def _solve(self, problem: AllocationProblem, continuous: bool = True) -> Allocation:
        start = time.perf_counter()
        fused = _fused(problem, continuous)
        if fused is not None:
            counts, relaxed, level = fused
        else:
            relaxed, level, slope, active = (_relax(problem) if continuous
                                             else (None, None, 0.0, 0))
            # The integer threshold lies just below the relaxation's level.
            counts = integer_waterline(problem, math.nan if level is None else level, slope,
                                       active)
        elapsed = time.perf_counter() - start
        return Allocation.from_solver_counts(problem, counts, solver=self.name, wall_time=elapsed,
                                   objective=PointLevels.from_problem(problem),
                                   continuous=relaxed, waterline=level)
