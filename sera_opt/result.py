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

__all__ = ["Allocation", "ActiveSet", "allocate_active", "ACTIVE", "TOO_EASY", "TOO_HARD", "SWITCHED_OFF"]

#: Codes of :attr:`ActiveSet.reasons`: why a prompt has the count it has.
ACTIVE = 0
#: Switched off by the active-set rule, as too easy (its chance of a mixed group at the
#: cap is below the threshold because it nearly always succeeds: ``p > 1/2``).
TOO_EASY = 1
#: Switched off by the active-set rule, as too hard (it nearly always fails: ``p <= 1/2``).
TOO_HARD = 2
#: Switched off by the caller (``max_rollouts`` 0 for it).
SWITCHED_OFF = 3
_REASON_NAMES = {ACTIVE: "active", TOO_EASY: "too easy", TOO_HARD: "too hard",
                 SWITCHED_OFF: "switched off by the caller"}


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False, repr=False)
class ActiveSet:
    """Which prompts of a batch receive rollouts, and why the others do not.

    A prompt that receives no rollouts ("switched off") contributes nothing to the
    batch: it is absent from the rollouts, its factor is 0, and the estimator skips it.
    Prompts are switched off by a policy's active-set rule (``active_threshold``;
    docs/theory.md, "SERA as its authors run it") or by the caller (``max_rollouts``
    0 for them).

    Attributes
    ----------
    index : ndarray of int64
        Positions of the active prompts in the batch, in batch order. Read-only.
    inner : Allocation
        The allocation of the active prompts alone (its solver's objective, levels and
        continuous solution), in the order of :attr:`index`.
    reasons : ndarray of int8, shape (M,)
        Per prompt: :data:`ACTIVE`, :data:`TOO_EASY`, :data:`TOO_HARD` or
        :data:`SWITCHED_OFF`. Read-only.
    threshold : float or None
        The rule's threshold ``tau`` on the chance of a mixed group; None when the
        caller chose the active prompts.
    scores : ndarray of float64 or None
        Each prompt's chance of a mixed group at the cap, ``u_i``, by which the rule
        ranks them; None when the caller chose.
    forced : int
        Active prompts whose chance of a mixed group at their own count is below the
        threshold: activated only because the budget could not be spent on fewer
        (0 when the rule found a useful active set).
    """

    index: np.ndarray
    inner: Allocation
    reasons: np.ndarray
    threshold: float | None = None
    scores: np.ndarray | None = None
    forced: int = 0

    @property
    def num_active(self) -> int:
        return int(self.index.shape[0])

    @property
    def active_fraction(self) -> float:
        m = int(self.reasons.shape[0])
        return self.num_active / m if m else 0.0

    @property
    def num_too_easy(self) -> int:
        return int(np.count_nonzero(self.reasons == TOO_EASY))

    @property
    def num_too_hard(self) -> int:
        return int(np.count_nonzero(self.reasons == TOO_HARD))

    @property
    def num_switched_off(self) -> int:
        """Prompts without rollouts, for whatever reason."""
        return int(self.reasons.shape[0]) - self.num_active

    def summary(self) -> dict[str, float]:
        """The numbers a trainer logs per step: active fraction, prompts switched off as
        too easy and as too hard, forced activations."""
        return {"active_fraction": self.active_fraction, "num_active": self.num_active,
                "too_easy": self.num_too_easy, "too_hard": self.num_too_hard,
                "switched_off_by_caller": int(np.count_nonzero(self.reasons == SWITCHED_OFF)),
                "forced": int(self.forced)}

    def reason_names(self) -> list[str]:
        """:attr:`reasons` in words, one per prompt."""
        return [_REASON_NAMES[int(r)] for r in self.reasons]

    def __repr__(self) -> str:
        return (f"ActiveSet(num_active={self.num_active}/{self.reasons.shape[0]}, "
                f"too_easy={self.num_too_easy}, too_hard={self.num_too_hard}, "
                f"forced={self.forced}, threshold={self.threshold})")


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
    active_set : ActiveSet or None
        Where some prompts get no rollouts: which are active, why the others are not,
        and the allocation of the active ones (:meth:`embed`). None when every prompt
        is active.

    Derived attributes: :attr:`factors`, :attr:`min_factor`, :attr:`factor_spread`,
    :attr:`levels`, :attr:`terms`, :attr:`objective_value`, :attr:`offset`,
    :attr:`budget`, :attr:`num_prompts`, :attr:`active`, :attr:`num_active`.
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
    active_set: ActiveSet | None = None

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
        if self.active_set is not None:
            if not isinstance(self.active_set, ActiveSet):
                raise SeraOptError(
                    f"active_set must be an ActiveSet, got {type(self.active_set).__name__}.")
            if not np.array_equal(np.flatnonzero(self.counts), self.active_set.index):
                raise SeraOptError(
                    "active_set.index must list exactly the prompts with a positive count.")
        object.__setattr__(self, "wall_time", float(self.wall_time))

    @classmethod
    def from_solver_counts(cls, problem: AllocationProblem, counts: np.ndarray, **fields: Any
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

    @classmethod
    def embed(cls, problem: AllocationProblem, inner: Allocation, index: np.ndarray, *,
              reasons: np.ndarray, threshold: float | None = None,
              scores: np.ndarray | None = None, forced: int = 0,
              solver: str | None = None, wall_time: float | None = None) -> Allocation:
        """The allocation of a whole batch whose active prompts ``index`` (batch order)
        are allocated by ``inner`` and whose other prompts get 0 rollouts. ``problem`` is
        the batch's problem, with ``max_rollouts`` 0 for every inactive prompt."""
        m = problem.num_prompts
        index = np.asarray(index, dtype=np.int64)
        counts = np.zeros(m, dtype=np.int64)
        counts[index] = inner.counts
        continuous = None
        if inner.continuous is not None:
            continuous = np.zeros(m, dtype=np.float64)
            continuous[index] = inner.continuous
        reasons = np.asarray(reasons, dtype=np.int8)
        if scores is not None:
            scores = _read_only(np.array(scores, dtype=np.float64))
        active_set = ActiveSet(index=_read_only(index), inner=inner,
                               reasons=_read_only(reasons.copy()),
                               threshold=None if threshold is None else float(threshold),
                               scores=scores, forced=int(forced))
        return cls(problem, counts, solver=inner.solver if solver is None else solver,
                   status=inner.status,
                   wall_time=inner.wall_time if wall_time is None else wall_time,
                   posterior=(None if inner.posterior is None else
                              _embed_posterior(inner.posterior, index, m)),
                   continuous=continuous, waterline=inner.waterline, active_set=active_set)

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

    @property
    def active(self) -> np.ndarray:
        """Which prompts receive rollouts (``counts > 0``), as a bool array."""
        return self.counts > 0

    @property
    def num_active(self) -> int:
        """The number of prompts that receive rollouts."""
        return self.num_prompts if self.active_set is None else self.active_set.num_active

    @property
    def _active_factors(self) -> np.ndarray:
        if self.active_set is None:
            return self.factors
        return self.factors[self.active_set.index]

    @cached_property
    def min_factor(self) -> float:
        """``min(factors)`` over the prompts that receive rollouts: the quantity that
        SERA maximizes (a switched-off prompt's factor is 0 and not counted)."""
        w = self._active_factors
        return float(w.min()) if w.size else 0.0

    @property
    def factor_spread(self) -> float:
        """``max(factors) - min(factors)`` over the prompts that receive rollouts: 0 when
        their factors are equal."""
        w = self._active_factors
        return float(w.max() - w.min()) if w.size else 0.0

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


def allocate_active(problem: AllocationProblem, solve) -> Allocation:
    """Allocate a problem with switched-off prompts (``max_rollouts`` 0): ``solve`` gets
    the problem of the active prompts alone, and the result is spread over the batch."""
    inner_problem, index = problem.active_subproblem()
    inner = solve(inner_problem)
    reasons = np.where(problem.switched_off, SWITCHED_OFF, ACTIVE)
    return Allocation.embed(problem, inner, index, reasons=reasons)


def _embed_posterior(posterior, index: np.ndarray, m: int):
    """A posterior of the active prompts spread over the batch (switched-off prompts keep
    the uniform Beta(1, 1): they receive no rollouts, so their entry is never used)."""
    alpha = np.ones(m, dtype=np.float64)
    beta = np.ones(m, dtype=np.float64)
    alpha[index] = posterior[0]
    beta[index] = posterior[1]
    return alpha, beta


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Allocation) if f.init
             and f.default is not dataclasses.MISSING}
