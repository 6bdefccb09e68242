"""The library's exception and warning types.

Every error raised on bad input derives from :class:`SeraOptError`, which is a
``ValueError`` so that callers who already catch ``ValueError`` keep working.
"""

from __future__ import annotations

__all__ = [
    "SeraOptError",
    "InfeasibleBudgetError",
    "MissingDependencyError",
    "SolverError",
    "SeraOptWarning",
]


class SeraOptError(ValueError):
    """Base class of every error that sera_opt raises on purpose."""


class InfeasibleBudgetError(SeraOptError):
    """The rollout budget cannot be met within the per-prompt bounds."""


class MissingDependencyError(SeraOptError, ImportError):
    """An optional dependency that the requested feature needs is not installed."""


class SolverError(SeraOptError, RuntimeError):
    """A solver failed on a problem that passed validation."""


class SeraOptWarning(UserWarning):
    """Something was ignored or adjusted; the message says what and why."""
