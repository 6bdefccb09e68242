"""The core policies: SERA and uniform allocation."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..exceptions import SeraOptError
from ..problem import AllocationProblem
from ..result import Allocation
from ..separable import SeparableObjective
from ..separable.tiers import even_increments, even_split
from ..solvers.base import SOLVERS, get_solver, is_registered
from ..solvers.waterline import WaterlineSolver, allocate_batch
from .base import DEFAULT_MAX_RATIO, AllocationPolicy, unknown_option_error
from .registry import register_policy

__all__ = ["SERAPolicy", "PaperSERAPolicy", "UniformPolicy", "EvenCounts", "uniform_counts"]

_DEFAULT: Any = object()


def _check_rounding(rounding) -> str:
    from .active import ROUNDINGS

    if rounding not in ROUNDINGS:
        raise SeraOptError(
            f"rounding must be one of {', '.join(repr(r) for r in ROUNDINGS)} ('exact': the "
            f"lexicographic max-min; 'paper': the authors' rounding of the waterline); got "
            f"{rounding!r}.")
    return rounding


def _paper_allocation(problem: AllocationProblem, name: str) -> Allocation:
    """The authors' rounding of ``problem``'s waterline, as an Allocation with SERA's
    levels as its objective."""
    from ..separable.levels import PointLevels
    from .active import paper_rounding

    start = time.perf_counter()
    counts, continuous, level = paper_rounding(problem)
    return Allocation(problem, counts, solver=f"{name} (paper rounding)",
                      status="paper rounding", wall_time=time.perf_counter() - start,
                      objective=PointLevels.from_problem(problem), continuous=continuous,
                      waterline=level)


@register_policy
class SERAPolicy(AllocationPolicy):
    """Scale-Equalized Rollout Allocation.

    Lexicographically maximizes the sorted attenuation factors
    ``w_c(p_i, n_i) = 1 - (1 - p_i) ** (n_i - c)`` subject to
    ``sum_i n_i = budget`` and the per-prompt bounds (docs/theory.md section 3).
    :func:`sera_opt.allocate` is this policy, with the same defaults.

    Parameters
    ----------
    solver : str, Solver or callable, default "waterline"
        Which solver computes the allocation (see :func:`sera_opt.available_solvers`).
    min_rollouts, max_rollouts, offset
        See :class:`AllocationPolicy`.
    max_ratio : float or None, default 4
        Cap used when no ``max_rollouts`` is given: ``ceil(max_ratio * budget / M)``
        rollouts per prompt. Max-min is ruled by the hardest prompts; with no cap,
        prompts whose estimated p is near 0 absorb the budget while the others
        stay at the minimum, which aligns the batch gradient *worse* than uniform
        allocation (docs/theory.md section 5; docs/benchmarks.md, alignment). Posterior
        means from :class:`sera_opt.SuccessTracker` make SERA less sensitive to
        the cap, but not immune: prompts that fail on every visit drive their
        posterior mean towards 0 too, and in the hard maze configuration SERA
        then loses to uniform allocation (docs/benchmarks.md, maze). ``None``
        removes the cap.
    active_threshold : float or None, default None
        Switch off the prompts that cannot give a useful mixed group (0 rollouts):
        the authors' active-set rule with threshold ``tau`` on the chance of a mixed
        group (:func:`sera_opt.policies.active.allocate_with_active_set`; the authors use
        0.05). ``min_rollouts=0`` is the same as ``active_threshold=0.05``: an active
        prompt still gets at least the usual minimum, ``max(1, 1 + offset)``. None:
        every prompt gets at least ``min_rollouts``.
    rounding : {"exact", "paper"}, default "exact"
        ``"exact"``: the solver's integer counts (the lexicographic max-min with the
        exact solvers). ``"paper"``: the authors' rounding of the bisected waterline
        (:func:`sera_opt.policies.active.paper_rounding`), for reproducing their runs;
        the solver is then not used.
    **solver_options
        Passed to the solver (e.g. ``continuous=False`` for "waterline"); options
        the solver does not understand are warned about here, when the policy is
        built.
    """

    name = "sera"
    preference = 0
    default_max_ratio = DEFAULT_MAX_RATIO
    active_set_capable = True
    default_rounding = "exact"
    default_offset = 0
    offset_sensitive = True
    # A round solves its objective over the prompts without a success, in the count of
    # the round: its counts follow the expected scales (docs/theory.md section 9).
    round_mode = "scale"

    def __init__(self, solver="waterline", *, min_rollouts=None, max_rollouts=None,
                 offset=None, max_ratio=_DEFAULT, active_threshold=_DEFAULT,
                 rounding=None, **solver_options: Any):
        bounds = {"min_rollouts": min_rollouts, "max_rollouts": max_rollouts,
                  "offset": self.default_offset if offset is None else offset,
                  "max_ratio": self.default_max_ratio if max_ratio is _DEFAULT else max_ratio}
        if active_threshold is not _DEFAULT:
            bounds["active_threshold"] = active_threshold
        super().__init__(**bounds)
        self.solver = get_solver(solver)
        self.solver_options = check_solver_options(self.solver, solver_options, stacklevel=2)
        self.rounding = _check_rounding(self.default_rounding if rounding is None else rounding)
        self.exact = self.solver.exact and self.rounding == "exact"

    def allocate(self, success_probs, budget, *, min_rollouts=None, max_rollouts=None,
                 **inputs: Any) -> Allocation:
        # The common batch (a float64 array, whole-number bounds, the waterline solver)
        # takes one compiled call that validates as it solves; anything else, and any
        # invalid input, takes the general path.
        if (not inputs and self.active_threshold is None and self.rounding == "exact"
                and type(success_probs) is np.ndarray and type(self.solver) is
                WaterlineSolver and success_probs.dtype == np.float64 and
                success_probs.ndim == 1 and success_probs.flags.c_contiguous):
            lo, hi = self._call_bounds(success_probs, budget, min_rollouts, max_rollouts)
            if hi is not None or self.max_ratio is None:
                out = allocate_batch(success_probs, budget, lo, hi, self.offset,
                                     self.solver_options.get("continuous", True))
                if out is not None:
                    return out
        return super().allocate(success_probs, budget, min_rollouts=min_rollouts,
                                max_rollouts=max_rollouts, **inputs)

    def _probe_solver(self, budget: int):
        if self.rounding != "exact" or type(self.solver) is not WaterlineSolver:
            return None
        continuous = self.solver_options.get("continuous", True)
        offset = self.offset
        return lambda p, lo, hi: allocate_batch(p, budget, lo, hi, offset, continuous)

    def _allocate(self, problem: AllocationProblem) -> Allocation:
        if self.rounding == "paper":
            return _paper_allocation(problem, self.name)
        return self.solver.solve(problem, **self.solver_options)

    def round_objective(self, problem: AllocationProblem, **inputs: Any):
        """SERA's levels, solved by the engine whatever the solver (a round's counts are
        the exact max-min; :meth:`start_rounds`)."""
        from ..separable.levels import PointLevels

        return PointLevels.from_problem(problem)

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["options"].update(self.solver_options)
        return config

    def _config_value(self, option: str, value: Any) -> Any:
        if option == "solver":
            if is_registered(value):
                return value.name
            return {"object": "solver", "name": value.name}
        return super()._config_value(option, value)

    @classmethod
    def all_option_names(cls) -> tuple[str, ...]:
        return ("solver", *super().all_option_names(), "rounding")

    @classmethod
    def accepted_option_names(cls, options) -> tuple[str, ...]:
        # Beyond the policy's own, the options of any registered solver are accepted
        # here: the chosen solver warns about those it ignores when the policy is built.
        own = cls.all_option_names()
        extra = _solver_option_names(options.get("solver", "waterline")) - set(own)
        return (*own, *sorted(extra))


def _solver_option_names(solver) -> set[str]:
    """Every option some registered solver takes, and those of ``solver`` itself."""
    names = set()
    for key in SOLVERS.names():
        names |= set(SOLVERS.lookup(key).options)
    names |= set(getattr(solver, "options", ()) or ())
    return names


def check_solver_options(solver, options, *, stacklevel: int = 2) -> dict[str, Any]:
    """The options of ``solver`` in ``options``: a name that no registered solver (nor
    ``solver``) takes is refused as a typo, with the closest valid name; one that another
    solver takes but this one ignores gets a :class:`~sera_opt.SeraOptWarning`."""
    known = _solver_option_names(solver)
    typos = sorted(set(options) - known)
    if typos:
        valid = (*SERAPolicy.all_option_names(), *sorted(known))
        raise unknown_option_error("policy 'sera'", typos, valid)
    return solver.check_options(options, stacklevel=stacklevel + 1)


class EvenCounts(SeparableObjective):
    """Uniform allocation's objective: lexicographically maximize the sorted counts
    themselves (max-min with level ``n``), i.e. raise the lowest counts first."""

    sense = "max-min"

    def gains(self, counts):
        return -self._counts(counts).astype(float)

    def terms(self, counts):
        return self._counts(counts).astype(float)

    def _solve_rows(self, idx, lo, hi, spare, stats):
        # Water-filling is this objective's exact optimum, with the engine's tie rule
        # (fewer rollouts first, then the lower index).
        return lo + even_increments(lo, hi - lo, spare)


def uniform_counts(problem: AllocationProblem):
    """Counts as even as the budget and bounds allow: water-filling, the lowest counts
    raised first, ties to the lower index (the lexicographic max-min of the counts)."""
    lo = problem.min_rollouts
    if problem.uniform_bounds:  # known without reading the bounds (validated: room for all)
        return lo + even_split(problem.num_prompts, problem.spare_budget)
    return lo + even_increments(lo, problem.max_rollouts - lo, problem.spare_budget)


@register_policy
class PaperSERAPolicy(SERAPolicy):
    """SERA as its authors run it (docs/theory.md, "SERA as its authors run it").

    :class:`SERAPolicy` with the authors' settings as its defaults: the mean-centred
    factor (``offset=1``), positive counts in ``[2, 4 N0]`` (``min_rollouts=2``,
    ``max_ratio=4``, with ``N0 = budget / M``), prompts without a useful chance of a mixed
    group switched off (``active_threshold=0.05``) and the authors' integer rounding
    (``rounding="paper"``). Every default can be overridden, e.g.
    ``get_policy("sera-paper", rounding="exact")`` for the lexicographic max-min on the
    same active set. The authors' estimates (frozen per epoch, discounted) and cold start
    come with the planner: :meth:`sera_opt.RolloutPlanner.paper_sera`.
    """

    name = "sera-paper"
    preference = 4
    # The authors' rounding is close to, not always, the lexicographic max-min.
    exact = False
    default_offset = 1
    default_min_rollouts = 2
    default_active_threshold = 0.05
    default_rounding = "paper"


@register_policy
class UniformPolicy(AllocationPolicy):
    """Uniform allocation (MaxRL, GRPO): ``n_i = budget / M``.

    With per-prompt bounds, or a budget that is not a multiple of ``M``, the
    counts are as even as the bounds allow: the spare budget is water-filled,
    one rollout at a time to the prompt with the fewest so far (ties to the
    lower index). So minimums ``[5, 1, 1]`` and a budget of 8 give ``[5, 2, 1]``.
    This is the lexicographic max-min of the counts themselves
    (:class:`EvenCounts`, ``Allocation.objective``).
    """

    name = "uniform"
    preference = 1
    # A round raises the active prompts' lowest totals first.
    round_mode = "totals"

    def round_objective(self, problem: AllocationProblem, **inputs: Any):
        """Even counts: a round raises the active prompts' lowest totals first."""
        return EvenCounts(problem.num_prompts)

    def _allocate(self, problem: AllocationProblem) -> Allocation:
        start = time.perf_counter()
        counts = uniform_counts(problem)
        objective = EvenCounts(problem.num_prompts)
        return Allocation.from_solver_counts(problem, counts, solver=self.name,
                                   wall_time=time.perf_counter() - start, objective=objective)
