"""The objective interface of the separable engine and its entry point: a subclass of
:class:`SeparableObjective` is solved exactly by :func:`solve_separable`."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .. import _jit
from .._background import BackgroundKernel
from ..exceptions import InfeasibleBudgetError, SeraOptError
from ..kernels.kinds import (
    CLOSED_FORM_KINDS,
    INTERIM_MAX_SPARE,
    STEPWISE_MAX_SPARE,
    closed_entry,
    search_entry,
)
from ..problem import exact_sum, validate_count, validate_offset
from . import tiers
from .inputs import count_bounds
from .numpy_engine import numpy_select

SENSES = ("max-min", "max-sum", "min-sum")


class SeparableObjective:
    """A separable objective over integer counts, in the form the engine solves.

    A subclass sets :attr:`sense` and implements :meth:`gains` and :meth:`terms`
    (vectorized over prompts, in numpy); :meth:`edges` is optional for max-min
    objectives. That is all a new objective needs: :meth:`solve` (and
    :func:`solve_separable`) then return its exact integer optimum. The
    built-in objectives also carry a numba kernel, which makes them fast.

    Parameters
    ----------
    num_prompts : int
        ``M``.
    offset : {0, 1}
        The estimator offset ``c`` the objective is defined with (0 when it
        does not depend on one).

    Attributes
    ----------
    sense : {"max-min", "max-sum", "min-sum"}
    """

    sense: ClassVar[str]
    # Set by built-in objectives: the numba kernel's id and its three rows of
    # per-prompt parameters (see :mod:`sera_opt.kernels.gains`); None uses the numpy engine.
    kernel_kind: ClassVar[int | None] = None
    # Max-min only: levels this close (relative) to the final threshold count as
    # tied, so that the tie rule, not rounding, decides between them.
    _tie_rtol: ClassVar[float] = 0.0

    def __init__(self, num_prompts: int, offset: int = 0):
        if getattr(self, "sense", None) not in SENSES:
            raise SeraOptError(
                f"{type(self).__name__}.sense must be one of {SENSES}, got "
                f"{getattr(self, 'sense', None)!r}."
            )
        self._m = int(num_prompts)
        self.offset = validate_offset(offset)

    @property
    def num_prompts(self) -> int:
        return self._m

    def gains(self, counts) -> np.ndarray:
        """Marginal gain of each prompt's step ``counts[i] -> counts[i] + 1`` (float64).

        ``u_i(k + 1) - u_i(k)`` for max-sum, ``f_i(k) - f_i(k + 1)`` for min-sum,
        ``-l_i(k)`` for max-min (the lowest level goes first); non-increasing in
        ``k`` for every prompt. Must accept any count at or above the prompt's
        minimum (also one step past its maximum). Any strictly increasing
        function of the gain may be returned instead (the engine only compares).
        """
        if self.kernel_kind is None:
            raise NotImplementedError(f"{type(self).__name__} must implement gains(counts).")
        kernels = _jit.kernels("sera_opt.kernels.gains")

        return kernels.gains_at(self.kernel_kind, *self.kernel_params(), self.offset, self._counts(counts))

    def terms(self, counts) -> np.ndarray:
        """Per-prompt terms at integer ``counts``: levels, utilities or costs (float64)."""
        if self.kernel_kind is None:
            raise NotImplementedError(f"{type(self).__name__} must implement terms(counts).")
        kernels = _jit.kernels("sera_opt.kernels.gains")

        return kernels.values(self.kernel_kind, *self.kernel_params(), self.offset, self._counts(counts))

    def edges(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Max-min only: masks of the prompts whose level is 0 (resp. infinite) at every
        count, which the limit order of :mod:`~sera_opt.separable.tiers` ranks. None: none."""
        return None

    @property
    def gains_by_row(self) -> bool:
        """Whether :meth:`row_gains` evaluates only the rows asked for (a built-in
        objective that keeps the engine's :meth:`gains`, through its kernel); otherwise
        it evaluates every row and picks those asked for."""
        return self.kernel_kind is not None and type(self).gains is SeparableObjective.gains

    def row_gains(self, rows: np.ndarray, counts) -> np.ndarray:
        """``gains(counts)[rows]``: ``counts`` has one entry per prompt, ``rows`` are
        ascending indices.

        A term depends on its own row alone, so a built-in objective evaluates the
        rows asked for only, by its kernel on those rows' parameters (each gain is the
        same float as in :meth:`gains`); the others evaluate every row.
        """
        if self.gains_by_row:
            p0, p1, p2 = self.kernel_params()
            n = np.asarray(counts, dtype=np.int64)
            return _jit.kernels("sera_opt.kernels.gains").gains_at(
                self.kernel_kind, p0[rows], p1[rows], p2[rows], self.offset, n[rows])
        return self.gains(counts)[rows]

    def value(self, counts) -> float:
        """The objective: ``min`` of the levels, or the ``sum`` of the terms."""
        t = self.terms(counts)
        return float(t.min() if self.sense == "max-min" else t.sum())

    def solve(self, budget, min_rollouts, max_rollouts, *, stats=None) -> np.ndarray:
        """Shorthand for :func:`solve_separable` on this objective (the same arguments)."""
        return solve_separable(self, budget, min_rollouts, max_rollouts, stats=stats)

    # ------------------------------------------------------------ internals
    def _counts(self, counts) -> np.ndarray:
        n = np.array(counts, dtype=np.int64, order="C")
        if n.shape != (self.num_prompts,):
            raise SeraOptError(f"counts must have shape ({self.num_prompts},), got {n.shape}.")
        return n

    def kernel_params(self):
        """The three parameter rows the kernels read with :attr:`kernel_kind` (float64,
        one entry per prompt; never write to them)."""
        return self._p0, self._p1, self._p2

    def _solve_params(self, hi: np.ndarray):
        """The parameter rows a solve with upper bounds ``hi`` reads."""
        return self.kernel_params()

    def _solve_rows(self, idx, lo, hi, spare, stats) -> np.ndarray:
        """Counts for the rows ``idx`` (a slice or index array) with bounds ``lo``, ``hi``
        (already restricted to them) and ``spare`` rollouts above ``sum(lo)``."""
        if self.kernel_kind is not None:
            p0, p1, p2 = (np.ascontiguousarray(x[idx]) for x in self._solve_params(hi))
            # The engine's per-row state and the counts, from numpy: it asks the kernel
            # for transparent huge pages, so that first writing 10^6 rows of state takes
            # about half the time it takes in memory numba allocates (numba allocates them
            # below this size).
            m = lo.shape[0] if lo.shape[0] >= _NUMPY_STATE_FROM else 0
            # Writable bounds (the policies pass the problem's own, kernel_bounds(); other
            # callers may pass read-only ones): numba compiles every kernel once more for
            # read-only arrays, and the subsample searches pass it writable ones. The
            # kernels do not write to them.
            if not lo.flags.writeable:
                lo = lo.copy()
            if not hi.flags.writeable:
                hi = hi.copy()
            if self.kernel_kind in CLOSED_FORM_KINDS:
                # The entry kernel is chosen here, by the size of the problem, so that no
                # training batch compiles the largest problems' (see kinds.closed_entry);
                # and a spare that needs a search (kinds.search_entry) is handed out one
                # rollout at a time (the same counts) while a background process compiles it.
                name = closed_entry(lo.shape[0])
                if (name == "closed_solve" and STEPWISE_MAX_SPARE < spare <= INTERIM_MAX_SPARE
                        and not SEARCHES[search_entry(self.kernel_kind)].ready()):
                    name = "stepwise_counts"
                entry = getattr(_jit.kernels("sera_opt.kernels.closed"), name)
                return entry(self.kernel_kind, p0, p1, p2, self.offset, lo, hi, spare, stats,
                             np.empty((4, m), dtype=np.int64), np.empty(m, dtype=np.int64))
            kernels = _jit.kernels("sera_opt.kernels.entries")
            return kernels.solve(self.kernel_kind, p0, p1, p2, self.offset, lo, hi, spare,
                                 self.sense == "max-min", self._tie_rtol, stats,
                                 np.empty((4, m), dtype=np.int64), np.empty((4, m)),
                                 np.empty((2, m)), np.empty(m, dtype=np.int64))
        return numpy_select(self, idx, lo, hi, spare)


#: From this many prompts on, the kernels' per-row state is allocated by numpy.
_NUMPY_STATE_FROM = 1 << 16


#: The closed-form kinds' searches beyond ``STEPWISE_MAX_SPARE`` spare rollouts
#: (:func:`~sera_opt.kernels.kinds.search_entry`; numba compiles each in about ten
#: seconds), by kernel name: a first solve that needs one has a background process
#: compile it while the one-at-a-time kernel serves (:mod:`sera_opt._background`).
SEARCHES = {
    name: BackgroundKernel("sera_opt.kernels.closed", name,
                           f"sera_opt.separable.utilities:{warm}",
                           "kernels.closed.stepwise_counts")
    for name, warm in (("bracket_solve", "warm_bracket_search"),
                       ("collect_solve", "warm_collecting_search"))
}


class KernelObjective(SeparableObjective):
    """A built-in objective: its parameters as three float64 rows for the numba kernel."""

    def __init__(self, p0: np.ndarray, p1: np.ndarray | None = None,
                 p2: np.ndarray | None = None, offset: int = 0):
        super().__init__(p0.shape[0], offset)
        # Writable C-contiguous rows: numba compiles a separate specialization for
        # read-only arrays, which would double the compile time.
        self._p0 = np.require(p0, dtype=np.float64, requirements=("C", "W"))
        self._p1 = (self._p0 if p1 is None
                    else np.require(p1, dtype=np.float64, requirements=("C", "W")))
        self._p2 = (self._p1 if p2 is None
                    else np.require(p2, dtype=np.float64, requirements=("C", "W")))


def solve_separable(objective: SeparableObjective, budget: int, min_rollouts,
                    max_rollouts, *, stats=None) -> np.ndarray:
    """Exact integer counts for a separable objective under one budget.

    Parameters
    ----------
    objective : SeparableObjective
        The per-prompt terms and the sense (max-min, max-sum or min-sum).
    budget : int
        ``B``; the counts sum to it exactly.
    min_rollouts, max_rollouts : int or array_like of int
        Per-prompt bounds ``lo_i <= n_i <= hi_i``.
    stats : ndarray of int64, shape (4,), optional
        Receives the kernel engine's work (full passes, gains collected, rows
        active at the end, subsample solves).

    Returns
    -------
    ndarray of int64
        Optimal counts (lexicographically max-min optimal for ``"max-min"``),
        with the tie rules of :mod:`sera_opt.separable`.

    Raises
    ------
    InfeasibleBudgetError
        When ``budget`` lies outside ``[sum(lo), sum(hi)]``.
    """
    if not isinstance(objective, SeparableObjective):
        raise SeraOptError(
            f"objective must be a SeparableObjective, got {type(objective).__name__}."
        )
    m = objective.num_prompts
    lo = count_bounds(min_rollouts, "min_rollouts", m)
    hi = count_bounds(max_rollouts, "max_rollouts", m)
    if (hi < lo).any():
        raise SeraOptError("bounds must satisfy 0 <= min_rollouts <= max_rollouts.")
    budget = validate_count(budget, "budget")
    lo_total, hi_total = exact_sum(lo), exact_sum(hi)
    if not lo_total <= budget <= hi_total:
        raise InfeasibleBudgetError(
            f"budget={budget} must lie in [sum(min_rollouts), sum(max_rollouts)] = "
            f"[{lo_total}, {hi_total}]."
        )
    return solve_validated(objective, lo, hi, budget - lo_total,
                  np.zeros(4, dtype=np.int64) if stats is None else stats)


def solve_validated(objective: SeparableObjective, lo: np.ndarray, hi: np.ndarray, spare: int,
           stats: np.ndarray) -> np.ndarray:
    """:func:`solve_separable` on validated int64 bounds and ``spare = B - sum(lo)``."""
    edges = objective.edges() if objective.sense == "max-min" else None
    if edges is None:
        return objective._solve_rows(slice(None), lo, hi, spare, stats)

    def finite(idx, take):
        return objective._solve_rows(idx, lo[idx], hi[idx], take, stats) - lo[idx]

    return lo + tiers.fill_tiers(lo - objective.offset, hi - lo, spare, *edges, finite)
