"""More coverage per hour? SERA inside TRL against stock GRPOTrainer, at equal steps and equal CPU time.

Run as ``sera-opt bench trl-coverage`` (or ``python -m sera_opt.benchmarks.trl_coverage``).
Reinforcement learning through trl 1.16 on CPU: the tiny GPT-2 of
:mod:`sera_opt.integrations.trl_tiny` with a character-level tokenizer, both
built in code, learns the arithmetic experiment's addition problems (verifiable
rewards, completions of 2 to ``max_digits + 2`` tokens) from a supervised warm
start that every arm of a seed shares. The arms of the default preset (:data:`~.train.ARMS`,
named by what they run; see :mod:`~.train` for the grammar):

* ``grpo``: stock ``trl.GRPOTrainer`` with its own defaults (loss type "dapo",
  rewards scaled per group) and ``num_generations`` = rollouts per prompt;
* ``uniform``: ``SeraGRPOTrainer`` with uniform counts, the MaxRL estimator alone;
* ``sera-fair:alpha=1``: its static plan, one generation call (the default planner
  when issue 41's runs were made, labelled ``sera:rounds=1`` in their files);
* ``sera-fair:alpha=1:rounds=2``; ``sera-fair:alpha=1:rounds=4``.

``--preset expand`` is where training can raise coverage (the warm start stopped at
0.12, a constant learning rate, 256 held-out problems, the authors' SERA beside
uniform, GRPO and sera-fair with a forgetting tracker), with the regime check and the
comparisons of docs/decisions/2026-12-07-coverage-expansion-rule.md.

Every arm has the same prompts per step, completions per step, optimizer and
learning rate, and runs on one thread. Pass@1, pass@8 and pass@64 (unbiased,
from ``eval_samples`` samples of each held-out problem) are evaluated at fixed
steps and on grids of CPU seconds (training and generation, evaluation taken
out), generated tokens and generation calls; per step the wall time, the time inside generation, generated tokens and
generation calls are recorded. The summary pairs every arm with each baseline
(``grpo``, ``uniform`` and ``sera-paper`` where present) seed by seed, with 95 % t
intervals, at the final step and at the grids' amounts that every arm of every
seed reached (equal CPU time; equal tokens and equal calls beside it). Writes ``trl_coverage.json``, ``trl_coverage.png`` (pass@k
against steps and against CPU time, mean and min-max over seeds) and
``trl_coverage_paired.png``.

Presets: the default (10 seeds x 5 arms, 600 steps; a (seed, arm) run takes
about 60-90 s of one core with its evaluations, a seed's warm start about 20 s:
about 35 minutes with ``--jobs 2`` on 2 cores) and ``--quick`` (3 steps, 1 seed,
a few seconds per arm, for a test). Seeds can be split over machines with
``--seed`` and ``--seeds`` and their JSON merged with ``--merge``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.benchmarks import _coverage, _harness
from sera_opt.exceptions import SeraOptError

NAME = "trl-coverage"
FILE = "trl_coverage"
REPORT_KS = (1, 8, 64)


def build_parser():
    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--seeds", type=_harness.at_least(1), default=None,
                        help="number of seeds; seed i is SEED + i (default 10, --quick 1)")
    parser.add_argument("--steps", type=_harness.at_least(1), default=None,
                        help="optimizer steps per arm")
    parser.add_argument("--preset", choices=("default", "expand", "quick"), default=None,
                        help="configuration (default: 'default'; --quick means 'quick')")
    parser.add_argument("--arms", default=None,
                        help="comma-separated arms: grpo, sera-paper[:rounding=exact]"
                             "[:cold_start=prior], or a policy NAME[:key=value...][:rounds=R]"
                             "[:first=N] (default: the preset's arms)")
    parser.add_argument("--cpu-grid", type=_grid, default=None,
                        help="CPU seconds at which every arm is evaluated, comma-separated "
                             "(default 10,20,...,60)")
    parser.add_argument("--jobs", type=_harness.at_least(1), default=1,
                        help="runs in parallel, one process and one thread each (default 1; "
                             "results do not depend on it)")
    parser.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                        help="summarize the runs of earlier trl_coverage.json files (seed "
                             "shards of one configuration) instead of training")
    return parser


def _grid(text: str) -> tuple[float, ...]:
    """An argparse type: increasing positive CPU seconds separated by commas."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(np.isfinite(values)) or min(values) <= 0 or list(values) != sorted(
            set(values)):
        raise argparse.ArgumentTypeError(
            f"takes increasing positive CPU seconds separated by commas, got {text!r}")
    return values


def config_from_args(args):
    from sera_opt.benchmarks.trl_coverage.train import PRESETS, parse_arms, with_overrides

    if args.quick and args.preset not in (None, "quick"):
        raise SeraOptError("--quick and --preset disagree; give one of them.")
    preset = "quick" if args.quick else (args.preset or "default")
    arms = None if args.arms is None else tuple(a.label for a in parse_arms(args.arms))
    cfg = with_overrides(PRESETS[preset], seeds=args.seeds, steps=args.steps, arms=arms,
                         cpu_grid_s=args.cpu_grid)
    return preset, cfg.validate()


def _run_tasks(func, tasks, *, jobs: int, desc: str, show: bool) -> list:
    """``func(*task)`` for every task in ``jobs`` processes (spawned); results in task order."""
    if jobs <= 1:
        return [func(*t) for t in _harness.progress(tasks, desc=desc, total=len(tasks),
                                                    enabled=show)]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(func, *t) for t in tasks]
        return [f.result() for f in _harness.progress(futures, desc=desc, total=len(futures),
                                                      enabled=show)]


def run(cfg, out_dir: Path, *, base_seed: int = 0, jobs: int = 1, show: bool = True) -> dict:
    """Warm start every seed (cached under ``out_dir``), then train every (seed, arm)."""
    from sera_opt.benchmarks.trl_coverage import train

    seeds = [base_seed + i for i in range(cfg.seeds)]
    warm = _run_tasks(train.warm_start_seed, [(cfg, s, out_dir) for s in seeds], jobs=jobs,
                      desc="warm starts", show=show)
    tasks = [(cfg, s, arm, out_dir) for s in seeds for arm in cfg.arms]
    runs = _run_tasks(train.run_arm, tasks, jobs=jobs, desc="arms", show=show)
    return {"seeds": seeds, "warm_starts": warm, "runs": runs}


# --------------------------------------------------------------------------- summary


#: The equal-cost grids: the configuration's field and the words of the tables.
COSTS = {"cpu_s": ("cpu_grid_s", "CPU seconds"), "tokens": ("token_grid", "generated tokens"),
         "calls": ("call_grid", "generation calls")}


def _common_grid(cfg, runs: list[dict], cost: str) -> list[float]:
    """The grid's amounts of ``cost`` that every run reached (so every pair is complete)."""
    return _harness.common_amounts(getattr(cfg, COSTS[cost][0]),
                                   (r["at_cost"][cost] for r in runs))


def _spread(rows) -> dict[str, Any]:
    rows = np.asarray(rows, dtype=np.float64)
    return {"mean": rows.mean(axis=0), "min": rows.min(axis=0), "max": rows.max(axis=0),
            "std": rows.std(axis=0, ddof=1) if len(rows) > 1 else np.full(rows.shape[1:], np.nan)}


def _cost(runs: list[dict]) -> dict[str, float]:
    """Per-step costs, medians over the arm's steps and seeds, and totals per run."""
    def every(key):
        return np.concatenate([np.asarray(r["steps"][key], dtype=np.float64) for r in runs])

    wall, generate = every("wall_s"), every("generate_s")
    return {"step_wall_s": float(np.median(wall)), "generate_s": float(np.median(generate)),
            "generate_share": float(np.median(generate / wall)),
            "generated_tokens_per_step": float(np.mean(every("generated_tokens"))),
            "generation_calls_per_step": float(np.mean(every("generation_calls"))),
            "reward_calls_per_step": float(np.mean(every("reward_calls"))),
            "cpu_s_per_step": float(np.mean([r["cpu_time_s"] / len(r["steps"]["cpu_s"])
                                             for r in runs])),
            "cpu_time_s": float(np.mean([r["cpu_time_s"] for r in runs])),
            "wall_time_s": float(np.mean([r["wall_time_s"] for r in runs]))}


def summarize(cfg, seeds: list[int], runs: list[dict],
              warm_starts: list[dict] | None = None) -> dict[str, Any]:
    """pass@k per arm at every evaluated step and grid time; costs; paired differences to each
    baseline (at the final step and at the grid times every run reached)."""
    from sera_opt.benchmarks.trl_coverage.train import BASELINES

    by_arm = {arm: sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
              for arm in cfg.arms}
    for arm, rows in by_arm.items():
        if [r["seed"] for r in rows] != seeds:
            raise SeraOptError(f"arm {arm!r} has runs for seeds {[r['seed'] for r in rows]}, "
                               f"not for every seed {seeds}; run or merge the missing ones.")
    grids = {cost: _common_grid(cfg, runs, cost) for cost in COSTS}
    summary: dict[str, Any] = {"common_grids": grids, "arms": {}, "paired": {}}
    for arm, rows in by_arm.items():
        active = np.concatenate([np.asarray(r["steps"].get("active_fraction", [1.0]), float)
                                 for r in rows])
        forced = np.concatenate([np.asarray(r["steps"].get("forced_activations", [0.0]), float)
                                 for r in rows])
        summary.setdefault("active_set", {})[arm] = {"active_fraction": float(active.mean()),
                                                     "forced": float(forced.mean())}
    for arm, rows in by_arm.items():
        entry = {"final": _spread([r["final_pass_at_k"] for r in rows]), "cost": _cost(rows)}
        entry["at_steps"] = {int(p["step"]): _spread([[q for q in r["at_steps"]
                                                       if q["step"] == p["step"]][0]["pass_at_k"]
                                                      for r in rows])
                             for p in rows[0]["at_steps"]}
        entry["at_cost"] = {cost: {t: _spread([_harness.at_cost(r["at_cost"][cost], t)
                                               for r in rows]) for t in grid}
                            for cost, grid in grids.items()}
        # For the plot: every amount of the CPU grid that all of this arm's seeds reached
        # (a cheaper arm's curve ends earlier; the comparison uses the common amounts only).
        own = _harness.common_amounts(cfg.cpu_grid_s, (r["at_cost"]["cpu_s"] for r in rows))
        entry["cpu_curve"] = {t: _spread([_harness.at_cost(r["at_cost"]["cpu_s"], t)
                                          for r in rows]) for t in own}
        summary["arms"][arm] = entry
    for base in BASELINES:
        if base not in by_arm:
            continue
        against = {}
        for arm, rows in by_arm.items():
            if arm == base:
                continue
            final = _harness.paired_difference([r["final_pass_at_k"] for r in rows],
                                               [r["final_pass_at_k"] for r in by_arm[base]])
            cell = {"final_step": final,
                    "final_step_at": _harness.paired_difference_at(final, REPORT_KS),
                    "at_cost": {cost: {} for cost in COSTS}}
            for cost, grid in grids.items():
                for t in grid:
                    paired = _harness.paired_difference(
                        [_harness.at_cost(r["at_cost"][cost], t) for r in rows],
                        [_harness.at_cost(r["at_cost"][cost], t) for r in by_arm[base]])
                    cell["at_cost"][cost][t] = _harness.paired_difference_at(paired, REPORT_KS)
            against[arm] = cell
        summary["paired"][base] = against
    if cfg.eval_samples >= _coverage.REGIME["k"] and "uniform" in by_arm:
        summary["coverage"] = _coverage_summary(cfg, seeds, by_arm, warm_starts, grids)
    return summary


def _coverage_summary(cfg, seeds, by_arm, warm_starts, grids) -> dict[str, Any] | None:
    """The regime check, the rule's comparisons (final step and the CPU grid's last amount
    every run reached) and the gains by warm-start success bin
    (docs/decisions/2026-12-07-coverage-expansion-rule.md); None for warm starts cached before the check."""
    warm = {w["seed"]: w for w in warm_starts or []}
    if any("train_success_rates" not in warm.get(s, {}) for s in seeds):
        return None
    warm_rows = [warm[s] for s in seeds]
    final = {arm: [r["final_pass_at_k"] for r in rows] for arm, rows in by_arm.items()}
    regime = _coverage.regime_check([w["train_success_rates"] for w in warm_rows],
                                    [w["pass_at_k"] for w in warm_rows], final["uniform"])
    at_cpu, amount = None, None
    if grids["cpu_s"]:
        amount = grids["cpu_s"][-1]
        at_cpu = {arm: [_harness.at_cost(r["at_cost"]["cpu_s"], amount) for r in rows]
                  for arm, rows in by_arm.items()}
    comparisons = _coverage.rule_comparisons(final, at_cpu, cpu_amount=amount)
    gains = {}
    if all(r.get("final_correct") is not None for rows in by_arm.values() for r in rows):
        gains = {arm: _coverage.gains_by_bin([w["correct"] for w in warm_rows],
                                             [r["final_correct"] for r in rows],
                                             [r["final_correct"] for r in by_arm["uniform"]],
                                             samples=cfg.eval_samples, k=_coverage.REGIME["k"])
                 for arm, rows in by_arm.items() if arm != "uniform"}
    return {"regime": regime, "comparisons": comparisons, "gains_by_bin": gains}


def _table(cfg, summary) -> str:
    ks = [k for k in REPORT_KS if k <= cfg.eval_samples]
    width = max(12, *(len(a) + 1 for a in cfg.arms))
    lines = [f"held-out pass@k after {cfg.steps} steps, mean [min, max] over {cfg.seeds} seed(s); "
             "cost per step (medians; CPU: mean)",
             "arm".ljust(width) + "".join(f"  pass@{k:<17d}" for k in ks)
             + "  step ms  gen ms  calls  tokens  CPU s"]
    for arm in cfg.arms:
        s, c = summary["arms"][arm]["final"], summary["arms"][arm]["cost"]
        cells = "".join(f"  {s['mean'][k - 1]:.3f} [{s['min'][k - 1]:.3f},{s['max'][k - 1]:.3f}]"
                        for k in ks)
        lines.append(f"{arm:<{width}s}{cells}  {c['step_wall_s'] * 1e3:7.1f} "
                     f"{c['generate_s'] * 1e3:7.1f} {c['generation_calls_per_step']:6.1f} "
                     f"{c['generated_tokens_per_step']:7.0f} {c['cpu_time_s']:6.1f}")
    for base, against in summary["paired"].items():
        if not against:
            continue
        lines += ["", f"at the final step ({cfg.steps}):",
                  _harness.paired_table({a: v["final_step_at"] for a, v in against.items()},
                                        baseline=base)]
        for cost, (_, words) in COSTS.items():
            grid = summary["common_grids"][cost]
            if grid:
                t = grid[-1]
                lines += ["", f"at {t:g} {words} (the grid's last amount every run reached):",
                          _harness.paired_table({a: v["at_cost"][cost][t]
                                                 for a, v in against.items()}, baseline=base)]
            else:
                lines.append(f"\nno amount of the {words} grid was reached by every run: no "
                             f"comparison at equal {words}")
    lines += ["", "active fraction / forced activations per step (means):"]
    lines += [f"  {arm:<{width}s} {row['active_fraction']:6.3f}  {row['forced']:6.2f}"
              for arm, row in summary.get("active_set", {}).items()]
    coverage = summary.get("coverage")
    if coverage:
        lines += ["", _coverage.format_rule(coverage["comparisons"], coverage["regime"])]
        if coverage["gains_by_bin"]:
            lines.append(f"gains at pass@{_coverage.REGIME['k']} over uniform by the held-out "
                         "problems' warm-start success:")
            lines += [f"  {arm:<{width}s} " + "  ".join(
                f"{b} {_harness.format_interval(v['mean'], v['ci_low'], v['ci_high'])}"
                for b, v in entry["bins"].items())
                for arm, entry in coverage["gains_by_bin"].items()]
    return "\n".join(lines)


def plot(cfg, summary, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = _harness.arm_colors(cfg.arms, fixed={"grpo": "black", "uniform": "tab:blue",
                                                  "sera-paper": "tab:red",
                                                  "sera-fair:alpha=1": "tab:green"})
    ks = [k for k in REPORT_KS if k <= cfg.eval_samples]
    fig, axes = plt.subplots(2, len(ks), figsize=(5 * len(ks), 8), squeeze=False)
    for col, k in enumerate(ks):
        for arm in cfg.arms:
            entry = summary["arms"][arm]
            for row, (points, label) in enumerate(((entry["at_steps"], "optimizer step"),
                                                   (entry["cpu_curve"],
                                                    "CPU seconds (one thread, evaluation "
                                                    "excluded)"))):
                ax = axes[row][col]
                xs = sorted(points)
                if not xs:
                    continue
                mean = [points[x]["mean"][k - 1] for x in xs]
                ax.plot(xs, mean, "o-", color=colors[arm], label=arm, markersize=3)
                ax.fill_between(xs, [points[x]["min"][k - 1] for x in xs],
                                [points[x]["max"][k - 1] for x in xs], color=colors[arm],
                                alpha=0.12)
                ax.set_xlabel(label)
                ax.set_ylabel(f"held-out pass@{k}")
        axes[0][col].set_title(f"pass@{k} against steps")
        axes[1][col].set_title(f"pass@{k} against CPU time")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"TRL on CPU, tiny GPT-2 on addition: mean and min-max over {cfg.seeds} "
                 f"seed(s), {cfg.budget} completions per step")
    fig.tight_layout()
    paths = [_harness.save_figure(fig, out_dir, FILE)]

    fig, axes = plt.subplots(1, len(summary["paired"]) or 1, figsize=(7 * max(1, len(summary["paired"])), 4.2),
                             squeeze=False)
    for ax, (base, against) in zip(axes[0], summary["paired"].items()):
        ks_all = np.arange(1, cfg.eval_samples + 1)
        _harness.plot_paired(ax, ks_all, {a: v["final_step"] for a, v in against.items()},
                             colors, seeds=cfg.seeds, baseline=base)
    fig.suptitle(f"paired differences at the final step ({cfg.steps})")
    fig.tight_layout()
    paths.append(_harness.save_figure(fig, out_dir, f"{FILE}_paired"))
    return paths


def _plot_coverage(cfg, runs: list[dict], out_dir: Path) -> Path:
    """Paired bands to uniform: pass@64 against steps and against CPU seconds."""
    k = _coverage.REGIME["k"]
    by_arm = {arm: sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
              for arm in cfg.arms}
    steps = {arm: [{p["step"]: p["pass_at_k"][k - 1] for p in r["at_steps"]} for r in rows]
             for arm, rows in by_arm.items()}
    cpu = {arm: [{p["at"]: p["value"][k - 1] for p in r["at_cost"]["cpu_s"]} for r in rows]
           for arm, rows in by_arm.items()}
    return _coverage.plot_paired_bands(
        [("optimizer step", f"held-out pass@{k}", steps),
         ("CPU seconds (one thread)", f"held-out pass@{k}", cpu)],
        out_dir, f"{FILE}_paired_bands",
        title=f"TRL, {cfg.seeds} seed(s): mean paired difference with its 95 % band")


def _merge(paths: list[Path]):
    """The configuration and runs of seed shards of one configuration, each file checked:
    a trl_coverage result, whole, with runs for exactly the seeds it names."""
    from sera_opt.benchmarks import _results
    from sera_opt.benchmarks.trl_coverage.train import CoverageConfig, legacy_label

    _results.same_files({f"--merge file {i + 1}": Path(p) for i, p in enumerate(paths)})
    payloads = [_results.read_result(Path(p), flag="--merge", benchmark="trl_coverage",
                                     keys=("config", "seeds", "runs", "warm_starts"))
                for p in paths]
    for path, payload in zip(paths, payloads):
        seeds = payload["seeds"]
        if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
            raise SeraOptError(f"--merge: {str(path)!r} has no list of seeds ('seeds').")
        ran = sorted({r.get("seed") for r in payload["runs"] if isinstance(r, dict)},
                     key=str)
        if ran != sorted(seeds) or not all(isinstance(r, dict) for r in payload["runs"]):
            raise SeraOptError(f"--merge: {str(path)!r} names seeds {seeds} but holds runs for "
                               f"{ran}; give the JSON its run wrote.")
    configs = [{k: v for k, v in p["config"].items() if k != "seeds"} for p in payloads]
    if any(c != configs[0] for c in configs):
        raise SeraOptError("--merge needs files of one configuration (only --seed and --seeds "
                           "may differ).")
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in payloads[0]["config"].items()
              if k in CoverageConfig.__dataclass_fields__}
    seeds = sorted({s for p in payloads for s in p["seeds"]})
    if sum(len(p["seeds"]) for p in payloads) != len(seeds):
        raise SeraOptError("--merge: a seed appears in more than one file.")
    fields["seeds"] = len(seeds)
    try:
        # Earlier files' labels read as what they measured (train.legacy_label).
        fields["arms"] = tuple(legacy_label(a) for a in fields.get("arms", ()))
        cfg = CoverageConfig(**fields).validate()
        runs = [{**r, "arm": legacy_label(r["arm"])} for p in payloads for r in p["runs"]]
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, SeraOptError):
            raise
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise SeraOptError(f"--merge: the files are not whole trl-coverage runs ({what}); "
                           "give the JSON the shards wrote.") from None
    warm = [w for p in payloads for w in p["warm_starts"]]
    # The shards' preset when they agree (a merge of default shards is a default run).
    named = {p.get("preset") for p in payloads}
    preset = named.pop() if len(named) == 1 and None not in named else "merged"
    return cfg, {"seeds": seeds, "warm_starts": warm, "runs": runs}, preset


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        parser.error("needs trl 1.16: pip install 'sera_opt[trl]'")
    start = time.perf_counter()
    if args.merge:
        cfg, result, preset = _merge(args.merge)
    else:
        preset, cfg = config_from_args(args)
        result = run(cfg, args.out, base_seed=args.seed, jobs=args.jobs,
                     show=not args.no_progress)
    try:
        summary = summarize(cfg, result["seeds"], result["runs"], result.get("warm_starts"))
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        if not args.merge or isinstance(exc, SeraOptError):
            raise
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise SeraOptError(f"--merge: the files' runs are not whole trl-coverage runs ({what}); "
                           "give the JSON the shards wrote.") from None
    command = "sera-opt bench trl-coverage " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"preset": preset, "command": command.strip(), "config": cfg.to_dict(),
               "trl": sys.modules["trl"].__version__, "torch_threads": 1, "jobs": args.jobs,
               "cpu_time": "process CPU time of training and generation, one thread per run, "
                           "evaluations excluded",
               "equal_cost_method": "grid evaluation: pass@k of the weights each arm had "
                                    "reached within t CPU seconds (tokens, calls)",
               **result, "summary": summary, "wall_time_s": time.perf_counter() - start}
    path = _harness.write_json(args.out, FILE, payload)
    paths = plot(cfg, summary, args.out)
    if summary.get("coverage"):
        paths.append(_plot_coverage(cfg, result["runs"], args.out))
    print(_table(cfg, summary))
    print(f"wall time {payload['wall_time_s']:.0f} s; wrote {path}, "
          + ", ".join(str(p) for p in paths))
    return 0
