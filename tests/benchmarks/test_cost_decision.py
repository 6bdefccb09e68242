"""The cost rule of docs/benchmarks.md applied to synthetic runs whose verdict is known."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from sera_opt.benchmarks import cost_decision as cd
from sera_opt.exceptions import SeraOptError

K = 64
#: The seeds the rule runs for each benchmark (cost_decision.RULE_RUNS).
SEEDS = {"trl_coverage": 10, "maze": 16, "arithmetic": 10}


def _curve(level: float) -> list[float]:
    # a pass@k curve that rises with k and sits at ``level`` for pass@1
    return list(np.clip(level + 0.3 * np.log(np.arange(1, K + 1)) / np.log(K), 0, 1))


def _points(grid, level, reach=None):
    # ``reach``: how many of the grid's amounts the run reached (all when None)
    reach = len(grid) if reach is None else reach
    return [{"at": t, "step": int(t), "spent": t, "value": _curve(level)} for t in grid[:reach]]


def _levels(shift: dict[str, float], seed: int, rng) -> dict[str, float]:
    base = 0.3 + 0.01 * seed
    return {arm: base + d + rng.normal(0, 0.002) for arm, d in shift.items()}


def _config(kind: str, preset: str, arms) -> dict:
    """The preset's configuration as a run of it writes it (JSON), with the given arms."""
    config = json.loads(json.dumps(cd._presets(kind)[preset], default=list))
    config["policies" if kind == "arithmetic" else "arms"] = list(arms)
    return config


def _payload(kind: str, shift: dict[str, float], *, reach: dict[str, int] | None = None,
             seeds=None, final_only: bool = False, preset: str = "default") -> dict:
    """A result of ``kind`` with arm pass@1 = seed's base + shift[arm] (+ small noise); with
    ``final_only`` the shift applies at the final step and not on the cost grids."""
    rng = np.random.default_rng(0)
    seeds = range(SEEDS[kind]) if seeds is None else seeds
    work = "moves" if kind == "maze" else "tokens"
    config = _config(kind, preset, shift)
    config["seeds"] = len(seeds)
    grids = {"cpu_s": config["cpu_grid_s"],
             work: config[f"{'move' if kind == 'maze' else 'token'}_grid"],
             "calls": config["call_grid"]}
    reach = reach or {}
    runs = []
    for seed in seeds:
        levels = _levels(shift, seed, rng)
        plain = _levels({a: 0.0 for a in shift}, seed, rng)
        for arm in shift:
            final = _curve(levels[arm])
            graded = plain[arm] if final_only else levels[arm]
            at = {cost: _points(grid, graded, reach.get(arm) if cost == "cpu_s" else None)
                  for cost, grid in grids.items()}
            runs.append((arm, seed, final, at))
    if kind == "trl_coverage":
        cost = {"cpu_s_per_step": 0.1, "generated_tokens_per_step": 400.0,
                "generation_calls_per_step": 1.0, "generate_s": 0.05, "step_wall_s": 0.2}
        return {"benchmark": kind, "preset": preset, "config": config,
                "runs": [{"arm": a, "seed": s, "final_pass_at_k": f, "at_cost": p}
                         for a, s, f, p in runs],
                "summary": {"arms": {a: {"cost": cost} for a in shift}}}
    cost = {"cpu_s_per_step": 0.1, f"{work}_per_step": 400.0, "calls_per_step": 1.0,
            "training_cpu_s": 10.0}
    if kind == "maze":
        body = [{"arm": a, "seed": s, "pass_at_k": f, "curves": {"at_cost": p}}
                for a, s, f, p in runs]
    else:
        by_seed: dict[int, dict] = {}
        for a, s, f, p in runs:
            by_seed.setdefault(s, {})[a] = {"pass_at_k": f, "curves": {"at_cost": p}}
        body = [{"seed": s, "policies": v} for s, v in by_seed.items()]
    return {"benchmark": kind, "config": config, "runs": body,
            "summary": {a: {"cost": cost} for a in shift}}


TRL = {"trl": 0.0, "sera:policy=uniform:rounds=1": 0.0, "sera:rounds=1": 0.0,
       "sera:rounds=2": 0.0, "sera:rounds=4": 0.0}
TORCH = {"uniform": 0.0, "sera-fair:alpha=1": 0.0, "uniform:rounds=2": 0.0,
         "uniform:rounds=4": 0.0}


def _all(trl=None, maze=None, hard=None, arith=None, **kw):
    return {"TRL arithmetic": cd.summarize(_payload("trl_coverage", {**TRL, **(trl or {})}, **kw),
                                           "TRL arithmetic"),
            "maze default": cd.summarize(_payload("maze", {**TORCH, **(maze or {})}, **kw),
                                         "maze default"),
            "maze hard": cd.summarize(_payload("maze", {**TORCH, **(hard or {})}, preset="hard",
                                               **kw), "maze hard"),
            "torch-loop arithmetic": cd.summarize(_payload("arithmetic", {**TORCH, **(arith or {})},
                                                           **kw), "torch-loop arithmetic")}


def test_ties_everywhere_keep_the_static_default():
    rule = cd.verdict(_all())
    assert rule["choice"] == "static"
    assert not any(v["wins"] for v in rule["candidates"].values())
    assert all(v["admissible"] for v in rule["admissible"].values())


def test_a_rounds_arm_clearly_ahead_at_equal_time_wins():
    rule = cd.verdict(_all(trl={"sera:rounds=2": 0.05}, maze={"uniform:rounds=2": 0.03}))
    assert rule["candidates"]["rounds=2"]["wins"]
    assert rule["candidates"]["rounds=2"]["mean_pass64_vs_static_at_t"] > 0
    assert rule["choice"] == "rounds=2"


def test_the_larger_averaged_gain_picks_between_two_winners():
    rule = cd.verdict(_all(maze={"uniform:rounds=2": 0.02, "uniform:rounds=4": 0.05}))
    assert rule["candidates"]["rounds=2"]["wins"] and rule["candidates"]["rounds=4"]["wins"]
    assert rule["choice"] == "rounds=4"


def test_a_gain_at_equal_steps_alone_does_not_win():
    # ahead at the final step, tied at equal CPU time: the rule judges the win at t*
    summaries = _all(maze={"uniform:rounds=4": 0.05}, final_only=True)
    final = summaries["maze default"]["paired"]["final"]["rounds=4 - static"]["pass@1"]
    assert final["ci_low"] > 0
    rule = cd.verdict(summaries)
    assert not rule["candidates"]["rounds=4"]["significantly_above_somewhere"]
    assert rule["choice"] == "static"


def test_below_static_in_one_configuration_loses_despite_gains_elsewhere():
    rule = cd.verdict(_all(trl={"sera:rounds=4": 0.2}, hard={"uniform:rounds=4": -0.03}))
    v = rule["candidates"]["rounds=4"]
    assert v["significantly_above_somewhere"] and not v["never_significantly_below_static"]
    assert not v["wins"] and rule["choice"] == "static"


def test_below_stock_trl_makes_an_arm_inadmissible():
    rule = cd.verdict(_all(trl={"trl": 0.1, "sera:rounds=1": 0.1,
                                "sera:policy=uniform:rounds=1": 0.1,
                                "sera:rounds=4": 0.15}))
    # rounds=2 stays at the others' old level: below stock trl (and static) through TRL
    assert rule["admissible"]["rounds=2"]["admissible"] is False
    assert any("stock trl" in r for r in rule["admissible"]["rounds=2"]["reasons"])
    assert rule["candidates"]["rounds=4"]["wins"]


def test_static_inadmissible_and_no_winner_falls_back_to_static_uniform():
    rule = cd.verdict(_all(maze={"sera-fair:alpha=1": -0.05, "uniform:rounds=2": -0.05,
                                 "uniform:rounds=4": -0.05}))
    assert not rule["admissible"]["static"]["admissible"]
    assert rule["choice"] == "static uniform"


def test_a_configuration_not_run_decides_nothing():
    summaries = _all(maze={"uniform:rounds=2": 0.05})
    del summaries["maze hard"]
    rule = cd.verdict(summaries)
    assert rule["choice"] is None and rule["missing"] == ["maze hard"]
    assert "not run" in rule["decision"]


def test_a_cpu_grid_nobody_reached_decides_nothing():
    summaries = _all(reach={"uniform:rounds=4": 0, "sera:rounds=4": 0})
    assert summaries["maze default"]["points"]["cpu_s"] is None
    rule = cd.verdict(summaries)
    assert rule["choice"] is None and "reached no CPU amount" in rule["decision"]


def test_t_star_is_the_largest_amount_every_run_reached():
    summaries = _all(reach={"uniform:rounds=4": 1, "sera:rounds=4": 1})
    assert summaries["maze default"]["points"]["cpu_s"] == 3.0
    assert summaries["maze default"]["common_amounts"]["cpu_s"] == [3.0]


def test_unpaired_seeds_are_refused():
    payload = _payload("maze", TORCH)
    payload["runs"] = [r for r in payload["runs"] if not (r["arm"] == "uniform" and r["seed"] == 3)]
    with pytest.raises(SeraOptError, match="paired by seed"):
        cd.summarize(payload)


def test_a_missing_arm_is_refused_with_the_command_to_run():
    payload = _payload("maze", {k: v for k, v in TORCH.items() if k != "uniform:rounds=2"})
    with pytest.raises(SeraOptError, match="docs/benchmarks.md"):
        cd.summarize(payload)


RULE_FILES = (("--trl", "trl_coverage", TRL, "default"), ("--maze", "maze", TORCH, "default"),
              ("--maze-hard", "maze", TORCH, "hard"),
              ("--arithmetic", "arithmetic", TORCH, "default"))


def _files(tmp_path) -> dict[str, str]:
    paths = {}
    for flag, kind, arms, preset in RULE_FILES:
        path = tmp_path / f"{flag[2:]}.json"
        path.write_text(json.dumps(_payload(kind, arms, preset=preset)))
        paths[flag] = str(path)
    return paths


def _argv(paths: dict[str, str]) -> list[str]:
    return [a for kv in paths.items() for a in kv]


def test_command_line_writes_the_verdict(tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert cd.main(_argv(_files(tmp_path)) + ["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "decision: no rounds candidate wins" in printed
    assert "| TRL arithmetic (10 seeds) | 60 cpu_s |" in printed
    assert "| maze hard (16 seeds) | 7 cpu_s |" in printed
    saved = json.loads(out.read_text())
    assert saved["rule"]["choice"] == "static"
    assert saved["benchmark"] == "cost_decision" and "machine" in saved


def _refused(argv, capsys, match: str) -> str:
    """The tool refuses ``argv``: exit status 2, one line on stderr matching ``match``,
    nothing on stdout (no tables, no verdict)."""
    assert cd.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "", "the tool judged before it refused"
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert re.search(match, lines[0]), lines[0]
    assert lines[0].startswith(f"{cd.PROG}: error: ")
    return lines[0]


def test_command_line_refuses_an_out_that_is_not_json(tmp_path, capsys):
    paths = _files(tmp_path)
    _refused(["--maze", paths["--maze"], "--out", str(tmp_path / "summary")], capsys,
             "names a .json file")


def test_an_out_under_a_file_is_refused_before_the_work(tmp_path, capsys):
    paths = _files(tmp_path)
    _refused(_argv(paths) + ["--out", str(tmp_path / "maze.json" / "summary.json")], capsys,
             "--out: cannot write .* is a file, not a folder")
    _refused(_argv(paths) + ["--out", str(tmp_path)  + ".json", "--plot", str(tmp_path)],
             capsys, "--plot names a .png file")
    (tmp_path / "summary.json").mkdir()
    _refused(_argv(paths) + ["--out", str(tmp_path / "summary.json")], capsys, "is a folder")


def test_a_trl_result_given_as_the_maze_is_refused(tmp_path, capsys):
    paths = _files(tmp_path)
    _refused(["--maze", paths["--trl"]], capsys,
             "--maze: .* is the result of the 'trl_coverage' benchmark; --maze takes a 'maze'")


def test_one_file_for_several_configurations_is_refused(tmp_path, capsys):
    paths = _files(tmp_path)
    one = paths["--trl"]
    _refused(["--trl", one, "--maze", one, "--maze-hard", one, "--arithmetic", one], capsys,
             "--trl and --maze are given the same file")
    copy = tmp_path / "copy.json"
    copy.write_text((tmp_path / "maze.json").read_text())
    _refused(["--maze", paths["--maze"], "--maze-hard", str(copy)], capsys,
             "--maze and --maze-hard are given the same runs")


def test_the_default_maze_given_as_the_hard_one_is_refused(tmp_path, capsys):
    paths = _files(tmp_path)
    path = tmp_path / "default_as_hard.json"
    payload = _payload("maze", TORCH)
    payload["runs"] = payload["runs"][::-1]  # another file, the same configuration
    path.write_text(json.dumps(payload))
    _refused(["--maze", paths["--maze"], "--maze-hard", str(path)], capsys,
             "--maze-hard .* is a run of the 'default' preset; maze hard is maze's 'hard'")


def test_a_changed_configuration_is_refused_naming_the_field(tmp_path, capsys):
    payload = _payload("arithmetic", TORCH)
    payload["config"]["rl_steps"] = 7
    path = tmp_path / "a.json"
    path.write_text(json.dumps(payload))
    _refused(["--arithmetic", str(path)], capsys, r"not the 'default' preset \(rl_steps: 7, not")


def test_fewer_seeds_than_the_rule_runs_are_refused(tmp_path, capsys):
    payload = _payload("maze", TORCH, seeds=range(8))
    path = tmp_path / "m.json"
    path.write_text(json.dumps(payload))
    _refused(["--maze", str(path)], capsys, "ran 8 seed\\(s\\); the rule judges maze default on 16")


@pytest.mark.parametrize("where", ["final", "at_cost"])
def test_all_nan_pass_at_k_is_refused(tmp_path, capsys, where):
    payload = _payload("maze", TORCH)
    run = payload["runs"][5]
    if where == "final":
        run["pass_at_k"] = [None] * K  # how the benchmarks write NaN
    else:
        run["curves"]["at_cost"]["cpu_s"][0]["value"] = [None] * K
    path = tmp_path / "m.json"
    path.write_text(json.dumps(payload))
    _refused(["--maze", str(path)], capsys, f"arm '{run['arm']}', seed {run['seed']}.*NaN")


def test_a_nan_literal_is_refused(tmp_path, capsys):
    payload = _payload("maze", TORCH)
    payload["runs"][0]["pass_at_k"][0] = float("nan")
    path = tmp_path / "m.json"
    path.write_text(json.dumps(payload))  # Python writes NaN, which JSON has not
    _refused(["--maze", str(path)], capsys, "holds NaN")


def test_a_quick_trl_coverage_run_is_refused_not_an_index_error(tmp_path, capsys):
    # What ``bench trl-coverage --quick`` writes: 8 samples per problem, one seed.
    payload = _payload("trl_coverage", TRL, preset="quick", seeds=[0])
    for run in payload["runs"]:
        run["final_pass_at_k"] = run["final_pass_at_k"][:8]
        for points in run["at_cost"].values():
            for point in points:
                point["value"] = point["value"][:8]
    path = tmp_path / "trl_coverage.json"
    path.write_text(json.dumps(payload))
    _refused(["--trl", str(path)], capsys, "is a run of the 'quick' preset")
    with pytest.raises(SeraOptError, match="pass@64 needs 64 samples per problem; the run drew 8"):
        cd.summarize(payload)


@pytest.mark.parametrize("text, match", [
    ("", "is empty"),
    ('{"benchmark": "maze", "config": {"cpu', "truncated"),
    ("[1, 2]", "holds a JSON list, not the object"),
    ("{}", "is an empty JSON object"),
    ('{"config": {}, "runs": [1], "summary": {}}', "names no benchmark"),
    ('{"benchmark": "maze", "runs": [1], "summary": {}}', "has no 'config'"),
    ('{"benchmark": "maze", "config": {}, "runs": [1]}', "has no 'summary'"),
    ('{"benchmark": "maze", "config": [], "runs": [1], "summary": {}}', "has a list as 'config'"),
    ('{"benchmark": "maze", "config": {}, "runs": [], "summary": {}}', "holds no runs"),
    ("not json", "it is not JSON at line 1"),
])
def test_broken_files_are_refused_in_one_line(tmp_path, capsys, text, match):
    path = tmp_path / "m.json"
    path.write_text(text)
    _refused(["--maze", str(path)], capsys, match)


def test_a_missing_file_and_missing_runs_are_refused(tmp_path, capsys):
    _refused(["--maze", str(tmp_path / "absent.json")], capsys, "no file")
    payload = _payload("maze", TORCH)
    del payload["runs"][0]["curves"]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(payload))
    _refused(["--maze", str(path)], capsys, r"not a whole maze result \(no 'curves'\)")
    payload = _payload("maze", TORCH)
    del payload["summary"]["uniform"]
    path.write_text(json.dumps(payload))
    _refused(["--maze", str(path)], capsys, "summary lacks the cost per step")
