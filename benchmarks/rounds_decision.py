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

Each file must be a whole run of the configuration it is given as (:data:`RULE_RUNS`: its
benchmark and preset, the baseline arm, the rule's seeds paired over the arms, pass@k up to
k = 64, no NaN), and no file may be given twice; anything else, and an ``--out`` that cannot
be written, is refused in one line with exit status 2 before any work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from sera_opt.benchmarks import _harness, _results
from sera_opt.benchmarks._results import ResultFileError

BASELINE = "sera-fair:alpha=1"
CANDIDATES = ("sera-fair:alpha=1:rounds=4", "uniform:rounds=4")
CONFIGURATIONS = ("maze default", "maze hard", "arithmetic")
KS = (1, 16, 64)
_ARMS = "uniform,sera-fair:alpha=1,sera-fair:alpha=1:rounds=4,uniform:rounds=4"
#: What the rule runs for each configuration (docs/benchmarks.md, the rounds rule): the
#: command-line flag, the benchmark, its preset, the seeds and the command.
RULE_RUNS = {
    "maze default": ("--maze", "maze", "default", 16, f"sera-opt bench maze --arms {_ARMS}"),
    "maze hard": ("--maze-hard", "maze", "hard", 16,
                  f"sera-opt bench maze --preset hard --arms {_ARMS}"),
    "arithmetic": ("--arithmetic", "arithmetic", "default", 10,
                   f"sera-opt bench arithmetic --arms {_ARMS}"),
}


def _runs(payload: dict, label: str):
    """(arm -> {seed: pass@k curve}, arm -> [CPU seconds], arm -> [round diagnostics]),
    every curve checked: at least k = 64 values, none NaN."""
    curves: dict[str, dict[int, np.ndarray]] = {}
    cpu: dict[str, list[float]] = {}
    rounds: dict[str, list] = {}
    kind = payload.get("benchmark")
    if kind not in ("maze", "arithmetic"):
        raise ResultFileError(f"{label} is not a result of maze or arithmetic (benchmark "
                              f"{kind!r})")
    try:
        if kind == "maze":
            items = [(r["arm"], r["seed"], r) for r in payload["runs"]]
            cpu_key = "cpu_time"
        else:
            items = [(arm, r["seed"], v) for r in payload["runs"]
                     for arm, v in r["policies"].items()]
            cpu_key = "cpu_time_s"
        for arm, seed, run in items:
            where = f"{label}, arm {arm!r}, seed {seed}"
            if int(seed) in curves.get(arm, {}):
                raise ResultFileError(f"{where} appears twice")
            curves.setdefault(arm, {})[int(seed)] = _results.curve(
                run["pass_at_k"], k=max(KS), where=where)
            cpu.setdefault(arm, []).append(float(run[cpu_key]))
            if "rounds" in run["curves"]:
                rounds.setdefault(arm, []).append(run["curves"]["rounds"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ResultFileError):
            raise
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise ResultFileError(f"{label} is not a whole {kind} result ({what}); give the JSON "
                              "its run wrote") from None
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


def summarize(payload: dict, name: str | None = None, *, label: str | None = None) -> dict:
    """One configuration: each arm's paired difference to the baseline, the CPU time and
    the round diagnostics. With ``name`` (a key of :data:`RULE_RUNS`) the run must also have
    the rule's number of seeds.

    Raises
    ------
    ResultFileError
        When the payload is not a whole result, has no baseline arm, its arms ran different
        seeds, or a pass@k curve stops before k = 64 or holds NaN.
    """
    label = label or "the result"
    if not isinstance(payload, dict):
        raise ResultFileError(f"{label} is not a result object")
    curves, cpu, rounds = _runs(payload, label)
    if BASELINE not in curves:
        raise ResultFileError(f"{label} has no {BASELINE!r} arm, the rule's baseline; run it "
                              "with the rule's arms")
    seeds = sorted(curves[BASELINE])
    for arm, by_seed in curves.items():
        if sorted(by_seed) != seeds:
            raise ResultFileError(f"{label}: arm {arm!r} ran seeds {sorted(by_seed)}, the "
                                  f"baseline {seeds}: the comparison is paired by seed")
    if name is not None and len(seeds) != RULE_RUNS[name][3]:
        raise ResultFileError(f"{label} ran {len(seeds)} seed(s); the rule judges {name} on "
                              f"{RULE_RUNS[name][3]}: {RULE_RUNS[name][4]}")
    try:
        round_summaries = {a: _round_summary(v) for a, v in rounds.items()}
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise ResultFileError(f"{label} has incomplete round diagnostics ({what}); give the "
                              "JSON its run wrote") from None
    out: dict = {"seeds": len(seeds), "paired": {}, "command": payload.get("command"),
                 "cpu_time_per_arm_s": {a: float(np.mean(v)) for a, v in cpu.items()},
                 "rounds": round_summaries}
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


PROG = "python -m sera_opt.benchmarks.rounds_decision"


def main(argv=None) -> int:
    """The command line; every refusal is one line on stderr and exit status 2."""
    return _results.run_tool(PROG, _main, argv)


def _main(argv=None) -> int:
    from sera_opt.cli.errors import Parser

    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--maze", type=Path, help="the default maze preset's JSON")
    parser.add_argument("--maze-hard", type=Path, help="the hard maze preset's JSON")
    parser.add_argument("--arithmetic", type=Path, help="arithmetic JSON")
    parser.add_argument("--out", type=Path, default=None, help="write the summary as JSON")
    args = parser.parse_args(argv)
    given = dict(zip(CONFIGURATIONS, (args.maze, args.maze_hard, args.arithmetic)))
    if all(path is None for path in given.values()):
        parser.error("give at least one of --maze, --maze-hard, --arithmetic")
    _results.check_output(args.out, flag="--out", suffix=".json")
    _results.same_files({RULE_RUNS[name][0]: path for name, path in given.items()})
    summaries = {}
    for name, path in given.items():
        if path is None:
            continue
        flag, kind, preset, _, command = RULE_RUNS[name]
        label = f"{flag} {str(path)!r}"
        payload = _results.read_result(path, flag=flag, benchmark=kind, keys=("config", "runs"))
        _results.check_preset(payload, kind=kind, preset=preset, label=label, name=name,
                              command=command)
        summaries[name] = summarize(payload, name, label=label)
    rule = verdict(summaries)
    _print(summaries, rule)
    if args.out is not None:
        args.out.write_text(json.dumps({"configurations": summaries, "rule": rule},
                                       indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
