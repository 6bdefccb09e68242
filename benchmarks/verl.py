"""verl on CPU: where a training step's time goes, stock GRPO against sera_opt's ``sera_sync``.

Runs whole verl 0.9.1 jobs on the CPU (:mod:`sera_opt.integrations.verl_cpu`: a tiny
Llama, a character tokenizer made in code, digit-addition prompts, Ray, an FSDP2 actor
on gloo, the transformers rollout), one per arm:

* ``grpo``: verl's synchronous V1 trainer with its own GRPO estimator and
  ``rollout.n`` rollouts for every prompt;
* ``sera``: the ``sera_sync`` mode with the ``sera_maxrl`` estimator, the
  multiplicity correction and SERA's per-prompt counts on the same budget.

For every step verl's own timers give the split: generation (``gen``), the old
log-probabilities (``old_log_prob``), the actor update (``update_actor``), the weight
sync to the rollout (``update_weights``), the advantage step (``adv``) and the whole
step; sera_opt's share is the time of its own work inside the step (planning the
counts, feeding the outcomes to the planner, the advantage estimator verl calls) over
the step; ``grpo`` runs none of it (0), and verl's own GRPO estimator is inside
``adv``. The first step carries one-off costs (the first weight sync, lazy imports), so
the table reports the median over the steps after it; the JSON keeps every step. Each arm is one run: the numbers are a
single-machine profile, not a comparison with an interval.

    sera-opt bench verl [--quick] [--out DIR] [--steps 4] [--arms grpo,sera]

``--quick`` runs 2 steps of each arm. Each run takes about a minute to start on a
2-core machine (verl starts about ten Ray processes, each importing torch).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sera_opt.exceptions import SeraOptError

from . import _harness

NAME = "verl"
ARMS = {
    "grpo": ("sync", ["algorithm.adv_estimator=grpo"]),
    "sera": (
        "sera_sync",
        ["algorithm.adv_estimator=sera_maxrl", "+algorithm.sera_maxrl.policy=sera"],
    ),
}
#: verl's timers of a step (``timing_s/<name>``), in the order of the step.
PHASES = ("gen", "old_log_prob", "adv", "update_actor", "update_weights")
DEFAULT_STEPS = 4
QUICK_STEPS = 2


def _parser():
    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--steps", type=_harness.at_least(2), default=None,
                        help=f"training steps per arm (default {DEFAULT_STEPS}; "
                             f"--quick: {QUICK_STEPS})")
    parser.add_argument("--arms", default="grpo,sera",
                        help="comma-separated arms among " + ", ".join(ARMS))
    return parser


def _arms(text: str) -> list[str]:
    arms = [arm.strip() for arm in text.split(",") if arm.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms:
        raise SeraOptError(f"--arms takes names among {sorted(ARMS)}, got {text!r}.")
    return arms


def split(steps: dict[int, dict]) -> dict[str, float]:
    """Median seconds per phase over the steps after the first, and sera_opt's share.

    Parameters
    ----------
    steps : dict
        Step -> that step's recorded metrics (``metrics.jsonl`` of
        :func:`sera_opt.integrations.verl_cpu.run`).
    """
    from sera_opt.integrations.verl_cpu import SERA_TIMERS

    later = [steps[step] for step in sorted(steps) if step > min(steps)] or list(steps.values())
    result = {}
    for phase in (*PHASES, "step"):
        result[phase] = statistics.median(row.get(f"timing_s/{phase}", 0.0) for row in later)
    sera = [sum(row.get(f"sera_timing_s/{name}", 0.0) for name in SERA_TIMERS) for row in later]
    result["sera_opt"] = statistics.median(sera)
    result["sera_opt_share"] = statistics.median(
        total / row["timing_s/step"] for total, row in zip(sera, later, strict=True)
    )
    return result


def run_arm(arm: str, folder: str, steps: int) -> dict:
    """One verl run on CPU; returns its per-step metrics and its wall time."""
    from sera_opt.integrations import verl_cpu

    mode, extra = ARMS[arm]
    # The arm's own folder (model and data linked), so no arm resumes another's checkpoint.
    arm_folder = os.path.join(folder, arm)
    os.makedirs(arm_folder)
    for name in ("model", "train.parquet", "val.parquet"):
        os.symlink(os.path.join(folder, name), os.path.join(arm_folder, name))
    record = os.path.join(arm_folder, "record")
    overrides = verl_cpu.cpu_overrides(arm_folder, mode=mode, steps=steps) + extra
    start = time.perf_counter()
    verl_cpu.run(overrides, record_dir=record)
    wall = time.perf_counter() - start
    with open(os.path.join(record, "metrics.jsonl")) as handle:
        metrics = {row["step"]: row["data"] for row in map(json.loads, handle)}
    return {"wall_s": wall, "metrics": metrics}


def _plot(results: dict, out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 3))
    arms = list(results)
    left = [0.0] * len(arms)
    for phase in (*PHASES, "sera_opt"):
        widths = [results[arm]["split"][phase] for arm in arms]
        ax.barh(arms, widths, left=left, label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel("seconds per step (median after step 1)")
    ax.set_title("verl 0.9.1 on CPU, tiny Llama")
    ax.legend(fontsize=7, loc="lower right")
    return _harness.save_figure(fig, out, NAME)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    arms = _arms(args.arms)
    steps = args.steps or (QUICK_STEPS if args.quick else DEFAULT_STEPS)
    from sera_opt.integrations import verl_cpu

    results = {}
    with tempfile.TemporaryDirectory(prefix="sera-bench-verl-") as folder:
        verl_cpu.build_tiny_setup(folder, seed=args.seed)
        for arm in _harness.progress(arms, desc="verl runs", enabled=not args.no_progress):
            run = run_arm(arm, folder, steps)
            run["split"] = split(run["metrics"])
            results[arm] = run
    header = f"{'arm':<6}" + "".join(f"{p:>15}" for p in (*PHASES, "step", "sera_opt")) + \
        f"{'share':>8}"
    print(header)
    for arm, run in results.items():
        row = run["split"]
        print(f"{arm:<6}" + "".join(f"{row[p]:>15.4f}" for p in (*PHASES, "step", "sera_opt"))
              + f"{row['sera_opt_share']:>8.2%}")
    payload = {
        "steps": steps,
        "seed": args.seed,
        "arms": {arm: {"mode": ARMS[arm][0], "overrides": ARMS[arm][1], **run}
                 for arm, run in results.items()},
        "note": "seconds; split = medians over the steps after the first",
    }
    path = _harness.write_json(args.out, NAME, payload)
    print(f"wrote {path}")
    figure = _plot(results, args.out)
    if figure is not None:
        print(f"wrote {figure}")
    return 0


if __name__ == "__main__":  # pragma: no cover - a command
    raise SystemExit(main())
