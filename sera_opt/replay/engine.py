"""The step-by-step replay of a recorded run under several arms.

For each recorded step, in order, and each arm:

1. at an epoch boundary (the record's ``epoch``, or the rule of
   :data:`~sera_opt.replay.records.EPOCH_RULE`) the arm's planner is told
   (``planner.end_epoch()``), before the new epoch's first plan;
2. the planner plans the step's prompts at the recorded budget (the step's recorded
   rollouts), within the bounds every arm shares (offset c, at least ``min_rollouts``
   per prompt it does not switch off, at most ``ceil(max_ratio * B / M)``), from its own
   tracker, which holds only earlier steps' outcomes;
3. the counts are scored against the step's recorded outcomes
   (:mod:`sera_opt.replay.scores`);
4. the arm's tracker observes what the arm would have drawn: ``feed="own"`` (default)
   gives it, per prompt, the first ``min(m, n)`` of the ``n`` recorded rewards for its
   count ``m`` and, beyond the record, draws from the prompt's posterior (seeded);
   ``feed="record"`` gives every arm all recorded rewards.

The replay measures the first-order effect only: it cannot know how training would
have changed under another allocation (the record's p are those of the recorded run's
own policy at each step).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import SeraOptError, SeraOptWarning
from .records import RecordedRun
from .scores import (
    DEFAULT_PRIOR,
    SCORE_NAMES,
    beta_tail_moments,
    fit_prior,
    score_counts,
    summarize,
)

__all__ = ["FIRST_ORDER_NOTE", "ReplaySettings", "ReplayResult", "replay", "FEEDS"]

FIRST_ORDER_NOTE = ("The replay measures the first-order effect only: each arm's counts are "
                    "scored against the recorded run's outcomes; it cannot know how training "
                    "would have changed under another allocation.")
FEEDS = ("own", "record")


@dataclass(frozen=True)
class ReplaySettings:
    """What every arm shares: the estimator's offset, the bounds, the prior of the
    evidence, what the trackers are fed, and the seed of the draws beyond the record."""

    offset: int = 1
    min_rollouts: int = 2
    max_ratio: float = 4.0
    prior: tuple[float, float] | str = DEFAULT_PRIOR
    feed: str = "own"
    seed: int = 0

    def check(self) -> ReplaySettings:
        if self.offset not in (0, 1):
            raise SeraOptError(f"offset is 0 or 1, got {self.offset!r}.")
        if not (isinstance(self.min_rollouts, int) and self.min_rollouts >= 1 + self.offset):
            raise SeraOptError(f"min_rollouts must be a whole number >= {1 + self.offset} "
                               f"(offset {self.offset}), got {self.min_rollouts!r}.")
        if not (math.isfinite(self.max_ratio) and self.max_ratio >= 1):
            raise SeraOptError(f"max_ratio must be a finite number >= 1, got "
                               f"{self.max_ratio!r}.")
        if isinstance(self.prior, str):
            if self.prior != "fit":
                raise SeraOptError(f"the prior is 'fit' (the run's own) or a pair (a, b) with "
                                   f"a, b > 0, got {self.prior!r}.")
        else:
            try:
                a, b = (float(x) for x in self.prior)
            except (TypeError, ValueError):
                a = b = math.nan
            if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
                raise SeraOptError(f"the prior is 'fit' (the run's own) or a pair (a, b) with "
                                   f"a, b > 0, got {self.prior!r}.")
        if self.feed not in FEEDS:
            raise SeraOptError(f"feed is one of {', '.join(FEEDS)}, got {self.feed!r}.")
        return self

    def max_rollouts(self, budget: int, num_prompts: int) -> int:
        """The common cap: ``ceil(max_ratio * B / M)``, at least the minimum."""
        return max(self.min_rollouts, math.ceil(self.max_ratio * budget / num_prompts - 1e-9))

    def prior_of(self, run: RecordedRun) -> tuple[float, float]:
        """The prior's (a0, b0) for ``run``: fitted to it (:func:`fit_prior`) or given."""
        if isinstance(self.prior, str):
            return fit_prior(np.concatenate([s.successes for s in run.steps]),
                             np.concatenate([s.counts for s in run.steps]))
        a, b = self.prior
        return float(a), float(b)

    def describe(self, prior: tuple[float, float] | None = None) -> str:
        """The settings in words (``prior``: the (a0, b0) in use, e.g. the fitted one)."""
        own = isinstance(self.prior, str)
        if prior is None:
            words = "the run's own prior" if own else f"a Beta{tuple(self.prior)} prior"
        else:
            kind = "the run's own" if own else "a"
            words = f"{kind} Beta({prior[0]:.3g}, {prior[1]:.3g}) prior"
        return (f"every arm: offset {self.offset}, at least {self.min_rollouts} rollouts per "
                f"prompt given any, at most ceil({self.max_ratio:g} x B / M) (B the step's "
                f"recorded rollouts, M its prompts); evidence of p: the step's outcomes under "
                f"{words}; trackers fed "
                + ("the arm's own draws (a prefix of the record, the posterior beyond it)"
                   if self.feed == "own" else "every recorded outcome"))


@dataclass
class ReplayResult:
    """Per-step scores of every arm on a recorded run.

    Attributes
    ----------
    steps, epochs : ndarray of int64
        The record's step numbers and their epochs.
    scores : dict
        ``scores[arm][name]``: one value per step, for each name of
        :data:`~sera_opt.replay.scores.SCORE_NAMES` and ``"mixed_sd"`` (the predictive
        standard deviation of the number of mixed prompts), ``"too_easy"`` and
        ``"too_hard"`` (prompts the arm's active set switched off, 0 without one).
    counts : dict
        ``counts[arm]``: the arm's counts, one array per step (the step's prompts in
        the record's order).
    has_active_set : dict
        ``has_active_set[arm]``: whether the arm's plans carried an active set.
    """

    run: RecordedRun
    settings: ReplaySettings
    arms: tuple[str, ...]
    steps: np.ndarray
    epochs: np.ndarray
    scores: dict[str, dict[str, np.ndarray]]
    counts: dict[str, list[np.ndarray]]
    has_active_set: dict[str, bool]
    prior: tuple[float, float] = (1.0, 1.0)
    #: The estimate's check on the record itself: the prompts per step expected to have a
    #: mixed group at the recorded counts, and those the record shows mixed (means over
    #: steps).
    calibration: dict[str, float] = field(default_factory=dict)
    wall_time_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def summary(self, *, baseline: str | None = "uniform", confidence: float = 0.95,
                resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
        """Each arm's scores over the steps with a block-bootstrap interval, and the paired
        difference to ``baseline`` (skipped when it is not an arm)."""
        base = baseline if baseline in self.arms else None
        return summarize(self.scores, baseline=base, confidence=confidence,
                         resamples=resamples, seed=seed)


def replay(run: RecordedRun, planners: Mapping[str, Any], settings: ReplaySettings | None = None,
           *, progress: Callable | None = None) -> ReplayResult:
    """Replay ``run`` for each planner of ``planners`` (label -> a fresh
    :class:`~sera_opt.RolloutPlanner`; its tracker must not hold this run's outcomes).

    Parameters
    ----------
    run : RecordedRun
        From :func:`~sera_opt.replay.read_record` or :meth:`RecordedRun.from_rollouts`.
    planners : mapping of str to RolloutPlanner
        One per arm; each is used (planned, fed and told of epochs) by the replay alone.
        Anything with the planner's ``plan(ids, budget, max_rollouts=)``,
        ``observe(ids, rewards)`` and ``end_epoch()`` will do.
    settings : ReplaySettings, optional
        The bounds, the offset, the prior and the feed every arm shares.
    progress : callable, optional
        ``progress(iterable, total=..., desc=...)`` wraps the loop over steps.

    Returns
    -------
    ReplayResult
    """
    settings = (settings or ReplaySettings()).check()
    if not planners:
        raise SeraOptError("replay needs at least one arm.")
    arms = tuple(planners)
    rng = np.random.default_rng(settings.seed)
    a0, b0 = settings.prior_of(run)
    names = (*SCORE_NAMES, "mixed_sd", "too_easy", "too_hard")
    t = run.num_steps
    scores = {arm: {name: np.zeros(t) for name in names} for arm in arms}
    counts: dict[str, list[np.ndarray]] = {arm: [] for arm in arms}
    has_active = dict.fromkeys(arms, False)
    steps = np.array([s.step for s in run.steps], dtype=np.int64)
    epochs = np.array([s.epoch for s in run.steps], dtype=np.int64)
    expected_mixed, realized_mixed = np.zeros(t), np.zeros(t)
    start = time.perf_counter()
    loop = enumerate(run.steps)
    if progress is not None:
        loop = progress(loop, total=t, desc="replaying steps")
    for index, step in loop:
        m, budget = step.num_prompts, step.budget
        if budget < settings.min_rollouts * m:
            raise SeraOptError(
                f"step {step.step} records {budget} rollouts for {m} prompts, fewer than the "
                f"minimum of {settings.min_rollouts} per prompt that every arm must give; "
                f"replay a record with at least {settings.min_rollouts} rollouts per prompt "
                f"(or lower min_rollouts for the offset-0 estimator).")
        cap = settings.max_rollouts(budget, m)
        alpha = a0 + step.successes
        beta = b0 + step.counts - step.successes
        top = max(cap, int(step.counts.max()))
        fail, win = beta_tail_moments(alpha, beta, top)
        group_start = np.concatenate([[0], np.cumsum(step.counts)[:-1]])
        position = np.arange(step.budget) - np.repeat(group_start, step.counts)
        recorded = score_counts(step.counts, fail, win, offset=settings.offset)
        expected_mixed[index] = recorded.mixed_prompts
        realized_mixed[index] = np.count_nonzero((step.successes > 0)
                                                 & (step.successes < step.counts))
        ids = step.prompts
        recorded_ids = np.repeat(ids, step.counts)
        for arm, planner in planners.items():
            if index and step.epoch != run.steps[index - 1].epoch:
                planner.end_epoch()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", SeraOptWarning)
                    alloc = planner.plan(ids, budget, max_rollouts=cap)
            except (SeraOptError, SeraOptWarning) as exc:
                raise SeraOptError(f"arm {arm!r} at step {step.step}: "
                                   f"{' '.join(str(exc).split())}") from None
            n = np.asarray(alloc.counts, dtype=np.int64)
            counts[arm].append(n)
            s = score_counts(n, fail, win, offset=settings.offset)
            row = scores[arm]
            for name in SCORE_NAMES:
                row[name][index] = getattr(s, name)
            row["mixed_sd"][index] = s.mixed_sd
            active_set = getattr(alloc, "active_set", None)
            if active_set is not None:
                has_active[arm] = True
                row["too_easy"][index] = active_set.num_too_easy
                row["too_hard"][index] = active_set.num_too_hard
            if settings.feed == "record":
                planner.observe(recorded_ids, step.rewards)
                continue
            kept = position < np.repeat(n, step.counts)
            fed_ids = [recorded_ids[kept]]
            fed = [step.rewards[kept]]
            extra = np.maximum(n - step.counts, 0)
            if extra.any():
                more = np.flatnonzero(extra)
                p = rng.beta(alpha[more], beta[more])
                draws = rng.random(int(extra.sum())) < np.repeat(p, extra[more])
                fed_ids.append(np.repeat(ids[more], extra[more]))
                fed.append(draws.astype(np.int8))
            rollout_ids = np.concatenate(fed_ids)
            if rollout_ids.size:
                planner.observe(rollout_ids, np.concatenate(fed))
    return ReplayResult(run=run, settings=settings, arms=arms, steps=steps, epochs=epochs,
                        scores=scores, counts=counts, has_active_set=has_active,
                        prior=(a0, b0),
                        calibration={"expected": float(expected_mixed.mean()),
                                     "realized": float(realized_mixed.mean())},
                        wall_time_s=time.perf_counter() - start)
