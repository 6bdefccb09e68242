"""The one result type that every solver and policy returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from .exceptions import SeraOptError
from .problem import AllocationProblem

if TYPE_CHECKING:  # pragma: no cover
    from .separable import SeparableObjective

__all__ = ["Allocation"]


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False, repr=False)
class Allocation:
    """An allocation of rollouts to prompts, and everything that follows from it.

    Only the counts and the problem they solve are stored; the factors, the
    smallest factor, the levels and the objective's terms are *derived* from
    them on first access (and cached), so a result can never contradict itself.
    Building an ``Allocation`` checks that the counts are feasible for the
    problem.

    Attributes
    ----------
    problem : AllocationProblem
        The validated problem (probabilities, budget, bounds, offset).
    counts : ndarray of int64, shape (M,)
        Rollouts per prompt; sums exactly to the budget. Read-only.
    solver : str
        Name of the solver or policy that produced it.
    status : str
        ``"optimal"`` for exact solvers and policies, otherwise a short description.
    wall_time : float
        Seconds spent solving (validation excluded).
    objective : SeparableObjective or None
        The policy's own objective (its sense, terms and value), where it has one.
    posterior : (ndarray, ndarray) or None
        Beta posteriors ``(alpha, beta)`` the allocation was made under; the
        factors are then expectations under them.
    continuous : ndarray of float64 or None
        The continuous relaxation's counts, where the solver computed one.
    waterline : float or None
        The continuous relaxation's level ``L*`` (SERA's waterline solver).

    Derived attributes: :attr:`factors`, :attr:`min_factor`, :attr:`factor_spread`,
    :attr:`levels`, :attr:`terms`, :attr:`objective_value`, :attr:`offset`,
    :attr:`budget`, :attr:`num_prompts`.
    """

    problem: AllocationProblem
    counts: np.ndarray
    solver: str = ""
    status: str = "optimal"
    wall_time: float = 0.0
    objective: SeparableObjective | None = None
    posterior: tuple[np.ndarray, np.ndarray] | None = None
    continuous: np.ndarray | None = None
    waterline: float | None = None

    def __post_init__(self):
        if not isinstance(self.problem, AllocationProblem):
            raise SeraOptError(
                f"an Allocation needs the AllocationProblem it solves, got "
                f"{type(self.problem).__name__}."
            )
        m = self.problem.num_prompts
        object.__setattr__(self, "counts", _read_only(self.problem.check_counts(self.counts)))
        if self.objective is not None and getattr(self.objective, "num_prompts", m) != m:
            raise SeraOptError(
                f"the objective has {self.objective.num_prompts} prompts, the problem {m}."
            )
        if self.posterior is not None:
            from .separable import validate_beta_posterior

            try:
                alpha, beta = self.posterior
            except (TypeError, ValueError):
                raise SeraOptError("posterior must be a pair (alpha, beta) of arrays.") from None
            alpha, beta = validate_beta_posterior(alpha, beta, m)
            object.__setattr__(self, "posterior", (_read_only(alpha), _read_only(beta)))
        if self.continuous is not None:
            relaxed = np.array(self.continuous, dtype=np.float64)
            if relaxed.shape != (m,):
                raise SeraOptError(f"continuous must have shape ({m},), got {relaxed.shape}.")
            object.__setattr__(self, "continuous", _read_only(relaxed))
        if self.waterline is not None:
            object.__setattr__(self, "waterline", float(self.waterline))
        object.__setattr__(self, "wall_time", float(self.wall_time))

    @classmethod
    def _trusted(cls, problem: AllocationProblem, counts: np.ndarray, **fields: Any
                 ) -> Allocation:
        """Build from counts that a library solver produced and the tests certify
        (int64, feasible), without re-checking them: O(1) instead of O(M)."""
        out = object.__new__(cls)
        state = out.__dict__
        state.update(_DEFAULTS)
        state.update(fields)
        state["problem"] = problem
        state["counts"] = _read_only(counts)
        if state["continuous"] is not None:
            _read_only(state["continuous"])
        return out

    def replace(self, **changes: Any) -> Allocation:
        """A copy with some stored fields changed (derived ones are recomputed)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------ derived
    @property
    def offset(self) -> int:
        """The estimator offset ``c`` the factors are computed with."""
        return self.problem.offset

    @property
    def num_prompts(self) -> int:
        return int(self.counts.shape[0])

    @property
    def budget(self) -> int:
        return self.problem.budget

    @cached_property
    def factors(self) -> np.ndarray:
        """Attenuation factors ``w_c(p_i, n_i)`` in the inputs' float dtype; under a
        posterior, their expectations ``E[w_c(p_i, n_i)]``. Read-only."""
        if self.posterior is None:
            w = np.asarray(self.problem.factors(self.counts))
        else:
            from .separable import expected_factors

            w = expected_factors(*self.posterior, self.counts, self.offset)
            w = w.astype(self.problem.dtype, copy=False)
        return _read_only(w)

    @cached_property
    def min_factor(self) -> float:
        """``min(factors)``: the quantity that SERA maximizes."""
        return float(self.factors.min())

    @property
    def factor_spread(self) -> float:
        """``max(factors) - min(factors)``: 0 when the factors are equal."""
        return float(self.factors.max() - self.factors.min())

    @cached_property
    def terms(self) -> np.ndarray | None:
        """The policy objective's per-prompt terms at the counts (levels for max-min
        objectives, utilities or costs for sums); None without an objective."""
        if self.objective is None:
            return None
        return _read_only(np.asarray(self.objective.terms(self.counts), dtype=np.float64))

    @property
    def levels(self) -> np.ndarray | None:
        """The levels of a max-min objective (SERA's ``a_i (n_i - c)``; sera-bayes's
        ``-log E[(1 - p_i)^(n_i - c)]``), else None."""
        if self.objective is None or self.objective.sense != "max-min":
            return None
        return self.terms

    @cached_property
    def objective_value(self) -> float | None:
        """The objective at the counts: the smallest level for max-min objectives, the
        sum of the terms otherwise; None without an objective."""
        if self.objective is None:
            return None
        terms = self.terms
        return float(terms.min() if self.objective.sense == "max-min" else terms.sum())

    def __repr__(self) -> str:
        return (
            f"Allocation(solver={self.solver!r}, status={self.status!r}, "
            f"num_prompts={self.num_prompts}, budget={self.budget}, "
            f"min_factor={self.min_factor:.6g}, factor_spread={self.factor_spread:.6g}, "
            f"wall_time={self.wall_time:.3g}s)"
        )


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Allocation) if f.init
             and f.default is not dataclasses.MISSING}
