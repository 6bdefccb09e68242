"""How an arm's counts for a recorded step are scored against the step's outcomes.

The record is the step's evidence of each prompt's success probability: prompt i drew
n_i rollouts with K_i successes, and under a Beta(a0, b0) prior (default Beta(1, 1),
Laplace's rule of succession, the batch view of ``sera_opt.advantage_diagnostics``)
p_i ~ Beta(a0 + K_i, b0 + n_i - K_i). Every score is an expectation over that posterior,
so the uncertainty of p from n_i rollouts is carried through, not plugged in. With the
arm's count m for the prompt and the estimator's offset c:

* expected factor ``E[w_c(p, m)] = 1 - E[(1 - p)^(m - c)]`` (0 for m <= c);
* chance of a mixed group ``q(m) = 1 - E[(1 - p)^m] - E[p^m]`` (0 for m <= 1): a group
  with a success and a failure, which carries a gradient under mean-centred MaxRL and
  GRPO alike;
* rollouts in groups without a signal, ``m (1 - q(m))``: the expected number of the
  arm's rollouts that come out all successes or all failures.

The moments are ``E[(1 - p)^m] = prod_{j < m} (b + j) / (a + b + j)`` and
``E[p^m] = prod_{j < m} (a + j) / (a + b + j)``, exact for every m.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..exceptions import SeraOptError

__all__ = ["DEFAULT_PRIOR", "beta_tail_moments", "StepScores", "score_counts",
           "SCORE_NAMES", "block_bootstrap_interval", "summarize"]

#: The prior the step's outcomes are shrunk with: Beta(1, 1).
DEFAULT_PRIOR = (1.0, 1.0)

#: Per-step scores, in the order of the report's table, with their meaning.
SCORE_NAMES = {
    "mean_factor": "expected factor E[w_c(p, n)], mean over the step's prompts (a prompt "
                   "without rollouts counts 0)",
    "min_factor": "smallest expected factor among the prompts with rollouts",
    "factor_spread": "largest minus smallest expected factor among the prompts with rollouts",
    "mixed_prompts": "expected prompts with a mixed group (a success and a failure)",
    "no_signal_rollouts": "expected rollouts in groups without a signal (all 0 or all 1)",
    "active_prompts": "prompts given rollouts",
}


def beta_tail_moments(alpha, beta, max_count: int) -> tuple[np.ndarray, np.ndarray]:
    """``E[(1 - p)^m]`` and ``E[p^m]`` for ``p ~ Beta(alpha_i, beta_i)`` and
    ``m = 0..max_count``: two arrays of shape (len(alpha), max_count + 1)."""
    a = np.asarray(alpha, dtype=np.float64)[:, None]
    b = np.asarray(beta, dtype=np.float64)[:, None]
    if a.size and (not np.all(np.isfinite(a)) or not np.all(np.isfinite(b))
                   or a.min() <= 0 or b.min() <= 0):
        raise SeraOptError("Beta parameters must be finite and positive.")
    j = np.arange(max_count, dtype=np.float64)[None, :]
    total = np.log(a + b + j)
    ones = np.zeros((a.shape[0], 1))
    fail = np.exp(np.concatenate([ones, np.cumsum(np.log(b + j) - total, axis=1)], axis=1))
    win = np.exp(np.concatenate([ones, np.cumsum(np.log(a + j) - total, axis=1)], axis=1))
    return fail, win


@dataclass(frozen=True)
class StepScores:
    """An arm's scores on one step (see the module docstring).

    ``factors``, ``mixed`` are per prompt; the rest are the step's totals or summaries.
    """

    factors: np.ndarray
    mixed: np.ndarray
    mean_factor: float
    min_factor: float
    factor_spread: float
    mixed_prompts: float
    mixed_sd: float
    no_signal_rollouts: float
    active_prompts: int

    def row(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in SCORE_NAMES}


def score_counts(counts, fail_moments: np.ndarray, win_moments: np.ndarray, *,
                 offset: int = 1) -> StepScores:
    """Score ``counts`` (one per prompt) with the posterior moments of
    :func:`beta_tail_moments` (whose ``max_count`` is at least ``counts.max()``)."""
    n = np.asarray(counts, dtype=np.int64)
    rows = np.arange(n.shape[0])
    if n.size and n.max() >= fail_moments.shape[1]:
        raise SeraOptError(f"a count of {int(n.max())} exceeds the moments' table "
                           f"({fail_moments.shape[1] - 1}).")
    effective = np.maximum(n - offset, 0)
    factors = np.where(n > offset, 1.0 - fail_moments[rows, effective], 0.0)
    mixed = np.where(n > 1, 1.0 - fail_moments[rows, n] - win_moments[rows, n], 0.0)
    mixed = np.clip(mixed, 0.0, 1.0)  # rounding below 0 when both tails are near 1/2 or 1
    active = n > 0
    on = factors[active]
    return StepScores(
        factors=factors, mixed=mixed,
        mean_factor=float(factors.mean()) if n.size else 0.0,
        min_factor=float(on.min()) if on.size else 0.0,
        factor_spread=float(on.max() - on.min()) if on.size else 0.0,
        mixed_prompts=float(mixed.sum()),
        mixed_sd=float(math.sqrt(float((mixed * (1.0 - mixed)).sum()))),
        no_signal_rollouts=float((n * (1.0 - mixed)).sum()),
        active_prompts=int(active.sum()),
    )


def block_bootstrap_interval(values, *, confidence: float = 0.95, resamples: int = 2000,
                             block: int | None = None, seed: int = 0) -> dict[str, float]:
    """Mean of ``values`` (one per step) with a moving-block bootstrap percentile interval.

    Neighbouring steps share prompts and a policy that changes slowly, so steps are not
    independent draws: blocks of ``block`` consecutive steps (default ``ceil(T^(1/3))``,
    the rate Hall, Horowitz and Jing (1995) give for a mean) are resampled instead of
    single steps. The interval says how much the step-to-step variation leaves the mean
    uncertain; it does not cover what the replay cannot know (how training would have
    gone under the arm).
    """
    x = np.asarray(values, dtype=np.float64)
    t = x.shape[0]
    if t == 0:
        raise SeraOptError("an interval needs at least one step.")
    if not 0 < confidence < 1:
        raise SeraOptError(f"confidence must lie in (0, 1), got {confidence!r}.")
    mean = float(x.mean())
    if t < 2:
        return {"mean": mean, "ci_low": math.nan, "ci_high": math.nan, "steps": t,
                "block": 1, "confidence": confidence}
    b = max(1, min(t, math.ceil(t ** (1 / 3)) if block is None else int(block)))
    rng = np.random.default_rng(seed)
    blocks = math.ceil(t / b)
    starts = rng.integers(0, t - b + 1, size=(resamples, blocks))
    index = (starts[:, :, None] + np.arange(b)[None, None, :]).reshape(resamples, -1)[:, :t]
    means = x[index].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return {"mean": mean, "ci_low": float(low), "ci_high": float(high), "steps": t,
            "block": b, "confidence": confidence}


def summarize(per_step: dict[str, dict[str, np.ndarray]], *, baseline: str | None = None,
              confidence: float = 0.95, resamples: int = 2000, seed: int = 0
              ) -> dict[str, dict[str, dict[str, float]]]:
    """Each arm's scores over the steps (:func:`block_bootstrap_interval`), and, for every
    arm but ``baseline``, the paired per-step difference to it (same steps, same blocks)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm, scores in per_step.items():
        entry = {name: block_bootstrap_interval(scores[name], confidence=confidence,
                                                resamples=resamples, seed=seed)
                 for name in SCORE_NAMES}
        if baseline is not None and arm != baseline and baseline in per_step:
            for name in SCORE_NAMES:
                diff = np.asarray(scores[name]) - np.asarray(per_step[baseline][name])
                entry[f"{name}_minus_{baseline}"] = block_bootstrap_interval(
                    diff, confidence=confidence, resamples=resamples, seed=seed)
        out[arm] = entry
    return out
