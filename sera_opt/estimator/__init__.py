"""The multiplicity-corrected MaxRL gradient estimator (PyTorch).

:mod:`.advantages` holds the estimator (:func:`maxrl_advantages`, the per-prompt
statistics and diagnostics); :mod:`.groups` turns prompt ids into groups (dense,
hashed, across ranks) and checks the inputs; :mod:`.hashing` and
:mod:`.hashing_kernels` give sparse ids compact slots; :mod:`.policy_loss` aggregates
per-token losses (:func:`aggregate_loss`, :func:`policy_gradient_loss`), with the checks
and the reduction of :mod:`.losses`. The
mathematics is in docs/theory.md sections 2 and 4 and in docs/estimator.md.
"""

from . import advantages as _advantages
from .advantages import (
    ESTIMATOR_OFFSETS,
    ESTIMATORS,
    LOSS_MODES,
    GroupStatistics,
    advantage_diagnostics,
    aggregate_loss,
    group_statistics,
    maxrl_advantages,
    policy_gradient_loss,
)
from .grpo import GRPO_EPSILON, GRPO_SCALES, grpo_advantages

__all__ = [*_advantages.__all__, "GRPO_SCALES", "GRPO_EPSILON", "grpo_advantages"]
