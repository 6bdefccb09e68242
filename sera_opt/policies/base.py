"""The allocation-policy interface and its registry."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from .._registry import Registry
from ..exceptions import SeraOptError
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
    max_ratio : float or None
        Only for policies that define ``default_max_ratio`` (SERA, sera-bayes):
        when no ``max_rollouts`` is given, cap each prompt at
        ``ceil(max_ratio * budget / M)``. ``None`` removes the cap.
    """

    name: ClassVar[str]
    preference: ClassVar[int] = 100  # place in the registry's listing (lower first)
    default_min_rollouts: ClassVar[int] = 1
    default_max_rollouts: ClassVar[int | None] = None
    # Policies that set this take a `max_ratio` option: the cap used when no
    # max_rollouts is given, as a multiple of the average count.
    default_max_ratio: ClassVar[float | None] = None
    #: Extra inputs that :meth:`allocate` takes as keywords beyond the probabilities,
    #: the budget and the bounds (e.g. ``{"posterior"}``, ``{"gradient_norms"}``).
    #: Callers such as :class:`sera_opt.RolloutPlanner` read this; nothing inspects
    #: signatures.
    extra_inputs: ClassVar[frozenset[str]] = frozenset()
    #: Whether the counts depend on the estimator offset ``c`` (the policies that
    #: shape the attenuation factors ``w_c``); trainers warn when it does not
    #: match their estimator's.
    offset_sensitive: ClassVar[bool] = False

    def __init__(self, *, min_rollouts=None, max_rollouts=None, offset: int = 0, **bounds):
        unknown = set(bounds) - ({"max_ratio"} if self.default_max_ratio is not None else set())
        if unknown:
            raise SeraOptError(
                f"{type(self).__name__} got unexpected option(s) {sorted(unknown)}."
            )
        max_ratio = bounds.get("max_ratio", self.default_max_ratio)
        if max_ratio is not None and not (isinstance(max_ratio, (int, float))
                                          and not isinstance(max_ratio, bool)
                                          and max_ratio >= 1):
            raise SeraOptError(
                f"max_ratio must be a number >= 1 (the cap as a multiple of the average count) "
                f"or None for no cap, got {max_ratio!r}."
            )
        self.max_ratio = max_ratio
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
        lo = self.min_rollouts if min_rollouts is None else min_rollouts
        hi = self.max_rollouts if max_rollouts is None else max_rollouts
        if hi is None and self.max_ratio is not None:
            hi = self._ratio_cap(success_probs, budget, lo)
        return AllocationProblem(success_probs, budget, min_rollouts=lo, max_rollouts=hi,
                                 offset=self.offset)

    def _ratio_cap(self, success_probs, budget, lo):
        """``ceil(max_ratio * budget / M)``, never below a prompt's minimum; ``None`` when
        the inputs are malformed (AllocationProblem then reports what is wrong)."""
        try:
            m = np.shape(success_probs)[0] if np.ndim(success_probs) == 1 else 0
            cap = math.ceil(self.max_ratio * float(budget) / m) if m else None
        except (TypeError, ValueError, OverflowError):
            return None
        if cap is None:
            return None
        try:
            return np.maximum(np.asarray(lo, dtype=np.int64), cap)
        except (TypeError, ValueError):
            return cap

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
        options = {"min_rollouts": self.min_rollouts, "max_rollouts": self.max_rollouts,
                   "offset": self.offset}
        if self.default_max_ratio is not None:
            options["max_ratio"] = self.max_ratio
        return options

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
            raise SeraOptError(
                "options cannot be applied to an existing policy instance; build a new one."
            )
        return name
    return POLICIES.lookup(name)(**options)


def available_policies() -> tuple[str, ...]:
    """Registered policy names, in preference order."""
    return POLICIES.names()
