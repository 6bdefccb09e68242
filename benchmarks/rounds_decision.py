"""The rounds rule of docs/benchmarks.md, applied to the runs' JSON files.

Reads the results of ``sera-opt bench maze``, ``sera-opt bench maze --preset hard`` and
``sera-opt bench arithmetic`` (run with the arms the rule names), and prints, per
configuration and candidate, the paired difference to the static default
``sera-fair:alpha=1`` of held-out pass@1, pass@16 and pass@64 (mean, 95 % interval from
a paired t over seeds, seeds ahead/behind), the round diagnostics (mean over every
seed's last 50 steps: budget and active fraction per round, expected scales), the CPU
time per arm, and the rule's verdict. A configuration not given counts as not run.

    python -m sera_opt.benchmarks.rounds_decision --maze M.json --maze-hard H.json \\
        --arithmetic A.json [--out summary.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from sera_opt.benchmarks import _harness

BASELINE = "sera-fair:alpha=1"
CANDIDATES = ("sera-fair:alpha=1:rounds=4", "uniform:rounds=4")
CONFIGURATIONS = ("maze default", "maze hard", "arithmetic")
KS = (1, 16, 64)


def _runs(payload: dict):
    """(arm -> {seed: pass@k curve}, arm -> [CPU seconds], arm -> [round diagnostics])."""
    curves: dict[str, dict[int, np.ndarray]] = {}
    cpu: dict[str, list[float]] = {}
    rounds: dict[str, list] = {}
    if payload["benchmark"] == "maze":
        items = [(r["arm"], r["seed"], r) for r in payload["runs"]]
        cpu_key = "cpu_time"
    else:
        items = [(arm, r["seed"], v) for r in payload["runs"] for arm, v in r["policies"].items()]
        cpu_key = "cpu_time_s"
    for arm, seed, run in items:
        curves.setdefault(arm, {})[seed] = np.asarray(run["pass_at_k"], dtype=float)
        cpu.setdefault(arm, []).append(float(run[cpu_key]))
        if "rounds" in run["curves"]:
            rounds.setdefault(arm, []).append(run["curves"]["rounds"])
    return curves, cpu, rounds


def _round_summary(runs: list, last: int = 50) -> dict:
    """Mean over every seed's last ``last`` steps of each round's budget and of the
    fraction of prompts active after it, the rollouts per step, and the expected scales
    where the rule has them. A step that ended before a round (a rule with exits) spent
    0 on it, and its active fraction stays what it was."""
    steps = [step for run in runs for step in run[-last:]]
    budgets, active = [], []
    for s in steps:
        if "active_fraction" in s:  # arithmetic's record
            b, a = list(s["round_budgets"]), list(s["active_fraction"])
        else:
            count = int(s["rounds"])
            b = [s[f"round_{r}_budget"] for r in range(count)]
            a = [s[f"round_{r}_active"] for r in range(count)]
        budgets.append(b)
        active.append(a)
    width = max(len(b) for b in budgets)
    budgets = np.array([b + [0.0] * (width - len(b)) for b in budgets], dtype=float)
    active = np.array([a + [a[-1]] * (width - len(a)) for a in active], dtype=float)
    out = {"budgets": [float(b) for b in budgets.mean(axis=0)],
           "active": [float(a) for a in active.mean(axis=0)],
           "rollouts_per_step": float(budgets.sum(axis=1).mean())}
    if all("mean_scale" in s for s in steps):
        out["mean_scale"] = float(np.mean([s["mean_scale"] for s in steps]))
        out["min_scale"] = float(np.mean([s["min_scale"] for s in steps]))
    return out


def summarize(payload: dict) -> dict:
    curves, cpu, rounds = _runs(payload)
    if BASELINE not in curves:
        raise SystemExit(f"the run has no {BASELINE!r} arm, the rule's baseline")
    seeds = sorted(curves[BASELINE])
    out: dict = {"seeds": len(seeds), "paired": {}, "command": payload.get("command"),
                 "cpu_time_per_arm_s": {a: float(np.mean(v)) for a, v in cpu.items()},
                 "rounds": {a: _round_summary(v) for a, v in rounds.items()}}
    base = np.stack([curves[BASELINE][s] for s in seeds])
    for arm, by_seed in curves.items():
        if arm == BASELINE:
            continue
        cand = np.stack([by_seed[s] for s in seeds])
        out["paired"][arm] = _harness.paired_difference_at(
            _harness.paired_difference(cand, base), KS)
    return out


def verdict(summaries: dict) -> dict:
    """The rule: a candidate wins when nowhere significantly below the static default
    (upper ends >= 0 at pass@1 and pass@64, mean pass@64 >= -0.01) and somewhere
    significantly above it (a lower end > 0 at pass@1 or pass@64)."""
    missing = [c for c in CONFIGURATIONS if c not in summaries]
    result = {"missing": missing, "candidates": {}}
    for cand in CANDIDATES:
        never_below, above = True, False
        for summary in summaries.values():
            row = summary["paired"].get(cand)
            if row is None:
                never_below = False
                continue
            p1, p64 = row["pass@1"], row["pass@64"]
            if p1["ci_high"] < 0 or p64["ci_high"] < 0 or p64["mean"] < -0.01:
                never_below = False
            if p1["ci_low"] > 0 or p64["ci_low"] > 0:
                above = True
        means = [s["paired"][cand]["pass@64"]["mean"] for s in summaries.values()
                 if cand in s["paired"]]
        result["candidates"][cand] = {"never_below": never_below, "somewhere_above": above,
                                      "wins": never_below and above and not missing,
                                      "mean_pass64": float(np.mean(means)) if means else None}
    winners = [c for c, v in result["candidates"].items() if v["wins"]]
    result["choice"] = (max(winners, key=lambda c: result["candidates"][c]["mean_pass64"])
                        if winners else None)
    return result


def _print(summaries: dict, rule: dict) -> None:
    print(f"minus static {BASELINE} on the same seed: mean [95 % interval] seeds ahead/behind")
    print("| configuration | arm | pass@1 | pass@16 | pass@64 |\n|---|---|---|---|---|")
    for name, summary in summaries.items():
        for arm, row in summary["paired"].items():
            cells = []
            for k in KS:
                r = row[f"pass@{k}"]
                mark = "**" if r["ci_high"] < 0 or r["ci_low"] > 0 else ""
                cells.append(f"{mark}{r['mean']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
                             f"{mark} {r['ahead']}/{r['behind']}")
            print(f"| {name} ({summary['seeds']} seeds) | `{arm}` | " + " | ".join(cells) + " |")
    for name, summary in summaries.items():
        print(f"\n{name}: CPU s per arm and seed " + ", ".join(
            f"{a} {v:.1f}" for a, v in summary["cpu_time_per_arm_s"].items()))
        for arm, r in summary["rounds"].items():
            scale = (f", expected scale mean {r['mean_scale']:.3f}, smallest {r['min_scale']:.3f}"
                     if "mean_scale" in r else "")
            print(f"  {arm}: budgets {[round(b, 1) for b in r['budgets']]} "
                  f"({r['rollouts_per_step']:.1f} rollouts per step), active after each "
                  f"round {[round(a, 3) for a in r['active']]}{scale}")
    print(f"\nnot run: {', '.join(rule['missing']) or 'none'}")
    for cand, v in rule["candidates"].items():
        print(f"{cand}: never significantly below {v['never_below']}, significantly above "
              f"somewhere {v['somewhere_above']}, wins {v['wins']}")
    print(f"choice: {rule['choice'] or 'none: static allocation stays the default'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sera_opt.benchmarks.rounds_decision",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--maze", type=Path)
    parser.add_argument("--maze-hard", type=Path)
    parser.add_argument("--arithmetic", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="write the summary as JSON")
    args = parser.parse_args(argv)
    summaries = {}
    for name, path in zip(CONFIGURATIONS, (args.maze, args.maze_hard, args.arithmetic)):
        if path is not None:
            summaries[name] = summarize(json.loads(path.read_text()))
    if not summaries:
        parser.error("give at least one of --maze, --maze-hard, --arithmetic")
    rule = verdict(summaries)
    _print(summaries, rule)
    if args.out is not None:
        args.out.write_text(json.dumps({"configurations": summaries, "rule": rule},
                                       indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
