"""The cost rule of docs/benchmarks.md ("A default chosen on cost"), applied to the runs' JSON.

Reads the results of the four configurations the rule names (``sera-opt bench
trl-coverage``, ``sera-opt bench maze``, ``sera-opt bench maze --preset hard`` and
``sera-opt bench arithmetic``, each run with the rule's arms) and prints, per
configuration, the paired differences of held-out pass@1 and pass@64 (mean, 95 % interval
from a paired t over seeds, seeds ahead/behind) at the final step and at equal CPU time
``t*`` (the largest amount of the configuration's CPU grid that every run of every arm
reached), of every arm against static uniform, through TRL against stock ``trl``, and of
each rounds candidate against the static candidate; the same at the last common amounts of
generated tokens (moves) and of generation calls, reported beside; each arm's cost per step;
and the rule's verdict. With ``--plot`` it draws pass@1 and pass@64 against CPU time.

    python -m sera_opt.benchmarks.cost_decision --trl T.json --maze M.json \\
        --maze-hard H.json --arithmetic A.json [--out SUMMARY.json] [--plot FIG.png]

A configuration not given counts as not run, and then the rule decides nothing. Each file
must be a whole run of the configuration it is given as (:data:`RULE_RUNS`: its benchmark,
its preset, the rule's arms and seeds, pass@k up to k = 64, no NaN), and no file may be given
twice; anything else, and an ``--out`` or ``--plot`` that cannot be written, is refused in
one line with exit status 2 before any work.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.benchmarks import _harness, _results
from sera_opt.benchmarks._results import ResultFileError

CONFIGURATIONS = ("TRL arithmetic", "maze default", "maze hard", "torch-loop arithmetic")
KS = (1, 64)
#: The rule's roles, per kind of configuration: which arm plays which part.
ROLES = {
    "trl": {"static uniform": "sera:policy=uniform:rounds=1", "static": "sera:rounds=1",
            "rounds=2": "sera:rounds=2", "rounds=4": "sera:rounds=4", "stock trl": "trl"},
    "torch": {"static uniform": "uniform", "static": "sera-fair:alpha=1",
              "rounds=2": "uniform:rounds=2", "rounds=4": "uniform:rounds=4"},
}
CANDIDATES = ("rounds=2", "rounds=4")
#: What the rule runs for each configuration (docs/benchmarks.md, "Configurations and runs"):
#: the command-line flag, the benchmark, its preset, the seeds and the command.
RULE_RUNS = {
    "TRL arithmetic": ("--trl", "trl_coverage", "default", 10,
                       "sera-opt bench trl-coverage --jobs 2 --out runs/trl_coverage"),
    "maze default": ("--maze", "maze", "default", 16,
                     "sera-opt bench maze --arms uniform,sera-fair:alpha=1,uniform:rounds=2,"
                     "uniform:rounds=4 --out runs/maze"),
    "maze hard": ("--maze-hard", "maze", "hard", 16,
                  "sera-opt bench maze --preset hard --arms uniform,sera-fair:alpha=1,"
                  "uniform:rounds=2,uniform:rounds=4 --out runs/maze_hard"),
    "torch-loop arithmetic": ("--arithmetic", "arithmetic", "default", 10,
                              "sera-opt bench arithmetic --arms uniform,sera-fair:alpha=1,"
                              "uniform:rounds=2,uniform:rounds=4 --out runs/arithmetic"),
}
#: Each benchmark's names for its (CPU, tokens-or-moves, calls) grids and their keys.
_TOKEN_GRIDS = (("cpu_s", "cpu_grid_s"), ("tokens", "token_grid"), ("calls", "call_grid"))
_GRIDS = {"trl_coverage": _TOKEN_GRIDS, "arithmetic": _TOKEN_GRIDS,
          "maze": (("cpu_s", "cpu_grid_s"), ("moves", "move_grid"), ("calls", "call_grid"))}


def _presets(kind: str) -> dict[str, dict[str, Any]]:
    """A benchmark's presets as its result's ``config`` holds them."""
    return _results.presets(kind)


def check_run(name: str, payload: dict, *, label: str) -> None:
    """Refuse a result that is not the run the rule names for configuration ``name``: another
    benchmark, another preset, or a configuration changed beside the arms and seeds
    (:func:`summarize` checks the arms, the seeds and pass@k)."""
    _, kind, preset, _, command = RULE_RUNS[name]
    _results.check_preset(payload, kind=kind, preset=preset, label=label, name=name,
                          command=command)


def _runs(payload: dict, *, label: str | None = None
          ) -> tuple[dict[str, dict[int, dict]], dict[str, list[float]]]:
    """(arm -> seed -> {"final": pass@k curve, "at_cost": CostGrid points}, cost -> grid),
    every curve checked: at least k = 64 values, none NaN."""
    kind = payload.get("benchmark")
    label = label or f"the {kind} result"
    if kind not in _GRIDS:
        raise ResultFileError(f"{label} is not a result of trl-coverage, maze or arithmetic "
                              f"(benchmark {kind!r})")
    try:
        grids = {cost: [float(t) for t in payload["config"][key]] for cost, key in _GRIDS[kind]}
        if kind == "trl_coverage":
            items = [(r["arm"], r["seed"], r["final_pass_at_k"], r["at_cost"])
                     for r in payload["runs"]]
        elif kind == "maze":
            items = [(r["arm"], r["seed"], r["pass_at_k"], r["curves"]["at_cost"])
                     for r in payload["runs"]]
        else:
            items = [(arm, r["seed"], v["pass_at_k"], v["curves"]["at_cost"])
                     for r in payload["runs"] for arm, v in r["policies"].items()]
        out: dict[str, dict[int, dict]] = {}
        for arm, seed, final, points in items:
            where = f"{label}, arm {arm!r}, seed {seed}"
            if int(seed) in out.get(arm, {}):
                raise ResultFileError(f"{where} appears twice; merge seed shards with "
                                      "their own tool, not by hand")
            # Checked copies: the payload stays as it was read (the plot reads it again).
            checked = {cost: [{**point, "value": _results.curve(
                point["value"], k=max(KS), where=f"{where}, at {point['at']:g} {cost}")}
                for point in points[cost]] for cost in grids}
            out.setdefault(arm, {})[int(seed)] = {
                "final": _results.curve(final, k=max(KS), where=f"{where}, final step"),
                "at_cost": checked}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ResultFileError):
            raise
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise ResultFileError(f"{label} is not a whole {kind} result ({what}); give the JSON "
                              "its run wrote") from None
    return out, grids


def _cost_per_step(payload: dict, arms) -> dict[str, dict[str, float]]:
    """Per arm: CPU seconds, tokens (moves) and calls per step, and through TRL the
    seconds inside generation per step, as the benchmark's own summary reports them."""
    kind, summary = payload["benchmark"], payload.get("summary")
    out = {}
    try:
        for arm in arms:
            if kind == "trl_coverage":
                c = summary["arms"][arm]["cost"]
                out[arm] = {"cpu_s": c["cpu_s_per_step"],
                            "tokens": c["generated_tokens_per_step"],
                            "calls": c["generation_calls_per_step"],
                            "generate_s": c["generate_s"], "wall_s": c["step_wall_s"]}
            else:
                c = summary[arm]["cost"]
                work = "moves" if kind == "maze" else "tokens"
                out[arm] = {"cpu_s": c["cpu_s_per_step"], work: c[f"{work}_per_step"],
                            "calls": c["calls_per_step"]}
    except (KeyError, TypeError) as exc:
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise ResultFileError(f"the {kind} result's summary lacks the cost per step ({what}); "
                              "give the JSON its run wrote") from None
    bad = [f"{arm} {key}" for arm, costs in out.items() for key, v in costs.items()
           if not isinstance(v, (int, float)) or not np.isfinite(v)]
    if bad:
        raise ResultFileError(f"the {kind} result's cost per step is not a number for "
                              f"{', '.join(bad[:4])}")
    return out


def _paired(rows_a: list, rows_b: list) -> dict[str, dict[str, Any]]:
    return _harness.paired_difference_at(
        _harness.paired_difference(np.stack(rows_a), np.stack(rows_b)), KS)


def summarize(payload: dict, name: str | None = None, *, label: str | None = None
              ) -> dict[str, Any]:
    """One configuration: the common amounts, and per point the paired differences the rule
    reads. With ``name`` (a key of :data:`RULE_RUNS`) the run must also have the rule's
    number of seeds for that configuration.

    Raises
    ------
    ResultFileError
        When the payload is not a whole result, lacks one of the rule's arms, its arms ran
        different seeds, a pass@k curve stops before k = 64 or holds NaN.
    """
    if not isinstance(payload, dict):
        raise ResultFileError(f"{label or 'a result'} is a JSON {type(payload).__name__}, "
                              "not a result object")
    runs, grids = _runs(payload, label=label)
    label = label or f"the {payload['benchmark']} result"
    kind = "trl" if payload["benchmark"] == "trl_coverage" else "torch"
    roles = ROLES[kind]
    missing = [arm for arm in roles.values() if arm not in runs]
    if missing:
        raise ResultFileError(f"{label} lacks the rule's arms {missing}; run it with the "
                              "command docs/benchmarks.md gives")
    seeds = sorted(runs[roles["static"]])
    for arm in roles.values():
        if sorted(runs[arm]) != seeds:
            raise ResultFileError(f"{label}: arm {arm!r} ran seeds {sorted(runs[arm])}, the "
                                  f"static arm {seeds}: the comparison is paired by seed")
    if name is not None and len(seeds) != RULE_RUNS[name][3]:
        raise ResultFileError(f"{label} ran {len(seeds)} seed(s); the rule judges {name} on "
                              f"{RULE_RUNS[name][3]}: {RULE_RUNS[name][4]}")
    every = [runs[arm][s]["at_cost"] for arm in roles.values() for s in seeds]
    common = {cost: _harness.common_amounts(grid, (p[cost] for p in every))
              for cost, grid in grids.items()}
    points: dict[str, float | None] = {"final": None}
    for cost, amounts in common.items():
        points[cost] = amounts[-1] if amounts else None

    def values(arm: str, point: str):
        if point == "final":
            return [runs[arm][s]["final"] for s in seeds]
        return [np.asarray(_harness.at_cost(runs[arm][s]["at_cost"][point], points[point]),
                           dtype=np.float64) for s in seeds]

    comparisons = [(role, "static uniform") for role in roles
                   if role not in ("static uniform", "stock trl")]
    if kind == "trl":
        comparisons += [(role, "stock trl") for role in roles if role != "stock trl"]
    comparisons += [(cand, "static") for cand in CANDIDATES]
    paired: dict[str, dict[str, Any]] = {}
    for point, amount in points.items():
        if point != "final" and amount is None:
            continue
        paired[point] = {f"{a} - {b}": _paired(values(roles[a], point), values(roles[b], point))
                         for a, b in comparisons}
    means = {point: {role: {f"pass@{k}": float(np.mean([v[k - 1] for v in values(arm, point)]))
                            for k in KS}
                     for role, arm in roles.items()}
             for point in paired}
    return {"benchmark": payload["benchmark"], "command": payload.get("command"),
            "seeds": seeds, "roles": roles, "grids": grids, "common_amounts": common,
            "points": points, "paired": paired, "means": means,
            "cost_per_step": _cost_per_step(payload, roles.values()),
            "cpu_grid_reached": points["cpu_s"] is not None}


def _significant(row: dict, *, below: bool) -> bool:
    return row["ci_high"] < 0 if below else row["ci_low"] > 0


def verdict(summaries: dict[str, dict]) -> dict[str, Any]:
    """The rule: admissibility, the rounds candidates' wins, and the choice."""
    missing = [c for c in CONFIGURATIONS if c not in summaries]
    no_grid = [c for c, s in summaries.items() if not s["cpu_grid_reached"]]
    result: dict[str, Any] = {"missing": missing, "cpu_grid_not_reached": no_grid,
                              "admissible": {}, "candidates": {}}
    roles = ("static", *CANDIDATES)
    for role in roles:
        reasons = []
        for name, s in summaries.items():
            for point in ("final", "cpu_s"):
                if point not in s["paired"]:
                    continue
                against = ["static uniform"] + (["stock trl"] if "stock trl" in s["roles"] else [])
                for base in against:
                    for k in KS:
                        row = s["paired"][point][f"{role} - {base}"][f"pass@{k}"]
                        if _significant(row, below=True):
                            reasons.append(f"{name}: below {base} at pass@{k} "
                                           f"({'final step' if point == 'final' else 't*'})")
        result["admissible"][role] = {"admissible": not reasons, "reasons": reasons}
    for cand in CANDIDATES:
        never_below, above, p64 = True, False, []
        for s in summaries.values():
            if "cpu_s" not in s["paired"]:
                never_below = False
                continue
            rows = s["paired"]["cpu_s"][f"{cand} - static"]
            if any(_significant(rows[f"pass@{k}"], below=True) for k in KS):
                never_below = False
            if any(_significant(rows[f"pass@{k}"], below=False) for k in KS):
                above = True
            p64.append(rows["pass@64"]["mean"])
        average = float(np.mean(p64)) if p64 else float("nan")
        wins = (result["admissible"][cand]["admissible"] and never_below and above
                and average > 0 and not missing and not no_grid)
        result["candidates"][cand] = {"never_significantly_below_static": never_below,
                                      "significantly_above_somewhere": above,
                                      "mean_pass64_vs_static_at_t": average, "wins": wins}
    winners = [c for c, v in result["candidates"].items() if v["wins"]]
    if missing or no_grid:
        result["choice"] = None
        result["decision"] = ("no decision: " + ", ".join(
            [f"{c} not run" for c in missing] + [f"{c} reached no CPU amount" for c in no_grid]))
    elif winners:
        best = max(winners, key=lambda c: result["candidates"][c]["mean_pass64_vs_static_at_t"])
        result["choice"] = best
        result["decision"] = f"{best} wins: it becomes the default"
    elif not result["admissible"]["static"]["admissible"]:
        result["choice"] = "static uniform"
        result["decision"] = ("no rounds candidate wins and the static candidate is not "
                              "admissible: the default becomes static uniform")
    else:
        result["choice"] = "static"
        result["decision"] = "no rounds candidate wins: the default stays the static plan"
    return result


def _cell(row: dict) -> str:
    mark = "**" if row["ci_high"] < 0 or row["ci_low"] > 0 else ""
    return (f"{mark}{_harness.format_interval(row['mean'], row['ci_low'], row['ci_high'])}{mark} "
            f"{row['ahead']}/{row['behind']}")


def tables(summaries: dict[str, dict]) -> str:
    """Markdown: per point of comparison, one row per configuration and comparison."""
    words = {"final": "equal steps (final step)", "cpu_s": "equal CPU time t*",
             "tokens": "equal generated tokens", "moves": "equal moves walked",
             "calls": "equal generation calls"}
    lines = []
    for point in ("final", "cpu_s", "work", "calls"):
        lines += [f"\n{words.get(point, 'equal generated tokens (moves in the mazes)')}: "
                  "mean [95 % interval] seeds ahead/behind (bold: the interval excludes 0)\n",
                  "| configuration | at | comparison | pass@1 | pass@64 |", "|---|---|---|---|---|"]
        for name, s in summaries.items():
            key = point
            if point == "work":
                key = "moves" if "moves" in s["paired"] or "moves" in s["points"] else "tokens"
            if key not in s["paired"]:
                lines.append(f"| {name} | not reached | | | |")
                continue
            at = "final step" if key == "final" else f"{s['points'][key]:g} {key}"
            for comparison, row in s["paired"][key].items():
                lines.append(f"| {name} ({len(s['seeds'])} seeds) | {at} | {comparison} | "
                             f"{_cell(row['pass@1'])} | {_cell(row['pass@64'])} |")
    lines += ["\ncost per step (mean over seeds):\n",
              "| configuration | arm | CPU s | tokens (moves) | calls | generation s (TRL) |",
              "|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        for role, arm in s["roles"].items():
            c = s["cost_per_step"][arm]
            work = c.get("tokens", c.get("moves"))
            gen = f"{c['generate_s']:.3f}" if "generate_s" in c else ""
            lines.append(f"| {name} | {role} (`{arm}`) | {c['cpu_s']:.3f} | {work:.0f} | "
                         f"{c['calls']:.2f} | {gen} |")
    return "\n".join(lines)


def _print(summaries: dict, rule: dict) -> None:
    print(tables(summaries))
    print()
    for name, s in summaries.items():
        print(f"{name}: common CPU amounts {s['common_amounts']['cpu_s']} of grid "
              f"{s['grids']['cpu_s']}; t* = {s['points']['cpu_s']}")
    for role, v in rule["admissible"].items():
        print(f"{role}: admissible {v['admissible']}" + (f" ({'; '.join(v['reasons'])})"
                                                          if v["reasons"] else ""))
    for cand, v in rule["candidates"].items():
        print(f"{cand}: never significantly below static at t* "
              f"{v['never_significantly_below_static']}, significantly above somewhere "
              f"{v['significantly_above_somewhere']}, mean pass@64 vs static at t* "
              f"{v['mean_pass64_vs_static_at_t']:+.4f}, wins {v['wins']}")
    print(f"decision: {rule['decision']}")


def plot(payloads: dict[str, dict], path: Path) -> None:
    """pass@1 and pass@64 against CPU seconds, one column per configuration: each rule arm's
    mean over seeds at every grid amount all its seeds reached, with the seeds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(payloads), figsize=(4.2 * len(payloads), 7), squeeze=False)
    for col, (name, payload) in enumerate(payloads.items()):
        runs, grids = _runs(payload)
        kind = "trl" if payload["benchmark"] == "trl_coverage" else "torch"
        for role, arm in ROLES[kind].items():
            seeds = sorted(runs[arm])
            amounts = _harness.common_amounts(grids["cpu_s"],
                                              (runs[arm][s]["at_cost"]["cpu_s"] for s in seeds))
            for row, k in enumerate(KS):
                ys = np.array([[_harness.at_cost(runs[arm][s]["at_cost"]["cpu_s"], t)[k - 1]
                                for s in seeds] for t in amounts]).reshape(len(amounts), -1)
                ax = axes[row, col]
                if len(amounts):
                    line, = ax.plot(amounts, ys.mean(axis=1), marker="o", label=f"{role}")
                    ax.fill_between(amounts, ys.min(axis=1), ys.max(axis=1),
                                    color=line.get_color(), alpha=0.1)
                ax.set_xlabel("CPU seconds of training and generation")
                ax.set_ylabel(f"held-out pass@{k}")
                ax.set_title(f"{name} ({len(seeds)} seeds)", fontsize=10)
        axes[0, col].legend(fontsize=7)
    fig.suptitle("pass@k at equal CPU time: mean over seeds, band = seeds' range", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PROG = "python -m sera_opt.benchmarks.cost_decision"


def main(argv=None) -> int:
    """The command line; every refusal is one line on stderr and exit status 2."""
    return _results.run_tool(PROG, _main, argv)


def _main(argv=None) -> int:
    from sera_opt.cli.errors import Parser

    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--trl", type=Path, help="trl_coverage.json")
    parser.add_argument("--maze", type=Path, help="the default maze preset's JSON")
    parser.add_argument("--maze-hard", type=Path, help="the hard maze preset's JSON")
    parser.add_argument("--arithmetic", type=Path, help="arithmetic JSON")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the summary and the verdict to this .json file")
    parser.add_argument("--plot", type=Path, default=None, help="write the CPU-time plot (PNG)")
    args = parser.parse_args(argv)
    given = dict(zip(CONFIGURATIONS, (args.trl, args.maze, args.maze_hard, args.arithmetic)))
    if all(path is None for path in given.values()):
        parser.error("give at least one of --trl, --maze, --maze-hard, --arithmetic")
    # Everything that can be refused is refused before the work (and before a verdict).
    _results.check_output(args.out, flag="--out", suffix=".json")
    _results.check_output(args.plot, flag="--plot", suffix=".png")
    _results.same_files({RULE_RUNS[name][0]: path for name, path in given.items()})
    payloads, summaries = {}, {}
    for name, path in given.items():
        if path is None:
            continue
        flag, kind = RULE_RUNS[name][:2]
        label = f"{flag} {str(path)!r}"
        payloads[name] = _results.read_result(path, flag=flag, benchmark=kind)
        check_run(name, payloads[name], label=label)
        summaries[name] = summarize(payloads[name], name, label=label)
    rule = verdict(summaries)
    _print(summaries, rule)
    if args.out is not None:
        _harness.write_json(args.out.parent, args.out.stem,
                            {"benchmark": "cost_decision", "configurations": summaries,
                             "rule": rule})
    if args.plot is not None:
        plot(payloads, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
