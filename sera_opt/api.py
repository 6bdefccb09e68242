"""The two top-level functions: :func:`allocate` and :func:`waterline`."""

from __future__ import annotations

import numpy as np

from .problem import AllocationProblem
from .result import Allocation
from .solvers.base import get_solver

__all__ = ["allocate", "waterline"]


def allocate(success_probs, budget, *, min_rollouts=1, max_rollouts=None, offset=0,
             solver="waterline", **solver_options) -> Allocation:
    """Allocate ``budget`` rollouts so that the attenuation factors are as equal as possible.

    Solves SERA's problem (THEORY.md section 3)::

        lexicographically maximize  sort_i( w_c(p_i, n_i) ),  w_c(p, n) = 1 - (1 - p) ** (n - c)
        subject to  sum_i n_i = budget,  min_rollouts <= n_i <= max_rollouts,  n_i integer.

    Parameters
    ----------
    success_probs : array_like, shape (M,)
        Estimated success probability of each prompt, in [0, 1]. Prefer
        posterior means (:class:`sera_opt.SuccessTracker`) to raw rates: a raw 0
        pins the prompt at ``max_rollouts``.
    budget : int
        Total rollouts; the counts sum to it exactly.
    min_rollouts, max_rollouts : int or array_like of int
        Per-prompt bounds; ``max_rollouts=None`` means no per-prompt cap.
    offset : {0, 1}
        0 for the success-average estimator, 1 for the mean-centred one (then
        ``min_rollouts`` must be at least 2).
    solver : str, Solver or callable
        ``"waterline"`` (default, exact and fast), ``"milp"`` (exact, cvxpy),
        ``"greedy"`` (exact, pure Python), a registered name, or your own.
    **solver_options
        Options of the chosen solver; unknown ones raise a warning.

    Returns
    -------
    Allocation
        ``.counts`` (int64, sums to ``budget``), ``.factors``, ``.min_factor``,
        ``.continuous`` (the waterline, where computed), ``.solver`` and more.

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
    problem = AllocationProblem(success_probs, budget, min_rollouts=min_rollouts,
                                max_rollouts=max_rollouts, offset=offset)
    return get_solver(solver).solve(problem, **solver_options)


def waterline(success_probs, budget, *, min_rollouts=1, max_rollouts=None, offset=0,
              return_level: bool = False):
    """The continuous relaxation of SERA: ``n_i = clip(c + L* / a_i, lo_i, hi_i)``.

    ``a_i = -log(1 - p_i)`` and the waterline level ``L*`` solves
    ``sum_i n_i = budget``. Found exactly, by locating the linear piece of
    ``sum_i n_i(L)`` that contains the root.

    Returns
    -------
    counts : ndarray of float64
        The continuous counts (they sum to ``budget`` up to rounding).
    level : float
        ``L*``, only when ``return_level=True``.
    """
    from .solvers.waterline import continuous_waterline

    problem = AllocationProblem(success_probs, budget, min_rollouts=min_rollouts,
                                max_rollouts=max_rollouts, offset=offset)
    counts, level = continuous_waterline(problem)
    counts = np.asarray(counts, dtype=np.float64)
    return (counts, level) if return_level else counts
