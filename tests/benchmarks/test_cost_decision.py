"""The cost rule of docs/benchmarks.md applied to synthetic runs whose verdict is known."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sera_opt.benchmarks import cost_decision as cd

SEEDS = 10
K = 64


def _curve(level: float) -> list[float]:
    # a pass@k curve that rises with k and sits at ``level`` for pass@1
    return list(np.clip(level + 0.3 * np.log(np.arange(1, K + 1)) / np.log(K), 0, 1))


def _points(grid, level, reach=None):
    reach = max(grid) if reach is None else reach
    return [{"at": t, "step": int(t), "spent": t, "value": _curve(level)}
            for t in grid if t <= reach]


def _levels(shift: dict[str, float], seed: int, rng) -> dict[str, float]:
    base = 0.3 + 0.01 * seed
    return {arm: base + d + rng.normal(0, 0.002) for arm, d in shift.items()}


def _payload(kind: str, shift: dict[str, float], *, reach: dict[str, float] | None = None,
             seeds=range(SEEDS), final_only: bool = False) -> dict:
    """A result of ``kind`` with arm pass@1 = seed's base + shift[arm] (+ small noise); with
    ``final_only`` the shift applies at the final step and not on the cost grids."""
    rng = np.random.default_rng(0)
    work = "moves" if kind == "maze" else "tokens"
    grids = {"cpu_s": [1.0, 2.0], work: [10.0], "calls": [5.0]}
    reach = reach or {}
    config = {"cpu_grid_s": grids["cpu_s"], f"{'move' if kind == 'maze' else 'token'}_grid":
              grids[work], "call_grid": grids["calls"]}
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
        return {"benchmark": kind, "config": config,
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
    return {"TRL arithmetic": cd.summarize(_payload("trl_coverage", {**TRL, **(trl or {})}, **kw)),
            "maze default": cd.summarize(_payload("maze", {**TORCH, **(maze or {})}, **kw)),
            "maze hard": cd.summarize(_payload("maze", {**TORCH, **(hard or {})}, **kw)),
            "torch-loop arithmetic": cd.summarize(_payload("arithmetic", {**TORCH, **(arith or {})},
                                                           **kw))}


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
    summaries = _all(reach={"uniform:rounds=4": 0.5, "sera:rounds=4": 0.5})
    assert summaries["maze default"]["points"]["cpu_s"] is None
    rule = cd.verdict(summaries)
    assert rule["choice"] is None and "reached no CPU amount" in rule["decision"]


def test_t_star_is_the_largest_amount_every_run_reached():
    summaries = _all(reach={"uniform:rounds=4": 1.5, "sera:rounds=4": 1.5})
    assert summaries["maze default"]["points"]["cpu_s"] == 1.0
    assert summaries["maze default"]["common_amounts"]["cpu_s"] == [1.0]


def test_unpaired_seeds_are_refused():
    payload = _payload("maze", TORCH)
    payload["runs"] = [r for r in payload["runs"] if not (r["arm"] == "uniform" and r["seed"] == 3)]
    with pytest.raises(SystemExit, match="paired by seed"):
        cd.summarize(payload)


def test_a_missing_arm_is_refused_with_the_command_to_run():
    payload = _payload("maze", {k: v for k, v in TORCH.items() if k != "uniform:rounds=2"})
    with pytest.raises(SystemExit, match="docs/benchmarks.md"):
        cd.summarize(payload)


def test_command_line_writes_the_verdict(tmp_path, capsys):
    paths = {}
    for flag, kind, arms in (("--trl", "trl_coverage", TRL), ("--maze", "maze", TORCH),
                             ("--maze-hard", "maze", TORCH), ("--arithmetic", "arithmetic", TORCH)):
        path = tmp_path / f"{flag[2:]}.json"
        path.write_text(json.dumps(_payload(kind, arms)))
        paths[flag] = str(path)
    out = tmp_path / "summary.json"
    assert cd.main([a for kv in paths.items() for a in kv] + ["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "decision: no rounds candidate wins" in printed
    assert "| TRL arithmetic (10 seeds) | 2 cpu_s |" in printed
    saved = json.loads(out.read_text())
    assert saved["rule"]["choice"] == "static"
    assert saved["benchmark"] == "cost_decision" and "machine" in saved


def test_command_line_refuses_an_out_that_is_not_json(tmp_path, capsys):
    path = tmp_path / "maze.json"
    path.write_text(json.dumps(_payload("maze", TORCH)))
    with pytest.raises(SystemExit):
        cd.main(["--maze", str(path), "--out", str(tmp_path / "summary")])
    assert "names a .json file" in capsys.readouterr().err
