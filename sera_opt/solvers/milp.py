"""Exact lexicographic max-min through a sequence of mixed-integer programs (cvxpy)."""

from __future__ import annotations

import time

import numpy as np

from ..exceptions import MissingDependencyError, SeraOptError, SolverError
from ..problem import AllocationProblem
from ..result import Allocation
from ..separable import PointLevels
from ..separable.tiers import fill_tiers
from .base import Solver, register_solver

__all__ = ["MILPSolver"]

# MILP-capable solvers cvxpy can call, in preference order.
_MILP_SOLVERS = ("HIGHS", "SCIPY", "SCIP", "GLPK_MI", "CBC")


_BANNER_SILENCED = False


def _silence_highs_banner() -> None:
    """HiGHS prints a copyright banner on standard output the first time a process
    creates a solver, in the middle of whatever the caller prints (``sera-opt allocate
    --solver milp`` writes the counts there). Create that first solver with the
    process's standard output pointed at the null device, once."""
    global _BANNER_SILENCED
    if _BANNER_SILENCED:
        return
    _BANNER_SILENCED = True
    try:
        import highspy
    except ImportError:
        return
    import ctypes
    import os
    import sys

    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
        try:  # the banner may sit in C's stdout buffer: flush it into the null device
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _pick_solver(requested: str | None) -> str:
    import cvxpy as cp

    installed = set(cp.installed_solvers())
    if requested is not None:
        if requested not in installed:
            raise MissingDependencyError(
                f"cvxpy solver {requested!r} is not installed; installed: {sorted(installed)}."
            )
        return requested
    for name in _MILP_SOLVERS:
        if name in installed:
            return name
    raise MissingDependencyError(
        "no MILP-capable cvxpy solver is installed; `pip install highspy` provides HiGHS."
    )


def _min_count(rates, m_lo, cap, level) -> np.ndarray:
    """Smallest extra rollouts ``k`` (per prompt, capped) with ``a (m_lo + k) >= level``,
    compared with the same products the greedy uses."""
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.ceil(level / rates - m_lo)
    k = np.clip(np.nan_to_num(k, nan=0.0, posinf=np.inf), 0, cap).astype(np.int64)
    for _ in range(3):  # settle rounding of the division by the exact products
        k = k - ((k > 0) & (rates * (m_lo + k - 1) >= level))
        k = k + ((k < cap) & (rates * (m_lo + k) < level))
    return k


class _StageModel:
    """``maximize t  s.t.  a_i (m_lo_i + x_i) >= t`` for free prompts, ``sum x = extra``,
    ``lower_i <= x_i <= upper_i``, ``x`` integer; fixed prompts have lower = upper.

    Bounds, the free mask and the level scale are cvxpy parameters, so the
    problem is canonicalized once and re-solved cheaply at every stage. Levels
    are divided by the current smallest free level so that ``t`` is of order 1
    whatever the probabilities, which keeps the solver's absolute tolerances
    meaningful.
    """

    def __init__(self, rates, m_lo, extra: int):
        import cvxpy as cp

        size = rates.shape[0]
        self.rates = rates
        self.m_lo = m_lo
        self.x = cp.Variable(size, integer=True)
        self.t = cp.Variable()
        self.lower = cp.Parameter(size)
        self.upper = cp.Parameter(size)
        self.slack = cp.Parameter(size, nonneg=True)  # 0 for free prompts, big for fixed
        self.coef = cp.Parameter(size, nonneg=True)
        self.base = cp.Parameter(size, nonneg=True)
        levels = cp.multiply(self.coef, self.x) + self.base
        self.problem = cp.Problem(
            cp.Maximize(self.t),
            [levels + self.slack >= self.t, cp.sum(self.x) == extra,
             self.x >= self.lower, self.x <= self.upper],
        )

    def solve(self, lower, upper, free, solver: str) -> np.ndarray:
        scaled = self.rates / float(np.min(self.rates[free] * (self.m_lo[free] + lower[free])))
        self.coef.value = scaled
        self.base.value = scaled * self.m_lo
        self.lower.value = lower.astype(np.float64)
        self.upper.value = upper.astype(np.float64)
        big = float(np.max(scaled * (self.m_lo + upper))) + 1.0
        self.slack.value = np.where(free, 0.0, big)
        opts = (
            {"mip_rel_gap": 0.0, "mip_abs_gap": 0.0, "output_flag": False,
             "primal_feasibility_tolerance": 1e-10, "mip_feasibility_tolerance": 1e-10}
            if solver == "HIGHS" else {}
        )
        try:
            self.problem.solve(solver=solver, warm_start=False, **opts)
        except Exception as exc:  # cvxpy raises its own SolverError types
            raise SolverError(f"the MILP solver {solver} failed: {exc}") from exc
        if self.problem.status not in ("optimal", "optimal_inaccurate") or self.x.value is None:
            raise SolverError(f"the MILP solver {solver} returned status {self.problem.status!r}.")
        return np.rint(self.x.value).astype(np.int64)


def _lexicographic_tier(rates, m_lo, cap, extra, solver: str) -> np.ndarray:
    """Lexicographic max-min on one tier by stages.

    Stage: the MILP gives the largest attainable minimum level ``t*`` among the
    free prompts. Every free prompt needs at least ``k_i(t*)`` extra rollouts
    (its smallest count with level >= t*); those at exactly ``t*`` can each be
    lifted above it by one more rollout, and the budget left over lifts
    ``s`` of them. The others are fixed at ``t*``. Which ``s`` to lift: the
    ones with the largest rate, since lifting ``i`` instead of ``j`` with
    ``a_i >= a_j`` leaves a level vector at least as good in every position
    (swap argument). Each stage fixes at least one prompt.
    """
    size = rates.shape[0]
    model = _StageModel(rates, m_lo, extra)
    lower = np.zeros(size, dtype=np.int64)
    upper = cap.copy()
    free = np.ones(size, dtype=bool)
    while free.any():
        free_budget = extra - int(lower[~free].sum())
        if free_budget == int(lower[free].sum()) or free_budget == int(upper[free].sum()):
            break
        x = model.solve(lower, upper, free, solver)
        level = float(np.min(rates[free] * (m_lo[free] + x[free])))
        idx = np.flatnonzero(free)
        need = np.maximum(_min_count(rates[idx], m_lo[idx], cap[idx], level), lower[idx])
        spare = free_budget - int(need.sum())
        at_level = rates[idx] * (m_lo[idx] + need) == level
        liftable = idx[at_level & (need < cap[idx])]
        at_level = idx[at_level]
        if spare < 0 or at_level.size == 0:
            raise SolverError(
                f"the MILP's stage optimum {level!r} is not feasible (spare budget {spare}); "
                f"the solver's tolerance may be too loose."
            )
        if liftable.size == at_level.size and spare >= liftable.size:
            # Not the maximum: every prompt at t* can be lifted within the budget (the
            # solver stopped at a point its tolerances accept). The optimum lies above
            # t*, so these lower bounds hold for it; solve the stage again from them.
            # Each retry raises a bound, so the stages still end.
            lower[idx] = need
            lower[at_level] += 1
            continue
        lift = liftable[np.argsort(-rates[liftable], kind="stable")[:spare]]
        stuck = np.setdiff1d(at_level, lift, assume_unique=True)
        lower[idx] = need
        lower[lift] += 1
        upper[stuck] = lower[stuck]
        free[stuck] = False
    free_budget = extra - int(lower[~free].sum())
    out = lower.copy()
    if free.any() and free_budget == int(upper[free].sum()):
        out[free] = upper[free]
    return out


@register_solver
class MILPSolver(Solver):
    """Exact lexicographic max-min by a sequence of MILPs (cvxpy; HiGHS by default).

    Each stage solves::

        maximize    t
        subject to  a_i (n_i - c) >= t      for every prompt not yet fixed
                    sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer

    then fixes the prompts that must stay at the optimal ``t`` and repeats,
    which yields the lexicographic optimum (see ``_lexicographic_tier``). This is
    the certifying reference for the fast solvers; it needs cvxpy and a
    MILP-capable solver.

    Options
    -------
    milp_solver : str, optional
        cvxpy solver name (default: the first installed of HIGHS, SCIPY, SCIP,
        GLPK_MI, CBC).
    """

    name = "milp"
    preference = 1
    exact = True
    requires = ("cvxpy",)
    options = frozenset({"milp_solver"})

    def check_options(self, options, *, stacklevel: int = 2):
        known = super().check_options(options, stacklevel=stacklevel + 1)
        name = known.get("milp_solver")
        if name is not None and not isinstance(name, str):
            # Whether it is installed is checked when solving (that needs cvxpy).
            raise SeraOptError(
                f"the milp solver's option milp_solver is the name of a cvxpy solver (a "
                f"string such as 'HIGHS') or None, got {name!r}."
            )
        return known

    def _solve(self, problem: AllocationProblem, milp_solver: str | None = None) -> Allocation:
        solver = _pick_solver(milp_solver)
        if solver == "HIGHS":
            _silence_highs_banner()
        start = time.perf_counter()
        rates = problem.rates
        lo = problem.min_rollouts
        m_lo = lo - problem.offset
        cap = problem.max_rollouts - lo

        def finite(idx, take):
            return _lexicographic_tier(rates[idx], m_lo[idx], cap[idx], take, solver)

        counts = lo + fill_tiers(m_lo, cap, problem.spare_budget, rates == 0, np.isinf(rates),
                                 finite)
        return Allocation(problem, counts, solver=self.name,
                          wall_time=time.perf_counter() - start,
                          objective=PointLevels.from_problem(problem))
