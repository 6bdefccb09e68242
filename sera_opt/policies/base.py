"""The allocation-policy interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from .._registry import Registry
from ..problem import AllocationProblem, validate_offset
from ..result import Allocation

__all__ = [
    "AllocationPolicy",
    "POLICIES",
    "register_policy",
    "get_policy",
    "available_policies",
]

POLICIES = Registry("policy")


class AllocationPolicy(ABC):
    """A rule that turns success probabilities and a budget into rollout counts.

    Subclasses set :attr:`name`, register themselves with
    :func:`register_policy`, and implement :meth:`_allocate`, which receives a
    validated :class:`~sera_opt.AllocationProblem`.

    Parameters
    ----------
    min_rollouts, max_rollouts : int or array_like, optional
        Default per-prompt bounds, used when :meth:`allocate` is called without
        them. ``max_rollouts=None`` means no per-prompt cap.
    offset : {0, 1}
        Offset ``c`` of the estimator the rollouts will feed (0: success-average,
        1: mean-centred). The reported factors use it; SERA equalizes them.
    """

    name: ClassVar[str]
    preference: ClassVar[int] = 100  # place in the registry's listing (lower first)
    default_min_rollouts: ClassVar[int] = 1
    default_max_rollouts: ClassVar[int | None] = None

    def __init__(self, *, min_rollouts=None, max_rollouts=None, offset: int = 0):
        self.offset = validate_offset(offset)
        self.min_rollouts = (
            max(self.default_min_rollouts, 1 + self.offset)
            if min_rollouts is None
            else min_rollouts
        )
        self.max_rollouts = (
            self.default_max_rollouts if max_rollouts is None else max_rollouts
        )

    def problem(self, success_probs, budget, *, min_rollouts=None,
                max_rollouts=None) -> AllocationProblem:
        """Validate the inputs into an :class:`~sera_opt.AllocationProblem`."""
        return AllocationProblem(
            success_probs,
            budget,
            min_rollouts=self.min_rollouts if min_rollouts is None else min_rollouts,
            max_rollouts=self.max_rollouts if max_rollouts is None else max_rollouts,
            offset=self.offset,
        )

    def allocate(self, success_probs, budget, *, min_rollouts=None,
                 max_rollouts=None) -> Allocation:
        """Allocate ``budget`` rollouts over the prompts.

        Parameters
        ----------
        success_probs : array_like, shape (M,)
            Estimated success probability of each prompt, in [0, 1].
        budget : int
            Total rollouts; the returned counts sum to it exactly.
        min_rollouts, max_rollouts : int or array_like, optional
            Override the policy's default bounds for this call.
        """
        problem = self.problem(success_probs, budget, min_rollouts=min_rollouts,
                               max_rollouts=max_rollouts)
        return self._allocate(problem)

    @abstractmethod
    def _allocate(self, problem: AllocationProblem) -> Allocation:
        """Allocate on a validated problem."""

    def _options(self) -> dict[str, Any]:
        return {"min_rollouts": self.min_rollouts, "max_rollouts": self.max_rollouts,
                "offset": self.offset}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options().items())
        return f"{type(self).__name__}({opts})"


def register_policy(cls=None, *, name: str | None = None, replace: bool = False):
    """Register an :class:`AllocationPolicy` subclass (usable as a decorator)."""
    return POLICIES.register(cls, name=name, replace=replace)


def get_policy(name, **options) -> AllocationPolicy:
    """Build the policy registered as ``name`` with ``options``.

    An :class:`AllocationPolicy` instance is returned as is (options must then
    be empty). Unknown names raise :class:`~sera_opt.SeraOptError` listing the
    known ones.
    """
    if isinstance(name, AllocationPolicy):
        if options:
            from ..exceptions import SeraOptError

            raise SeraOptError(
                "options cannot be applied to an existing policy instance; build a new one."
            )
        return name
    return POLICIES.lookup(name)(**options)


def available_policies() -> tuple[str, ...]:
    """Registered policy names, in preference order."""
    return POLICIES.names()
