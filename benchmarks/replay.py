"""Replay a recorded run under other allocation policies: the report, its speed, a sample.

Three commands share this module:

* ``sera-opt replay RECORD --arms uniform,sera-paper,sera-fair:alpha=1`` (:func:`replay_main`)
  reads a recorded run (verl's rollout dump folder, or a CSV / JSONL / Parquet table of
  ``step, prompt_id, reward[, epoch]``; :mod:`sera_opt.replay.records`), replays it step
  by step for each arm (:mod:`sera_opt.replay.engine`), prints a table per arm (mean
  over steps with a block-bootstrap interval, and the paired difference to uniform) and
  writes ``replay.json`` and ``replay.png`` under ``--out``.
* ``sera-opt bench replay`` (:func:`main`) times a replay of 1,000 steps of 256 prompts
  x 16 rollouts for four arms (``--quick``: 100 steps), on a run drawn here, and the
  reading of the same run from a CSV file.
* ``sera-opt bench replay --sample`` records the project's own uniform run (the
  arithmetic experiment, :mod:`sera_opt.benchmarks.arithmetic`) in verl's dump format,
  trains the other arms from the same warm start, replays the record, and compares
  the replay's prediction with what each arm's training run measured.

Every arm gets the same bounds and offset (those of the authors' runs and of the
experiments: offset 1, at least 2 rollouts per prompt given any, at most 4 x the
step's average count); :func:`build_planner` is the one place an arm becomes a planner.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.benchmarks import _harness
from sera_opt.exceptions import SeraOptError
from sera_opt.replay import (
    FEEDS,
    FIRST_ORDER_NOTE,
    SCORE_NAMES,
    RecordedRun,
    ReplayResult,
    ReplaySettings,
    read_record,
    replay,
    write_table,
    write_verl_dump,
)

__all__ = ["NAME", "DEFAULT_ARMS", "build_planner", "build_planners", "run_replay",
           "format_report", "replay_main", "main", "synthetic_run"]

NAME = "replay"
#: The arms of ``sera-opt replay`` when none are given.
DEFAULT_ARMS = "uniform,sera-paper,sera-fair:alpha=1"
#: The arms of the speed row (four).
SPEED_ARMS = "uniform,sera-paper,sera-fair:alpha=1,sera"
ESTIMATE_OF_P = ("each prompt's p at a step is Beta(a0 + K, b0 + n - K) from the step's "
                 "recorded n rollouts with K successes; every score is its expectation under "
                 "that posterior")
_LABELS = {
    "mean_factor": "expected factor, mean per prompt",
    "min_factor": "expected factor, minimum",
    "factor_spread": "expected factor, max - min",
    "mixed_prompts": "prompts with a mixed group",
    "no_signal_rollouts": "rollouts without signal",
    "active_prompts": "prompts given rollouts",
}


# --------------------------------------------------------------------------- arms


def build_planner(spec: _harness.ArmSpec, settings: ReplaySettings, *,
                  tracker_decay: float | None = None):
    """The planner of one arm: the arm's policy with the replay's offset and minimum
    (the cap is passed per step, ``ceil(max_ratio * B / M)``, the same for every arm).

    ``sera-paper`` is the authors' whole configuration (:meth:`RolloutPlanner.paper_sera`
    with the arm's options, its epoch tracker included), as the experiments run it. Other
    arms get a fresh ``SuccessTracker()``, or ``SuccessTracker(decay=tracker_decay)`` (the
    experiments' forgetting tracker, for comparing with their runs).
    """
    import sera_opt

    if spec.is_reinforce_ada or spec.rounds > 1:
        raise _harness.ArmSpecError(
            f"arm {spec.label!r} draws in rounds, which need each round's outcomes within "
            f"the step; the replay plans each step once (static arms only).")
    if "max_ratio" in spec.kwargs:
        raise _harness.ArmSpecError(
            f"arm {spec.label!r}: max_ratio is the replay's for every arm alike "
            f"({settings.max_ratio:g} x the step's average count); drop it from the arm.")
    if spec.policy == "sera-paper":
        try:
            planner = sera_opt.RolloutPlanner.paper_sera(**spec.kwargs)
        except (SeraOptError, TypeError, ValueError) as exc:
            words = " ".join(str(exc).split())
            raise _harness.ArmSpecError(f"arm {spec.label!r}: {words}") from None
        policy = planner.policy
        if (policy.offset, policy.min_rollouts) != (settings.offset, settings.min_rollouts):
            raise _harness.ArmSpecError(
                f"arm {spec.label!r} has offset {policy.offset} and minimum "
                f"{policy.min_rollouts}; the replay's are {settings.offset} and "
                f"{settings.min_rollouts}.")
        return planner
    tracker = None if tracker_decay is None else sera_opt.SuccessTracker(decay=tracker_decay)
    policy = spec.build(min_rollouts=settings.min_rollouts, max_rollouts=None,
                        offset=settings.offset)
    return sera_opt.RolloutPlanner(policy, tracker=tracker)


def build_planners(arms, settings: ReplaySettings, *, tracker_decay: float | None = None
                   ) -> dict[str, Any]:
    """``{label: planner}`` for an arm list (``"uniform,sera-paper"``, the bench syntax)."""
    specs = _harness.parse_arms(arms)
    return {spec.label: build_planner(spec, settings, tracker_decay=tracker_decay)
            for spec in specs}


# --------------------------------------------------------------------------- the report


def _progress(enabled: bool):
    def wrap(iterable, *, total=None, desc=""):
        return _harness.progress(iterable, desc=desc, total=total, enabled=enabled)

    return wrap


def run_replay(record, arms=DEFAULT_ARMS, *, settings: ReplaySettings | None = None,
               id_field: str | None = None, show_progress: bool = True,
               tracker_decay: float | None = None) -> ReplayResult:
    """Read ``record`` (a path or a :class:`RecordedRun`) and replay it for ``arms``."""
    settings = (settings or ReplaySettings()).check()
    planners = build_planners(arms, settings, tracker_decay=tracker_decay)
    run = record if isinstance(record, RecordedRun) else read_record(
        record, id_field=id_field, progress=_progress(show_progress))
    return replay(run, planners, settings, progress=_progress(show_progress))


def _baseline(result: ReplayResult) -> str:
    return "uniform" if "uniform" in result.arms else result.arms[0]


def _cell(entry: dict[str, float], signed: bool = False) -> str:
    form = "+.3f" if signed else ".3f"
    if abs(entry["mean"]) >= 100:
        form = "+.1f" if signed else ".1f"
    low, high = entry["ci_low"], entry["ci_high"]
    body = f"{entry['mean']:{form}}"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{body} [no interval]"
    return f"{body} [{low:{form}}, {high:{form}}]"


def format_report(result: ReplayResult, summary: dict[str, Any]) -> str:
    """The text report: the first-order note first, what was replayed, a table per arm."""
    run, settings = result.run, result.settings
    base = _baseline(result)
    first = next(iter(next(iter(summary.values())).values()))
    level = f"{first['confidence']:.0%}".replace("%", " %")
    lines = [
        FIRST_ORDER_NOTE,
        f"record: {run.source or '(in memory)'} ({run.format}): {run.describe()}",
        f"epochs: {run.epoch_source}",
        f"bounds: {settings.describe(result.prior)}",
        f"estimate of p: {ESTIMATE_OF_P} (a0, b0 = {result.prior[0]:.3g}, "
        f"{result.prior[1]:.3g})",
        f"intervals: {level}, moving-block bootstrap over steps (blocks of {first['block']} "
        f"steps)",
    ]
    width = max(len(label) for label in _LABELS.values())
    for arm in result.arms:
        entry = summary[arm]
        lines += ["", f"{arm}" + (" (baseline)" if arm == base else "")]
        head = "  " + "per step".ljust(width) + "  mean over steps [interval]"
        if arm != base:
            head = head.ljust(width + 40) + f"minus {base} [interval]"
        lines.append(head)
        for name, label in _LABELS.items():
            row = "  " + label.ljust(width) + "  " + _cell(entry[name])
            key = f"{name}_minus_{base}"
            if key in entry:
                row = row.ljust(width + 40) + _cell(entry[key], signed=True)
            lines.append(row)
        if result.has_active_set[arm]:
            easy = float(np.mean(result.scores[arm]["too_easy"]))
            hard = float(np.mean(result.scores[arm]["too_hard"]))
            lines.append(f"  active set: {easy:.1f} prompts per step switched off as too easy, "
                         f"{hard:.1f} as too hard (means over steps)")
    check = result.calibration
    lines += ["", f"check of the estimate: at the recorded counts, {check['expected']:.2f} "
                  f"prompts per step are expected to have a mixed group and "
                  f"{check['realized']:.2f} had one in the record"]
    lines += ["", f"replayed {run.num_steps} steps for {len(result.arms)} arms in "
                  f"{result.wall_time_s:.1f} s"]
    return "\n".join(lines)


def _payload(result: ReplayResult, summary: dict[str, Any]) -> dict[str, Any]:
    run, s = result.run, result.settings
    return {
        "note": FIRST_ORDER_NOTE,
        "record": {"source": run.source, "format": run.format, "steps": run.num_steps,
                   "prompts": len(run.prompt_keys), "rollouts": run.num_rollouts,
                   "epochs": run.num_epochs, "epoch_rule": run.epoch_source},
        "settings": {"offset": s.offset, "min_rollouts": s.min_rollouts,
                     "max_rollouts": f"ceil({s.max_ratio:g} * B / M)",
                     "prior": s.prior if isinstance(s.prior, str) else list(s.prior),
                     "prior_used": list(result.prior), "feed": s.feed, "seed": s.seed,
                     "described": s.describe(result.prior)},
        "estimate_of_p": ESTIMATE_OF_P,
        "scores": SCORE_NAMES,
        "baseline": _baseline(result),
        "arms": list(result.arms),
        "summary": summary,
        "calibration": result.calibration,
        "per_step": {"step": result.steps, "epoch": result.epochs,
                     **{arm: result.scores[arm] for arm in result.arms}},
        "wall_time_s": result.wall_time_s,
    }


def plot_replay(result: ReplayResult, out: Path, name: str = NAME) -> Path:
    """Per step: prompts with a mixed group, the mean expected factor and the rollouts
    without signal, one line per arm (a moving mean over a few steps on long runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ["mixed_prompts", "mean_factor", "no_signal_rollouts"]
    if any(result.has_active_set.values()):
        panels.append("active_prompts")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    colors = _harness.arm_colors(result.arms)
    t = result.steps.shape[0]
    window = max(1, t // 50)
    kernel = np.ones(window) / window
    for ax, panel in zip(axes, panels):
        for arm in result.arms:
            y = np.asarray(result.scores[arm][panel], dtype=np.float64)
            if window > 1:
                y = np.convolve(y, kernel, mode="valid")
                x = result.steps[window - 1:]
            else:
                x = result.steps
            ax.plot(x, y, color=colors[arm], label=arm, linewidth=1.2)
        ax.set_xlabel("recorded step")
        ax.set_title(_LABELS[panel] + (f" ({window}-step mean)" if window > 1 else ""),
                     fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle("replay of a recorded run: first-order effect only (scored against the "
                 "recorded outcomes)", fontsize=9)
    fig.tight_layout()
    return _harness.save_figure(fig, out, name)


def _prior(text: str) -> tuple[float, float] | str:
    if text == "fit":
        return text
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a prior is 'fit' or 'a,b' (two numbers), got "
                                         f"{text!r}") from None
    if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
        raise argparse.ArgumentTypeError(f"a Beta prior needs a, b > 0, got {text!r}")
    return a, b


def build_replay_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sera-opt replay",
        description="Replay a recorded run (verl's rollout dump folder, or a CSV / JSONL / "
                    "Parquet table of step, prompt_id, reward[, epoch]) under allocation "
                    "policies, and see what each would have spent. First-order effect only.")
    parser.add_argument("record", help="verl's trainer.rollout_data_dir folder, or a .csv, "
                                       ".jsonl or .parquet file in the plain schema")
    parser.add_argument("--arms", default=DEFAULT_ARMS,
                        help=f"comma-separated arms in the bench syntax (default: "
                             f"{DEFAULT_ARMS})")
    parser.add_argument("--out", type=Path, default=_harness.DEFAULT_OUT,
                        help=f"folder for replay.json and replay.png (default: "
                             f"{_harness.DEFAULT_OUT})")
    parser.add_argument("--id-field", default=None,
                        help="verl dumps: the line field holding the prompt's id (default: "
                             "the prompt text, 'input')")
    parser.add_argument("--prior", type=_prior, default="fit", metavar="fit|A,B",
                        help="the Beta prior the step's outcomes are shrunk with: 'fit' (the "
                             "run's own, the Beta-Binomial maximum likelihood; default) or A,B (1,1 is "
                             "Laplace's rule)")
    parser.add_argument("--feed", choices=FEEDS, default="own",
                        help="what each arm's tracker observes: its own draws (a prefix of the "
                             "record, default) or every recorded outcome")
    parser.add_argument("--seed", type=_harness.seed, default=0,
                        help="seed of the draws beyond the record and of the bootstrap")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


def replay_main(argv=None) -> int:
    """``sera-opt replay``: the report on stdout, ``replay.json`` and ``replay.png`` under
    ``--out``."""
    args = build_replay_parser().parse_args(argv)
    settings = ReplaySettings(prior=args.prior, feed=args.feed, seed=args.seed).check()
    result = run_replay(args.record, args.arms, settings=settings, id_field=args.id_field,
                        show_progress=not args.no_progress)
    summary = result.summary(baseline=_baseline(result), seed=args.seed)
    print(format_report(result, summary))
    path = _harness.write_json(args.out, NAME, _payload(result, summary))
    print(f"results: {path}")
    if not args.no_plot:
        print(f"plot: {plot_replay(result, args.out)}")
    return 0


# --------------------------------------------------------------------------- speed row


def synthetic_run(steps: int, prompts: int, rollouts: int, *, pool: int | None = None,
                  seed: int = 0) -> RecordedRun:
    """A uniform run drawn here: a pool of prompts with p ~ Beta(0.6, 1.2) (the spread of
    docs/theory.md's expected effect), shuffled passes over the pool, each step's
    prompts drawing ``rollouts`` Bernoulli(p) rewards; p rises slowly over the run, as in
    training."""
    rng = np.random.default_rng(seed)
    pool = 4 * prompts if pool is None else pool
    logit = np.log(rng.beta(0.6, 1.2, pool).clip(1e-6, 1 - 1e-6))
    logit -= np.log1p(-np.exp(logit))
    order: list[int] = []
    ids, rewards = [], []
    for t in range(steps):
        while len(order) < prompts:
            order.extend(rng.permutation(pool).tolist())
        batch = np.asarray(order[:prompts])
        del order[:prompts]
        p = 1.0 / (1.0 + np.exp(-(logit[batch] + 1.5 * t / max(steps, 1))))
        ids.append(np.repeat(batch, rollouts))
        rewards.append((rng.random((prompts, rollouts)) < p[:, None]).ravel())
    return RecordedRun.from_rollouts(np.repeat(np.arange(1, steps + 1), prompts * rollouts),
                                     np.concatenate(ids).tolist(),
                                     np.concatenate(rewards).astype(np.int8),
                                     source="synthetic", format="arrays")


def speed_row(steps: int, prompts: int, rollouts: int, arms: str, *, seed: int,
              show_progress: bool, read: bool = True) -> dict[str, Any]:
    """Time one replay of a synthetic run (and the reading of it from a CSV file)."""
    run = synthetic_run(steps, prompts, rollouts, seed=seed)
    settings = ReplaySettings(seed=seed)
    row: dict[str, Any] = {"steps": steps, "prompts": prompts, "rollouts": rollouts,
                           "arms": arms, "rollouts_total": run.num_rollouts}
    if read:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "run.csv"
            write_table(path, run)
            row["csv_mib"] = path.stat().st_size / 2**20
            start, cpu = time.perf_counter(), time.process_time()
            again = read_record(path, progress=_progress(show_progress))
            row["read_s"] = time.perf_counter() - start
            row["read_cpu_s"] = time.process_time() - cpu
            # Baseline: numpy's own parser on the same file (all three columns are
            # integers here), which checks nothing and keeps no ids.
            start = time.perf_counter()
            np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64)
            row["loadtxt_s"] = time.perf_counter() - start
            row["read_vs_loadtxt"] = row["read_s"] / row["loadtxt_s"]
        if again.num_rollouts != run.num_rollouts:
            raise SeraOptError("the CSV read back differs from the run written.")
    planners = build_planners(arms, settings)
    cpu = time.process_time()
    result = replay(run, planners, settings, progress=_progress(show_progress))
    row["replay_s"] = result.wall_time_s
    row["replay_cpu_s"] = time.process_time() - cpu
    # Baseline: the same replay with the uniform arm alone (its plan is a split of the
    # budget), the floor of the replay's own bookkeeping and scoring per arm.
    alone = replay(run, build_planners("uniform", settings), settings,
                   progress=_progress(False))
    row["uniform_alone_s"] = alone.wall_time_s
    row["replay_vs_uniform_alone"] = row["replay_s"] / alone.wall_time_s
    row["mixed_prompts"] = {arm: float(np.mean(result.scores[arm]["mixed_prompts"]))
                            for arm in result.arms}
    return row


# --------------------------------------------------------------------------- the sample


def _recorder(recorded: list, texts: list[str], tokenizer):
    """The arithmetic loop's ``on_rollouts`` hook: each step's rollouts as verl dumps them
    (verl counts steps from 1; the prompt's text is its ``input``)."""
    def on_rollouts(step, prompt_ids, rewards, completions):
        outputs = [tokenizer.decode(row) for row in completions.cpu().tolist()]
        recorded.append((step + 1, [texts[i] for i in np.asarray(prompt_ids).tolist()],
                         outputs, np.asarray(rewards, dtype=np.float64).tolist()))

    return on_rollouts


def record_sample(out: Path, *, arms: str, seeds: int, preset: str, show_progress: bool
                  ) -> dict[str, Any]:
    """Record the arithmetic experiment's uniform run in verl's dump format
    (``out/replay_sample/seed{S}/{step}.jsonl``), train the other arms of ``arms`` from
    the same warm start, replay each record, and compare the prediction of each arm's
    prompts with a mixed group (and its change from uniform) with what its training run
    measured (``signal_fraction`` of the estimator's diagnostics, times the prompts)."""
    import copy

    import torch

    from sera_opt.benchmarks.arithmetic.task import make_split
    from sera_opt.benchmarks.arithmetic.train import (
        PRESETS,
        build_model,
        train_maxrl,
        warm_start,
    )

    specs = _harness.parse_arms(arms)
    if specs[0].label != "uniform":
        raise SeraOptError("the sample's arms start with 'uniform', the recorded run.")
    labels = tuple(s.label for s in specs)
    cfg = PRESETS[preset]
    from dataclasses import replace

    cfg = replace(cfg, policies=labels).validate()
    if cfg.max_rollouts != 4 * cfg.rollouts_per_prompt or cfg.offset != 1:
        raise SeraOptError("the sample's preset must cap at 4 x the average count with "
                           "offset 1, the replay's bounds.")
    settings = ReplaySettings()
    rows = []
    for seed in range(seeds):
        train, test = make_split(cfg.data_seed, cfg.num_train, cfg.num_test, cfg.max_digits)
        texts = train.prompts()
        torch.manual_seed(seed)
        model, tokenizer = build_model(cfg, "cpu")
        warm_start(model, tokenizer, cfg, train, test, seed, "cpu", show_progress=show_progress)
        warm = copy.deepcopy(model.state_dict())
        recorded: list[tuple[int, list[str], list[str], list[float]]] = []
        on_rollouts = _recorder(recorded, texts, tokenizer)
        measured = {}
        for label in labels:
            model.load_state_dict(warm)
            torch.manual_seed(seed)
            trained = train_maxrl(model, tokenizer, cfg, train, test, label, seed, "cpu",
                                  show_progress=show_progress,
                                  on_rollouts=on_rollouts if label == "uniform" else None)
            diag = trained["curves"]["diagnostics"]
            measured[label] = np.array([d["signal_fraction"] * d["num_prompts"]
                                        for d in diag])
        folder = write_verl_dump(Path(out) / "replay_sample" / f"seed{seed}", recorded)
        result = run_replay(folder, arms, settings=settings, show_progress=show_progress,
                            tracker_decay=cfg.tracker_decay)
        predicted = {arm: np.asarray(result.scores[arm]["mixed_prompts"]) for arm in labels}
        rows.append({"seed": seed, "folder": folder, "steps": int(result.steps.shape[0]),
                     "predicted": {a: float(v.mean()) for a, v in predicted.items()},
                     "measured": {a: float(v.mean()) for a, v in measured.items()},
                     "predicted_first_epoch": {
                         a: float(v[:cfg.num_train // cfg.prompts_per_step].mean())
                         for a, v in predicted.items()},
                     "measured_first_epoch": {
                         a: float(v[:cfg.num_train // cfg.prompts_per_step].mean())
                         for a, v in measured.items()}})
    return {"preset": preset, "arms": list(labels), "seeds": seeds,
            "prompts_per_step": cfg.prompts_per_step, "steps": cfg.rl_steps,
            "tracker": f"sera-paper: the authors' epoch tracker; the other arms: "
                       f"SuccessTracker(decay={cfg.tracker_decay}), as in the experiment",
            "rows": rows}


def _sample_table(sample: dict[str, Any]) -> str:
    labels = sample["arms"]
    lines = [FIRST_ORDER_NOTE,
             f"arithmetic preset {sample['preset']}: {sample['steps']} steps of "
             f"{sample['prompts_per_step']} prompts; prompts with a mixed group per step, "
             f"mean over the steps, predicted by replaying the uniform run vs measured in "
             f"each arm's own training run (same seed, same warm start)",
             "seed  arm".ljust(28) + "predicted  measured   pred. - uniform  meas. - uniform"]
    for row in sample["rows"]:
        p, m = row["predicted"], row["measured"]
        for arm in labels:
            lines.append(f"{row['seed']:<4d}  {arm:<22s}{p[arm]:9.2f} {m[arm]:9.2f}   "
                         f"{p[arm] - p['uniform']:+15.2f}  {m[arm] - m['uniform']:+15.2f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = _harness.common_parser(
        NAME, "Speed of a replay of a recorded run (1,000 steps x 256 prompts x 16 rollouts, "
              "four arms), or --sample: record the arithmetic experiment's uniform run in "
              "verl's dump format and compare the replay's prediction with the arms' runs.")
    parser.add_argument("--arms", default=None,
                        help=f"the arms (default: {SPEED_ARMS}; with --sample: "
                             f"uniform,sera-fair:alpha=1,sera-paper)")
    parser.add_argument("--steps", type=_harness.at_least(1), default=None,
                        help="recorded steps of the speed row (default 1000, --quick 100)")
    parser.add_argument("--sample", action="store_true",
                        help="record the project's uniform arithmetic run and compare")
    parser.add_argument("--seeds", type=_harness.at_least(1), default=3,
                        help="--sample: seeds (default 3)")
    parser.add_argument("--preset", default=None,
                        help="--sample: the arithmetic preset (default: default, --quick: quick)")
    return parser


def main(argv=None) -> int:
    """``sera-opt bench replay``: the speed row, or ``--sample``."""
    args = build_parser().parse_args(argv)
    show = not args.no_progress
    if args.sample:
        preset = args.preset or ("quick" if args.quick else "default")
        sample = record_sample(args.out, arms=args.arms or "uniform,sera-fair:alpha=1,sera-paper",
                               seeds=1 if args.quick else args.seeds, preset=preset,
                               show_progress=show)
        print(_sample_table(sample))
        print(f"results: {_harness.write_json(args.out, 'replay_sample', sample)}")
        return 0
    steps = args.steps or (100 if args.quick else 1000)
    row = speed_row(steps, 256, 16, args.arms or SPEED_ARMS, seed=args.seed,
                    show_progress=show)
    print(f"replay of {row['steps']} steps x {row['prompts']} prompts x {row['rollouts']} "
          f"rollouts ({row['rollouts_total']:,} rollouts), arms {row['arms']}:")
    print(f"  replay {row['replay_s']:.1f} s wall ({row['replay_cpu_s']:.1f} s CPU); reading "
          f"the run from CSV ({row['csv_mib']:.0f} MiB) {row['read_s']:.1f} s wall "
          f"({row['read_cpu_s']:.1f} s CPU)")
    print(f"  baselines in the same run: the replay is {row['replay_vs_uniform_alone']:.1f}x "
          f"the uniform arm replayed alone ({row['uniform_alone_s']:.1f} s); the reading "
          f"{row['read_vs_loadtxt']:.1f}x numpy.loadtxt of the same file "
          f"({row['loadtxt_s']:.1f} s)")
    print(f"  machine: {_harness.machine_info().get('cpu_model', '?')}, "
          f"{_harness.machine_info()['cpu_count']} CPUs (wall time counts other work on "
          f"them; CPU time is this process's)")
    print(f"results: {_harness.write_json(args.out, 'replay_speed', {'speed': row})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_harness.run_command(NAME, main))
