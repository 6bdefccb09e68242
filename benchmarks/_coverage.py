"""The coverage-expansion experiments' shared pieces: arms, epochs, the regime check, the rule.

The ``expand`` presets of ``arithmetic`` and ``trl-coverage`` and the maze's
``paper`` preset ask whether SERA, run as its authors run it, raises coverage
(held-out pass@64) where training can raise it at all, against uniform MaxRL and
against GRPO. The decision rule was fixed before the runs in
docs/decisions/2026-12-07-coverage-expansion-rule.md; this module computes what it
reads:

* **Arms** named by what they are (:func:`parse_loop_arm`): ``uniform`` (MaxRL with
  uniform counts), ``grpo`` (uniform counts, :func:`sera_opt.grpo_advantages`),
  ``sera-paper`` (the authors' configuration: :meth:`sera_opt.RolloutPlanner.paper_sera`,
  estimates frozen per epoch, :meth:`~sera_opt.RolloutPlanner.end_epoch` at each pass
  over the data), ``sera-paper:rounding=exact`` and ``sera-paper:cold_start=prior``
  (the library's improvements on it), and any registered policy with options
  (``sera-fair:alpha=1``), which gets a forgetting :class:`sera_opt.SuccessTracker`.
* **The regime check** (:func:`warm_start_regime`, :func:`regime_check`): on the warm
  start at least 20 % of the training prompts with success in (0, 0.1] and at most 10 %
  at 0, and uniform MaxRL raising held-out pass@64 over the warm start by at least
  +0.03 with its 95 % interval above 0. A configuration that fails decides nothing.
* **The rule's comparisons** (:func:`rule_comparisons`) with Holm's correction, and the
  gains by warm-start success bin (:func:`gains_by_bin`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sera_opt.benchmarks import _harness
from sera_opt.exceptions import SeraOptError

__all__ = ["COVERAGE_ARMS", "PAPER", "GRPO", "LoopArm", "parse_loop_arm", "parse_loop_arms",
           "build_planner", "EpochClock", "active_set_row", "REGIME", "warm_start_regime",
           "regime_check", "format_regime", "holm", "rule_comparisons", "format_rule",
           "gains_by_bin", "SUCCESS_BINS"]

#: The authors' configuration, and the estimator arm.
PAPER = "sera-paper"
GRPO = "grpo"
#: The arms of the coverage experiments, named before the runs: the baseline, GRPO, the
#: authors' SERA, sera-fair with a forgetting tracker, and the library's two improvements
#: on the authors' configuration (exact rounding; each unseen prompt at the prior mean
#: instead of the whole batch uniform).
COVERAGE_ARMS = ("uniform", GRPO, PAPER, "sera-fair:alpha=1", "sera-paper:rounding=exact",
                 "sera-paper:cold_start=prior")

#: Options of a ``sera-paper`` arm that configure its tracker, not its policy.
_TRACKER_OPTIONS = ("cold_start",)


@dataclass(frozen=True)
class LoopArm:
    """One arm of the project's own loops (arithmetic, maze).

    Attributes
    ----------
    label : str
        The arm as written; its name in the results.
    estimator : {"maxrl", "grpo"}
        Which advantages the loss is built from.
    spec : ArmSpec or None
        The allocation policy of a MaxRL arm that is not the authors' configuration
        (``uniform`` for ``grpo``); None for ``sera-paper`` arms.
    paper : bool
        The authors' configuration: its planner comes from
        :meth:`sera_opt.RolloutPlanner.paper_sera` and its epochs end at each pass.
    policy_options, tracker_options : tuple of (str, value) pairs
        A ``sera-paper`` arm's options for the policy and for its tracker.
    """

    label: str
    estimator: str
    spec: _harness.ArmSpec | None = None
    paper: bool = False
    policy_options: tuple[tuple[str, Any], ...] = ()
    tracker_options: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def rounds(self) -> int:
        return 1 if self.spec is None else self.spec.rounds

    @property
    def is_reinforce_ada(self) -> bool:
        return self.spec is not None and self.spec.is_reinforce_ada


def parse_loop_arm(text: str) -> LoopArm:
    """Parse an arm of the project's loops (see the module's docstring)."""
    if not isinstance(text, str):
        raise _harness.ArmSpecError(f"an arm is a string such as 'sera-paper', got {text!r}.")
    label = text.strip()
    name = _harness.arm_policy_name(label)
    if name == GRPO:
        if label != GRPO:
            raise _harness.ArmSpecError(
                f"arm {label!r}: grpo is uniform counts with TRL's group-normalized advantages; "
                "it takes no options.")
        return LoopArm(label=label, estimator="grpo", spec=_harness.parse_arm("uniform"))
    if name == PAPER:
        options = _paper_options(label)
        policy = tuple((k, v) for k, v in options if k not in _TRACKER_OPTIONS)
        tracker = tuple((k, v) for k, v in options if k in _TRACKER_OPTIONS)
        return LoopArm(label=label, estimator="maxrl", paper=True, policy_options=policy,
                       tracker_options=tracker)
    return LoopArm(label=label, estimator="maxrl", spec=_harness.parse_arm(label))


def _paper_options(label: str) -> tuple[tuple[str, Any], ...]:
    """The ``key=value`` options of a ``sera-paper`` arm; a bare word is a string
    (``rounding=exact``, ``cold_start=prior``), anything else a Python literal."""
    import ast

    _, *items = [part.strip() for part in _harness._split_top_level(label, ":")]
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key.isidentifier() or not value:
            raise _harness.ArmSpecError(
                f"arm {label!r}: {item!r} is not of the form key=value "
                "(write e.g. 'sera-paper:rounding=exact').")
        if key in options:
            raise _harness.ArmSpecError(f"arm {label!r}: option {key!r} is given twice.")
        if key in _harness.ROUND_OPTIONS or key in _harness.RESERVED_OPTIONS:
            raise _harness.ArmSpecError(
                f"arm {label!r}: the authors' configuration plans each step once with its own "
                f"bounds; {key} cannot be set.")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            if not value.isidentifier():
                raise _harness.ArmSpecError(
                    f"arm {label!r}: the value {value!r} of {key!r} is neither a word nor a "
                    "Python literal.") from None
            options[key] = value
    return tuple(options.items())


def parse_loop_arms(arms: str | Sequence[str]) -> tuple[LoopArm, ...]:
    """Parse comma-separated arms (or a sequence); a repeated label is refused."""
    texts = _harness._split_top_level(arms, ",") if isinstance(arms, str) else list(arms)
    parsed = tuple(parse_loop_arm(t) for t in texts)
    labels = [a.label for a in parsed]
    if len(set(labels)) != len(labels):
        raise _harness.ArmSpecError(f"give each arm once: {labels}.")
    return parsed


def build_planner(arm: LoopArm, *, min_rollouts: int, max_rollouts: int, offset: int,
                  tracker_decay: float, num_prompts: int | None = None):
    """The arm's :class:`sera_opt.RolloutPlanner`.

    ``sera-paper`` arms get the authors' whole configuration (their bounds ``[2, 4
    N0]``, their tracker); the experiment's bounds must be those (checked by
    :func:`check_paper_bounds`). Every other arm gets its policy with the experiment's
    bounds and offset and a :class:`sera_opt.SuccessTracker` that forgets
    (``decay=tracker_decay``).
    """
    import sera_opt

    if arm.paper:
        paper_sera = getattr(sera_opt.RolloutPlanner, "paper_sera", None)
        if paper_sera is None:
            raise SeraOptError(
                f"arm {arm.label!r} needs RolloutPlanner.paper_sera (the authors' SERA); this "
                "sera_opt does not have it yet: update it, or drop the sera-paper arms.")
        try:
            return paper_sera(**dict(arm.tracker_options), **dict(arm.policy_options))
        except (SeraOptError, TypeError, ValueError) as exc:
            raise _harness.ArmSpecError(f"arm {arm.label!r}: {_harness._one_line(exc)}") from None
    options = {} if num_prompts is None else {"num_prompts": num_prompts}
    tracker = sera_opt.SuccessTracker(decay=tracker_decay, **options)
    if arm.is_reinforce_ada:
        return sera_opt.RolloutPlanner(tracker=tracker)
    policy = arm.spec.build(min_rollouts=min_rollouts, max_rollouts=max_rollouts, offset=offset)
    return sera_opt.RolloutPlanner(policy, tracker=tracker)


def check_paper_bounds(arms: Sequence[LoopArm], *, rollouts_per_prompt: int,
                       min_rollouts: int, max_rollouts: int) -> None:
    """Refuse a configuration whose common bounds differ from the authors' ``[2, 4 N0]``
    while it runs ``sera-paper`` arms: their counts would not share the others' range."""
    if any(a.paper for a in arms) and (min_rollouts, max_rollouts) != (2, 4 * rollouts_per_prompt):
        raise SeraOptError(
            f"the sera-paper arms allocate within the authors' bounds [2, 4 N0] = [2, "
            f"{4 * rollouts_per_prompt}], but this configuration gives every arm "
            f"[{min_rollouts}, {max_rollouts}]; set min_rollouts=2 and max_rollouts="
            f"{4 * rollouts_per_prompt}, or drop the sera-paper arms.")


class EpochClock:
    """Counts the prompts a run has visited and says when a pass over ``num_train`` ends.

    The authors' estimates are frozen per epoch; a run calls
    ``planner.end_epoch()`` whenever :meth:`advance` returns True.
    """

    def __init__(self, num_train: int):
        if num_train < 1:
            raise SeraOptError(f"num_train must be at least 1, got {num_train}.")
        self.num_train = int(num_train)
        self.visited = 0
        self.epochs = 0

    def advance(self, num_prompts: int) -> bool:
        """Count a step of ``num_prompts`` prompts; True if a pass ended within it."""
        self.visited += int(num_prompts)
        ended = self.visited // self.num_train > self.epochs
        self.epochs = self.visited // self.num_train
        return ended


def active_set_row(allocation) -> dict[str, float]:
    """The step's active fraction, prompts switched off as too easy / too hard, and forced
    activations (all active, none forced, for a plan without an active set)."""
    active_set = getattr(allocation, "active_set", None)
    if active_set is None:
        return {"active_fraction": 1.0, "too_easy": 0.0, "too_hard": 0.0, "forced": 0.0}
    return {"active_fraction": float(active_set.active_fraction),
            "too_easy": float(active_set.num_too_easy),
            "too_hard": float(active_set.num_too_hard), "forced": float(active_set.forced)}


# --------------------------------------------------------------------------- regime check

#: The pre-registered regime check (docs/decisions/2026-12-07-coverage-expansion-rule.md).
REGIME = {"low_band": (0.0, 0.1), "min_low_fraction": 0.20, "max_zero_fraction": 0.10,
          "min_gain_pass64": 0.03, "k": 64}


def warm_start_regime(success_rates) -> dict[str, Any]:
    """The warm start's half of the regime check, from the training prompts' sampled success
    rates (one seed): the fractions in (0, 0.1] and at 0, and whether they pass."""
    rates = np.asarray(success_rates, dtype=np.float64)
    if rates.ndim != 1 or rates.size == 0:
        raise SeraOptError("success_rates must be one rate per training prompt.")
    low, high = REGIME["low_band"]
    in_band = float(np.mean((rates > low) & (rates <= high)))
    zero = float(np.mean(rates == 0))
    return {"fraction_low": in_band, "fraction_zero": zero,
            "mean_success": float(rates.mean()),
            "passes": in_band >= REGIME["min_low_fraction"] and zero <= REGIME["max_zero_fraction"]}


def regime_check(train_success_rates: Sequence, warm_pass_at_k: Sequence,
                 uniform_pass_at_k: Sequence) -> dict[str, Any]:
    """The whole regime check of one configuration, over its seeds.

    Parameters
    ----------
    train_success_rates : sequence of arrays
        Per seed, the warm start's sampled success rate of every training prompt.
    warm_pass_at_k, uniform_pass_at_k : sequence of arrays
        Per seed (same order), the held-out pass@k curves (k = 1..K, K >= 64) of the
        warm start and of the uniform arm at its final step.

    Returns
    -------
    dict
        ``warm_start`` (per seed and the mean fractions), ``gain`` (the paired
        difference of uniform to the warm start at pass@64), ``passes`` and a
        one-line ``verdict``.
    """
    k = REGIME["k"]
    per_seed = [warm_start_regime(r) for r in train_success_rates]
    low = float(np.mean([s["fraction_low"] for s in per_seed]))
    zero = float(np.mean([s["fraction_zero"] for s in per_seed]))
    spread_ok = low >= REGIME["min_low_fraction"] and zero <= REGIME["max_zero_fraction"]
    warm = np.asarray(warm_pass_at_k, dtype=np.float64)
    uniform = np.asarray(uniform_pass_at_k, dtype=np.float64)
    if warm.ndim != 2 or warm.shape[1] < k or warm.shape != uniform.shape:
        raise SeraOptError(f"the regime check needs pass@k curves up to k = {k} per seed, "
                           f"warm start and uniform alike; got {warm.shape} and {uniform.shape}.")
    gain = _harness.paired_difference(uniform[:, k - 1], warm[:, k - 1])
    gain_ok = bool(gain["mean"] >= REGIME["min_gain_pass64"] and np.isfinite(gain["ci_low"])
                   and gain["ci_low"] > 0)
    passes = bool(spread_ok and gain_ok)
    if passes:
        verdict = "passes the regime check: its comparisons decide"
    else:
        reasons = []
        if low < REGIME["min_low_fraction"]:
            reasons.append(f"{low:.0%} of training prompts in (0, 0.1], under 20 %")
        if zero > REGIME["max_zero_fraction"]:
            reasons.append(f"{zero:.0%} at 0, over 10 %")
        if not gain_ok:
            reasons.append(f"uniform - warm start at pass@{k} is {gain['mean']:+.3f} "
                           f"[{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}], not >= "
                           f"+{REGIME['min_gain_pass64']} with its interval above 0")
        verdict = "fails the regime check (" + "; ".join(reasons) + "): it decides nothing"
    return {"rule": dict(REGIME), "warm_start": {"per_seed": per_seed, "fraction_low": low,
                                                 "fraction_zero": zero, "passes": spread_ok},
            "gain": gain, "gain_passes": gain_ok, "passes": passes, "verdict": verdict}


def format_regime(check: Mapping[str, Any] | None = None, *, warm: Mapping | None = None,
                  label: str = "") -> str:
    """One or two lines: the warm start's half (``warm``, one seed) or a whole check."""
    head = f"regime check{' of ' + label if label else ''}: "
    if check is None:
        if warm is None:
            raise SeraOptError("give a whole check or a warm start's half.")
        return (head + f"warm start: {warm['fraction_low']:.1%} of training prompts in (0, 0.1] "
                f"(>= 20 %), {warm['fraction_zero']:.1%} at 0 (<= 10 %), mean success "
                f"{warm['mean_success']:.3f}: {'passes' if warm['passes'] else 'FAILS'}")
    w, g = check["warm_start"], check["gain"]
    return (head + f"warm start (mean over seeds) {w['fraction_low']:.1%} in (0, 0.1], "
            f"{w['fraction_zero']:.1%} at 0; uniform - warm start at pass@64 "
            f"{_harness.format_interval(g['mean'], g['ci_low'], g['ci_high'])}\n  this "
            f"configuration {check['verdict']}")


# --------------------------------------------------------------------------- the rule


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (family-wise error), keyed as given; NaN stays NaN
    and does not count in the family."""
    items = sorted(((p, key) for key, p in p_values.items() if np.isfinite(p)))
    m = len(items)
    out = {key: float("nan") for key in p_values}
    running = 0.0
    for rank, (p, key) in enumerate(items):
        running = max(running, min(1.0, (m - rank) * p))
        out[key] = running
    return out


#: The k of the rule's comparisons.
RULE_KS = (1, 8, 64)


def _comparisons(arms: Sequence[str]) -> tuple[list, list]:
    """(primary, secondary) lists of (candidate, baseline, k) among ``arms``."""
    primary = [(PAPER, "uniform", 64)] if PAPER in arms and "uniform" in arms else []
    secondary = []
    if PAPER in arms and "uniform" in arms:
        secondary += [(PAPER, "uniform", k) for k in (1, 8)]
    if "uniform" in arms and GRPO in arms:
        secondary += [("uniform", GRPO, k) for k in RULE_KS]
    fair = [a for a in arms if _harness.arm_policy_name(a) == "sera-fair"]
    for arm in fair:
        if "uniform" in arms:
            secondary += [(arm, "uniform", k) for k in RULE_KS]
    improvements = [a for a in arms if a != PAPER and _harness.arm_policy_name(a) == PAPER]
    for arm in improvements:
        if PAPER in arms:
            secondary += [(arm, PAPER, k) for k in RULE_KS]
    # The default-change rule reads every candidate against uniform at pass@1 and pass@64.
    for arm in [a for a in arms if a not in ("uniform", GRPO)]:
        for k in (1, 64):
            if "uniform" in arms and (arm, "uniform", k) not in primary + secondary:
                secondary.append((arm, "uniform", k))
    return primary, secondary


def rule_comparisons(final: Mapping[str, Sequence], at_cpu: Mapping[str, Sequence] | None = None,
                     *, cpu_amount: float | None = None) -> dict[str, Any]:
    """The rule's paired comparisons of one configuration.

    Parameters
    ----------
    final : mapping arm -> array (seeds, K)
        Held-out pass@k curves at the final step, seeds in the same order for every arm.
    at_cpu : mapping arm -> array (seeds, K), optional
        The same at equal CPU time (the largest amount of the CPU grid that every run
        reached, ``cpu_amount`` seconds).

    Returns
    -------
    dict
        ``primary`` and ``secondary``: lists of rows (candidate, baseline, k, point
        "final" or "cpu", the paired difference's mean, interval and p-value, and
        ``p_holm`` adjusted within its family: the primary family is the primary
        comparison at the final step and at equal CPU time, the secondary family every
        other row of the configuration).
    """
    arms = list(final)
    primary, secondary = _comparisons(arms)
    points = [("final", final)] + ([("cpu", at_cpu)] if at_cpu else [])
    out: dict[str, Any] = {"cpu_amount": cpu_amount}
    for family, pairs in (("primary", primary), ("secondary", secondary)):
        rows = []
        for candidate, baseline, k in pairs:
            for point, curves in points:
                diff = _harness.paired_difference(np.asarray(curves[candidate])[:, k - 1],
                                                  np.asarray(curves[baseline])[:, k - 1])
                rows.append({"candidate": candidate, "baseline": baseline, "k": k,
                             "point": point, "mean": float(diff["mean"]),
                             "ci_low": float(diff["ci_low"]), "ci_high": float(diff["ci_high"]),
                             "std": float(diff["std"]), "p_value": float(diff["p_value"]),
                             "n": int(diff["n"]), "ahead": int(diff["ahead"]),
                             "behind": int(diff["behind"])})
        adjusted = holm({i: row["p_value"] for i, row in enumerate(rows)})
        for i, row in enumerate(rows):
            row["p_holm"] = adjusted[i]
            row["significant"] = bool(np.isfinite(row["p_holm"]) and row["p_holm"] < 0.05)
        out[family] = rows
    return out


def format_rule(comparisons: Mapping[str, Any], regime: Mapping[str, Any] | None = None) -> str:
    """The rule's table: every comparison with its interval and Holm-adjusted p-value."""
    lines = []
    if regime is not None:
        lines.append(format_regime(regime))
    cpu = comparisons.get("cpu_amount")
    lines.append("the rule's comparisons (paired by seed; p_holm within the family; 'final': "
                 "the last step, 'cpu': " + (f"{cpu:g} CPU seconds" if cpu else "no common CPU "
                                             "amount") + ")")
    for family in ("primary", "secondary"):
        lines.append(f"  {family}:")
        for row in comparisons.get(family, []):
            name = f"{row['candidate']} - {row['baseline']}"
            lines.append(f"    {name:<48} pass@{row['k']:<3d} {row['point']:<5} "
                         f"{_harness.format_interval(row['mean'], row['ci_low'], row['ci_high'])}"
                         f"  p {row['p_value']:.3g}  p_holm {row['p_holm']:.3g}"
                         f"{'  *' if row['significant'] else ''}")
    return "\n".join(lines)


#: The warm-start success bins of the held-out prompts for the gains table.
SUCCESS_BINS = (("0", 0.0, 0.0), ("(0, 0.1]", 0.0, 0.1), ("(0.1, 0.5]", 0.1, 0.5),
                ("(0.5, 1]", 0.5, 1.0))


def _per_prompt_pass(correct, samples: int, k: int) -> np.ndarray:
    """Each prompt's unbiased pass@k from ``correct`` of ``samples``."""
    correct = np.asarray(correct, dtype=np.int64)
    return _harness.pass_at_k(np.full(correct.shape, samples), correct, k)


def gains_by_bin(warm_correct: Sequence, candidate_correct: Sequence, baseline_correct: Sequence,
                 *, samples: int, k: int = 64) -> dict[str, Any]:
    """Where a gain comes from: the paired per-seed difference of the mean per-prompt pass@k,
    candidate minus baseline, within each bin of the held-out prompts' warm-start success rate
    (:data:`SUCCESS_BINS`). Arguments are per seed, one count of correct samples (of
    ``samples``) per held-out prompt."""
    out: dict[str, Any] = {"k": k, "bins": {}}
    for name, low, high in SUCCESS_BINS:
        diffs, sizes = [], []
        for warm, cand, base in zip(warm_correct, candidate_correct, baseline_correct, strict=True):
            rate = np.asarray(warm, dtype=np.float64) / samples
            members = (rate == 0) if high == 0 else (rate > low) & (rate <= high)
            sizes.append(int(members.sum()))
            if members.any():
                diffs.append(float(np.mean(_per_prompt_pass(cand, samples, k)[members]
                                           - _per_prompt_pass(base, samples, k)[members])))
            else:
                diffs.append(math.nan)
        entry = _harness.mean_interval(np.asarray(diffs))
        out["bins"][name] = {"mean": float(entry["mean"]), "ci_low": float(entry["ci_low"]),
                             "ci_high": float(entry["ci_high"]),
                             "prompts_per_seed": float(np.mean(sizes))}
    return out


# --------------------------------------------------------------------------- plots


def paired_bands(series: Mapping[str, Sequence[Mapping[float, float]]], *,
                 baseline: str = "uniform") -> dict[str, dict[str, list[float]]]:
    """Per arm but the baseline, the paired difference to it at each x every seed of both has:
    ``series[arm]`` lists, seed by seed in one order, ``{x: value}`` (pass@k at a step or at
    an amount of CPU seconds). Returns ``{arm: {"x", "mean", "low", "high"}}``."""
    out: dict[str, dict[str, list[float]]] = {}
    base = series[baseline]
    for arm, rows in series.items():
        if arm == baseline:
            continue
        xs = sorted(set.intersection(*(set(r) for r in [*rows, *base]))) if rows else []
        band: dict[str, list[float]] = {"x": [], "mean": [], "low": [], "high": []}
        for x in xs:
            diff = _harness.mean_interval(np.array([r[x] - b[x] for r, b in zip(rows, base,
                                                                                  strict=True)]))
            band["x"].append(float(x))
            band["mean"].append(float(diff["mean"]))
            band["low"].append(float(diff["ci_low"]))
            band["high"].append(float(diff["ci_high"]))
        out[arm] = band
    return out


def plot_paired_bands(panels: Sequence[tuple[str, str, Mapping[str, Sequence[Mapping]]]],
                      out_dir, name: str, *, title: str, baseline: str = "uniform"):
    """One figure of paired bands: each panel ``(x label, y label, series)`` draws every arm's
    mean paired difference to ``baseline`` with its 95 % band (see :func:`paired_bands`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    for ax, (xlabel, ylabel, series) in zip(axes[0], panels):
        bands = paired_bands(series, baseline=baseline)
        colors = _harness.arm_colors(bands)
        for arm, band in bands.items():
            if not band["x"]:
                continue
            ax.plot(band["x"], band["mean"], "o-", ms=3, color=colors[arm], label=arm)
            ax.fill_between(band["x"], band["low"], band["high"], color=colors[arm], alpha=0.15)
        ax.axhline(0.0, color="0.4", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{ylabel} minus {baseline}'s (paired by seed)")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return _harness.save_figure(fig, out_dir, name)
