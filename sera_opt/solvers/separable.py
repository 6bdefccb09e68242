"""The separable engine's objectives, where the solver layer has always named them.

The engine and its objectives live in :mod:`sera_opt.separable` (below the result
and the solvers, so that both may use them); this module re-exports the same
objects under their documented names ``sera_opt.solvers.separable.*``.
"""

from __future__ import annotations

from .. import separable as _engine
from ..separable import (
    AlphaFairUtility,
    BetaLevels,
    HitUtility,
    InverseCountCost,
    KnapsackValue,
    PointHitUtility,
    PointLevels,
    RLOOVariance,
    SeparableObjective,
    check_alpha,
    solve_separable,
    validate_beta_posterior,
)

# The documented names here: the engine's, less expected_factors (sera_opt.policies' name).
__all__ = [name for name in _engine.__all__ if name != "expected_factors"]
