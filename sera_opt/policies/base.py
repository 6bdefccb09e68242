"""The allocation-policy protocol, its registry, and policies built on a separable objective."""

from __future__ import annotations

import difflib
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..exceptions import SeraOptError
from ..problem import (
    MAX_BUDGET,
    AllocationProblem,
    refuse_masked,
    validate_count,
    validate_offset,
    validate_real,
)
from ..result import Allocation
from ..rounds.session import DEFAULT_ROUNDS, ROUND_MODES

__all__ = [
    "AllocationPolicy",
    "SeparablePolicy",
    "DEFAULT_MAX_RATIO",
    "unknown_option_error",
]


#: The default cap of the SERA policies and of :func:`sera_opt.allocate`: with no
#: ``max_rollouts``, no prompt gets more than ``ceil(4 * budget / M)`` rollouts.
#: Max-min is ruled by the hardest prompts; uncapped, prompts whose estimated ``p``
#: is near 0 absorb the budget while the others stay at the minimum, which aligns
#: the batch gradient worse than uniform allocation (docs/theory.md section 5).
DEFAULT_MAX_RATIO = 4.0

_UNSET: Any = object()
# Options every policy has; the others each policy declares in `option_names`.
_BOUND_OPTIONS = ("min_rollouts", "max_rollouts", "offset")


def _check_bound(value, name: str):
    """A per-prompt bound given at construction: None, a whole number, or an array of them."""
    if value is None:
        return None
    refuse_masked(value, name)
    if np.ndim(value) == 0:
        return validate_count(value, name, minimum=1)
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        raise SeraOptError(f"{name} must be a whole number or a 1-D array of them, got {value!r}.")
    return np.array([validate_count(v, name, minimum=1) for v in arr.tolist()], dtype=np.int64)


def unknown_option_error(owner: str, unknown, valid) -> SeraOptError:
    """The error for options that ``owner`` does not take: each unknown name with its
    closest valid one (a typo's likely fix), then every valid name."""
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), list(valid), n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return SeraOptError(
        f"{owner} has no option {', '.join(hints)}; its options are "
        f"{', '.join(valid) or 'none'}."
    )


def _check_bounds_agree(lo, hi, offset: int, lo_given: bool, hi_given: bool,
                        name: str) -> None:
    """What the construction-time bounds must satisfy whatever the batch: a minimum of at
    least ``1 + offset``, and no maximum below the minimum (per prompt when both are
    arrays of one length)."""
    need = 1 + offset
    low = lo if np.ndim(lo) == 0 else (int(lo.min()) if lo.size else need)
    if low < need:
        why = ("with offset=1 (the mean-centred estimator) a prompt with one rollout has "
               "factor 0 and its advantage is always 0" if offset
               else "every prompt needs at least one rollout")
        raise SeraOptError(
            f"policy {name!r}: min_rollouts must be at least {need}: {why}; got {low}. Set "
            f"min_rollouts={need} or more{', or offset=0' if offset else ''}."
        )
    if hi is None:
        return
    if np.ndim(lo) and np.ndim(hi) and lo.shape != hi.shape:
        raise SeraOptError(
            f"policy {name!r}: min_rollouts and max_rollouts are arrays of different lengths "
            f"({lo.shape[0]} and {hi.shape[0]}); give one entry per prompt in both, or a "
            f"scalar."
        )
    below = np.asarray(hi) < np.asarray(lo)
    if below.any():
        i = int(np.flatnonzero(below)[0]) if below.ndim else None
        lo_i = int(lo if np.ndim(lo) == 0 else lo[i])
        hi_i = int(hi if np.ndim(hi) == 0 else hi[i])
        where = "" if i is None else f" at index {i}"
        source = ("" if hi_given else
                  " (the policy's default max_rollouts; pass a larger max_rollouts)")
        raise SeraOptError(
            f"policy {name!r}: max_rollouts={hi_i}{source} is below min_rollouts={lo_i}"
            f"{where}: no count satisfies both. Raise max_rollouts or lower min_rollouts."
        )


def _check_max_ratio(max_ratio):
    if max_ratio is None:
        return None
    return validate_real(max_ratio, "max_ratio", minimum=1.0,
                         meaning="the cap as a multiple of the average count; None for no cap")


class AllocationPolicy(ABC):
    """A rule that turns success probabilities and a budget into rollout counts.

    The protocol, declared rather than discovered:

    * :attr:`name` and :attr:`option_names`: the registry key and the constructor
      options beyond the bounds (``min_rollouts``, ``max_rollouts``, ``offset``,
      and ``max_ratio`` where :attr:`default_max_ratio` is set). Options are
      checked when the policy is built; :meth:`config` returns them and
      :func:`policy_from_config` rebuilds the policy from them.
    * :attr:`extra_inputs`: the keywords :meth:`allocate` takes beyond the
      probabilities, budget and bounds (``{"posterior"}``, ``{"gradient_norms"}``).
    * :attr:`offset_sensitive`: whether the counts depend on the estimator offset.
    * :attr:`round_mode`: how the policy takes part in rounds
      (:meth:`start_rounds`): ``"scale"``, its :meth:`round_objective` solved over
      the prompts still without a success in the count of the round (its counts
      follow the expected scales); ``"totals"``, its rule applied to those prompts'
      totals; ``None``, it plans in one round only.
    * :attr:`exact`: whether the counts are the exact optimum of the policy's own
      objective (``Allocation.objective``); the optimality tests run every
      registered policy flagged exact against brute force.

    Subclasses implement :meth:`_allocate`, which receives a validated
    :class:`~sera_opt.AllocationProblem` and the extra inputs.

    Parameters
    ----------
    min_rollouts, max_rollouts : int or array_like, optional
        Default per-prompt bounds, used when :meth:`allocate` is called without
        them. ``min_rollouts=None`` means ``max(default, 1 + offset)``;
        ``max_rollouts=None`` means the policy's default cap (below, or none).
    offset : {0, 1}
        Offset ``c`` of the estimator the rollouts will feed (0: success-average,
        1: mean-centred). The reported factors use it.
    max_ratio : float or None
        Only for policies that define :attr:`default_max_ratio` (the SERA family):
        when no ``max_rollouts`` is given, cap each prompt at
        ``ceil(max_ratio * budget / M)``. ``None`` removes the cap.
    """

    name: ClassVar[str]
    preference: ClassVar[int] = 100  # place in the registry's listing (lower first)
    option_names: ClassVar[tuple[str, ...]] = ()
    extra_inputs: ClassVar[frozenset[str]] = frozenset()
    offset_sensitive: ClassVar[bool] = False
    round_mode: ClassVar[str | None] = None
    exact: ClassVar[bool] = True
    default_min_rollouts: ClassVar[int] = 1
    default_max_rollouts: ClassVar[int | None] = None
    default_max_ratio: ClassVar[float | None] = None
    #: Whether the policy can choose its active set (``active_threshold``, or the
    #: spelling ``min_rollouts=0``): prompts without a useful chance of a mixed group get
    #: no rollouts (docs/theory.md, "SERA as its authors run it").
    active_set_capable: ClassVar[bool] = False
    default_active_threshold: ClassVar[float | None] = None

    def __init__(self, *, min_rollouts=None, max_rollouts=None, offset: int = 0,
                 max_ratio=_UNSET, active_threshold=_UNSET):
        from .active import DEFAULT_ACTIVE_THRESHOLD, check_active_threshold

        self.offset = validate_offset(offset)
        if np.ndim(min_rollouts) == 0 and min_rollouts is not None and not isinstance(
                min_rollouts, (bool, np.bool_)) and min_rollouts == 0:
            if not self.active_set_capable:
                raise SeraOptError(
                    f"policy {self.name!r} cannot switch prompts off (min_rollouts=0): only "
                    f"the SERA policies choose an active set. Switch prompts off yourself "
                    f"with max_rollouts=0 for them in allocate(), or use "
                    f"get_policy('sera', min_rollouts=0).")
            # The spelling of the active set: positive counts keep their usual minimum.
            min_rollouts = None
            if active_threshold is _UNSET or active_threshold is None:
                active_threshold = DEFAULT_ACTIVE_THRESHOLD
        if active_threshold is not _UNSET and not self.active_set_capable:
            raise SeraOptError(
                f"{type(self).__name__} has no active_threshold option (only the SERA "
                f"policies choose an active set); pass max_rollouts=0 for the prompts to "
                f"switch off instead.")
        self.active_threshold = (check_active_threshold(
            self.default_active_threshold if active_threshold is _UNSET else active_threshold)
            if self.active_set_capable else None)
        if max_ratio is not _UNSET and self.default_max_ratio is None:
            raise SeraOptError(
                f"{type(self).__name__} has no max_ratio option (only the SERA policies cap "
                f"by a multiple of the average count); pass max_rollouts instead."
            )
        self.max_ratio = (_check_max_ratio(self.default_max_ratio if max_ratio is _UNSET
                                           else max_ratio)
                          if self.default_max_ratio is not None else None)
        lo = _check_bound(min_rollouts, "min_rollouts")
        self.min_rollouts = max(self.default_min_rollouts, 1 + self.offset) if lo is None else lo
        hi = _check_bound(max_rollouts, "max_rollouts")
        self.max_rollouts = self.default_max_rollouts if hi is None else hi
        _check_bounds_agree(self.min_rollouts, self.max_rollouts, self.offset, lo is not None,
                            hi is not None, self.name)

    # ------------------------------------------------------------ configuration
    @classmethod
    def all_option_names(cls) -> tuple[str, ...]:
        """Every constructor option of this policy, in a stable order."""
        ratio = ("max_ratio",) if cls.default_max_ratio is not None else ()
        active = ("active_threshold",) if cls.active_set_capable else ()
        return (*cls.option_names, *_BOUND_OPTIONS, *ratio, *active)

    @classmethod
    def accepted_option_names(cls, options: Mapping[str, Any]) -> tuple[str, ...]:
        """Every option name this policy takes alongside ``options`` (a policy that
        forwards options to a component, as SERA to its solver, adds the component's)."""
        return cls.all_option_names()

    @classmethod
    def unknown_options(cls, options: Mapping[str, Any]) -> list[str]:
        """The names in ``options`` that this policy does not take."""
        return sorted(set(options) - set(cls.accepted_option_names(options)))

    def config(self) -> dict[str, Any]:
        """The policy's name and every option it was built with: plain data that
        :func:`policy_from_config` turns back into an equal policy. Objects that are
        not registered by name (a user's solver) appear as ``{"object": kind, "name":
        ...}`` and must be passed again when rebuilding."""
        return {"name": self.name,
                "options": {k: self._config_value(k, getattr(self, k))
                            for k in self.all_option_names()}}

    def _config_value(self, option: str, value: Any) -> Any:
        """How an option's value is written into :meth:`config`."""
        if isinstance(value, np.ndarray):
            return value.copy()
        return value

    # ------------------------------------------------------------ allocation
    def problem(self, success_probs, budget, *, min_rollouts=None,
                max_rollouts=None) -> AllocationProblem:
        """Validate the inputs into an :class:`~sera_opt.AllocationProblem`."""
        lo, hi = self._call_bounds(success_probs, budget, min_rollouts, max_rollouts)
        return AllocationProblem(success_probs, budget, min_rollouts=lo, max_rollouts=hi,
                                 offset=self.offset)

    def _call_bounds(self, success_probs, budget, min_rollouts, max_rollouts):
        """The bounds of one call: the call's own, else the policy's, and with neither a
        maximum the ``max_ratio`` cap (``None``: no cap)."""
        lo = self.min_rollouts if min_rollouts is None else min_rollouts
        hi = self.max_rollouts if max_rollouts is None else max_rollouts
        if hi is None and self.max_ratio is not None:
            try:
                m = len(success_probs) if np.ndim(success_probs) == 1 else 0
            except (TypeError, ValueError):  # a ragged list (AllocationProblem reports it)
                m = 0
            hi = self._ratio_cap(m, budget, lo)
        return lo, hi

    def _ratio_cap(self, m: int, budget, lo):
        """``ceil(max_ratio * budget / M)`` (at most :data:`MAX_BUDGET`), never below a
        prompt's minimum; ``None`` when
        the inputs are malformed (AllocationProblem then reports what is wrong)."""
        try:
            budget = validate_count(budget, "budget")
        except (TypeError, ValueError):  # a bad budget (SeraOptError)
            return None
        if not m:
            return None
        # Exact rational ceiling, in Python integers (a float product would round
        # for budgets near 2**53).
        num, den = float(self.max_ratio).as_integer_ratio()
        # Clamped to MAX_BUDGET: a cap above the budget changes nothing (no prompt can
        # take more), and budgets near 2**53 are then not refused for a max_rollouts
        # that the caller never passed.
        cap = min(-((-num * budget) // (den * m)), MAX_BUDGET)
        if np.ndim(lo) == 0:
            try:
                return max(int(lo), cap)
            except (TypeError, ValueError):
                return cap
        try:
            return np.maximum(np.asarray(lo, dtype=np.int64), cap)
        except (TypeError, ValueError, OverflowError):
            return cap

    def allocate(self, success_probs, budget, *, min_rollouts=None, max_rollouts=None,
                 **inputs: Any) -> Allocation:
        """Allocate ``budget`` rollouts over the prompts.

        Parameters
        ----------
        success_probs : array_like, shape (M,)
            Estimated success probability of each prompt, in [0, 1].
        budget : int
            Total rollouts; the returned counts sum to it exactly.
        min_rollouts, max_rollouts : int or array_like, optional
            Override the policy's default bounds for this call.
        **inputs
            The policy's :attr:`extra_inputs` (e.g. ``posterior=(alpha, beta)``).
        """
        self._check_inputs(inputs)
        problem = self.problem(success_probs, budget, min_rollouts=min_rollouts,
                               max_rollouts=max_rollouts)
        return self._allocate_batch(problem, inputs)

    def _allocate_batch(self, problem: AllocationProblem, inputs: Mapping[str, Any]
                        ) -> Allocation:
        """:meth:`_allocate` on the whole batch, or on its active prompts: those the
        caller did not switch off, chosen by the active-set rule where the policy has a
        threshold."""
        from ..result import allocate_active
        from .active import allocate_with_active_set, subset_inputs

        m = problem.num_prompts
        if self.active_threshold is not None:
            return allocate_with_active_set(
                problem, self.active_threshold,
                lambda sub, index: self._allocate(sub, **subset_inputs(inputs, index, m)),
                name=self.name, fast=None if inputs else self._probe_solver(problem.budget))
        if problem.switched_off is not None:
            index = np.flatnonzero(~problem.switched_off)
            return allocate_active(
                problem, lambda sub: self._allocate(sub, **subset_inputs(inputs, index, m)))
        return self._allocate(problem, **inputs)

    def _probe_solver(self, budget: int):
        """A one-call allocation of an active-set probe with scalar bounds,
        ``f(success_probs, lo, hi) -> Allocation or None``; None: probes take
        :meth:`_allocate`."""
        return None

    def validate(self, success_probs, budget, *, min_rollouts=None, max_rollouts=None,
                 **inputs: Any) -> AllocationProblem:
        """Check everything :meth:`allocate` checks, with its messages, without allocating:
        the extra inputs' names and values, the probabilities, the budget and the bounds.
        Returns the validated :class:`~sera_opt.AllocationProblem`.

        :meth:`start_rounds` runs it before the first round, so that what a round
        would refuse is refused before any rollout is drawn. A policy with extra inputs
        checks them here (the base class builds its :meth:`round_objective` where it
        has one, which checks them as :meth:`allocate` does).
        """
        self._check_inputs(inputs)
        problem = self.problem(success_probs, budget, min_rollouts=min_rollouts,
                               max_rollouts=max_rollouts)
        if inputs and self.round_mode is not None:
            self.round_objective(problem, **inputs)
        return problem

    def start_rounds(self, success_probs, budget, *, rounds=None, first_round=None,
                     later_budgets=None, min_rollouts=None, max_rollouts=None, prior=None,
                     prompt_ids=None, observer=None, **inputs: Any):
        """Spend ``budget`` over ``rounds`` rounds, allocating each on what the earlier
        ones showed (docs/theory.md section 9); returns a
        :class:`~sera_opt.rounds.RoundSession`.

        The probabilities are taken as the truth (a ``prior``, or a posterior given as
        ``posterior=``, is updated round by round instead), so the session's
        ``factors`` are exact expectations. ``rounds=1`` is :meth:`allocate`: the same
        counts, bit for bit. Everything :meth:`allocate` checks is checked here, before
        the first round (:meth:`validate`), with the same messages.

        Parameters
        ----------
        success_probs : array_like, shape (M,)
            The prompts' success probabilities (``None`` with a ``posterior``: its means).
        budget : int
            The step's rollouts over all rounds; spent exactly unless the session is
            stopped early (:meth:`~sera_opt.rounds.RoundSession.stop`).
        rounds : int, optional
            ``R >= 1``; default :data:`sera_opt.rounds.DEFAULT_ROUNDS` (1, which is
            :meth:`allocate`'s plan in one round; rounds are opt-in). Rounds the
            budget leaves empty are dropped when the session starts (a round that
            draws nothing is no generation call); when ``rounds`` was given, with a
            :class:`~sera_opt.SeraOptWarning` that names how many can sample.
        first_round : int, optional
            Rollouts per prompt in the first, non-adaptive round (at least the prompt's
            ``min_rollouts``). Default: half the average count, ``budget // (2 M)``, and
            at least ``min_rollouts``. With ``rounds`` not given it (and
            ``later_budgets``) is refused: the default is one round, which has neither.
        later_budgets : sequence of int, optional
            The budgets of rounds 2..R (``R - 1`` of them, summing to what the first
            round leaves). Default: what is left, split evenly.
        min_rollouts, max_rollouts : int or array_like, optional
            Bounds on each prompt's realized total, as in :meth:`allocate`.
        prior : tuple (alpha, beta) of array_like, optional
            Beta posteriors of the prompts' success probabilities, which the later
            rounds update with the step's failures and allocate on (the planner passes
            its tracker's); default: the ``posterior`` input where the policy takes
            one, else none (``success_probs`` are the truth).
        prompt_ids : array_like, optional
            The prompts' ids, carried to :attr:`RoundResult.prompt_ids
            <sera_opt.rounds.RoundResult>`.
        observer : object, optional
            Something with ``observe_rounds(session)``, called once with the session
            when it ends (its last round recorded, or stopped); the planner passes
            itself.
        **inputs
            The policy's :attr:`extra_inputs`.
        """
        from ..rounds import RoundSession

        named = rounds is not None
        rounds = DEFAULT_ROUNDS if rounds is None else validate_count(rounds, "rounds",
                                                                      minimum=1)
        if not named and rounds == 1:
            # The default, one round, would run the static plan and drop these silently.
            for option, value in (("first_round", first_round), ("later_budgets", later_budgets)):
                if value is not None:
                    raise SeraOptError(
                        f"{option} asks for rounds, but none were named and the default is one "
                        f"round (the static plan); pass rounds=R >= 2 (for example rounds=4), or "
                        f"drop {option}."
                    )
        if named and rounds == 1:
            # One round is the static plan: a first round or later budgets would do nothing.
            for option, value in (("first_round", first_round), ("later_budgets", later_budgets)):
                if value is not None:
                    raise SeraOptError(
                        f"{option} shapes rounds, but rounds=1 is the static plan in one round "
                        f"and has none to shape; pass rounds=R >= 2, or drop {option}."
                    )
        if rounds > 1 and self.round_mode is None:
            raise SeraOptError(
                f"policy {self.name!r} does not run in rounds (its round_mode is None): declare "
                f"round_mode and implement round_objective(problem, **inputs) to use it in "
                f"rounds, or plan in one round (rounds=1, the default of start_rounds and the "
                f"trainers)."
            )
        if rounds > 1 and self.round_mode not in ROUND_MODES:
            raise SeraOptError(
                f"policy {self.name!r} declares round_mode={self.round_mode!r}; a round mode is "
                f"one of {ROUND_MODES} (or None for a policy that does not run in rounds)."
            )
        problem = self.validate(success_probs, budget, min_rollouts=min_rollouts,
                                max_rollouts=max_rollouts, **inputs)
        # One round is the static allocation itself (validated the same way just now).
        plan = (self.allocate(success_probs, budget, min_rollouts=min_rollouts,
                              max_rollouts=max_rollouts, **inputs)
                if rounds == 1 or self.active_threshold is not None else None)
        static = None if plan is None else plan.counts
        lo, hi = np.array(problem.min_rollouts), np.array(problem.max_rollouts)
        if self.active_threshold is not None:
            # The active set is chosen once, before the first round: the rounds share the
            # budget among the prompts it keeps, and the others get no round at all.
            off = static == 0
            lo[off], hi[off] = 0, 0
            if rounds > 1:
                static = None
        m = problem.num_prompts
        if prior is None:
            prior = inputs.get("posterior")
        if prior is not None:
            from ..separable import validate_beta_posterior

            try:
                alpha, beta = prior
            except (TypeError, ValueError):
                raise SeraOptError(
                    "prior must be a pair (alpha, beta) of arrays, one entry per prompt."
                ) from None
            prior = validate_beta_posterior(alpha, beta, m)
        if first_round is None:
            first_round = problem.budget // (2 * m) if m else 0
        else:
            first_round = validate_count(first_round, "first_round", minimum=1)
        others = {k: v for k, v in inputs.items() if k != "posterior"}
        session = RoundSession(self, problem.budget, rounds=rounds, first_round=first_round,
                            later_budgets=later_budgets, lo=lo, hi=hi,
                            truth=None if prior is not None else problem.success_probs,
                            prior=prior, inputs=others, static_counts=static,
                            prompt_ids=prompt_ids, observer=observer, rounds_named=named)
        # The static plan behind the first round (its active set, where it has one).
        session.static_allocation = plan
        return session

    def bounds(self, num_prompts: int, budget: int, *, min_rollouts=None, max_rollouts=None):
        """``(min_rollouts, max_rollouts)`` of a call over ``num_prompts`` prompts: the
        call's own, else the policy's, and with neither a maximum the ``max_ratio`` cap
        ``ceil(max_ratio * budget / M)`` (``None``: no cap). A scalar or an array each,
        as given."""
        m = validate_count(num_prompts, "num_prompts")
        lo = self.min_rollouts if min_rollouts is None else min_rollouts
        hi = self.max_rollouts if max_rollouts is None else max_rollouts
        if hi is None and self.max_ratio is not None:
            hi = self._ratio_cap(m, budget, lo)
        return lo, hi

    def round_objective(self, problem: AllocationProblem, **inputs: Any):
        """The objective a round of :meth:`start_rounds` solves over the active prompts,
        on their updated estimates (``problem.success_probs``). Policies with an
        :meth:`objective` use it; others must override this (and declare
        :attr:`round_mode`) to run in rounds."""
        objective = getattr(self, "objective", None)
        if objective is None:
            raise SeraOptError(
                f"policy {self.name!r} has no objective to solve a round with; implement "
                f"round_objective(problem, **inputs) to use it in rounds, or plan in one round "
                f"(rounds=1, the default of start_rounds and the trainers)."
            )
        return objective(problem, **inputs)

    def _check_inputs(self, inputs: Mapping[str, Any]) -> None:
        unknown = sorted(set(inputs) - self.extra_inputs)
        if unknown:
            raise SeraOptError(
                f"policy {self.name!r} does not take {', '.join(map(repr, unknown))}; its "
                f"extra inputs are {sorted(self.extra_inputs) or 'none'}."
            )

    @abstractmethod
    def _allocate(self, problem: AllocationProblem, **inputs: Any) -> Allocation:
        """Allocate on a validated problem."""

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.config()["options"].items())
        return f"{type(self).__name__}({opts})"


class SeparablePolicy(AllocationPolicy):
    """A policy that allocates by the exact optimum of a separable objective.

    A subclass implements :meth:`objective`; the separable engine
    (:mod:`sera_opt.separable`) does the rest. A new policy is thus one
    :class:`~sera_opt.separable.SeparableObjective` subclass and::

        @sera_opt.register_policy
        class MyPolicy(sera_opt.SeparablePolicy):
            name = "mine"
            def objective(self, problem):
                return MyObjective(problem.success_probs, offset=problem.offset)
    """

    #: Its objective, solved over the active prompts' totals (see :attr:`round_mode`).
    round_mode: ClassVar[str | None] = "totals"

    @abstractmethod
    def objective(self, problem: AllocationProblem, **inputs: Any):
        """The objective to optimize on ``problem``."""

    def _allocate(self, problem: AllocationProblem, **inputs: Any) -> Allocation:
        start = time.perf_counter()
        objective = self.objective(problem, **inputs)
        return self._solve(problem, objective, start)

    def _solve(self, problem: AllocationProblem, objective, start: float, *,
               posterior=None) -> Allocation:
        from ..separable.objective import SeparableObjective, solve_validated

        if not isinstance(objective, SeparableObjective) or \
                objective.num_prompts != problem.num_prompts:
            raise SeraOptError(
                f"{type(self).__name__}.objective must return a SeparableObjective over the "
                f"problem's {problem.num_prompts} prompts, got {objective!r}."
            )
        lo, hi = problem.kernel_bounds()
        counts = solve_validated(objective, lo, hi, problem.spare_budget,
                                 np.zeros(4, dtype=np.int64))
        return Allocation.from_solver_counts(problem, counts, solver=self.name,
                                   wall_time=time.perf_counter() - start,
                                   objective=objective, posterior=posterior)
