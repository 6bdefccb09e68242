"""Success-probability estimates before sampling (docs/theory.md section 5).

:class:`SuccessTracker` (:mod:`.tracker`) is two parts with one job each: a
prompt-id index (:mod:`.index`, id -> slot, over the hash tables of
:mod:`.index_kernels`) and a Beta evidence table (:mod:`.evidence`: per-slot
evidence, the decay clock and the fitted prior's moments, kept incrementally by
:mod:`.evidence_kernels`). :class:`EpochTracker` (:mod:`.epoch`) is the authors'
estimator: discounted Beta evidence, frozen per epoch, on the same index.
"""

from .epoch import COLD_STARTS, EpochTracker
from .tracker import MAX_PRIOR_STRENGTH, SuccessTracker

__all__ = ["EpochTracker", "SuccessTracker"]
