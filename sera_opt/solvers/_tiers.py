"""How prompts with ``p = 0`` or ``p = 1`` enter the level order.

A prompt's level after ``m = n - c`` effective rollouts is ``a m`` with
``a = -log(1 - p)``. At ``p = 0`` (``a = 0``) every level is 0 and at ``p = 1``
(``a = inf``) every level is infinite, so the plain order cannot rank extra
rollouts among such prompts. sera_opt orders them as the limits ``p -> 0+``
and ``p -> 1-`` do: a ``p = 0`` prompt's level behaves like ``eps * m``, below
every positive level, and a ``p = 1`` prompt's like ``m / eps``, above every
finite one. Hence three tiers, served in order: ``p = 0`` prompts take spare
rollouts first (evenly among themselves, up to their maximum: THEORY.md's
"pinned at hi"), then the ordinary prompts, then ``p = 1`` prompts (which keep
their minimum unless everything else is full). Within the two edge tiers the
level is ``m`` itself, i.e. rate 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..problem import AllocationProblem

EDGE_LEVEL = {"zero": 0.0, "infinite": np.inf}


def tiers(rates: np.ndarray) -> Iterator[tuple[str, np.ndarray | slice, np.ndarray]]:
    """Yield ``(tier name, index, rates within the tier)`` in serving order."""
    zero = rates == 0
    infinite = np.isinf(rates)
    if not zero.any() and not infinite.any():
        yield "finite", slice(None), rates
        return
    finite = ~(zero | infinite)
    for name, mask in (("zero", zero), ("finite", finite), ("infinite", infinite)):
        if mask.any():
            idx = np.flatnonzero(mask)
            tier_rates = rates[idx] if name == "finite" else np.ones(idx.size)
            yield name, idx, tier_rates


def fill_tiers(
    problem: AllocationProblem,
    fill: Callable[[np.ndarray, np.ndarray, np.ndarray, int], object],
    *,
    continuous: bool = False,
) -> tuple[np.ndarray, float]:
    """Serve the spare budget tier by tier with ``fill(rates, m_lo, cap, extra)``.

    ``fill`` returns the increments over the minimum (or ``(level, increments)``
    when ``continuous``). Returns the counts (int64, or float64 when
    ``continuous``) and the waterline level where the budget ran out.
    """
    lo = problem.min_rollouts
    m_lo = np.ascontiguousarray(lo - problem.offset, dtype=np.int64)
    cap = np.ascontiguousarray(problem.max_rollouts - lo, dtype=np.int64)
    counts = lo.astype(np.float64 if continuous else np.int64)
    extra = problem.spare_budget
    # With no spare budget every level at or below the lowest one solves the
    # relaxation; report the lowest.
    level = float(problem.levels(lo).min())
    for name, idx, tier_rates in tiers(problem.rates):
        tier_cap = cap[idx]
        take = min(extra, int(tier_cap.sum()))
        if take <= 0:
            continue
        out = fill(np.ascontiguousarray(tier_rates, dtype=np.float64),
                   np.ascontiguousarray(m_lo[idx]), np.ascontiguousarray(tier_cap), take)
        if continuous:
            tier_level, out = out
            level = float(tier_level) if name == "finite" else EDGE_LEVEL[name]
        counts[idx] = counts[idx] + out
        extra -= take
    return counts, level
