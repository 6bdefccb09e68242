"""How well MaxRL gradient estimates align with the exact likelihood gradient.

docs/theory.md section 6. A digits classifier plays the policy (see
``benchmarks/alignment/digits.py``): a prompt is an input, a rollout samples a label,
success means the true label, so every ``grad log p_i`` is exact. For a batch
of ``M`` prompts and an average budget of ``nbar`` rollouts per prompt, each
method (an allocation policy, the probabilities it is fed, the estimator's
offset ``c`` and whether the multiplicity correction is on) is scored by

* the **expected estimator** ``sum_i v_i w_c(p_i, n_i) grad log p_i`` with
  ``v_i = 1/M`` under the multiplicity correction and ``v_i = n_i / B`` without
  it (token-mean aggregation, docs/theory.md section 4), and
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
registered; and the arms in rounds (``round_arms``, e.g. ``uniform:rounds=4``) on
the tracker's posteriors updated round by round and on the true ``p``, corrected.
All policies get the same bounds: ``1 + c <= n_i <= max_ratio * nbar``.

A step in rounds has counts that depend on its rewards, so its expected estimator
is simulated: ``round_sessions`` sessions per batch and budget give ``kappa_i =
P(K_i >= 1) - c p_i (1 - p_i)^(n0_i - 1)`` (docs/theory.md section 9) as the fraction
of sessions in which prompt i drew a success, and the expected estimator is
``(1/M) sum_i kappa_i grad log p_i``; its sampled estimators are the first
``draws`` of those sessions, with the first-round baseline at ``c = 1``.
A peer is a policy name or a specification with options, such as
``sera-fair:alpha=1`` (see :func:`sera_opt.benchmarks._harness.parse_arm`).

Per budget, every method's cosines come with a 95 % interval across batches
(t over the batch means) and, beside uniform's, the paired difference to
uniform's on the same batches (paired t over batches).

Run ``sera-opt bench alignment`` (full, seed 0), ``sera-opt bench alignment
--quick``, or ``sera-opt demo`` for the quick comparison as a table.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict
from typing import Any

import numpy as np

import sera_opt
from sera_opt.benchmarks import _harness
from sera_opt.benchmarks.alignment import digits as _digits
from sera_opt.rounds import run_rounds

from .config import HISTOGRAM_BINS, AlignmentConfig, build_methods
from .gradients import (
    HOPELESS,
    BatchGradients,
    alignment_scores,
    expected_coefficients,
    hopeless_prompts,
    make_policy,
    prepare,
    sample_rollouts,
    stream,
)


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


def run(config: AlignmentConfig, *, show_progress: bool = True, sampled: bool = True,
        log=print) -> dict[str, Any]:
    """Run the comparison; returns the JSON payload (see the module docstring).

    Torch runs on one thread: the batches are small, so more threads only add
    contention, and one thread makes the sums, hence the numbers, reproducible.
    """
    with _digits.single_thread():
        return _run(config, show_progress=show_progress, sampled=sampled, log=log)


def _run(config: AlignmentConfig, *, show_progress: bool, sampled: bool, log) -> dict[str, Any]:
    total_start = time.perf_counter()
    setting = prepare(config)
    available = tuple(sera_opt.available_policies())
    methods, notes = build_methods(config, available)
    for note in notes:
        log(f"note: {note}")
    if sampled:
        _check_sampled_estimators()
    rows = {m.key: {b: _empty_row() for b in config.budgets} for m in methods}
    failures: dict[str, dict[int, str]] = {}
    # The first SERA call compiles the numba kernels; time it separately, not inside a row.
    start = time.perf_counter()
    sera_opt.allocate(np.array([0.2, 0.5, 0.9]), 6)
    setting.timings["first_allocate_s"] = time.perf_counter() - start

    hopeless = [hopeless_prompts(setting.policies.current, setting.inputs[batch],
                                 setting.labels[batch]) for batch in setting.batches]
    _score_all(config, setting, methods, rows, failures, sampled=sampled,
               show_progress=show_progress)
    results = [_result_entry(method, nbar, rows[method.key][nbar],
                             rows[f"uniform c={method.offset}"][nbar])
               for method in methods for nbar in config.budgets
               if rows[method.key][nbar]["expected"]]
    setting.timings["total_s"] = time.perf_counter() - total_start
    return {
        "config": asdict(config),
        "setup": _setup_description(config, setting),
        "success_probs": _success_prob_summary(setting, hopeless),
        "policies_available": list(available),
        "notes": notes,
        "failures": failures,
        "results": results,
        "timings": setting.timings,
    }


def _check_sampled_estimators() -> None:
    for name in ("maxrl_advantages", "aggregate_loss"):
        if not hasattr(sera_opt, name):
            raise RuntimeError(
                f"sera_opt.{name} is not available; the sampled estimators need it "
                "(run with sampled=False for the expected estimator only)."
            )


def _empty_row() -> dict[str, list]:
    return {"expected": [], "sampled": [], "min_factor": [], "weight_cv": [], "max_count": [],
            "fraction_at_min": [], "top5_share": [], "batch": [], "sampled_batch_cosine": []}


def _score_all(config: AlignmentConfig, setting, methods, rows, failures, *, sampled: bool,
               show_progress: bool) -> None:
    """Every method on every batch and budget: allocate, then score the expected (and,
    with ``sampled``, the sampled) estimator into ``rows``; refusals go to ``failures``."""
    policy_cache: dict[tuple, Any] = {}
    steps = [(b_idx, budget) for b_idx in range(len(setting.batches)) for budget in config.budgets]
    gradients_s = 0.0
    allocate_s = 0.0
    rounds_s = 0.0
    for b_idx, nbar in _harness.progress(steps, desc="alignment", total=len(steps),
                                         enabled=show_progress):
        batch = setting.batches[b_idx]
        grads = BatchGradients(setting.policies.current, setting.inputs[batch],
                               setting.labels[batch])
        for method in methods:
            t0 = time.perf_counter()
            if method.in_rounds:
                try:
                    _score_rounds(config, setting, method, policy_cache, b_idx, grads, nbar,
                                  rows[method.key][nbar], sampled=sampled)
                except sera_opt.SeraOptError as exc:
                    failures.setdefault(method.key, {})[nbar] = str(exc)
                rounds_s += time.perf_counter() - t0
                continue
            try:
                counts = _allocate(config, setting, method, policy_cache, batch,
                                   grads.success_probs, nbar)
            except sera_opt.SeraOptError as exc:
                failures.setdefault(method.key, {})[nbar] = str(exc)
                continue
            allocate_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            _score(config, grads, method, counts, b_idx, nbar, rows[method.key][nbar],
                   sampled=sampled)
            gradients_s += time.perf_counter() - t0
    setting.timings["allocate_s"] = allocate_s
    setting.timings["gradients_s"] = gradients_s
    setting.timings["rounds_s"] = rounds_s


def _policy(config: AlignmentConfig, method, policy_cache: dict, nbar: int):
    lo = 1 + method.offset
    hi = max(config.max_ratio * nbar, lo) if method.capped else None
    cache_key = (method.policy, method.offset, lo, hi)
    if cache_key not in policy_cache:
        policy_cache[cache_key] = make_policy(method.policy, min_rollouts=lo, max_rollouts=hi,
                                              offset=method.offset)
    return policy_cache[cache_key]


def _allocate(config: AlignmentConfig, setting, method, policy_cache: dict, batch,
              p_true: np.ndarray, nbar: int) -> np.ndarray:
    """The method's counts for one batch at ``nbar`` rollouts per prompt."""
    policy = _policy(config, method, policy_cache, nbar)
    budget = nbar * batch.shape[0]
    if (method.source == "tracker" and setting.tracker_posterior is not None
            and "posterior" in policy.extra_inputs):
        # Policies that reason about uncertainty get the whole posterior.
        alpha, beta = setting.tracker_posterior
        alloc = policy.allocate(None, budget, posterior=(alpha[batch], beta[batch]))
    else:
        sources = {"true": p_true, "tracker": setting.tracker_estimates[batch], "none": p_true}
        alloc = policy.allocate(sources[method.source], budget)
    return np.asarray(alloc.counts, dtype=np.int64)


def _score(config: AlignmentConfig, grads, method, counts: np.ndarray, b_idx: int, nbar: int,
           row: dict[str, list], *, sampled: bool) -> None:
    """One allocation's scores and shape statistics, appended to its row."""
    p_true = grads.success_probs
    m = counts.shape[0]
    lo = 1 + method.offset
    coef = expected_coefficients(p_true, counts, method.offset, method.multiplicity_correction)
    row["expected"].append(alignment_scores(grads.weighted(coef), grads.exact))
    row["batch"].append(b_idx)
    factors = sera_opt.attenuation(p_true, counts, method.offset)
    row["min_factor"].append(float(factors.min()))
    scaled = coef * m
    row["weight_cv"].append(float(scaled.std() / scaled.mean()) if scaled.mean() > 0
                            else float("inf"))
    row["max_count"].append(int(counts.max()))
    row["fraction_at_min"].append(float((counts == lo).mean()))
    row["top5_share"].append(float(np.sort(counts)[-5:].sum() / (nbar * m)))
    if sampled:
        rng = stream(config, "draws", b_idx, nbar, method.key)
        draws = [alignment_scores(grads.sampled(rng, counts, method), grads.exact)
                 for _ in range(config.draws)]
        row["sampled"].extend(draws)
        row["sampled_batch_cosine"].append(float(np.mean([d["cosine"] for d in draws])))


def _score_rounds(config: AlignmentConfig, setting, method, policy_cache: dict, b_idx: int,
                  grads, nbar: int, row: dict[str, list], *, sampled: bool) -> None:
    """A method in rounds on one batch: ``config.round_sessions`` simulated steps.

    Each session samples labels round by round (the tracker's posteriors, or the true p,
    decide each round from the earlier ones). The expected estimator's coefficient of
    ``grad log p_i`` is ``kappa_i / M`` (multiplicity-corrected), with ``kappa_i =
    P(K_i >= 1) - c p_i (1 - p_i)^(n0_i - 1)`` (docs/theory.md section 9; the first round
    ``n0_i`` is fixed before sampling), and ``P(K_i >= 1)`` is the fraction of sessions
    in which prompt i drew a success: unbiased, with a standard error below
    ``0.5 / sqrt(round_sessions)``. The first ``draws`` sessions also give the sampled
    gradients (first-round baseline at c = 1).
    """
    arm = method.arm
    policy = _policy(config, method, policy_cache, nbar)
    batch = setting.batches[b_idx]
    p_true = grads.success_probs
    m = p_true.shape[0]
    budget = nbar * m
    planner = None
    if method.source == "tracker":
        planner = sera_opt.RolloutPlanner(policy, tracker=setting.tracker)
    rng = stream(config, "rounds", b_idx, nbar, method.key)
    hits = np.zeros(m)
    first = None
    counts_seen, at_min, top5, draws = [], [], [], []
    lo = 1 + method.offset
    for s in range(config.round_sessions):
        with warnings.catch_warnings():
            # The arm's rounds are an upper bound across the budgets swept: where the
            # first round takes the whole budget (c = 1, two rollouts a prompt) the
            # session runs that round alone, as it says.
            warnings.simplefilter("ignore", sera_opt.SeraOptWarning)
            if planner is not None:
                # observe=False: the tracker is the earlier round's, the same for every
                # session
                session = planner.start_rounds(batch, budget, rounds=arm.rounds,
                                               first_round=arm.first, observe=False)
            else:
                session = policy.start_rounds(p_true, budget, rounds=arm.rounds,
                                              first_round=arm.first)
        labels, index, rounds = [], [], []
        totals, successes = np.zeros(m, dtype=np.int64), np.zeros(m)

        def sample(counts):
            nonlocal first, totals, successes
            prompt_index, drawn = sample_rollouts(rng, grads.label_probs, counts)
            rewards = (drawn == grads.labels[prompt_index]).astype(np.float64)
            if not rounds:
                first = counts  # the first round is fixed before sampling: the same each time
            totals += counts
            successes += np.bincount(prompt_index, weights=rewards, minlength=m)
            labels.append(drawn)
            index.append(prompt_index)
            rounds.append(np.full(prompt_index.shape[0], len(rounds), dtype=np.int64))
            return rewards

        run_rounds(session, sample)
        # (session.result() is not needed: the rows are the ones drawn here; its factors,
        # the session's own approximation of kappa, are not used)
        hits += successes >= 1
        counts_seen.append(int(totals.max()))
        at_min.append(float((totals == lo).mean()))
        top5.append(float(np.sort(totals)[-5:].sum() / budget))
        if sampled and s < config.draws:
            estimate = grads.gradient_of(np.concatenate(index), np.concatenate(labels), method,
                                         np.concatenate(rounds))
            draws.append(alignment_scores(estimate, grads.exact))
    if int(first.sum()) == budget:
        # the first round took the whole budget (at c = 1 with two rollouts a prompt): a
        # static allocation, whose scale is exact
        kappa = sera_opt.attenuation(p_true, first, method.offset)
    else:
        kappa = hits / config.round_sessions
        if method.offset == 1:
            kappa = kappa - p_true * (1.0 - p_true) ** (first - 1)
    coef = kappa / m
    row["expected"].append(alignment_scores(grads.weighted(coef), grads.exact))
    row["batch"].append(b_idx)
    row["min_factor"].append(float(kappa.min()))
    row["weight_cv"].append(float(kappa.std() / kappa.mean()) if kappa.mean() > 0
                            else float("inf"))
    row["max_count"].append(max(counts_seen))
    row["fraction_at_min"].append(float(np.mean(at_min)))
    row["top5_share"].append(float(np.mean(top5)))
    if sampled:
        row["sampled"].extend(draws)
        row["sampled_batch_cosine"].append(float(np.mean([d["cosine"] for d in draws])))


def _result_entry(method, nbar: int, row: dict[str, list], uniform: dict[str, list]) -> dict:
    """A method's result at one budget: means over batches, summaries of the draws, and the
    intervals (paired to ``uniform``'s row)."""
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
    _add_intervals(entry, row, uniform)
    return entry


def _setup_description(config: AlignmentConfig, setting) -> dict[str, Any]:
    return {
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
    }


def _success_prob_summary(setting, hopeless: list[dict[str, float]]) -> dict[str, Any]:
    """The batches' success probabilities, true, earlier and the tracker's, in short."""
    in_batches = np.concatenate(setting.batches)
    true = setting.success_probs[in_batches]
    tracker = setting.tracker_estimates[in_batches]
    return {
        "bins": list(HISTOGRAM_BINS),
        "true_histogram": _histogram(true),
        "earlier_histogram": _histogram(setting.earlier_success_probs[in_batches]),
        "tracker_histogram": _histogram(tracker),
        "mean": float(true.mean()),
        "fraction_below_0.01": float((true < 0.01).mean()),
        "fraction_above_0.95": float((true > 0.95).mean()),
        "hopeless_below": HOPELESS,
        "hopeless_gradient_share": float(np.mean([h["gradient_share"] for h in hopeless])),
        "hopeless_score_norm_ratio": float(np.mean([h["score_norm_ratio"] for h in hopeless])),
        "tracker_min": float(tracker.min()),
        "tracker_mean_abs_error": float(np.abs(tracker - true).mean()),
    }
