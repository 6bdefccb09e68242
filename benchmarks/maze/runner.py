"""Maze navigation coverage: pass@k after MaxRL training under matched rollout budgets.

Run as ``sera-opt bench maze`` (or ``python -m sera_opt.benchmarks.maze``). Each seed
draws its own training and held-out mazes (perfect mazes from a randomized
depth-first search, 3x3 to 8x8 cells by default), warms a small MLP policy up
by imitating a shortest-path teacher for a few steps, and then trains one copy
per allocation rule ("arm") with the multiplicity-corrected MaxRL estimator:

* ``uniform``  every maze of a batch gets ``rollouts_per_maze`` rollouts (plain MaxRL);
* ``sera``     counts from ``RolloutPlanner("sera")`` on ``SuccessTracker`` estimates;
* peers       e.g. ``knapsack`` or ``hora`` through the same planner and tracker.

An arm is a registered policy, optionally with options: ``--arms
uniform,sera,sera-fair:alpha=1,vip:gamma=0.001`` (values are Python literals or
``inf``; see :func:`sera_opt.benchmarks._harness.parse_arm`). Every arm gets the
configuration's bounds and offset; a bad arm is refused before any training.

All arms of a seed start from the same weights, see the same batches and spend
the same number of rollouts per step. The result is the unbiased pass@k on the
held-out mazes for k = 1..64, with its spread over seeds, the paired
per-seed difference of every arm to uniform with a 95 % interval (paired t over
seeds), and the training curves. Beside equal steps, the arms are compared at
equal cost: each step's CPU time (one thread, evaluations excluded), moves walked
(the task's generated tokens) and walk calls (its generation calls, one per
round) are recorded, and each arm is evaluated on the weights it had reached
within fixed amounts of each (grid evaluation, ``cpu_grid_s``, ``move_grid``,
``call_grid``); the summary pairs the arms with uniform at the amounts every run
reached. Writes ``maze.json``, ``maze.png`` (pass@k)
and ``maze_training.png``.

Presets: ``--quick`` (under a minute), the default (16 seeds and the six arms
of :data:`REPORT_ARMS`, the runs that decided the library's default allocation;
an arm costs about 20 s of CPU time per seed and a seed's warm-up 8 s: about
31 minutes with the 2 worker processes on 2 shared cores), ``--preset hard``
(larger mazes, 4 rollouts per maze, 16 seeds; about the same time) and
``--preset large`` (for a GPU: ``--device cuda``). ``--preset paper`` runs the hard
mazes with the paper's settings (N0 = 16, bounds 2 and 64, passes over the training
mazes) and the coverage arms, with the regime check and the comparisons of
docs/decisions/2026-12-07-coverage-expansion-rule.md. Results are in docs/benchmarks.md.

Seeds can run in shards across sessions: ``--seed S --seeds 1`` runs seed S alone, and
``--merge a/maze.json b/maze.json.gz ...`` summarizes shards of one configuration as one run
of all their seeds would have (the equal-CPU points come from each shard's own timings).
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np

from sera_opt.benchmarks import _coverage, _harness
from sera_opt.benchmarks._cost import cost_per_step
from sera_opt.exceptions import SeraOptError

NAME = "maze"
REPORT_KS = (1, 2, 4, 8, 16, 32, 64)
REPORT_ARMS = _harness.REPORT_ARMS
#: Held-out mazes are grouped by the length of their shortest path (moves).
PATH_BINS = ((1, 10), (10, 20), (20, 30), (30, 1000))
BIN_KS = (1, 8, 64)


def build_parser():
    from sera_opt.benchmarks.maze.train import PRESETS

    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="configuration preset (default: 'default'; --quick selects 'quick')")
    parser.add_argument("--seeds", type=_harness.at_least(1), default=None,
                        help="number of runs; run i uses seed SEED + i")
    parser.add_argument("--steps", type=_harness.at_least(1), default=None,
                        help="MaxRL steps per arm")
    parser.add_argument("--arms", default=None,
                        help="comma-separated arms, each a policy name or "
                             "name:key=value[:key=value...], including uniform (default: "
                             f"{','.join(REPORT_ARMS)}, the report runs' arms)")
    parser.add_argument("--rollouts-per-maze", type=_harness.at_least(1), default=None,
                        help="average rollouts per maze; the budget per step is this times "
                             "the mazes per step")
    parser.add_argument("--mazes-per-step", type=_harness.at_least(1), default=None,
                        help="mazes in each batch")
    parser.add_argument("--max-rollouts", type=_harness.at_least(1), default=None,
                        help="most rollouts one maze may get in a step (default 32)")
    parser.add_argument("--tracker-decay", type=_harness.fraction, default=None,
                        help="SuccessTracker decay: weight kept by old evidence per step "
                             "(default 1: no forgetting)")
    parser.add_argument("--device", default="cpu",
                        help="torch device: cpu, cuda, or auto (cuda when available)")
    parser.add_argument("--workers", type=_harness.at_least(1), default=min(2, os.cpu_count() or 1),
                        help="parallel processes on CPU, one thread each (default: 2 or the "
                             "number of CPUs if fewer; results do not depend on it)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="summarize the runs of earlier maze.json files (seed shards of "
                             "one configuration, made with --seed and --seeds; .json.gz "
                             "files too) instead of training")
    return parser


def _resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SeraOptError("--device cuda was given but no CUDA device is available; "
                           "use --device cpu or --device auto")
    return name


def _config_from_args(args):
    from sera_opt.benchmarks.maze.train import PRESETS, with_overrides

    preset = args.preset or ("quick" if args.quick else "default")
    arms = None
    if args.arms is not None:
        arms = tuple(arm.label for arm in _coverage.parse_loop_arms(args.arms))
    config = with_overrides(
        PRESETS[preset], seeds=args.seeds, steps=args.steps, arms=arms,
        rollouts_per_maze=args.rollouts_per_maze, mazes_per_step=args.mazes_per_step,
        tracker_decay=args.tracker_decay, max_rollouts=args.max_rollouts,
        device=_resolve_device(args.device))
    return preset, config


def check_arms(config) -> tuple[_harness.ArmSpec, ...]:
    """Build every arm's policy with the configuration's bounds and allocate once: a bad arm
    fails here, before the warm-ups, not inside a worker minutes later. ``grpo`` allocates
    as ``uniform``; a ``sera-paper`` arm builds the authors' planner with its own bounds,
    which must be the configuration's (:func:`sera_opt.benchmarks._coverage.check_paper_bounds`)."""
    arms = _coverage.parse_loop_arms(config.arms)
    _coverage.check_paper_bounds(arms, rollouts_per_prompt=config.rollouts_per_maze,
                                 min_rollouts=config.min_rollouts,
                                 max_rollouts=config.max_rollouts)
    for arm in arms:
        if arm.paper:
            planner = _coverage.build_planner(
                arm, min_rollouts=config.min_rollouts, max_rollouts=config.max_rollouts,
                offset=config.offset, tracker_decay=config.tracker_decay)
            planner.policy.allocate(np.linspace(0.02, 0.98, config.mazes_per_step),
                                    config.budget)
    return _harness.check_arms([a.label for a in arms if not a.paper and a.estimator == "maxrl"],
                               min_rollouts=config.min_rollouts,
                               max_rollouts=config.max_rollouts, offset=config.offset,
                               num_prompts=config.mazes_per_step, budget=config.budget)


def _run_tasks(func, tasks, *, workers: int, desc: str, show: bool):
    """Run ``func(*task)`` for every task, in ``workers`` processes; results in task order."""
    if workers <= 1:
        return [func(*t) for t in _harness.progress(tasks, desc=desc, total=len(tasks),
                                                    enabled=show)]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(func, *t) for t in tasks]
        return [f.result() for f in _harness.progress(futures, desc=desc, total=len(futures),
                                                      enabled=show)]


def _spread(rows) -> dict:
    """Mean, median, std, min and max over seeds (axis 0), ignoring NaN (an empty group).

    The std of fewer than two values is NaN: one seed shows no spread, not a spread of 0.
    """
    rows = np.asarray(rows, dtype=np.float64)
    with warnings.catch_warnings():
        # A column that is NaN for every seed stays NaN, without a warning.
        warnings.simplefilter("ignore", RuntimeWarning)
        valid = np.isfinite(rows).sum(axis=0)
        return {"mean": np.nanmean(rows, axis=0), "median": np.nanmedian(rows, axis=0),
                "std": np.where(valid > 1, np.nanstd(rows, axis=0, ddof=1), np.nan),
                "min": np.nanmin(rows, axis=0), "max": np.nanmax(rows, axis=0)}


def _by_path_length(config, successes: np.ndarray, path: np.ndarray) -> np.ndarray:
    """pass@k for k in BIN_KS within each PATH_BINS group (NaN for an empty group)."""
    from sera_opt.benchmarks.maze.train import pass_at_k_curve

    out = np.full((len(PATH_BINS), len(BIN_KS)), np.nan)
    ks = [k for k in BIN_KS if k <= config.k_max]
    for b, (lo, hi) in enumerate(PATH_BINS):
        sel = (path >= lo) & (path < hi)
        if sel.any():
            curve = pass_at_k_curve(np.asarray(successes)[sel], config.eval_samples, max(ks))
            out[b, :len(ks)] = curve[np.asarray(ks) - 1]
    return out


def summarize(config, warmups: list[dict], arms: list[dict]) -> dict:
    """Pass@k per arm (mean, median, std, min, max over seeds), paired differences to uniform
    (their spread, and ``paired_vs_uniform``: mean, 95 % interval by a paired t over seeds,
    p-value, seeds ahead / behind / tied, for every k; ``paired_vs_uniform_at`` the same at
    pass@1, pass@16 and pass@64), and pass@k by shortest-path length of the held-out mazes."""
    seeds = [w["seed"] for w in warmups]
    paths = {w["seed"]: np.asarray(w["test_shortest_path"]) for w in warmups}
    by_arm = {arm: [r for r in arms if r["arm"] == arm] for arm in config.arms}
    summary = {"warmup": _spread([w["pass_at_k"] for w in warmups]),
               "path_bins": [list(b) for b in PATH_BINS], "path_bin_ks": list(BIN_KS),
               "path_bin_counts": _spread([[((paths[s] >= lo) & (paths[s] < hi)).sum()
                                            for lo, hi in PATH_BINS] for s in seeds])}
    summary["warmup"]["by_path_length"] = _spread(
        [_by_path_length(config, w["test_successes"], paths[w["seed"]]) for w in warmups])
    # np.asarray: runs read back from a result file (--merge) hold lists
    base = {r["seed"]: np.asarray(r["pass_at_k"]) for r in by_arm["uniform"]}
    for arm, runs in by_arm.items():
        runs = sorted(runs, key=lambda r: seeds.index(r["seed"]))
        entry = _spread([r["pass_at_k"] for r in runs])
        differences = np.array([np.asarray(r["pass_at_k"]) - base[r["seed"]] for r in runs])
        entry["difference_to_uniform"] = _spread(differences)
        entry["seeds_above_uniform"] = (differences > 0).sum(axis=0)
        entry["seeds_below_uniform"] = (differences < 0).sum(axis=0)
        if arm != "uniform":
            paired = _harness.paired_difference([r["pass_at_k"] for r in runs],
                                                [base[r["seed"]] for r in runs])
            entry["paired_vs_uniform"] = paired
            entry["paired_vs_uniform_at"] = _harness.paired_difference_at(
                paired, _harness.INTERVAL_KS)
        entry["final_train_success_rate"] = _spread(
            [[np.mean(r["curves"]["maze_success_rate"][-10:])] for r in runs])
        entry["by_path_length"] = _spread(
            [_by_path_length(config, r["test_successes"], paths[r["seed"]]) for r in runs])
        entry["cost"] = _cost(runs)
        summary[arm] = entry
    summary["equal_cost"] = _equal_cost(config, by_arm)
    if config.k_max >= _coverage.REGIME["k"]:
        summary["coverage"] = _coverage_summary(config, warmups, by_arm, seeds)
    return summary


def _coverage_summary(config, warmups: list[dict], by_arm: dict[str, list[dict]],
                      seeds: list[int]) -> dict:
    """The regime check, the rule's comparisons (final step and the CPU grid's last amount
    every run reached) and the gains by warm-up success bin
    (docs/decisions/2026-12-07-coverage-expansion-rule.md)."""
    runs = {arm: sorted(rows, key=lambda r: seeds.index(r["seed"])) for arm, rows in by_arm.items()}
    final = {arm: [r["pass_at_k"] for r in rows] for arm, rows in runs.items()}
    regime = _coverage.regime_check([w["train_success_probs"] for w in warmups],
                                    [w["pass_at_k"] for w in warmups], final["uniform"])
    amounts = _harness.common_amounts(config.cpu_grid_s, (r["curves"]["at_cost"]["cpu_s"]
                                                          for rows in runs.values() for r in rows))
    at_cpu, amount = None, None
    if amounts:
        amount = amounts[-1]
        at_cpu = {arm: [_harness.at_cost(r["curves"]["at_cost"]["cpu_s"], amount) for r in rows]
                  for arm, rows in runs.items()}
    comparisons = _coverage.rule_comparisons(final, at_cpu, cpu_amount=amount)
    gains = {arm: _coverage.gains_by_bin([w["test_successes"] for w in warmups],
                                         [r["test_successes"] for r in rows],
                                         [r["test_successes"] for r in runs["uniform"]],
                                         samples=config.eval_samples,
                                         k=_coverage.REGIME["k"])
             for arm, rows in runs.items() if arm != "uniform"}
    active = {}
    for arm, rows in runs.items():
        steps = [row for r in rows for row in r["curves"].get("active_set", [])]
        active[arm] = {key: float(np.mean([row[key] for row in steps])) if steps else
                       (1.0 if key == "active_fraction" else 0.0)
                       for key in ("active_fraction", "forced", "too_easy", "too_hard")}
    return {"regime": regime, "comparisons": comparisons, "gains_by_bin": gains,
            "active_set": active}


#: The equal-cost grids: the configuration's field and the words of the tables.
COSTS = {"cpu_s": ("cpu_grid_s", "CPU seconds"), "moves": ("move_grid", "moves walked"),
         "calls": ("call_grid", "walk calls")}


def _cost(runs: list[dict]) -> dict[str, float]:
    """What a step of the arm spends, means over its steps and seeds: CPU seconds (training
    and walking, one thread, evaluations excluded), moves walked and walk calls."""
    return cost_per_step([r["curves"] for r in runs], {"moves": "moves", "calls": "walk_calls"})


def _equal_cost(config, by_arm: dict[str, list[dict]]) -> dict:
    """pass@k at the grids' amounts every run reached (grid evaluation: the weights each arm
    had reached within the amount), and each arm's paired difference to uniform there."""
    return _harness.equal_cost_summary(
        {cost: getattr(config, field) for cost, (field, _) in COSTS.items()},
        {arm: [r["curves"]["at_cost"] for r in sorted(rows, key=lambda r: r["seed"])]
         for arm, rows in by_arm.items()},
        ks=_harness.INTERVAL_KS)


def _table(config, summary) -> str:
    """pass@k (mean [min, max] over seeds), then the paired difference to uniform with its
    95 % interval at pass@1, pass@16 and pass@64."""
    ks = [k for k in REPORT_KS if k <= config.k_max]
    width = max(11, *(len(a) + 1 for a in config.arms))
    lines = ["pass@k on held-out mazes, mean [min, max] over seeds",
             "arm".ljust(width) + "".join(f"  k={k:<18d}" for k in ks)]
    for arm in ("warmup", *config.arms):
        s = summary[arm]
        cells = "".join(f"  {s['mean'][k - 1]:.3f} [{s['min'][k - 1]:.3f},{s['max'][k - 1]:.3f}]"
                        for k in ks)
        lines.append(f"{arm:<{width}s}{cells}")
    lines += ["", f"at the final step ({config.steps}):",
              _harness.paired_table({arm: summary[arm]["paired_vs_uniform_at"]
                                     for arm in config.arms if arm != "uniform"})]
    lines += ["", "cost per step (mean): CPU ms (one thread, evaluations excluded), moves "
                  "walked, walk calls"]
    for arm in config.arms:
        c = summary[arm]["cost"]
        lines.append(f"{arm:<{width}s}  {c['cpu_s_per_step'] * 1e3:8.1f}  "
                     f"{c['moves_per_step']:9.0f}  {c['calls_per_step']:5.2f}")
    lines.append(_harness.equal_cost_table(summary["equal_cost"],
                                           {cost: words for cost, (_, words) in COSTS.items()}))
    if "coverage" in summary:
        coverage = summary["coverage"]
        lines += ["", _coverage.format_rule(coverage["comparisons"], coverage["regime"]),
                  "active fraction / forced activations per step (means):"]
        lines += [f"  {arm:<{width}s} {row['active_fraction']:6.3f}  {row['forced']:6.2f}"
                  for arm, row in coverage["active_set"].items()]
        lines.append(f"gains at pass@{_coverage.REGIME['k']} over uniform by the held-out "
                     "mazes' warm-up success:")
        lines += [f"  {arm:<{width}s} " + "  ".join(
            f"{b} {_harness.format_interval(v['mean'], v['ci_low'], v['ci_high'])}"
            for b, v in entry["bins"].items()) for arm, entry in coverage["gains_by_bin"].items()]
    return "\n".join(lines)


def plot(config, summary, arms: list[dict], out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(1, config.k_max + 1)
    colors = {"warmup": "0.6", **_harness.arm_colors(config.arms)}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.2))
    for arm in ("warmup", *config.arms):
        s = summary[arm]
        label = "warm-up (start of all arms)" if arm == "warmup" else arm
        ax1.plot(ks, s["mean"], color=colors.get(arm), label=label,
                 linestyle="--" if arm == "warmup" else "-")
        ax1.fill_between(ks, s["min"], s["max"], color=colors.get(arm), alpha=0.15)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("k")
    ax1.set_ylabel("pass@k on held-out mazes")
    ax1.set_title(f"mean and min-max over {config.seeds} seeds")
    ax1.legend(loc="best", fontsize=8)
    _harness.plot_paired(ax2, ks, {arm: summary[arm]["paired_vs_uniform"]
                                   for arm in config.arms if arm != "uniform"}, colors,
                         seeds=config.seeds)
    # pass@64 (or the largest k) by shortest-path length, mean and min-max over seeds
    kcol = len([k for k in BIN_KS if k <= config.k_max]) - 1
    names = ("warmup", *config.arms)
    width = 0.8 / len(names)
    labels = [f"{lo}-{hi - 1}" if hi < 1000 else f">={lo}" for lo, hi in PATH_BINS]
    for i, arm in enumerate(names):
        by = summary[arm]["by_path_length"]
        mean, lo, hi = by["mean"][:, kcol], by["min"][:, kcol], by["max"][:, kcol]
        x = np.arange(len(PATH_BINS)) + (i - (len(names) - 1) / 2) * width
        ax3.bar(x, mean, width, color=colors.get(arm), label=arm,
                yerr=np.vstack([mean - lo, hi - mean]), error_kw={"linewidth": 0.8})
    counts = summary["path_bin_counts"]["mean"]
    ax3.set_xticks(np.arange(len(PATH_BINS)),
                   [f"{lab}\n({c:.0f} mazes)" for lab, c in zip(labels, counts)])
    ax3.set_xlabel("shortest path from start to goal (moves)")
    ax3.set_ylabel(f"pass@{BIN_KS[kcol]} on held-out mazes")
    ax3.set_title("by maze difficulty (bars: mean, whiskers: min-max)")
    ax3.set_ylim(0, 1.3)
    ax3.set_yticks(np.linspace(0, 1, 6))
    ax3.legend(fontsize=7, ncol=3, loc="upper center")
    fig.suptitle(f"Maze navigation: MaxRL with {config.rollouts_per_maze} rollouts per maze "
                 f"on average, {config.steps} steps")
    fig.tight_layout()
    paths = [_harness.save_figure(fig, out_dir, NAME)]

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    axes = axes.ravel()
    window = max(1, config.steps // 20)

    def smoothed(ax, series, **style):
        series = np.asarray(series, dtype=np.float64)
        if series.size and np.isfinite(series).all():
            smooth = np.convolve(series, np.ones(window) / window, mode="valid")
            ax.plot(np.arange(len(smooth)) + window, smooth, **style)

    for arm in config.arms:
        runs = [r for r in arms if r["arm"] == arm]
        color = colors.get(arm)
        # Per-maze mean: comparable across arms, unlike the per-rollout rate,
        # which SERA pulls down by giving hard mazes more rollouts.
        smoothed(axes[0], np.mean([r["curves"]["maze_success_rate"] for r in runs], axis=0),
                 color=color, label=arm)
        steps = runs[0]["curves"]["eval_step"]
        if steps:
            p1 = np.mean([r["curves"]["eval_pass_at_1"] for r in runs], axis=0)
            pk = np.mean([r["curves"]["eval_pass_at_k_max"] for r in runs], axis=0)
            axes[1].plot(steps, p1, "o-", color=color, label=f"{arm} pass@1")
            axes[1].plot(steps, pk, "s--", color=color,
                         label=f"{arm} pass@{config.curve_samples}")
        for ax, (source, key) in ((axes[2], ("diagnostics", "signal_fraction")),
                                  (axes[3], ("planned_diagnostics", "alignment_proxy"))):
            series = [[d.get(key, np.nan) for d in r["curves"].get(source, [])] for r in runs]
            smoothed(ax, np.mean(series, axis=0), color=color, label=arm)
    titles = [
        "batch success rate (mean over the batch's mazes)",
        f"held-out pass@k during training ({config.curve_samples} samples per maze)",
        "fraction of the batch's mazes with a non-zero advantage",
        "alignment proxy on the tracker's estimates (1: equal effective weights)",
    ]
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("MaxRL step")
        if ax.has_data():
            ax.legend(fontsize=7, ncol=2 if ax is axes[1] else 1)
    fig.suptitle(f"Maze training curves (mean over {config.seeds} seeds; "
                 f"{window}-step moving means)")
    fig.tight_layout()
    paths.append(_harness.save_figure(fig, out_dir, f"{NAME}_training"))
    return paths


def _plot_coverage(config, runs: list[dict], out_dir):
    """Paired bands to uniform: pass@k of the training evaluations against steps, pass@64
    against CPU seconds (the grid evaluations)."""
    k = _coverage.REGIME["k"]
    by_arm = {arm: sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
              for arm in config.arms}
    steps = {arm: [dict(zip(r["curves"]["eval_step"], r["curves"]["eval_pass_at_k_max"]))
                   for r in rows] for arm, rows in by_arm.items()}
    cpu = {arm: [{p["at"]: p["value"][k - 1] for p in r["curves"]["at_cost"]["cpu_s"]}
                 for r in rows] for arm, rows in by_arm.items()}
    return _coverage.plot_paired_bands(
        [("MaxRL step", f"held-out pass@{config.curve_samples}", steps),
         ("CPU seconds (one thread)", f"held-out pass@{k}", cpu)],
        out_dir, f"{NAME}_paired_bands",
        title=f"maze, {config.seeds} seed(s): mean paired difference with its 95 % band")


def run(config, *, workers: int = 1, show_progress: bool = True, base_seed: int = 0) -> dict:
    """Warm up every seed, train every arm, and collect the results (no files written)."""
    from sera_opt.benchmarks.maze import train as _maze_train

    check_arms(config)
    start = time.perf_counter()
    seeds = [base_seed + i for i in range(config.seeds)]
    warmups = _run_tasks(_maze_train.run_seed_warmup, [(config, s) for s in seeds],
                         workers=workers, desc="maze warm-up", show=show_progress)
    if show_progress:
        # The warm-ups' half of the regime check, before any arm trains.
        for w in warmups:
            print(f"seed {w['seed']}: " + _coverage.format_regime(warm=w["regime"]), flush=True)
    tasks = [(config, w["seed"], arm, w["state_dict"]) for w in warmups for arm in config.arms]
    arms = _run_tasks(_maze_train.run_arm, tasks, workers=workers, desc="maze arms",
                      show=show_progress)
    summary = summarize(config, warmups, arms)
    for w in warmups:
        w.pop("state_dict")
    return {"seeds": seeds, "warmups": warmups, "runs": arms, "summary": summary,
            "wall_time": time.perf_counter() - start}


def merge(paths, out_dir=None, *, plots: bool = True):
    """Combine seed shards of one configuration (``maze.json`` files, or their gzip-compressed
    ``.json.gz`` copies) into one payload with its summary over all their seeds, as one run of
    all the seeds would have written it; write it (and the plots) to ``out_dir``.

    Raises
    ------
    SeraOptError
        When a file is not a whole maze result, the files differ in more than their seeds,
        or a seed appears in more than one of them.
    """
    from pathlib import Path

    from sera_opt.benchmarks import _results
    from sera_opt.benchmarks.maze.train import MazeConfig

    payloads = [_results.read_result(Path(p), flag="--merge", benchmark=NAME,
                                     keys=("config", "seeds", "warmups", "runs"))
                for p in paths]
    configs = [{k: v for k, v in p["config"].items() if k != "seeds"} for p in payloads]
    if any(c != configs[0] for c in configs):
        differ = sorted(k for c in configs for k in set(c) | set(configs[0])
                        if c.get(k) != configs[0].get(k))
        raise SeraOptError("--merge needs files of one configuration (only --seed and --seeds "
                           f"may differ); these differ in {', '.join(dict.fromkeys(differ))}.")
    seeds = sorted(s for p in payloads for s in p["seeds"])
    if len(set(seeds)) != len(seeds):
        raise SeraOptError("--merge: a seed appears in more than one file; give each shard "
                           "once.")
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in configs[0].items()
              if k in MazeConfig.__dataclass_fields__}
    config = MazeConfig(**fields, seeds=len(seeds))
    warmups = sorted((w for p in payloads for w in p["warmups"]), key=lambda w: w["seed"])
    # summarize orders each arm's runs by the seeds of the warm-ups
    runs = [r for p in payloads for r in p["runs"]]
    payload = {**payloads[0], "config": config.to_dict(), "seeds": seeds,
               "warmups": warmups, "runs": runs, "summary": summarize(config, warmups, runs),
               "merged_from": [str(p) for p in paths],
               "wall_time": sum(p.get("wall_time", 0.0) for p in payloads)}
    if out_dir is not None:
        _harness.write_json(out_dir, NAME, payload)
        if plots:
            plot(config, payload["summary"], runs, out_dir)
            if "coverage" in payload["summary"]:
                _plot_coverage(config, runs, out_dir)
    return config, payload


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.merge:
        config, payload = merge(args.merge, args.out)
        print(_table(config, payload["summary"]))
        print(f"merged {len(payload['seeds'])} seeds from {len(args.merge)} file(s); wrote "
              f"{args.out}/{NAME}.json")
        return 0
    if args.quick and args.preset not in (None, "quick"):
        # Both name a preset; running one of them without a word would be a guess.
        parser.error(f"--quick and --preset {args.preset} disagree: --quick is the 'quick' "
                     "preset; give one of them")
    if args.device != "cpu":
        # Deterministic cuBLAS needs this before CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    preset, config = _config_from_args(args)
    workers = 1 if config.device != "cpu" else max(1, args.workers)
    show = not args.no_progress
    result = run(config, workers=workers, show_progress=show, base_seed=args.seed)
    command = "sera-opt bench maze " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"preset": preset, "command": command.strip(), "seed": args.seed,
               "workers": workers, "config": config.to_dict(), **result}
    json_path = _harness.write_json(args.out, NAME, payload)
    paths = plot(config, result["summary"], result["runs"], args.out)
    if "coverage" in result["summary"]:
        paths.append(_plot_coverage(config, result["runs"], args.out))
    print(_table(config, result["summary"]))
    cpu = sum(r["cpu_time"] for r in (*result["warmups"], *result["runs"]))
    print(f"wall time {result['wall_time']:.1f} s ({cpu:.1f} s of CPU time in the warm-ups "
          f"and arms, {workers} worker(s)); wrote {json_path}, "
          + ", ".join(str(p) for p in paths))
    return 0
