"""The one result type that every solver and policy returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import AllocationProblem

__all__ = ["Allocation"]


@dataclass(frozen=True, eq=False)
class Allocation:
    """An allocation of rollouts to prompts.

    Attributes
    ----------
    counts : ndarray of int64, shape (M,)
        Rollouts per prompt; sums exactly to the budget.
    factors : ndarray, shape (M,)
        Attenuation factors ``w_c(p_i, n_i)`` (or, for policies that allocate
        under uncertainty, their posterior expectation), in the inputs' float dtype.
    min_factor : float
        ``min(factors)``: the quantity that SERA maximizes.
    levels : ndarray of float64 or None
        ``a_i (n_i - c)`` with ``a_i = -log(1 - p_i)``, where the policy's
        objective is defined through levels.
    continuous : ndarray of float64 or None
        The continuous relaxation's counts (the waterline), where the solver
        computed one.
    waterline : float or None
        The continuous relaxation's level ``L*``.
    objective : float or None
        The policy's own objective value, for policies that optimize a sum.
    solver : str
        Name of the solver or policy that produced it.
    status : str
        ``"optimal"`` for exact solvers, otherwise a short description.
    wall_time : float
        Seconds spent solving (validation excluded).
    offset : int
        The estimator offset ``c`` the factors were computed with.
    """

    counts: np.ndarray
    factors: np.ndarray
    min_factor: float
    levels: np.ndarray | None = None
    continuous: np.ndarray | None = None
    waterline: float | None = None
    objective: float | None = None
    solver: str = ""
    status: str = "optimal"
    wall_time: float = 0.0
    offset: int = 0

    @classmethod
    def from_counts(
        cls,
        problem: AllocationProblem,
        counts,
        *,
        solver: str,
        wall_time: float,
        status: str = "optimal",
        continuous=None,
        waterline=None,
        objective=None,
        factors=None,
        with_levels: bool = True,
    ) -> Allocation:
        """Build the result for ``counts`` on ``problem``, checking feasibility.

        ``factors`` defaults to the attenuation factors of ``counts``; policies
        whose objective is an expected factor pass their own.
        """
        n = problem.check_counts(counts)
        n.setflags(write=False)
        levels = problem.levels(n)
        levels.setflags(write=False)
        w = problem.factors(n, levels) if factors is None else np.asarray(factors)
        w.setflags(write=False)
        if not with_levels:
            levels = None
        if continuous is not None:
            continuous = np.asarray(continuous, dtype=np.float64)
            continuous.setflags(write=False)
        return cls(
            counts=n,
            factors=w,
            min_factor=float(w.min()),
            levels=levels,
            continuous=continuous,
            waterline=None if waterline is None else float(waterline),
            objective=None if objective is None else float(objective),
            solver=solver,
            status=status,
            wall_time=float(wall_time),
            offset=problem.offset,
        )

    @property
    def num_prompts(self) -> int:
        return int(self.counts.shape[0])

    @property
    def budget(self) -> int:
        return int(self.counts.sum())

    @property
    def factor_spread(self) -> float:
        """``max(factors) - min(factors)``: 0 when the factors are equal."""
        return float(self.factors.max() - self.factors.min())

    def __repr__(self) -> str:
        return (
            f"Allocation(solver={self.solver!r}, status={self.status!r}, "
            f"num_prompts={self.num_prompts}, budget={self.budget}, "
            f"min_factor={self.min_factor:.6g}, factor_spread={self.factor_spread:.6g}, "
            f"wall_time={self.wall_time:.3g}s)"
        )
