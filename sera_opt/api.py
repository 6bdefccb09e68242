"""The two top-level functions: :func:`allocate` and :func:`waterline`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .policies.base import DEFAULT_MAX_RATIO
from .policies.core import SERAPolicy, check_solver_options
from .result import Allocation
from .solvers.base import SOLVERS

__all__ = ["allocate", "waterline"]


def allocate(success_probs, budget, *, min_rollouts=None, max_rollouts=None, offset=0,
             max_ratio=DEFAULT_MAX_RATIO, solver="waterline", **solver_options: Any
             ) -> Allocation:
    """Allocate ``budget`` rollouts so that the attenuation factors are as equal as possible.

    Solves SERA's problem (docs/theory.md section 3)::

        lexicographically maximize  sort_i( w_c(p_i, n_i) ),  w_c(p, n) = 1 - (1 - p) ** (n - c)
        subject to  sum_i n_i = budget,  min_rollouts <= n_i <= max_rollouts,  n_i integer.

    This is ``sera_opt.get_policy("sera", ...).allocate(...)`` with the same defaults.

    Parameters
    ----------
    success_probs : array_like, shape (M,)
        Estimated success probability of each prompt, in [0, 1]. Prefer
        posterior means (:class:`sera_opt.SuccessTracker`) to raw rates: a raw 0
        pins the prompt at its maximum.
    budget : int
        Total rollouts; the counts sum to it exactly.
    min_rollouts : int or array_like of int, optional
        Per-prompt minimum; default ``1 + offset``.
    max_rollouts : int or array_like of int, optional
        Per-prompt maximum; default ``ceil(max_ratio * budget / M)``.
    offset : {0, 1}
        0 for the success-average estimator, 1 for the mean-centred one (then
        ``min_rollouts`` must be at least 2).
    max_ratio : float or None, default 4
        The default cap as a multiple of the average count (see
        :data:`sera_opt.DEFAULT_MAX_RATIO` for why); ``None`` for no cap.
    solver : str, Solver or callable
        ``"waterline"`` (default, exact and fast), ``"milp"`` (exact, cvxpy),
        ``"greedy"`` (exact, pure Python), a registered name, or your own.
    **solver_options
        Options of the chosen solver. A name that no solver takes (a typo) raises
        :class:`SeraOptError` with the closest valid one; an option of another
        solver that the chosen one ignores raises a warning.

    Returns
    -------
    Allocation
        ``.counts`` (int64, sums to ``budget``), ``.factors``, ``.min_factor``,
        ``.continuous`` (the relaxation's counts, where computed), ``.waterline``
        (its level), ``.solver`` and more.

    Raises
    ------
    SeraOptError
        For invalid probabilities or bounds; ``InfeasibleBudgetError`` when
        ``budget`` is outside ``[sum(min_rollouts), sum(max_rollouts)]``.

    Examples
    --------
    >>> import sera_opt
    >>> alloc = sera_opt.allocate([0.9, 0.5, 0.05], budget=24, max_rollouts=16)
    >>> alloc.counts.tolist()
    [2, 6, 16]
    """
    key = _configuration_key(solver, min_rollouts, max_rollouts, offset, max_ratio,
                             solver_options)
    policy = _POLICIES.get(key) if key is not None else None
    if policy is None or type(policy.solver) is not SOLVERS.lookup(solver):
        policy = SERAPolicy(solver, min_rollouts=min_rollouts, max_rollouts=max_rollouts,
                            offset=offset, max_ratio=max_ratio)
        # Checked here, so that a warning about an ignored option points at the caller.
        policy.solver_options = check_solver_options(policy.solver, solver_options,
                                                     stacklevel=2)
        if key is not None:
            if len(_POLICIES) >= _MAX_POLICIES:
                _POLICIES.clear()  # a program that keeps changing its configuration
            _POLICIES[key] = policy
    return policy.allocate(success_probs, budget)


#: The policies of recent configurations of :func:`allocate`: building one checks every
#: option against the solver registry, which costs as much as solving a batch of a
#: thousand prompts, so a configuration is checked once, when first used. Only plain
#: configurations are kept (a registered solver's name, whole-number or absent bounds,
#: no solver options): their policy holds no object of the caller's.
_POLICIES: dict[tuple, SERAPolicy] = {}
_MAX_POLICIES = 32


def _configuration_key(solver, min_rollouts, max_rollouts, offset, max_ratio,
                       solver_options) -> tuple | None:
    """The key of a plain configuration in :data:`_POLICIES`, or None. Types are part of
    the key, so that ``1``, ``1.0`` and ``True`` (which a check may treat apart) never
    share an entry."""
    if solver_options or type(solver) is not str or solver not in SOLVERS:
        return None
    for value in (min_rollouts, max_rollouts, offset):
        if value is not None and type(value) is not int:
            return None
    if max_ratio is not None and type(max_ratio) not in (int, float):
        return None
    return (solver, min_rollouts, max_rollouts, type(offset), offset, type(max_ratio),
            max_ratio)


def waterline(success_probs, budget, *, min_rollouts=None, max_rollouts=None, offset=0,
              max_ratio=DEFAULT_MAX_RATIO, return_level: bool = False):
    """The continuous relaxation of SERA: ``n_i = clip(c + L* / a_i, lo_i, hi_i)``.

    ``a_i = -log(1 - p_i)`` and the waterline level ``L*`` solves
    ``sum_i n_i = budget``. Found exactly, by locating the linear piece of
    ``sum_i n_i(L)`` that contains the root. Bounds and defaults as in
    :func:`allocate`.

    Returns
    -------
    counts : ndarray of float64
        The continuous counts (they sum to ``budget`` up to rounding).
    level : float
        ``L*``, only when ``return_level=True``.
    """
    from .solvers.waterline import continuous_waterline

    policy = SERAPolicy(min_rollouts=min_rollouts, max_rollouts=max_rollouts, offset=offset,
                        max_ratio=max_ratio)
    counts, level = continuous_waterline(policy.problem(success_probs, budget))
    counts = np.asarray(counts, dtype=np.float64)
    return (counts, level) if return_level else counts
