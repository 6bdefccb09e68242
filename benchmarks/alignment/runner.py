"""How well MaxRL gradient estimates align with the exact likelihood gradient.

THEORY.md section 6. A digits classifier plays the policy (see
``benchmarks/alignment/digits.py``): a prompt is an input, a rollout samples a label,
success means the true label, so every ``grad log p_i`` is exact. For a batch
of ``M`` prompts and an average budget of ``nbar`` rollouts per prompt, each
method (an allocation policy, the probabilities it is fed, the estimator's
offset ``c`` and whether the multiplicity correction is on) is scored by

* the **expected estimator** ``sum_i v_i w_c(p_i, n_i) grad log p_i`` with
  ``v_i = 1/M`` under the multiplicity correction and ``v_i = n_i / B`` without
  it (token-mean aggregation, THEORY.md section 4), and
* **sampled estimators**: rollouts drawn from the policy, advantages from
  :func:`sera_opt.maxrl_advantages`, the token-mean loss of
  :func:`sera_opt.aggregate_loss`, differentiated by autograd,

each compared with the exact gradient ``(1/M) sum_i grad log p_i`` by cosine
similarity and relative L2 error ``|g_hat - g| / |g|`` (which also counts the
shrinkage of the gradient by the factors, see ``norm_ratio``).

The methods, for both estimators (``c = 0`` success-average, ``c = 1``
mean-centred): uniform MaxRL; SERA fed the true ``p`` and SERA fed the
posterior means of a :class:`sera_opt.SuccessTracker` that saw a few rollouts
per prompt from an earlier checkpoint, each with and without the multiplicity
correction; and the peers' policies (fed the tracker's estimates) when they are
registered. All policies get the same bounds: ``1 + c <= n_i <= max_ratio * nbar``.
A peer is a policy name or a specification with options, such as
``sera-fair:alpha=1`` (see :func:`sera_opt.benchmarks._harness.parse_arm`).

Per budget, every method's cosines come with a 95 % interval across batches
(t over the batch means) and, beside uniform's, the paired difference to
uniform's on the same batches (paired t over batches).

Run ``sera-opt bench alignment`` (full, seed 0), ``sera-opt bench alignment
--quick``, or ``sera-opt demo`` for the quick comparison as a table.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import sera_opt
from sera_opt.benchmarks import _harness
from sera_opt.benchmarks.alignment import digits as _digits
from sera_opt.planner import DEFAULT_POLICY, DEFAULT_POLICY_OPTIONS

__all__ = [
    "AlignmentConfig",
    "Method",
    "QUICK",
    "FULL",
    "PEERS",
    "REPORT_PEERS",
    "build_methods",
    "check_peers",
    "prepare",
    "run",
    "format_table",
    "plot",
    "main",
    "demo",
]

NAME = "alignment"
#: Every registered policy but the ones the runner always draws (uniform, SERA and the
#: default sera-fair), in the registry's order.
PEERS = tuple(name for name in sera_opt.available_policies()
              if name not in ("uniform", "sera", "sera-fair"))
#: The peers of the run that decides the recommended default (docs/benchmarks.md,
#: "Choosing the default allocation"; uniform and SERA are always compared):
#: ``sera-opt bench alignment --peers`` followed by ``" ".join(REPORT_PEERS)``.
REPORT_PEERS = ("hora", "sera-fair:alpha=0", "sera-fair:alpha=1", "sera-fair:alpha=2")
ESTIMATORS = {0: "success_average", 1: "mean_centred"}
HISTOGRAM_BINS = (0.0, 1e-3, 0.01, 0.05, 0.2, 0.5, 0.8, 0.95, 0.99, 1.0)


@dataclass(frozen=True)
class AlignmentConfig:
    """Everything that determines the numbers (with ``seed``)."""

    budgets: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    batch_size: int = 256
    num_batches: int = 7
    draws: int = 32
    history_rollouts: int = 4
    max_ratio: int = 4
    peers: tuple[str, ...] = PEERS
    offsets: tuple[int, ...] = (0, 1)
    train_steps: int = 300
    history_lag: int = 50
    label_noise: float = 0.3
    hidden: int = 64
    temperature: float = 0.5
    seed: int = 0


FULL = AlignmentConfig()
QUICK = replace(FULL, num_batches=2, draws=8)


@dataclass(frozen=True)
class Method:
    """One way of producing a batch gradient: allocation, its inputs, estimator."""

    policy: str  # a registered policy name, or a specification such as "sera-fair:alpha=1"
    source: str  # "true" (the exact p), "tracker" (posterior means) or "none" (uniform)
    offset: int
    multiplicity_correction: bool
    capped: bool = True  # max_rollouts = max_ratio * nbar; False: the policy's default

    @property
    def estimator(self) -> str:
        return ESTIMATORS[self.offset]

    @property
    def key(self) -> str:
        if self.policy == "uniform":
            return f"uniform c={self.offset}"
        corr = "corrected" if self.multiplicity_correction else "uncorrected"
        cap = "" if self.capped else "/uncapped"
        return f"{self.policy}/{self.source}/{corr}{cap} c={self.offset}"


def build_methods(config: AlignmentConfig, available: tuple[str, ...]) -> tuple[list[Method], list[str]]:
    """The methods to compare, and notes about peers that are not registered.

    Per offset: uniform; SERA on the tracker's estimates and on the true ``p``,
    with and without the multiplicity correction, under the common cap; SERA
    (corrected) on both sources with no cap at all (``max_ratio=None``), which is
    where raw probabilities pin hopeless prompts (THEORY.md section 5); the
    registered peers on the tracker's estimates, with and without the correction.
    """
    methods: list[Method] = []
    notes: list[str] = []
    peers = []
    for name in dict.fromkeys(config.peers):
        if name in ("uniform", "sera"):
            notes.append(f"policy {name!r} is always compared; not repeated as a peer.")
        elif _harness.arm_policy_name(name) not in available:
            notes.append(f"policy {_harness.arm_policy_name(name)!r} is not registered in this "
                         f"sera_opt; {name!r} skipped.")
        else:
            peers.append(_harness.parse_arm(name, available=available).label)
    for c in config.offsets:
        # Uniform counts are all equal, so the correction (nbar / n_i = 1) changes nothing.
        methods.append(Method("uniform", "none", c, True))
        for source in ("tracker", "true"):
            for corr in (True, False):
                methods.append(Method("sera", source, c, corr))
        for source in ("tracker", "true"):
            methods.append(Method("sera", source, c, True, capped=False))
        for name in peers:
            for corr in (True, False):
                methods.append(Method(name, "tracker", c, corr))
    return methods, notes


# --------------------------------------------------------------------------- setup


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


def prepare(config: AlignmentConfig) -> Setting:
    """Train the policy, run the earlier round through the tracker, draw the batches."""
    import sera_opt

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
                   timings)


# --------------------------------------------------------------------------- pieces


def _make_policy(spec: str, *, min_rollouts: int, max_rollouts: int | None, offset: int):
    from sera_opt.policies import POLICIES

    arm = _harness.parse_arm(spec)
    if (max_rollouts is None and POLICIES.lookup(arm.policy).default_max_ratio is not None
            and "max_ratio" not in arm.kwargs):
        # "no cap" means none, not the policy's default cap of max_ratio x the average.
        arm = replace(arm, options=(*arm.options, ("max_ratio", None)))
    return arm.build(min_rollouts=min_rollouts, max_rollouts=max_rollouts, offset=offset)


def prompt_weights(counts: np.ndarray, multiplicity_correction: bool) -> np.ndarray:
    """``v_i``: a prompt's share of the token-mean batch gradient (THEORY.md section 4).

    With the correction every prompt weighs ``1/M``; without it, ``n_i / B``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if multiplicity_correction:
        return np.full(counts.shape, 1.0 / counts.shape[0])
    return counts / counts.sum()


def expected_coefficients(success_probs, counts, offset: int,
                          multiplicity_correction: bool) -> np.ndarray:
    """``v_i w_c(p_i, n_i)``: the coefficient of ``grad log p_i`` in the expected estimator."""
    import sera_opt

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
        import sera_opt

        torch = self._torch
        prompt_index, sampled = sample_rollouts(rng, self.label_probs, counts)
        rewards = (sampled == self.labels[prompt_index]).astype(np.float64)
        index_t = torch.as_tensor(prompt_index)
        advantages = sera_opt.maxrl_advantages(
            torch.as_tensor(rewards), index_t, estimator=method.estimator,
            multiplicity_correction=method.multiplicity_correction,
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


def _stream(config: AlignmentConfig, *parts) -> np.random.Generator:
    """A generator determined by the seed and ``parts`` only (stable across runs and methods)."""
    key = [config.seed] + [zlib.crc32(str(p).encode()) for p in parts]
    return np.random.default_rng(key)


def _summary(values) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(arr.mean()),
        # one draw shows no spread: NaN (null in the JSON), not a spread of 0
        "std": float(arr.std(ddof=1)) if arr.size > 1 else float("nan"),
        "q10": float(np.quantile(arr, 0.1)),
        "q90": float(np.quantile(arr, 0.9)),
    }


def _add_intervals(entry: dict[str, Any], row: dict[str, list], uniform: dict[str, list]):
    """Per-batch cosines, their 95 % intervals across batches and, for methods other than
    uniform, the paired difference to uniform's cosine on the same batches."""
    entry["batch_index"] = list(row["batch"])
    entry["expected_cosine_interval"] = _harness.mean_interval(
        entry["expected_cosine_per_batch"], unit="batch")
    if row["sampled_batch_cosine"]:
        # The mean over a batch's draws: one value per batch, so the interval is across
        # batches like the expected estimator's.
        entry["sampled_cosine_per_batch"] = list(row["sampled_batch_cosine"])
        entry["sampled_cosine_interval"] = _harness.mean_interval(
            row["sampled_batch_cosine"], unit="batch")
    if row is uniform:
        return
    # Pair by batch; a batch on which either method failed is left out of the pair.
    shared = [b for b in row["batch"] if b in uniform["batch"]]
    pos, upos = ([rows_["batch"].index(b) for b in shared] for rows_ in (row, uniform))
    if not shared:
        return
    for metric, key in (("expected", "expected_cosine"), ("sampled_batch_cosine",
                                                         "sampled_cosine")):
        if not row[metric]:
            continue
        mine = [_cosine(row[metric][i]) for i in pos]
        base = [_cosine(uniform[metric][i]) for i in upos]
        entry[f"{key}_vs_uniform"] = _harness.paired_difference(mine, base, unit="batch")


def _cosine(value) -> float:
    return float(value["cosine"] if isinstance(value, dict) else value)


def _histogram(values) -> list[int]:
    counts, _ = np.histogram(np.asarray(values), bins=np.asarray(HISTOGRAM_BINS))
    return counts.tolist()


# --------------------------------------------------------------------------- run


def run(config: AlignmentConfig, *, show_progress: bool = True, sampled: bool = True,
        log=print) -> dict[str, Any]:
    """Run the comparison; returns the JSON payload (see the module docstring).

    Torch runs on one thread: the batches are small, so more threads only add
    contention, and one thread makes the sums, hence the numbers, reproducible.
    """
    with _digits.single_thread():
        return _run(config, show_progress=show_progress, sampled=sampled, log=log)


def _run(config: AlignmentConfig, *, show_progress: bool, sampled: bool, log) -> dict[str, Any]:
    import sera_opt

    total_start = time.perf_counter()
    setting = prepare(config)
    available = tuple(sera_opt.available_policies())
    methods, notes = build_methods(config, available)
    for note in notes:
        log(f"note: {note}")
    if sampled:
        for name in ("maxrl_advantages", "aggregate_loss"):
            if not hasattr(sera_opt, name):
                raise RuntimeError(
                    f"sera_opt.{name} is not available; the sampled estimators need it "
                    "(run with sampled=False for the expected estimator only)."
                )

    rows: dict[str, dict[int, dict[str, list]]] = {
        m.key: {b: {"expected": [], "sampled": [], "min_factor": [], "weight_cv": [],
                    "max_count": [], "fraction_at_min": [], "top5_share": [], "batch": [],
                    "sampled_batch_cosine": []}
            for b in config.budgets}
        for m in methods
    }
    failures: dict[str, dict[int, str]] = {}
    policy_cache: dict[tuple, Any] = {}
    # The first SERA call compiles the numba kernels; time it separately, not inside a row.
    start = time.perf_counter()
    sera_opt.allocate(np.array([0.2, 0.5, 0.9]), 6)
    setting.timings["first_allocate_s"] = time.perf_counter() - start

    hopeless = []
    for batch in setting.batches:
        hopeless.append(hopeless_prompts(setting.policies.current, setting.inputs[batch],
                                         setting.labels[batch]))
    steps = [(b_idx, budget) for b_idx in range(len(setting.batches)) for budget in config.budgets]
    gradients_s = 0.0
    allocate_s = 0.0
    for b_idx, nbar in _harness.progress(steps, desc="alignment", total=len(steps),
                                         enabled=show_progress):
        batch = setting.batches[b_idx]
        grads = BatchGradients(setting.policies.current, setting.inputs[batch],
                               setting.labels[batch])
        p_true = grads.success_probs
        sources = {"true": p_true, "tracker": setting.tracker_estimates[batch],
                   "none": p_true}
        m = batch.shape[0]
        budget = nbar * m
        for method in methods:
            lo = 1 + method.offset
            hi = max(config.max_ratio * nbar, lo) if method.capped else None
            cache_key = (method.policy, method.offset, lo, hi)
            t0 = time.perf_counter()
            try:
                if cache_key not in policy_cache:
                    policy_cache[cache_key] = _make_policy(method.policy, min_rollouts=lo,
                                                           max_rollouts=hi, offset=method.offset)
                policy = policy_cache[cache_key]
                if (method.source == "tracker" and setting.tracker_posterior is not None
                        and "posterior" in policy.extra_inputs):
                    # Policies that reason about uncertainty get the whole posterior.
                    alpha, beta = setting.tracker_posterior
                    alloc = policy.allocate(None, budget, posterior=(alpha[batch], beta[batch]))
                else:
                    alloc = policy.allocate(sources[method.source], budget)
            except sera_opt.SeraOptError as exc:
                failures.setdefault(method.key, {})[nbar] = str(exc)
                continue
            allocate_s += time.perf_counter() - t0
            counts = np.asarray(alloc.counts, dtype=np.int64)
            row = rows[method.key][nbar]
            t0 = time.perf_counter()
            coef = expected_coefficients(p_true, counts, method.offset,
                                         method.multiplicity_correction)
            row["expected"].append(alignment_scores(grads.weighted(coef), grads.exact))
            row["batch"].append(b_idx)
            factors = sera_opt.attenuation(p_true, counts, method.offset)
            row["min_factor"].append(float(factors.min()))
            scaled = coef * m
            row["weight_cv"].append(float(scaled.std() / scaled.mean()) if scaled.mean() > 0
                                    else float("inf"))
            row["max_count"].append(int(counts.max()))
            row["fraction_at_min"].append(float((counts == lo).mean()))
            row["top5_share"].append(float(np.sort(counts)[-5:].sum() / budget))
            if sampled:
                rng = _stream(config, "draws", b_idx, nbar, method.key)
                draws = [alignment_scores(grads.sampled(rng, counts, method), grads.exact)
                         for _ in range(config.draws)]
                row["sampled"].extend(draws)
                row["sampled_batch_cosine"].append(float(np.mean([d["cosine"] for d in draws])))
            gradients_s += time.perf_counter() - t0
    setting.timings["allocate_s"] = allocate_s
    setting.timings["gradients_s"] = gradients_s

    results = []
    for method in methods:
        for nbar in config.budgets:
            row = rows[method.key][nbar]
            if not row["expected"]:
                continue
            entry: dict[str, Any] = {
                "method": method.key,
                "policy": method.policy,
                "source": method.source,
                "offset": method.offset,
                "estimator": method.estimator,
                "multiplicity_correction": method.multiplicity_correction,
                "budget_per_prompt": nbar,
                "batches": len(row["expected"]),
                "min_factor": float(np.mean(row["min_factor"])),
                "weight_cv": float(np.mean(row["weight_cv"])),
                "max_count": int(max(row["max_count"])),
                "fraction_at_min": float(np.mean(row["fraction_at_min"])),
                "top5_share": float(np.mean(row["top5_share"])),
            }
            for metric in ("cosine", "relative_error", "norm_ratio"):
                per_batch = [s[metric] for s in row["expected"]]
                entry[f"expected_{metric}"] = float(np.mean(per_batch))
                entry[f"expected_{metric}_per_batch"] = per_batch
            if row["sampled"]:
                for metric in ("cosine", "relative_error", "norm_ratio"):
                    entry[f"sampled_{metric}"] = _summary([s[metric] for s in row["sampled"]])
                entry["draws"] = len(row["sampled"])
            _add_intervals(entry, row, rows[f"uniform c={method.offset}"][nbar])
            results.append(entry)
    setting.timings["total_s"] = time.perf_counter() - total_start

    in_batches = np.concatenate(setting.batches)
    return {
        "config": asdict(config),
        "setup": {
            "data": "scikit-learn digits (load_digits), inputs scaled to [0, 1]",
            "prompts": int(setting.labels.shape[0]),
            "model": (f"tanh MLP 64-{config.hidden}-10, {config.train_steps} full-batch Adam "
                      f"steps on labels with {config.label_noise:.0%} replaced by a wrong one, "
                      f"sampled at temperature {config.temperature}"),
            "earlier_round": (f"{config.history_rollouts} rollouts per prompt from the checkpoint "
                              f"{config.history_lag} steps earlier, through "
                              f"sera_opt.SuccessTracker() (default prior)"),
            "bounds": f"min_rollouts = 1 + c, max_rollouts = {config.max_ratio} * budget_per_prompt",
            "aggregation": "token-mean, one token (the label) per rollout",
        },
        "success_probs": {
            "bins": list(HISTOGRAM_BINS),
            "true_histogram": _histogram(setting.success_probs[in_batches]),
            "earlier_histogram": _histogram(setting.earlier_success_probs[in_batches]),
            "tracker_histogram": _histogram(setting.tracker_estimates[in_batches]),
            "mean": float(setting.success_probs[in_batches].mean()),
            "fraction_below_0.01": float((setting.success_probs[in_batches] < 0.01).mean()),
            "fraction_above_0.95": float((setting.success_probs[in_batches] > 0.95).mean()),
            "hopeless_below": HOPELESS,
            "hopeless_gradient_share": float(np.mean([h["gradient_share"] for h in hopeless])),
            "hopeless_score_norm_ratio": float(np.mean([h["score_norm_ratio"] for h in hopeless])),
            "tracker_min": float(setting.tracker_estimates[in_batches].min()),
            "tracker_mean_abs_error": float(np.abs(
                setting.tracker_estimates[in_batches] - setting.success_probs[in_batches]).mean()),
        },
        "policies_available": list(available),
        "notes": notes,
        "failures": failures,
        "results": results,
        "timings": setting.timings,
    }


# --------------------------------------------------------------------------- output


def _lookup(payload, key: str, nbar: int) -> dict | None:
    for entry in payload["results"]:
        if entry["method"] == key and entry["budget_per_prompt"] == nbar:
            return entry
    return None


def _cell(entry: dict | None, sampled: bool) -> str:
    if entry is None:
        return "-"
    text = f"{entry['expected_cosine']:.3f}"
    if sampled and "sampled_cosine" in entry:
        s = entry["sampled_cosine"]
        spread = f"{s['std']:.3f}" if np.isfinite(s["std"]) else "n/a"
        text += f" ({s['mean']:.3f}±{spread})"
    return text


def short_label(key: str) -> str:
    """A column title for a method key: ``sera/true/corrected/uncapped c=0`` -> ``SERA(true p) no cap``."""
    base = key.rsplit(" ", 1)[0]
    if base == "uniform":
        return "uniform"
    parts = base.split("/")
    policy = "SERA" if parts[0] == "sera" else parts[0]
    source = {"true": "true p", "tracker": "tracker"}.get(parts[1], parts[1])
    label = f"{policy}({source})"
    if "uncorrected" in parts:
        label += " uncorr."
    if "uncapped" in parts:
        label += " no cap"
    return label


def format_table(payload: dict, methods: list[str] | None = None, *,
                 sampled: bool = True) -> str:
    """Cosine similarity to the exact gradient, one row per budget, one column per method.

    Each cell: the expected estimator's cosine, then the sampled estimators'
    mean ± standard deviation over draws.
    """
    budgets = payload["config"]["budgets"]
    if methods is None:
        seen: list[str] = []
        for entry in payload["results"]:
            if entry["method"] not in seen:
                seen.append(entry["method"])
        methods = seen
    header = ["rollouts/prompt"] + [short_label(key) for key in methods]
    body = [[str(nbar)] + [_cell(_lookup(payload, key, nbar), sampled) for key in methods]
            for nbar in budgets]
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


_STYLE = {
    "uniform": ("black", "-", "o"),
    "sera/tracker/corrected": ("tab:blue", "-", "s"),
    "sera/tracker/uncorrected": ("tab:blue", ":", "s"),
    "sera/true/corrected": ("tab:red", "-", "^"),
    "sera/true/uncorrected": ("tab:red", ":", "^"),
    "sera/tracker/corrected/uncapped": ("tab:blue", "-.", "x"),
    "sera/true/corrected/uncapped": ("tab:red", "-.", "x"),
}
#: The lines whose expected cosine gets its interval band (more would hide the curves).
_BANDED = ("uniform", "sera/tracker/corrected")


def plot(payload: dict):
    """Histogram of ``p`` and the alignment curves; returns a matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    sp = payload["success_probs"]
    labels = [f"{a:g}-{b:g}" for a, b in zip(sp["bins"][:-1], sp["bins"][1:], strict=True)]
    x = np.arange(len(labels))
    ax = axes[0, 0]
    ax.bar(x - 0.2, sp["true_histogram"], width=0.4, label="true p (current policy)")
    ax.bar(x + 0.2, sp["tracker_histogram"], width=0.4, label="tracker estimate")
    ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("prompts")
    ax.set_title("success probabilities")
    ax.legend(fontsize=8)

    offsets = payload["config"]["offsets"]
    panels = [(axes[0, 1 + k], c, "expected_cosine", "expected estimator: cosine")
              for k, c in enumerate(offsets[:2])]
    panels += [(axes[1, 0], offsets[0], "expected_relative_error",
                "expected estimator: relative L2 error")]
    panels += [(axes[1, 1 + k], c, "sampled_cosine", "sampled estimator: cosine (mean ± sd)")
               for k, c in enumerate(offsets[:2])]
    peer_colours = _harness.arm_colors(
        dict.fromkeys(e["policy"] for e in payload["results"]))
    for ax, c, metric, title in panels:
        keys = []
        for entry in payload["results"]:
            if entry["offset"] == c and entry["method"] not in keys:
                keys.append(entry["method"])
        for key in keys:
            entries = [e for e in payload["results"] if e["method"] == key and metric in e]
            if not entries:
                continue
            base = key.rsplit(" ", 1)[0]
            policy = base.split("/")[0]
            if base in _STYLE:
                colour, ls, marker = _STYLE[base]
                lw = 2.0
            else:
                if base.endswith("uncorrected"):
                    continue  # keep the plot readable; the JSON has them
                colour, ls, marker, lw = peer_colours[policy], "--", ".", 1.0
            xs = [e["budget_per_prompt"] for e in entries]
            if isinstance(entries[0][metric], dict):
                ys = np.array([e[metric]["mean"] for e in entries])
                sd = np.array([e[metric]["std"] for e in entries])
                if base in _STYLE and "uncorrected" not in base:  # bands for the main lines only
                    ax.fill_between(xs, ys - sd, ys + sd, color=colour, alpha=0.1)
            else:
                ys = np.array([e[metric] for e in entries])
                band = [e.get(f"{metric}_interval") for e in entries]
                if (base in _BANDED and all(band)
                        and all(np.isfinite(b["ci_low"]) for b in band)):
                    # 95 % interval of the mean over batches
                    ax.fill_between(xs, [b["ci_low"] for b in band], [b["ci_high"] for b in band],
                                    color=colour, alpha=0.1)
            ax.plot(xs, ys, color=colour, linestyle=ls, marker=marker, lw=lw,
                    label=short_label(key))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rollouts per prompt (budget / M)")
        ax.set_title(f"{title}, {ESTIMATORS[c].replace('_', '-')} (c={c})"
                     + ("\nbands: 95 % interval of the mean over batches (uniform, SERA(tracker))"
                        if metric == "expected_cosine" else ""), fontsize=10)
        ax.grid(alpha=0.3)
    handles, names = axes[0, 1].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=6, fontsize=9, frameon=False)
    fig.suptitle("Alignment of MaxRL gradient estimates with the exact likelihood gradient "
                 "(digits classifier)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


# --------------------------------------------------------------------------- entry points

# The demo's one peer: the library's default allocation (RolloutPlanner's), as an arm. Its
# offset and minimum are the experiment's, set for every arm alike (RESERVED_OPTIONS).
_DEMO_OPTIONS = {k: v for k, v in DEFAULT_POLICY_OPTIONS.items()
                 if k not in _harness.RESERVED_OPTIONS}
DEMO_DEFAULT = DEFAULT_POLICY + "".join(f":{k}={v:g}" for k, v in _DEMO_OPTIONS.items())

DEMO_COLUMNS = {
    0: ["uniform c=0", f"{DEMO_DEFAULT}/tracker/corrected c=0", "sera/tracker/corrected c=0",
        "sera/tracker/uncorrected c=0", "sera/true/corrected c=0",
        "sera/true/corrected/uncapped c=0"],
    1: ["uniform c=1", f"{DEMO_DEFAULT}/tracker/corrected c=1", "sera/tracker/corrected c=1",
        "sera/true/corrected/uncapped c=1"],
}


LEGEND = """\
uniform          equal rollouts per prompt (MaxRL as published)
SERA(tracker)    SERA on posterior means from a few rollouts per prompt of an earlier round
SERA(true p)     SERA on the exact success probabilities
uncorr.          without the multiplicity correction (token-mean weights prompts by n_i)
no cap           no maximum count (max_ratio=None); otherwise n_i <= {ratio} x budget/prompt
With c=1 every policy needs 2 rollouts per prompt, so at 2 rollouts/prompt all coincide."""

DEMO_LEGEND = """\
{default}: the default allocation (RolloutPlanner's), alpha-fair with {options},
on the same posterior means; between SERA (alpha = inf) and the plain sum (alpha = 0)."""


def verdict(payload: dict, extra: tuple[str, ...] = ()) -> list[str]:
    """One line per offset: at how many budgets each SERA variant (and each method ``extra``
    names, e.g. ``"sera-fair:alpha=1/tracker/corrected"``) beats uniform (expected cosine)."""
    lines = []
    for c in payload["config"]["offsets"]:
        uniform = {e["budget_per_prompt"]: e["expected_cosine"] for e in payload["results"]
                   if e["method"] == f"uniform c={c}"}
        parts = []
        for key in (*(f"{k} c={c}" for k in extra), f"sera/tracker/corrected c={c}",
                    f"sera/true/corrected c={c}", f"sera/true/corrected/uncapped c={c}"):
            rows = [e for e in payload["results"] if e["method"] == key]
            if not rows:
                continue
            better = sum(e["expected_cosine"] > uniform[e["budget_per_prompt"]] + 1e-12
                         for e in rows)
            worse = sum(e["expected_cosine"] < uniform[e["budget_per_prompt"]] - 1e-12
                        for e in rows)
            parts.append(f"{short_label(key)} above uniform at {better}/{len(rows)} budgets, "
                         f"below at {worse}")
        lines.append(f"c={c}: " + "; ".join(parts) + ".")
    return lines


def _describe(payload: dict) -> str:
    sp = payload["success_probs"]
    cfg = payload["config"]
    return (
        f"{cfg['num_batches']} batches of {cfg['batch_size']} digits prompts; "
        f"mean p {sp['mean']:.2f}, {sp['fraction_below_0.01']:.0%} of prompts below 0.01, "
        f"{sp['fraction_above_0.95']:.0%} above 0.95.\n"
        f"Tracker: posterior means after {cfg['history_rollouts']} rollouts per prompt from "
        f"an earlier checkpoint (mean |estimate - p| = {sp['tracker_mean_abs_error']:.2f})."
    )


def _column_groups(payload: dict, c: int) -> list[list[str]]:
    """Tables of at most a handful of columns: SERA variants, peers corrected, peers not."""
    keys = list(dict.fromkeys(e["method"] for e in payload["results"] if e["offset"] == c))
    uniform = f"uniform c={c}"
    sera = [k for k in keys if k.startswith("sera/")]
    peers = [k for k in keys if k not in sera and k != uniform]
    groups = [sera[:4], sera[4:],
              [k for k in peers if "/corrected" in k],
              [k for k in peers if "/uncorrected" in k]]
    return [[uniform] + g for g in groups if g]


def _print_report(payload: dict, *, sampled: bool, columns: dict[int, list[str]] | None = None):
    print(_describe(payload))
    for c in payload["config"]["offsets"]:
        groups = ([columns[c]] if columns is not None and c in columns
                  else _column_groups(payload, c))
        print()
        print(f"Cosine similarity with the exact likelihood gradient, {ESTIMATORS[c]} "
              f"estimator (c={c}); cell: expected estimator"
              + (f" (sampled: mean±sd over {payload['config']['draws']} draws x "
                 f"{payload['config']['num_batches']} batches)" if sampled else ""))
        for keys in groups:
            print(format_table(payload, keys, sampled=sampled))
            print()


def _print_paired(payload: dict) -> None:
    """Per offset and estimator: each corrected tracker-fed method's cosine minus uniform's on
    the same batches, mean [95 % interval], one row per budget."""
    batches = payload["config"]["num_batches"]
    for c in payload["config"]["offsets"]:
        keys = [k for k in dict.fromkeys(e["method"] for e in payload["results"]
                                         if e["offset"] == c)
                if "/tracker/corrected" in k and "/uncapped" not in k]
        for metric, what in (("expected_cosine", "expected"), ("sampled_cosine", "sampled")):
            field = f"{metric}_vs_uniform"
            if not any(field in e for e in payload["results"]):
                continue
            print(f"\n{what.capitalize()} estimator's cosine minus uniform's on the same batch, "
                  f"{ESTIMATORS[c]} (c={c}): mean [95 % interval, paired t over {batches} "
                  "batches]" + (" (sampled: the mean over each batch's draws)"
                                if what == "sampled" else ""))
            for group in [keys[i:i + 4] for i in range(0, len(keys), 4)]:
                header = ["rollouts/prompt"] + [short_label(k) for k in group]
                body = []
                for nbar in payload["config"]["budgets"]:
                    cells = [str(nbar)]
                    for key in group:
                        entry = _lookup(payload, key, nbar)
                        d = entry.get(field) if entry else None
                        cells.append("-" if d is None else _harness.format_interval(
                            d["mean"], d["ci_low"], d["ci_high"]))
                    body.append(cells)
                widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
                for r in [header] + body:
                    print("  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True)))
    if batches < 2:
        print("note: one batch: the intervals are undefined (shown as 'no interval').")


def check_peers(config: AlignmentConfig) -> None:
    """Refuse, before anything runs, a peer that is malformed, unknown, or whose policy does
    not build and allocate with the benchmark's bounds (at each offset, largest budget)."""
    specs = _harness.parse_arms(config.peers)
    nbar = max(config.budgets)
    for c in config.offsets:
        lo = 1 + c
        _harness.check_arms(specs, min_rollouts=lo, max_rollouts=max(config.max_ratio * nbar, lo),
                            offset=c, num_prompts=config.batch_size,
                            budget=nbar * config.batch_size)


def _parser(prog: str, description: str, *, for_demo: bool = False) -> argparse.ArgumentParser:
    if for_demo:
        # The demo is always the quick preset and writes nothing unless asked.
        parser = argparse.ArgumentParser(prog=prog, description=description)
        parser.add_argument("--out", type=Path, default=None,
                            help="also write the results as demo.json into this folder")
        parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
        parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    else:
        parser = _harness.common_parser(NAME, description)
        parser.prog = prog
    parser.add_argument("--budgets", type=int, nargs="+",
                        help="average rollouts per prompt (default: 2 4 8 16 32 64)")
    parser.add_argument("--draws", type=int, help="sampled draws per batch and method")
    parser.add_argument("--batches", type=int, help="number of prompt batches")
    parser.add_argument("--batch-size", type=int, help="prompts per batch (default: 256)")
    parser.add_argument("--history-rollouts", type=int,
                        help="rollouts per prompt in the earlier round that feeds the tracker")
    parser.add_argument("--max-ratio", type=int,
                        help="max_rollouts = this * budget per prompt (default: 4)")
    parser.add_argument("--peers", nargs="*",
                        help="peer policies to compare, each a name or "
                             "name:key=value[:key=value...] (default: "
                             f"{' '.join(PEERS)}"
                             + ("; the demo compares none unless asked)" if for_demo else
                                f"; the report run uses {' '.join(REPORT_PEERS)})"))
    parser.add_argument("--expected-only", action="store_true",
                        help="skip the sampled estimators (no torch estimator needed)")
    return parser


def _config_from(args, base: AlignmentConfig) -> AlignmentConfig:
    updates: dict[str, Any] = {"seed": args.seed}
    for arg, name in (("budgets", "budgets"), ("draws", "draws"), ("batches", "num_batches"),
                      ("batch_size", "batch_size"), ("history_rollouts", "history_rollouts"),
                      ("max_ratio", "max_ratio"), ("peers", "peers")):
        value = getattr(args, arg)
        if value is not None:
            updates[name] = tuple(value) if isinstance(value, list) else value
    return replace(base, **updates)


def main(argv=None) -> int:
    """``sera-opt bench alignment``: write alignment.json and alignment.png to ``--out``."""
    parser = _parser("sera-opt bench alignment",
                     "Alignment of MaxRL gradient estimates with the exact likelihood gradient "
                     "on a digits classifier, for uniform, SERA and peer allocations.")
    args = parser.parse_args(argv)
    config = _config_from(args, QUICK if args.quick else FULL)
    check_peers(config)
    payload = run(config, show_progress=not args.no_progress, sampled=not args.expected_only)
    payload["command"] = "sera-opt bench alignment " + " ".join(
        sys.argv[1:] if argv is None else list(argv))
    _print_report(payload, sampled=not args.expected_only)
    _print_paired(payload)
    print("\nExpected-estimator cosine versus uniform:")
    for line in verdict(payload):
        print("  " + line)
    json_path = _harness.write_json(args.out, NAME, payload)
    fig_path = _harness.save_figure(plot(payload), args.out, NAME)
    print(f"\nwrote {json_path} and {fig_path} ({payload['timings']['total_s']:.1f} s)")
    return 0


def demo(argv=None) -> int:
    """``sera-opt demo``: the quick alignment comparison, printed as a table."""
    parser = _parser("sera-opt demo",
                     "Quick comparison of SERA and uniform MaxRL: how well the gradient "
                     "estimate aligns with the exact likelihood gradient of a digits classifier.",
                     for_demo=True)
    args = parser.parse_args(argv)
    config = _config_from(args, QUICK)
    chosen = args.peers is not None
    if not chosen:
        config = replace(config, peers=(DEMO_DEFAULT,))  # the default allocation beside SERA
    check_peers(config)
    start = time.perf_counter()
    payload = run(config, show_progress=not args.no_progress, sampled=not args.expected_only)
    print("sera-opt demo: how well the MaxRL batch gradient aligns with the exact likelihood")
    print("gradient of a digits classifier (1.0 = same direction).")
    _print_report(payload, sampled=not args.expected_only,
                  columns=None if chosen else DEMO_COLUMNS)
    print()
    print(LEGEND.format(ratio=config.max_ratio))
    if not chosen:
        print(DEMO_LEGEND.format(default=short_label(f"{DEMO_DEFAULT}/tracker"), options=", ".join(
            f"{k} = {v:g}" for k, v in _DEMO_OPTIONS.items())))
    print()
    print("Expected-estimator cosine versus uniform:")
    for line in verdict(payload, () if chosen else (f"{DEMO_DEFAULT}/tracker/corrected",)):
        print("  " + line)
    if args.out is not None:
        _harness.write_json(args.out, "demo", payload)
    t = payload["timings"]
    print(f"({time.perf_counter() - start:.1f} s: training {t['train_s']:.1f} s, first allocation "
          f"(numba compile or cache load) {t['first_allocate_s']:.1f} s. Full run with the peers: "
          f"sera-opt bench alignment)")
    return 0
