"""Reasoning coverage: a tiny transformer learns addition by MaxRL, uniform versus the policies.

Run as ``sera-opt bench arithmetic`` (10 seeds and the six arms of
:data:`REPORT_ARMS`, the runs that decided the library's default allocation; a
seed's warm start costs about 30 s of CPU time and each policy about 30 s with
its evaluation: about 37 minutes of CPU time on one core),
``sera-opt bench arithmetic --quick`` (1 seed, under a minute) or
``sera-opt bench arithmetic --preset large --device auto`` (the larger
configuration, meant for a CUDA device). ``--preset expand`` is where training can raise
coverage (the arms of :data:`sera_opt.benchmarks._coverage.COVERAGE_ARMS`, the regime check
and the comparisons of docs/decisions/2026-12-07-coverage-expansion-rule.md; shard its seeds
with ``--seed``/``--seeds`` and combine them with ``--merge``). The results and their
reading are in docs/benchmarks.md, section "Arithmetic".

For each seed:

1. A character-level decoder-only transformer is warm-started by a short
   supervised phase on freshly drawn addition problems (see
   :mod:`sera_opt.benchmarks.arithmetic.task`), stopped early so that the success
   rates of the training prompts spread from near 0 to near 1.
2. From that same warm start, one MaxRL run per allocation policy: each step
   takes the next ``prompts_per_step`` prompts of a fixed training pool (the
   same order for every policy), a :class:`sera_opt.RolloutPlanner` with its
   own :class:`sera_opt.SuccessTracker` splits the fixed budget of
   ``prompts_per_step * rollouts_per_prompt`` rollouts over them, the rollouts
   are sampled at temperature 1 and verified exactly, and the model takes one
   gradient step on the multiplicity-corrected mean-centred MaxRL loss
   (:func:`sera_opt.maxrl_advantages`, :func:`sera_opt.aggregate_loss`).
3. The held-out test set is sampled ``eval_samples`` times per problem and
   pass@k for k = 1..64 is computed with the unbiased estimator.

The summary pairs every policy with uniform seed by seed: the mean difference,
its 95 % interval (paired t over seeds), the p-value and the seeds ahead /
behind / tied, over the whole k curve and at pass@1, pass@16 and pass@64.
A policy is a registered name or a specification with options, ``--arms
uniform,sera,sera-fair:alpha=1`` (see :func:`sera_opt.benchmarks._harness.parse_arm`);
every policy gets the configuration's bounds and offset.

Results go to ``--out`` as ``arithmetic.json``, ``arithmetic.png`` (pass@k)
and ``arithmetic_training.png`` (the estimator's diagnostics during training).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.benchmarks import _coverage, _harness
from sera_opt.benchmarks._cost import cost_per_step
from sera_opt.benchmarks.arithmetic.train import (
    PRESETS,
    ExperimentConfig,
    _torch,
    build_model,
    run_seed,
)
from sera_opt.exceptions import SeraOptError

__all__ = ["ExperimentConfig", "PRESETS", "run_experiment", "main"]

NAME = "arithmetic"
REPORT_ARMS = _harness.REPORT_ARMS


def _summary(cfg: ExperimentConfig, runs: list[dict]) -> dict[str, Any]:
    """pass@k per policy over seeds, and per policy but uniform the paired per-seed difference
    to uniform: its mean, the per-seed rows, and ``paired_vs_uniform`` (mean, 95 % interval
    by a paired t over seeds, p-value, seeds ahead / behind / tied, for every k;
    ``paired_vs_uniform_at`` the same at pass@1, pass@16 and pass@64)."""
    ks = np.arange(1, cfg.max_k + 1)
    summary: dict[str, Any] = {}
    names = ["warm_start", *cfg.policies]
    curves = {}
    for name in names:
        rows = np.array([
            run["warm_start"]["pass_at_k"] if name == "warm_start"
            else run["policies"][name]["pass_at_k"] for run in runs
        ])
        curves[name] = rows
        summary[name] = {
            "pass_at_k_mean": rows.mean(axis=0),
            # one seed shows no spread: NaN (null in the JSON), not a spread of 0
            "pass_at_k_std": (rows.std(axis=0, ddof=1) if len(rows) > 1
                              else np.full(len(ks), np.nan)),
            "pass_at_k_min": rows.min(axis=0),
            "pass_at_k_max": rows.max(axis=0),
        }
    for name in cfg.policies:
        if name == "uniform":
            continue
        diff = curves[name] - curves["uniform"]
        summary[name]["difference_vs_uniform_mean"] = diff.mean(axis=0)
        summary[name]["difference_vs_uniform_per_seed"] = diff
        summary[name]["seeds_better_than_uniform"] = (diff > 0).sum(axis=0)
        paired = _harness.paired_difference(curves[name], curves["uniform"])
        summary[name]["paired_vs_uniform"] = paired
        summary[name]["paired_vs_uniform_at"] = _harness.paired_difference_at(
            paired, _harness.INTERVAL_KS)
    table = {}
    for name in names:
        table[name] = {
            f"pass@{k}": [float(summary[name]["pass_at_k_mean"][k - 1]),
                          float(summary[name]["pass_at_k_std"][k - 1])]
            for k in (1, 4, 16, cfg.max_k) if k <= cfg.max_k
        }
    summary["table_mean_std"] = table
    for name in cfg.policies:
        summary[name]["cost"] = _cost([run["policies"][name] for run in runs])
    summary["equal_cost"] = _harness.equal_cost_summary(
        {cost: getattr(cfg, field) for cost, (field, _) in COSTS.items()},
        {name: [run["policies"][name]["curves"]["at_cost"] for run in runs]
         for name in cfg.policies}, ks=_harness.INTERVAL_KS)
    if cfg.max_k >= _coverage.REGIME["k"]:
        summary["coverage"] = _coverage_summary(cfg, runs, curves)
    return summary


def _coverage_summary(cfg: ExperimentConfig, runs: list[dict], curves: dict) -> dict[str, Any]:
    """The regime check, the rule's comparisons (final step and the CPU grid's last amount
    every run reached) and the gains by warm-start success bin
    (docs/decisions/2026-12-07-coverage-expansion-rule.md)."""
    regime = _coverage.regime_check(
        [run["warm_start"]["train_success_rates"] for run in runs],
        curves["warm_start"], curves["uniform"])
    amounts = _harness.common_amounts(
        cfg.cpu_grid_s, (run["policies"][name]["curves"]["at_cost"]["cpu_s"]
                         for run in runs for name in cfg.policies))
    at_cpu, amount = None, None
    if amounts:
        amount = amounts[-1]
        at_cpu = {name: [_harness.at_cost(run["policies"][name]["curves"]["at_cost"]["cpu_s"],
                                          amount) for run in runs] for name in cfg.policies}
    final = {name: curves[name] for name in cfg.policies}
    comparisons = _coverage.rule_comparisons(final, at_cpu, cpu_amount=amount)
    gains = {name: _coverage.gains_by_bin(
        [run["warm_start"]["correct"] for run in runs],
        [run["policies"][name]["correct"] for run in runs],
        [run["policies"]["uniform"]["correct"] for run in runs],
        samples=cfg.eval_samples, k=_coverage.REGIME["k"])
        for name in cfg.policies if name != "uniform"}
    active = {name: _active_summary([run["policies"][name]["curves"] for run in runs])
              for name in cfg.policies}
    return {"regime": regime, "comparisons": comparisons, "gains_by_bin": gains,
            "active_set": active}


def _active_summary(records: list[dict]) -> dict[str, float]:
    """Mean over steps and seeds of the active fraction and the forced activations."""
    rows = [row for c in records for row in c.get("active_set", [])]
    if not rows:
        return {"active_fraction": 1.0, "forced": 0.0, "too_easy": 0.0, "too_hard": 0.0}
    return {key: float(np.mean([row[key] for row in rows]))
            for key in ("active_fraction", "forced", "too_easy", "too_hard")}


#: The equal-cost grids: the configuration's field and the words of the tables.
COSTS = {"cpu_s": ("cpu_grid_s", "CPU seconds"), "tokens": ("token_grid", "generated tokens"),
         "calls": ("call_grid", "generation calls")}


def _cost(records: list[dict]) -> dict[str, float]:
    """What a step of the policy spends, means over its steps and seeds: CPU seconds
    (training and sampling, evaluations excluded), generated tokens, generation calls."""
    return cost_per_step([r["curves"] for r in records],
                         {"tokens": "tokens", "calls": "generation_calls"})


# --------------------------------------------------------------------------- plots

def _colors(cfg) -> dict[str, str]:
    """A colour per policy (the fixed ones for bare names) and the warm start's grey."""
    return {"warm_start": "0.5", **_harness.arm_colors(cfg.policies)}


def _plot_pass_at_k(cfg, summary, runs, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(1, cfg.max_k + 1)
    colors = _colors(cfg)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    ax = axes[0]
    for name in ["warm_start", *cfg.policies]:
        s = summary[name]
        color = colors.get(name)
        ax.plot(ks, s["pass_at_k_mean"], label=name.replace("_", " "), color=color)
        ax.fill_between(ks, s["pass_at_k_min"], s["pass_at_k_max"], color=color, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k on the held-out set")
    ax.set_title(f"mean over {len(runs)} seeds (band: min to max)")
    ax.legend()
    _harness.plot_paired(axes[1], ks, {name: summary[name]["paired_vs_uniform"]
                                       for name in cfg.policies if name != "uniform"},
                         colors, seeds=len(runs))
    ax = axes[2]
    names = ["warm_start", *cfg.policies]
    digit_keys = sorted(runs[0]["warm_start"]["pass_at_k_by_digits"], key=int)
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        values = []
        for d in digit_keys:
            rows = [run["warm_start"] if name == "warm_start" else run["policies"][name]
                    for run in runs]
            values.append(np.mean([row["pass_at_k_by_digits"][d][-1] for row in rows]))
        ax.bar(np.arange(len(digit_keys)) + (j - (len(names) - 1) / 2) * width, values, width,
               color=colors.get(name), label=name.replace("_", " "))
    ax.set_xticks(np.arange(len(digit_keys)), [f"{d} digit{'s' if int(d) > 1 else ''}" for d in digit_keys])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(f"pass@{cfg.max_k}")
    ax.set_title(f"pass@{cfg.max_k} by the longer operand's digit count")
    fig.suptitle(f"MaxRL on {cfg.max_digits}-digit addition, budget {cfg.budget} rollouts/step, "
                 f"{cfg.rl_steps} steps")
    return _harness.save_figure(fig, out_dir, NAME)


def _plot_coverage(cfg, runs, out_dir: Path) -> Path:
    """Paired bands to uniform: pass@k of the checkpoints against steps, pass@64 against CPU
    seconds (the grid evaluations)."""
    k = _coverage.REGIME["k"]
    steps = {name: [dict(zip(run["policies"][name]["checkpoints"]["step"],
                             run["policies"][name]["checkpoints"]["pass_at_max"]))
                    for run in runs] for name in cfg.policies}
    cpu = {name: [{p["at"]: p["value"][k - 1]
                   for p in run["policies"][name]["curves"]["at_cost"]["cpu_s"]}
                  for run in runs] for name in cfg.policies}
    return _coverage.plot_paired_bands(
        [("MaxRL step", f"held-out pass@{cfg.curve_samples}", steps),
         ("CPU seconds (training and sampling)", f"held-out pass@{k}", cpu)],
        out_dir, f"{NAME}_paired_bands",
        title=f"arithmetic, {len(runs)} seed(s): mean paired difference with its 95 % band")


def _mean_curve(runs, policy, getter):
    rows = [getter(run["policies"][policy]) for run in runs]
    return np.mean(np.array(rows, dtype=float), axis=0)


def _plot_training(cfg, runs, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = _colors(cfg)
    fig, axes = plt.subplots(2, 3, figsize=(12.6, 6.4))
    window = max(1, cfg.rl_steps // 20)
    kernel = np.ones(window) / window

    def smooth_plot(ax, y, **style):
        y = np.asarray(y, dtype=float)
        smooth = np.convolve(y, kernel, mode="valid") if y.size >= window else y
        ax.plot(np.arange(smooth.size) + (window - 1 if y.size >= window else 0), smooth,
                **style)

    for ax, (panel, title) in zip(axes.flat, _TRAINING_PANELS):
        for policy in cfg.policies:
            color = colors.get(policy)
            if panel in ("pass_at_1", "pass_at_max"):
                steps = runs[0]["policies"][policy]["checkpoints"]["step"]
                y = _mean_curve(runs, policy, lambda r, key=panel: r["checkpoints"][key])
                ax.plot(steps, y, marker="o", ms=3, color=color, label=policy)
            elif panel == "mean_reward":
                smooth_plot(ax, _mean_curve(runs, policy, lambda r: r["curves"]["mean_reward"]),
                            color=color, label=policy)
            else:
                for source, style in (("diagnostics", "-"), ("diagnostics_planned", ":")):
                    if panel == "zero_success_fraction" and source == "diagnostics_planned":
                        continue  # the same count either way
                    y = _mean_curve(runs, policy, lambda r, key=panel, src=source: [
                        row.get(key, np.nan) for row in r["curves"][src]])
                    smooth_plot(ax, y, color=color, ls=style,
                                label=policy if source == "diagnostics" else None)
        ax.set_title(title.format(k=cfg.curve_samples), fontsize=10)
        ax.set_xlabel("MaxRL step")
    axes.flat[0].legend()
    fig.suptitle(f"training curves, mean over {len(runs)} seeds (moving average over {window} "
                 "steps; dotted: factors from the planner's estimates instead of the batch's)",
                 fontsize=10)
    fig.tight_layout()
    return _harness.save_figure(fig, out_dir, f"{NAME}_training")


#: (key, title) of the training plot's panels; the middle ones are keys of
#: sera_opt.advantage_diagnostics.
_TRAINING_PANELS = (
    ("mean_reward", "training reward (mean over the step's rollouts)"),
    ("zero_success_fraction", "prompts of the step with zero successes"),
    ("weight_spread", "spread (std/mean) of the prompts' factors"),
    ("min_factor", "smallest attenuation factor of the step"),
    ("pass_at_1", "held-out pass@1 (checkpoints)"),
    ("pass_at_max", "held-out pass@{k} (checkpoints)"),
)


# --------------------------------------------------------------------------- entry points


def resolve_device(name: str) -> str:
    """``auto`` picks CUDA when present, else the CPU."""
    torch = _torch()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SeraOptError("--device cuda was requested but torch sees no CUDA device; "
                           "use --device cpu or auto.")
    if name != "cpu" and not name.startswith("cuda"):
        raise SeraOptError(f"--device must be auto, cpu or cuda[:N], got {name!r}.")
    return name


def run_experiment(cfg: ExperimentConfig, *, seed: int = 0, device: str = "cpu",
                   out_dir: Path | None = None, show_progress: bool = True,
                   threads: int = 1, plots: bool = True) -> dict[str, Any]:
    """Run every seed, write ``arithmetic.json`` (and the plots) to ``out_dir``; return the payload."""
    torch = _torch()
    cfg.validate()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        seeds = [seed + i for i in range(cfg.seeds)]
        runs = [run_seed(cfg, s, device, show_progress=show_progress) for s in seeds]
    finally:
        torch.set_num_threads(previous_threads)
    from sera_opt.benchmarks.arithmetic.task import make_split

    train, test = make_split(cfg.data_seed, cfg.num_train, cfg.num_test, cfg.max_digits)
    model, _ = build_model(cfg, "cpu")
    payload: dict[str, Any] = {
        "config": {**asdict(cfg), "budget": cfg.budget},
        "seeds": seeds,
        "device": device,
        "threads": threads,
        "model_parameters": model.num_parameters(),
        "test_set": {
            "digits_histogram": {int(d): int((test.digits() == d).sum())
                                 for d in np.unique(test.digits())},
            "carries_histogram": {int(c): int((test.carries() == c).sum())
                                  for c in np.unique(test.carries())},
        },
        "ks": list(range(1, cfg.max_k + 1)),
        "runs": runs,
        "summary": _summary(cfg, runs),
        "wall_time_s": time.perf_counter() - start,
        "cpu_time_s": time.process_time() - cpu_start,
    }
    if out_dir is not None:
        _harness.write_json(out_dir, NAME, payload)
        if plots:
            _plot_pass_at_k(cfg, payload["summary"], runs, out_dir)
            _plot_training(cfg, runs, out_dir)
            if "coverage" in payload["summary"]:
                _plot_coverage(cfg, runs, out_dir)
    return payload


def _print_table(cfg: ExperimentConfig, payload: dict) -> None:
    table = payload["summary"]["table_mean_std"]
    keys = list(next(iter(table.values())).keys())
    width = max(12, *(len(name) + 1 for name in table))
    print(f"{'':<{width}}" + "".join(f"{k:>16}" for k in keys))
    for name, row in table.items():
        print(f"{name:<{width}}" + "".join(
            f"{m:>9.3f} ± {s:<4.3f}" if np.isfinite(s) else f"{m:>9.3f} ± n/a  "
            for m, s in row.values()))
    summary = payload["summary"]
    print()
    print(_harness.paired_table({name: summary[name]["paired_vs_uniform_at"]
                                 for name in cfg.policies if name != "uniform"}))
    print()
    print("cost per step (mean): CPU ms (evaluations excluded), generated tokens, "
          "generation calls")
    for name in cfg.policies:
        c = summary[name]["cost"]
        print(f"{name:<{width}}  {c['cpu_s_per_step'] * 1e3:8.1f}  {c['tokens_per_step']:8.0f}  "
              f"{c['calls_per_step']:5.2f}")
    print(_harness.equal_cost_table(summary["equal_cost"],
                                    {cost: words for cost, (_, words) in COSTS.items()}))
    if "coverage" in summary:
        print()
        print(_coverage.format_rule(summary["coverage"]["comparisons"],
                                    summary["coverage"]["regime"]))
        print("active fraction / forced activations per step (means):")
        for name, row in summary["coverage"]["active_set"].items():
            print(f"  {name:<{width}} {row['active_fraction']:6.3f}  {row['forced']:6.2f}")
        print(f"gains at pass@{_coverage.REGIME['k']} over uniform by the held-out prompts' "
              "warm-start success:")
        for name, entry in summary["coverage"]["gains_by_bin"].items():
            print(f"  {name:<{width}} " + "  ".join(
                f"{b} {_harness.format_interval(v['mean'], v['ci_low'], v['ci_high'])}"
                for b, v in entry["bins"].items()))
    print(f"wall time {payload['wall_time_s']:.0f} s, CPU time {payload['cpu_time_s']:.0f} s, "
          f"on {payload['device']} ({payload['threads']} thread(s))")


def build_parser() -> argparse.ArgumentParser:
    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="named configuration (default: 'default'; --quick means 'quick')")
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda[:N] or auto (CUDA when present); default cpu")
    parser.add_argument("--threads", type=_harness.at_least(1), default=1,
                        help="torch CPU threads (default 1: bit-reproducible on the CPU)")
    parser.add_argument("--seeds", type=_harness.at_least(1), default=None,
                        help="number of seeds (override)")
    parser.add_argument("--arms", "--policies", dest="policies", default=None,
                        help="comma-separated arms, each a policy name or "
                             "name:key=value[:key=value...], including uniform (override; default "
                             f"{','.join(REPORT_ARMS)}, the report runs' arms)")
    parser.add_argument("--rl-steps", type=_harness.at_least(1), default=None,
                        help="MaxRL steps (override)")
    parser.add_argument("--sft-steps", type=_harness.at_least(0), default=None,
                        help="warm-start steps (override)")
    parser.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                        help="summarize the runs of earlier arithmetic.json files (seed shards "
                             "of one configuration, made with --seed and --seeds) instead of "
                             "training")
    parser.add_argument("--sft-target", type=_harness.fraction, default=None,
                        help="the sampled success at which the warm start stops (override)")
    parser.add_argument("--rl-lr", type=_harness.positive, default=None,
                        help="the MaxRL steps' constant learning rate (override; the pilot "
                             "of a preset picks it)")
    return parser


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    if args.quick and args.preset not in (None, "quick"):
        raise SeraOptError("--quick and --preset disagree; give one of them.")
    cfg = PRESETS["quick" if args.quick else (args.preset or "default")]
    overrides: dict[str, Any] = {}
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    if args.policies is not None:
        overrides["policies"] = tuple(a.label for a in _coverage.parse_loop_arms(args.policies))
    if args.rl_steps is not None:
        overrides["rl_steps"] = args.rl_steps
    if args.sft_steps is not None:
        overrides["sft_steps"] = args.sft_steps
    if args.rl_lr is not None:
        overrides["rl_lr"] = args.rl_lr
    if args.sft_target is not None:
        overrides["sft_target_success"] = args.sft_target
    return replace(cfg, **overrides).validate()


def merge(paths: list[Path], out_dir: Path | None = None, *, plots: bool = True
          ) -> tuple[ExperimentConfig, dict[str, Any]]:
    """Combine seed shards of one configuration (``arithmetic.json`` files) into one payload
    with its summary over all their seeds; write it (and the plots) to ``out_dir``. A shard
    may be gzip-compressed (``arithmetic.json.gz``), as the committed shards under
    docs/results/ are."""
    from sera_opt.benchmarks import _results

    payloads = [_results.read_result(Path(p), flag="--merge", benchmark=NAME,
                                     keys=("config", "seeds", "runs")) for p in paths]
    configs = [{k: v for k, v in p["config"].items() if k != "seeds"} for p in payloads]
    if any(c != configs[0] for c in configs):
        raise SeraOptError("--merge needs files of one configuration (only --seed and --seeds "
                           "may differ).")
    seeds = sorted(s for p in payloads for s in p["seeds"])
    if len(set(seeds)) != len(seeds):
        raise SeraOptError("--merge: a seed appears in more than one file.")
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in configs[0].items()
              if k in ExperimentConfig.__dataclass_fields__}
    cfg = ExperimentConfig(**fields, seeds=len(seeds))
    runs = sorted((r for p in payloads for r in p["runs"]), key=lambda r: r["seed"])
    payload = {**payloads[0], "config": {**payloads[0]["config"], "seeds": len(seeds)},
               "seeds": seeds, "runs": runs, "summary": _summary(cfg, runs),
               "merged_from": [str(p) for p in paths],
               "wall_time_s": sum(p["wall_time_s"] for p in payloads),
               "cpu_time_s": sum(p["cpu_time_s"] for p in payloads)}
    if out_dir is not None:
        _harness.write_json(out_dir, NAME, payload)
        if plots:
            _plot_pass_at_k(cfg, payload["summary"], runs, out_dir)
            _plot_training(cfg, runs, out_dir)
            if "coverage" in payload["summary"]:
                _plot_coverage(cfg, runs, out_dir)
    return cfg, payload


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.merge:
        cfg, payload = merge(args.merge, args.out)
        _print_table(cfg, payload)
        print(f"results: {Path(args.out) / (NAME + '.json')}")
        return 0
    cfg = config_from_args(args)
    device = resolve_device(args.device)
    if args.threads < 1:
        raise SeraOptError("--threads must be at least 1.")
    payload = run_experiment(cfg, seed=args.seed, device=device, out_dir=args.out,
                             show_progress=not args.no_progress, threads=args.threads)
    _print_table(cfg, payload)
    print(f"results: {Path(args.out) / (NAME + '.json')}")
    return 0
