"""The gradient mathematics of the comparison: the prepared setting (data, checkpoints,
tracker), per-prompt weights and expected coefficients, exact and sampled gradients of
a batch, and the alignment scores."""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

import sera_opt
from sera_opt.benchmarks import _harness
from sera_opt.benchmarks.alignment import digits as _digits

from .config import AlignmentConfig, Method


@dataclass
class Setting:
    """The prompts, the trained policy, the tracker's estimates and the batches."""

    inputs: np.ndarray
    labels: np.ndarray
    policies: Any  # _digits.TrainedPolicies
    success_probs: np.ndarray  # current policy, every prompt
    earlier_success_probs: np.ndarray
    tracker_estimates: np.ndarray  # posterior means after the earlier round
    tracker_posterior: tuple[np.ndarray, np.ndarray] | None  # Beta (alpha, beta) per prompt
    batches: list[np.ndarray]
    timings: dict[str, float] = field(default_factory=dict)
    tracker: Any = None  # the SuccessTracker after the earlier round (sessions in rounds)


def prepare(config: AlignmentConfig) -> Setting:
    """Train the policy, run the earlier round through the tracker, draw the batches."""

    timings: dict[str, float] = {}
    start = time.perf_counter()
    inputs, labels = _digits.load_prompts()
    policies = _digits.train_policies(
        inputs, labels, seed=config.seed, steps=config.train_steps, lag=config.history_lag,
        label_noise=config.label_noise, hidden=config.hidden, temperature=config.temperature,
    )
    p_now = _digits.success_probs(policies.current, inputs, labels)
    p_then = _digits.success_probs(policies.earlier, inputs, labels)
    timings["train_s"] = time.perf_counter() - start

    m_total = labels.shape[0]
    needed = config.batch_size * config.num_batches
    if needed > m_total:
        raise ValueError(
            f"{config.num_batches} batches of {config.batch_size} prompts need {needed} prompts; "
            f"the digits data has {m_total}."
        )
    rng = np.random.default_rng([config.seed, 1])
    order = rng.permutation(m_total)
    batches = [np.sort(order[b * config.batch_size:(b + 1) * config.batch_size])
               for b in range(config.num_batches)]

    # The earlier round: a few rollouts per prompt from the earlier checkpoint.
    start = time.perf_counter()
    tracker = sera_opt.SuccessTracker()
    ids = np.arange(m_total)
    h = config.history_rollouts
    if h > 0:
        history_rng = np.random.default_rng([config.seed, 2])
        rewards = (history_rng.random((m_total, h)) < p_then[:, None]).astype(np.float64)
        tracker.update(np.repeat(ids, h), rewards.reshape(-1))
    estimates = np.asarray(tracker.estimate(ids), dtype=np.float64)
    posterior = None
    if hasattr(tracker, "posterior"):
        alpha, beta = tracker.posterior(ids)
        posterior = (np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64))
    timings["tracker_s"] = time.perf_counter() - start
    return Setting(inputs, labels, policies, p_now, p_then, estimates, posterior, batches,
                   timings, tracker)


def make_policy(spec: str, *, min_rollouts: int, max_rollouts: int | None, offset: int):
    from sera_opt.policies import POLICIES

    arm = _harness.parse_arm(spec)
    if (max_rollouts is None and POLICIES.lookup(arm.policy).default_max_ratio is not None
            and "max_ratio" not in arm.kwargs):
        # "no cap" means none, not the policy's default cap of max_ratio x the average.
        arm = replace(arm, options=(*arm.options, ("max_ratio", None)))
    return arm.build(min_rollouts=min_rollouts, max_rollouts=max_rollouts, offset=offset)


def prompt_weights(counts: np.ndarray, multiplicity_correction: bool) -> np.ndarray:
    """``v_i``: a prompt's share of the token-mean batch gradient (docs/theory.md section 4).

    With the correction every prompt weighs ``1/M``; without it, ``n_i / B``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if multiplicity_correction:
        return np.full(counts.shape, 1.0 / counts.shape[0])
    return counts / counts.sum()


def expected_coefficients(success_probs, counts, offset: int,
                          multiplicity_correction: bool) -> np.ndarray:
    """``v_i w_c(p_i, n_i)``: the coefficient of ``grad log p_i`` in the expected estimator."""

    return prompt_weights(counts, multiplicity_correction) * sera_opt.attenuation(
        np.asarray(success_probs, dtype=np.float64), counts, offset
    )


def alignment_scores(estimate: np.ndarray, exact: np.ndarray) -> dict[str, float]:
    """Cosine similarity, relative L2 error and norm ratio of ``estimate`` to ``exact``."""
    exact_norm = float(np.linalg.norm(exact))
    est_norm = float(np.linalg.norm(estimate))
    cosine = float(estimate @ exact / (est_norm * exact_norm)) if est_norm > 0 else 0.0
    return {
        "cosine": cosine,
        "relative_error": float(np.linalg.norm(estimate - exact) / exact_norm),
        "norm_ratio": est_norm / exact_norm,
    }


def sample_rollouts(rng: np.random.Generator, label_probs: np.ndarray,
                    counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``counts[i]`` labels from row ``i`` of ``label_probs``.

    Returns ``(prompt_index, sampled_labels)``, one entry per rollout, grouped by prompt.
    """
    prompt_index = np.repeat(np.arange(counts.shape[0]), counts)
    cdf = np.cumsum(label_probs, axis=1)
    cdf[:, -1] = 1.0  # guard against rounding: every uniform draw lands in a label
    u = rng.random(prompt_index.shape[0])
    sampled = (u[:, None] >= cdf[prompt_index]).sum(axis=1)
    return prompt_index, sampled


class BatchGradients:
    """Exact, expected and sampled gradients for one batch, from one forward pass."""

    def __init__(self, model, inputs: np.ndarray, labels: np.ndarray):
        import torch

        self._torch = torch
        self.model = model
        self.labels = labels
        self.params = list(model.parameters())
        self.log_probs = _digits.log_probs(model, inputs)  # (M, 10), graph kept
        self.label_probs = self.log_probs.detach().exp().numpy()
        rows = torch.arange(labels.shape[0])
        self.log_success = self.log_probs[rows, torch.as_tensor(labels)]
        self.success_probs = self.log_success.detach().exp().numpy()
        m = labels.shape[0]
        self.exact = self.weighted(np.full(m, 1.0 / m))

    def _grad(self, objective) -> np.ndarray:
        grads = self._torch.autograd.grad(objective, self.params, retain_graph=True)
        return self._torch.cat([g.reshape(-1) for g in grads]).numpy()

    def weighted(self, coefficients: np.ndarray) -> np.ndarray:
        """``sum_i coefficients_i grad log p_i``."""
        coef = self._torch.as_tensor(coefficients, dtype=self._torch.float64)
        return self._grad((coef * self.log_success).sum())

    def sampled(self, rng: np.random.Generator, counts: np.ndarray, method: Method) -> np.ndarray:
        """One draw of the batch gradient that a trainer would follow (ascent direction)."""
        prompt_index, sampled = sample_rollouts(rng, self.label_probs, counts)
        return self.gradient_of(prompt_index, sampled, method)

    def gradient_of(self, prompt_index: np.ndarray, sampled: np.ndarray, method: Method,
                    round_index: np.ndarray | None = None) -> np.ndarray:
        """The ascent direction of the MaxRL loss on these rollouts (labels ``sampled``
        of prompts ``prompt_index``; ``round_index`` for a step in rounds)."""
        torch = self._torch
        rewards = (sampled == self.labels[prompt_index]).astype(np.float64)
        index_t = torch.as_tensor(prompt_index)
        advantages = sera_opt.maxrl_advantages(
            torch.as_tensor(rewards), index_t, estimator=method.estimator,
            multiplicity_correction=method.multiplicity_correction,
            round_index=None if round_index is None else torch.as_tensor(round_index),
        )
        logp = self.log_probs[index_t, torch.as_tensor(sampled)]
        # One token per rollout (the label): the policy-gradient loss per token.
        per_token_loss = -(advantages.detach().to(torch.float64) * logp).unsqueeze(1)
        mask = torch.ones_like(per_token_loss)
        loss = sera_opt.aggregate_loss(per_token_loss, mask, "token-mean")
        return -self._grad(loss)


HOPELESS = 0.01


def hopeless_prompts(model, inputs, labels) -> dict[str, float]:
    """How much of the exact gradient the prompts with ``p < HOPELESS`` carry.

    ``gradient_share``: the projection of their part of ``(1/M) sum_i grad log p_i``
    on the whole, divided by its squared norm (the shares of all prompts sum to 1).
    ``score_norm_ratio``: mean ``|grad log p_i|`` of those prompts over that of the others.
    """
    rows = _digits.per_prompt_gradients(model, inputs, labels)
    p = _digits.success_probs(model, inputs, labels)
    mask = p < HOPELESS
    exact = rows.mean(axis=0)
    norms = np.linalg.norm(rows, axis=1)
    share = float(rows[mask].sum(axis=0) / len(p) @ exact / (exact @ exact))
    ratio = (float(norms[mask].mean() / norms[~mask].mean())
             if mask.any() and (~mask).any() else float("nan"))
    return {"fraction": float(mask.mean()), "gradient_share": share, "score_norm_ratio": ratio}


def stream(config: AlignmentConfig, *parts) -> np.random.Generator:
    """A generator determined by the seed and ``parts`` only (stable across runs and methods)."""
    key = [config.seed] + [zlib.crc32(str(p).encode()) for p in parts]
    return np.random.default_rng(key)
