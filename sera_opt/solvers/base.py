"""The solver interface and its registry (cvxpy-style capability flags)."""

from __future__ import annotations

import importlib.util
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from .._registry import Registry
from ..exceptions import MissingDependencyError, SeraOptError, SeraOptWarning
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
    """A method that solves an :class:`~sera_opt.AllocationProblem`.

    Subclasses set the class attributes below and implement :meth:`_solve`.

    Attributes
    ----------
    name : str
        Registry key, e.g. ``"waterline"``.
    integer : bool
        Whether the returned counts are the solver's own integer solution.
    exact : bool
        Whether the integer solution is certified lexicographically max-min optimal.
    requires : tuple of str
        Importable modules the solver needs (checked before solving).
    options : frozenset of str
        Keyword options :meth:`solve` understands; others are warned about.
    preference : int
        Place in the registry's preference order (lower first).
    """

    name: ClassVar[str]
    preference: ClassVar[int] = 100
    integer: ClassVar[bool] = True
    exact: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def is_available(cls) -> bool:
        """True when every module in :attr:`requires` can be imported."""
        return all(importlib.util.find_spec(m) is not None for m in cls.requires)

    def solve(self, problem: AllocationProblem, **options: Any) -> Allocation:
        """Solve ``problem`` and return an :class:`~sera_opt.Allocation`."""
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingDependencyError(
                f"solver {self.name!r} needs {', '.join(missing)}; install it with "
                f"`pip install {' '.join(missing)}` or choose another solver."
            )
        unknown = sorted(set(options) - self.options)
        for key in unknown:
            warnings.warn(
                f"solver {self.name!r} ignores the option {key!r}; it understands "
                f"{sorted(self.options) or 'no options'}.",
                SeraOptWarning,
                stacklevel=3,
            )
        known = {k: v for k, v in options.items() if k in self.options}
        return self._solve(problem, **known)

    @abstractmethod
    def _solve(self, problem: AllocationProblem, **options: Any) -> Allocation:
        """Solve a validated problem; options are already filtered."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class CallableSolver(Solver):
    """Wraps a user function ``f(problem) -> counts or Allocation`` as a solver."""

    integer = True
    exact = False

    def __init__(self, func: Callable[[AllocationProblem], Any], name: str | None = None):
        self.func = func
        self.name = name or getattr(func, "__name__", "callable")

    def _solve(self, problem: AllocationProblem, **options: Any) -> Allocation:
        start = time.perf_counter()
        out = self.func(problem)
        elapsed = time.perf_counter() - start
        if isinstance(out, Allocation):
            problem.check_counts(out.counts)
            return out
        return Allocation.from_counts(
            problem, np.asarray(out), solver=self.name, wall_time=elapsed,
            status="user solver",
        )


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
