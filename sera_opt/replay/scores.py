"""How an arm's counts for a recorded step are scored against the step's outcomes.

The record is the step's evidence of each prompt's success probability: prompt i drew
n_i rollouts with K_i successes, and under a Beta(a0, b0) prior p_i ~ Beta(a0 + K_i,
b0 + n_i - K_i). The default prior is the run's own (:func:`fit_prior`, the maximum of
the Beta-Binomial likelihood over every prompt and step of the record), so that the recorded arm's expected
scores match what it realized on average; Beta(1, 1) (Laplace's rule, the batch view of
``sera_opt.advantage_diagnostics``) is one option away, and shrinks an all-failure group
of 8 to a 47 % chance of a mixed group in a fresh one. Every score is an expectation over that posterior,
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

__all__ = ["DEFAULT_PRIOR", "fit_prior", "beta_tail_moments", "StepScores", "score_counts",
           "SCORE_NAMES", "block_bootstrap_interval", "summarize"]

#: The prior the step's outcomes are shrunk with by default: the run's own.
DEFAULT_PRIOR = "fit"
#: The bounds of the fitted prior's strength a0 + b0 (in rollouts).
PRIOR_STRENGTH = (0.2, 1000.0)

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


def _beta_binomial_loglik(pairs_k, pairs_n, weights, a, b) -> np.ndarray:
    """Log-likelihood of the (K, n) pairs (each ``weights`` times) under Beta-Binomial
    (a, b), without the binomial coefficients, for arrays ``a``, ``b`` of one shape."""
    top = int(pairs_n.max())
    j = np.arange(top, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)[..., None]
    b = np.asarray(b, dtype=np.float64)[..., None]
    zero = np.zeros(a.shape[:-1] + (1,))
    # cum_x[..., m] = sum_{j < m} log(x + j)
    cum_a = np.concatenate([zero, np.cumsum(np.log(a + j), axis=-1)], axis=-1)
    cum_b = np.concatenate([zero, np.cumsum(np.log(b + j), axis=-1)], axis=-1)
    cum_ab = np.concatenate([zero, np.cumsum(np.log(a + b + j), axis=-1)], axis=-1)
    terms = cum_a[..., pairs_k] + cum_b[..., pairs_n - pairs_k] - cum_ab[..., pairs_n]
    return terms @ weights


def fit_prior(successes, counts) -> tuple[float, float]:
    """The Beta(a0, b0) prior of a run: the maximum of the Beta-Binomial likelihood of
    its ``(K, n)`` pairs, one per prompt and step (empirical Bayes).

    The likelihood is maximized over the prior's mean (on the logit scale) and its
    strength ``a0 + b0`` (on the log scale, within :data:`PRIOR_STRENGTH`) by a grid
    search refined twice around its best point. Matching the whole distribution of K,
    not only its mean and variance, is what makes the fitted prior reproduce the
    run's share of all-failure and all-success groups, on which the chance of a
    mixed group turns.
    """
    k = np.asarray(successes, dtype=np.int64)
    n = np.asarray(counts, dtype=np.int64)
    keep = n > 0
    k, n = k[keep], n[keep]
    if n.size == 0:
        raise SeraOptError("a prior is fitted from at least one prompt with rollouts.")
    pairs, weights = np.unique(np.stack([k, n], axis=1), axis=0, return_counts=True)
    pk, pn, w = pairs[:, 0], pairs[:, 1], weights.astype(np.float64)
    mean = (k.sum() + 0.5) / (n.sum() + 1.0)
    centre = np.array([math.log(mean / (1.0 - mean)), 0.0])
    half = np.array([8.0, 0.5 * math.log(PRIOR_STRENGTH[1] / PRIOR_STRENGTH[0])])
    centre[1] = math.log(PRIOR_STRENGTH[0]) + half[1]
    low, high = (math.log(x) for x in PRIOR_STRENGTH)
    for _ in range(3):
        logit = centre[0] + np.linspace(-half[0], half[0], 41)
        log_strength = np.clip(centre[1] + np.linspace(-half[1], half[1], 41), low, high)
        mu = 1.0 / (1.0 + np.exp(-logit))[:, None]
        strength = np.exp(log_strength)[None, :]
        loglik = _beta_binomial_loglik(pk, pn, w, mu * strength, (1.0 - mu) * strength)
        i, j = np.unravel_index(int(np.argmax(loglik)), loglik.shape)
        centre = np.array([logit[i], log_strength[j]])
        half = half / 8.0
    mu = 1.0 / (1.0 + math.exp(-centre[0]))
    strength = math.exp(centre[1])
    return mu * strength, (1.0 - mu) * strength


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
