"""The solver interface and its registry (cvxpy-style capability flags).

A solver here solves SERA's problem, the lexicographic max-min of the levels
``a_i (n_i - c)`` (docs/theory.md section 3); :class:`~sera_opt.SERAPolicy` and
:func:`sera_opt.allocate` choose one by name. Other policies solve their own
objectives in the separable engine (:mod:`sera_opt.separable`).
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from .._registry import Registry
from ..exceptions import MissingDependencyError, SeraOptError, SeraOptWarning, SolverError
from ..problem import AllocationProblem
from ..result import Allocation

__all__ = [
    "Solver",
    "CallableSolver",
    "register_solver",
    "get_solver",
    "available_solvers",
    "SOLVERS",
]

SOLVERS = Registry("solver")


class Solver(ABC):
    """A method that solves an :class:`~sera_opt.AllocationProblem` for SERA.

    Subclasses set the class attributes below and implement :meth:`_solve`,
    which returns an :class:`~sera_opt.Allocation` of the problem it was given.

    Attributes
    ----------
    name : str
        Registry key, e.g. ``"waterline"``.
    exact : bool
        Whether the counts are certified lexicographically max-min optimal. The
        optimality tests run every registered solver flagged exact against brute
        force by itself.
    relaxation : bool
        Whether the solver also returns the continuous relaxation
        (``Allocation.continuous`` and ``.waterline``); the conformance tests check
        that it does, and that the others leave them None.
    requires : tuple of str
        Importable modules the solver needs (checked before solving, and by
        :func:`available_solvers`).
    options : frozenset of str
        Keyword options :meth:`solve` understands; others are warned about.
    preference : int
        Place in the registry's preference order (lower first).
    """

    name: ClassVar[str]
    preference: ClassVar[int] = 100
    exact: ClassVar[bool] = True
    relaxation: ClassVar[bool] = False
    requires: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def is_available(cls) -> bool:
        """True when every module in :attr:`requires` can be imported."""
        return not cls._missing()

    @classmethod
    def _missing(cls) -> list[str]:
        # Looked up once per class and process: an install does not appear mid-run,
        # and find_spec costs a microsecond on every call.
        cache = cls.__dict__.get("_missing_cache")
        if cache is None or cache[0] != cls.requires:
            cache = (cls.requires,
                     [m for m in cls.requires if importlib.util.find_spec(m) is None])
            cls._missing_cache = cache
        return cache[1]

    def check_options(self, options: Mapping[str, Any], *, stacklevel: int = 2) -> dict[str, Any]:
        """The options this solver understands; a :class:`SeraOptWarning` for each other."""
        for key in sorted(set(options) - self.options):
            warnings.warn(
                f"solver {self.name!r} ignores the option {key!r}; it understands "
                f"{sorted(self.options) or 'no options'}.",
                SeraOptWarning,
                stacklevel=stacklevel + 1,
            )
        return {k: v for k, v in options.items() if k in self.options}

    def solve(self, problem: AllocationProblem, **options: Any) -> Allocation:
        """Solve ``problem`` and return an :class:`~sera_opt.Allocation` of it."""
        missing = self._missing()
        if missing:
            raise MissingDependencyError(
                f"solver {self.name!r} needs {', '.join(missing)}; install it with "
                f"`pip install {' '.join(missing)}` or choose another solver."
            )
        known = self.check_options(options, stacklevel=2) if options else options
        if problem.switched_off is not None:
            from ..result import allocate_active

            return allocate_active(problem, lambda inner: self.solve(inner, **known))
        out = self._solve(problem, **known)
        if not isinstance(out, Allocation):
            raise SolverError(
                f"solver {self.name!r} returned {type(out).__name__}, not an Allocation."
            )
        if out.problem is not problem:
            # A result for another problem object: rebuilt (and so checked) on this one.
            out = Allocation(problem, out.counts, solver=out.solver or self.name,
                             status=out.status, wall_time=out.wall_time)
        return out

    @abstractmethod
    def _solve(self, problem: AllocationProblem, **options: Any) -> Allocation:
        """Solve a validated problem; options are already filtered."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class CallableSolver(Solver):
    """Wraps a user function ``f(problem) -> counts or Allocation`` as a solver.

    Whatever the function returns, the result is rebuilt from its counts on the
    problem it was given (so the factors and levels follow from the counts) and
    rejected with :class:`SeraOptError` if the counts are not feasible.
    """

    exact = False

    def __init__(self, func: Callable[[AllocationProblem], Any], name: str | None = None):
        if not callable(func):
            raise SeraOptError(f"a solver function must be callable, got {func!r}.")
        self.func = func
        self.name = name or getattr(func, "__name__", "callable")

    def _solve(self, problem: AllocationProblem, **options: Any) -> Allocation:
        start = time.perf_counter()
        out = self.func(problem)
        elapsed = time.perf_counter() - start
        counts = out.counts if isinstance(out, Allocation) else np.asarray(out)
        return Allocation(problem, counts, solver=self.name, wall_time=elapsed,
                          status="user solver")

    def __repr__(self) -> str:
        return f"CallableSolver({self.func!r}, name={self.name!r})"


def register_solver(cls=None, *, name: str | None = None, replace: bool = False):
    """Register a :class:`Solver` subclass (usable as a decorator)."""
    return SOLVERS.register(cls, name=name, replace=replace)


def get_solver(solver) -> Solver:
    """Resolve ``solver`` (a registered name, a Solver instance or class, or a callable)."""
    if isinstance(solver, Solver):
        return solver
    if isinstance(solver, type) and issubclass(solver, Solver):
        return solver()
    if isinstance(solver, str):
        return SOLVERS.lookup(solver)()
    if callable(solver):
        return CallableSolver(solver)
    raise SeraOptError(
        f"solver must be a name ({', '.join(map(repr, SOLVERS.names()))}), a Solver or a "
        f"callable, got {solver!r}."
    )


def available_solvers() -> tuple[str, ...]:
    """Registered solver names whose dependencies are installed, in preference order."""
    return tuple(n for n in SOLVERS.names() if SOLVERS.lookup(n).is_available())


def is_registered(solver: Solver) -> bool:
    """Whether ``solver`` is an instance of the class registered under its name."""
    return solver.name in SOLVERS and type(solver) is SOLVERS.lookup(solver.name)
