"""The maze experiment: generator, environment, and the quick pipeline end to end.

Also the pieces of the shared harness that the three experiments (maze,
arithmetic, alignment) use alike: arm specifications on the command line, the
paired intervals of their summaries, and the comparison of result files.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

torch = pytest.importorskip("torch")

from sera_opt.benchmarks import _harness  # noqa: E402
from sera_opt.benchmarks.compare import compare_payloads  # noqa: E402
from sera_opt.benchmarks.maze import env as env_mod  # noqa: E402
from sera_opt.benchmarks.maze.env import (  # noqa: E402
    Maze,
    MazeBatch,
    MazeEnv,
    distance_map,
    generate_maze,
    generate_maze_sets,
    is_perfect,
    maze_key,
)
from sera_opt.exceptions import SeraOptError  # noqa: E402

# ---------------------------------------------------------------------------
# generator


def _union_find_is_tree(open_: np.ndarray) -> bool:
    """Reference check, independent of the module: the passages form a spanning tree."""
    height, width = open_.shape[:2]
    parent = list(range(height * width))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    edges = 0
    for r in range(height):
        for c in range(width):
            # east and south passages, each undirected edge once
            for m, (dr, dc) in ((1, (0, 1)), (2, (1, 0))):
                if open_[r, c, m]:
                    a, b = find(r * width + c), find((r + dr) * width + c + dc)
                    if a == b:
                        return False  # a loop
                    parent[a] = b
                    edges += 1
    roots = {find(i) for i in range(height * width)}
    return edges == height * width - 1 and len(roots) == 1


@pytest.mark.parametrize("height,width", [(2, 2), (3, 5), (6, 4), (8, 8)])
def test_generated_mazes_are_perfect(height, width):
    rng = np.random.default_rng(height * 100 + width)
    for _ in range(20):
        maze = generate_maze(height, width, rng, min_path=3)
        open_ = maze.open
        # no opening through the outer wall, and every opening is carved from both sides
        assert not open_[0, :, 0].any() and not open_[-1, :, 2].any()
        assert not open_[:, 0, 3].any() and not open_[:, -1, 1].any()
        assert np.array_equal(open_[:-1, :, 2], open_[1:, :, 0])
        assert np.array_equal(open_[:, :-1, 1], open_[:, 1:, 3])
        assert _union_find_is_tree(open_)
        assert is_perfect(open_)
        assert maze.start != maze.goal
        assert maze.shortest_path == distance_map(open_, maze.goal)[maze.start]
        eccentricity = int(distance_map(open_, maze.goal).max())
        assert maze.shortest_path >= min(3, eccentricity)


def test_is_perfect_rejects_loops_and_disconnection():
    open_ = np.zeros((2, 2, 4), dtype=bool)
    # a full ring: 4 passages on 4 cells is a loop
    open_[0, 0, 1] = open_[0, 1, 3] = True
    open_[0, 1, 2] = open_[1, 1, 0] = True
    open_[1, 1, 3] = open_[1, 0, 1] = True
    open_[1, 0, 0] = open_[0, 0, 2] = True
    assert not is_perfect(open_)
    assert not _union_find_is_tree(open_)
    open_[1, 0, 0] = open_[0, 0, 2] = False
    assert is_perfect(open_)
    open_[1, 1, 3] = open_[1, 0, 1] = False  # cell (1, 0) cut off
    assert not is_perfect(open_)
    open_[1, 1, 3] = True  # one-sided opening
    assert not is_perfect(open_)


def test_maze_sets_are_deterministic_from_the_seed():
    a_train, a_test = generate_maze_sets(30, 10, sizes=(3, 6), seed=7)
    b_train, b_test = generate_maze_sets(30, 10, sizes=(3, 6), seed=7)
    c_train, _ = generate_maze_sets(30, 10, sizes=(3, 6), seed=8)
    assert [maze_key(m) for m in a_train + a_test] == [maze_key(m) for m in b_train + b_test]
    assert [maze_key(m) for m in a_train] != [maze_key(m) for m in c_train]
    sizes = {(m.height, m.width) for m in a_train}
    assert all(3 <= h <= 6 and 3 <= w <= 6 for h, w in sizes)
    assert len(sizes) > 3  # sizes really vary


def test_held_out_mazes_are_disjoint_even_when_collisions_are_likely():
    # 2x2 grids have 4 spanning trees and 12 ordered (start, goal) pairs: 48 mazes
    # in all, so two independent draws of 20 would collide without the rejection.
    train, test = generate_maze_sets(20, 20, sizes=(2, 2), min_path=1, seed=0)
    train_keys = {maze_key(m) for m in train}
    test_keys = {maze_key(m) for m in test}
    assert len(train_keys) == 20 and len(test_keys) == 20
    assert not train_keys & test_keys
    with pytest.raises(RuntimeError, match="distinct mazes"):
        generate_maze_sets(30, 30, sizes=(2, 2), min_path=1, seed=0)


def test_default_sets_are_disjoint():
    train, test = generate_maze_sets(256, 128, sizes=(3, 8), min_path=3, seed=0)
    assert not {maze_key(m) for m in train} & {maze_key(m) for m in test}


# ---------------------------------------------------------------------------
# environment on a hand-made maze
#
#   (0,0) - (0,1) - (0,2)
#             |       |
#   (1,0) - (1,1)   (1,2)
#
# Start (1,0), goal (1,2); the only path is E, N, E, S.

N, E, S, W = 0, 1, 2, 3


def _hand_maze() -> Maze:
    open_ = np.zeros((2, 3, 4), dtype=bool)

    def carve(a, b, m):
        open_[a][m] = True
        open_[b][env_mod.OPPOSITE[m]] = True

    carve((0, 0), (0, 1), E)
    carve((0, 1), (0, 2), E)
    carve((0, 2), (1, 2), S)
    carve((0, 1), (1, 1), S)
    carve((1, 1), (1, 0), W)
    assert is_perfect(open_)
    return Maze(open=open_, start=(1, 0), goal=(1, 2),
                shortest_path=int(distance_map(open_, (1, 2))[1, 0]))


def test_env_step_logic_on_a_hand_made_maze():
    maze = _hand_maze()
    assert maze.shortest_path == 4
    batch = MazeBatch([maze], size=4)
    env = MazeEnv(batch, [0, 0, 0], horizon=6, view_radius=1)
    # walker 0 follows the path; walker 1 bumps into walls; walker 2 idles into the horizon
    plans = [
        [E, N, E, S, N, N],   # reaches the goal on move 4; later moves ignored
        [N, W, S, E, E, E],   # N, W, S blocked at (1,0); then E to (1,1); E blocked; E blocked
        [W, W, W, W, W, W],
    ]
    positions = []
    for t in range(6):
        env.step(torch.tensor([p[t] for p in plans]))
        positions.append(env.position.tolist())
        if t == 3:
            assert env.done.tolist() == [True, False, False]
            assert env.success.tolist() == [True, False, False]
    assert positions[0][0] == [1, 1] and positions[1][0] == [0, 1]
    assert positions[3][0] == [1, 2] and positions[5][0] == [1, 2]  # stays after success
    assert positions[2][1] == [1, 0] and positions[3][1] == [1, 1] and positions[5][1] == [1, 1]
    assert all(p[2] == [1, 0] for p in positions)
    assert env.done.all()  # horizon reached
    assert env.success.tolist() == [True, False, False]
    # walker 0's last recorded move is the one that reached the goal
    assert env.prev_move.tolist() == [S, E, W]


def test_env_observation_encodes_window_goal_previous_move_and_visits():
    maze = _hand_maze()
    batch = MazeBatch([maze], size=4)
    env = MazeEnv(batch, [0], horizon=10, view_radius=1)
    obs = env.reset()
    assert obs.shape == (1, env.observation_size) == (1, 9 * 6 + 8)
    window = obs[0, :54].reshape(9, 6)
    centre = window[4]  # the walker's own cell (1, 0): only east open, inside, visited
    assert centre.tolist() == [0, 1, 0, 0, 1, 1]
    # north neighbour (0, 0): inside, not visited, open only to the east
    assert window[1].tolist() == [0, 1, 0, 0, 1, 0]
    # south neighbour (2, 0) is padding of the 4x4 grid: outside the maze, all blocked
    assert window[7].tolist() == [0, 0, 0, 0, 0, 0]
    # west of column 0 lies beyond the grid: also outside
    assert window[3].tolist() == [0, 0, 0, 0, 0, 0]
    goal_offset = obs[0, 54:56].tolist()
    assert goal_offset == pytest.approx([0.0, 2 / 4])
    assert obs[0, 56:58].tolist() == [0.0, 1.0]  # signs
    assert obs[0, 58:].tolist() == [0, 0, 0, 0]  # no previous move yet
    obs = env.step(torch.tensor([E]))
    window = obs[0, :54].reshape(9, 6)
    assert window[3].tolist() == [0, 1, 0, 0, 1, 1]  # (1, 0) now west of the walker, visited
    assert window[4][5] == 1
    assert obs[0, 58:].tolist() == [0, 1, 0, 0]


def test_expert_moves_walk_the_shortest_path():
    train, _ = generate_maze_sets(40, 1, sizes=(3, 7), seed=3)
    batch = MazeBatch(train, size=7)
    env = MazeEnv(batch, np.arange(40), horizon=60)
    steps_taken = np.zeros(40, dtype=np.int64)
    for _ in range(60):
        alive = (~env.done).numpy()
        steps_taken += alive
        env.step(env.expert_moves())
    assert env.success.all()
    assert np.array_equal(steps_taken, batch.shortest_path.numpy())


# ---------------------------------------------------------------------------
# training pipeline


def _tiny_config(**overrides):
    from sera_opt.benchmarks.maze.train import MazeConfig

    base = dict(sizes=(3, 5), num_train=24, num_test=8, horizon=24, hidden=32,
                warmup_steps=3, warmup_mazes=8, steps=4, mazes_per_step=6,
                rollouts_per_maze=4, max_rollouts=10, eval_samples=8, k_max=8,
                eval_every=2, curve_samples=4, seeds=2, arms=("uniform", "sera"))
    base.update(overrides)
    return MazeConfig(**base)


def test_config_validation_names_the_problem():
    with pytest.raises(SeraOptError, match="uniform"):
        _tiny_config(arms=("sera",))
    with pytest.raises(SeraOptError, match="k_max"):
        _tiny_config(k_max=9)
    with pytest.raises(SeraOptError, match="rollouts_per_maze"):
        _tiny_config(rollouts_per_maze=12)


@pytest.mark.parametrize("arms,match", [
    ("uniform,not-a-policy", "unknown policy 'not-a-policy'"),
    ("uniform,vip:no_such_option=1", "no_such_option"),
    ("uniform,sera:no_such_option=1", "has no option 'no_such_option'"),
    ("uniform,sera:max_ratio=2", "max_ratio has no effect"),
    ("uniform,sera:max_ratio", "key=value"),
    ("uniform,vip:gamma=fast", "not a Python literal"),
    ("uniform,sera:min_rollouts=4", "set by the experiment"),
    ("uniform,sera,sera", "give each arm once"),
    ("sera,hora", "uniform"),
])
def test_cli_refuses_bad_arms_before_any_training(tmp_path, monkeypatch, arms, match):
    from sera_opt.benchmarks import maze
    from sera_opt.benchmarks.maze import train

    def no_training(*args, **kwargs):
        raise AssertionError("training started before the arms were checked")

    monkeypatch.setattr(train, "run_seed_warmup", no_training)
    monkeypatch.setattr(train, "run_arm", no_training)
    with pytest.raises(SeraOptError, match=match) as info:
        maze.main(["--quick", "--arms", arms, "--out", str(tmp_path), "--workers", "1"])
    assert "\n" not in str(info.value)
    assert not (tmp_path / "maze.json").exists()


def test_sera_opt_bench_reports_a_bad_arm_in_one_line(tmp_path, capsys):
    from sera_opt.cli import main

    assert main(["bench", "maze", "--quick", "--arms", "uniform,vip:gamma=-1",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vip:gamma=-1" in err and "gamma" in err
    assert not (tmp_path / "maze.json").exists()


def test_arm_planner_gets_the_options_and_the_configuration_bounds():
    from sera_opt.benchmarks.maze import train

    config = _tiny_config(arms=("uniform", "vip:gamma=0.001", "hora:prior_strength=inf"))
    vip = train._planner("vip:gamma=0.001", config).policy
    assert vip.name == "vip" and vip.gamma == 0.001
    assert (vip.min_rollouts, vip.max_rollouts, vip.offset) == (2, 10, 1)
    hora = train._planner("hora:prior_strength=inf", config).policy
    assert hora.name == "hora" and math.isinf(hora.prior_strength)
    sera = train._planner("sera", config).policy
    assert (sera.name, sera.min_rollouts, sera.max_rollouts, sera.offset) == ("sera", 2, 10, 1)


def test_pipeline_end_to_end_is_deterministic():
    from sera_opt.benchmarks import maze

    config = _tiny_config(arms=("uniform", "sera", "vip:gamma=0.001"))
    first = maze.run(config, show_progress=False, base_seed=5)
    second = maze.run(config, show_progress=False, base_seed=5)
    assert first["seeds"] == [5, 6]
    for a, b in zip(first["runs"], second["runs"]):
        assert (a["seed"], a["arm"]) == (b["seed"], b["arm"])
        assert np.array_equal(a["test_successes"], b["test_successes"])
        assert a["curves"]["loss"] == b["curves"]["loss"]
    for run in first["runs"]:
        curve = run["pass_at_k"]
        assert curve.shape == (8,)
        assert np.all(np.diff(curve) >= -1e-12) and 0 <= curve[0] and curve[-1] <= 1
        assert len(run["curves"]["success_rate"]) == 4
        assert run["curves"]["eval_step"] == [2, 4]
        assert run["curves"]["diagnostics"] and all(
            np.isfinite(v) for d in run["curves"]["diagnostics"] for v in d.values())
        planned = run["curves"]["planned_diagnostics"]
        assert len(planned) == 4 and all(0 <= d["min_factor"] <= 1 for d in planned)
        if run["arm"] == "uniform":
            # matched budget: every maze gets exactly rollouts_per_maze
            assert run["curves"]["counts_std"] == [0.0] * 4
    sera_std = [s for r in first["runs"] if r["arm"] == "sera" for s in r["curves"]["counts_std"]]
    # after the first visits the tracker's estimates differ, so SERA's counts do too
    assert max(sera_std) > 0
    summary = first["summary"]
    assert set(summary) >= {"warmup", *config.arms}
    # The summary against an independent recomputation from the runs, paired by seed.
    curves = {(r["arm"], r["seed"]): r["pass_at_k"] for r in first["runs"]}
    uniform = np.array([curves["uniform", s] for s in first["seeds"]])
    for arm in ("sera", "vip:gamma=0.001"):
        rows = np.array([curves[arm, s] for s in first["seeds"]])
        diff = rows - uniform
        entry = summary[arm]
        np.testing.assert_array_equal(entry["mean"], rows.mean(axis=0))
        np.testing.assert_array_equal(entry["min"], rows.min(axis=0))
        np.testing.assert_array_equal(entry["max"], rows.max(axis=0))
        np.testing.assert_allclose(entry["difference_to_uniform"]["mean"], diff.mean(axis=0),
                                   atol=1e-15)
        np.testing.assert_array_equal(entry["seeds_above_uniform"], (diff > 0).sum(axis=0))
        np.testing.assert_array_equal(entry["seeds_below_uniform"], (diff < 0).sum(axis=0))
        paired = entry["paired_vs_uniform"]
        np.testing.assert_array_equal(paired["ahead"] + paired["behind"] + paired["tied"],
                                      len(first["seeds"]))
        np.testing.assert_allclose(paired["mean"], diff.mean(axis=0), atol=1e-15)
        varying = diff.std(axis=0) > 0
        low, high = stats.ttest_rel(rows[:, varying], uniform[:, varying]).confidence_interval()
        np.testing.assert_allclose(paired["ci_low"][varying], low, rtol=1e-10)
        np.testing.assert_allclose(paired["ci_high"][varying], high, rtol=1e-10)
        assert set(entry["paired_vs_uniform_at"]) == {"pass@1"}  # k_max = 8 here
    # The arms really differ from uniform somewhere, so the checks above compared numbers.
    assert np.any(summary["vip:gamma=0.001"]["paired_vs_uniform"]["std"] > 0)
    assert "paired_vs_uniform" not in summary["uniform"]
    # the difficulty breakdown covers every held-out maze exactly once
    assert np.all(summary["path_bin_counts"]["mean"].sum() == config.num_test)
    by = summary["uniform"]["by_path_length"]["mean"]
    assert by.shape == (len(maze.PATH_BINS), len(maze.BIN_KS))


def test_main_writes_json_and_plots(tmp_path):
    from sera_opt.benchmarks import maze
    from sera_opt.benchmarks.maze import train as _maze_train

    quick = _maze_train.PRESETS["quick"]
    assert quick.seeds >= 3 and quick.k_max == 64 and len(quick.arms) >= 3
    argv = ["--quick", "--seeds", "1", "--steps", "2", "--arms", "uniform,sera",
            "--out", str(tmp_path), "--no-progress", "--seed", "3"]
    assert maze.main(argv) == 0
    payload = json.loads((tmp_path / "maze.json").read_text())
    assert payload["benchmark"] == "maze" and payload["preset"] == "quick"
    assert payload["config"]["steps"] == 2 and payload["seeds"] == [3]
    assert len(payload["summary"]["sera"]["mean"]) == 64
    # one seed has no spread: null, not 0
    assert payload["summary"]["sera"]["std"] == [None] * 64
    assert payload["summary"]["sera"]["min"] == payload["summary"]["sera"]["max"]
    # One seed: the interval is undefined, written as null with a note, never a zero width.
    at = payload["summary"]["sera"]["paired_vs_uniform_at"]
    assert set(at) == {"pass@1", "pass@16", "pass@64"}
    for cell in at.values():
        assert cell["n"] == 1 and cell["ci_low"] is None and cell["ci_high"] is None
        assert cell["p_value"] is None and "undefined" in cell["note"]
        assert cell["ahead"] + cell["behind"] + cell["tied"] == 1
    assert (tmp_path / "maze.png").stat().st_size > 0
    assert (tmp_path / "maze_training.png").stat().st_size > 0


def test_report_arms_build_with_the_report_configurations():
    from sera_opt.benchmarks import maze
    from sera_opt.benchmarks.maze import train

    assert maze.REPORT_ARMS[0] == "uniform" and len(maze.REPORT_ARMS) == 6
    assert train.PRESETS["default"].seeds == 16 and train.PRESETS["hard"].seeds == 16
    # the default configurations are the ones the report runs used, and the quick check
    # includes the library's default allocation
    assert train.PRESETS["default"].arms == train.PRESETS["hard"].arms == maze.REPORT_ARMS
    assert "sera-fair:alpha=1" in train.PRESETS["quick"].arms
    for preset in ("default", "hard"):
        config = replace(train.PRESETS[preset], arms=maze.REPORT_ARMS)
        specs = maze.runner.check_arms(config)
        assert [s.label for s in specs] == list(maze.REPORT_ARMS)
        alphas = [s.kwargs["alpha"] for s in specs if s.policy == "sera-fair"]
        assert alphas == [0, 1, 2]


# ---------------------------------------------------------------------------
# shared harness: arm specifications


@pytest.mark.parametrize("text,policy,options", [
    ("uniform", "uniform", {}),
    ("  sera ", "sera", {}),
    ("sera:max_ratio=2", "sera", {"max_ratio": 2}),
    ("vip:gamma=0.001", "vip", {"gamma": 0.001}),
    ("vip:gamma=7e-4", "vip", {"gamma": 7e-4}),
    ("hora:prior_strength=inf", "hora", {"prior_strength": math.inf}),
    ("sera:max_ratio=None", "sera", {"max_ratio": None}),
    ("sera:solver='milp'", "sera", {"solver": "milp"}),
    ("sera:continuous=False", "sera", {"continuous": False}),
    ("gvm:alpha=0.5:beta=-inf", "gvm", {"alpha": 0.5, "beta": -math.inf}),
    ("gvm : alpha = 1 : beta = 3", "gvm", {"alpha": 1, "beta": 3}),
])
def test_parse_arm(text, policy, options):
    spec = _harness.parse_arm(text)
    assert spec.label == text.strip()
    assert spec.policy == policy
    assert spec.kwargs == options
    assert [type(v) for v in spec.kwargs.values()] == [type(v) for v in options.values()]


@pytest.mark.parametrize("text,match", [
    ("", "empty"),
    ("no-such-policy", "unknown policy 'no-such-policy'"),
    ("sera:", "key=value"),
    ("sera:max_ratio", "key=value"),
    ("sera:=2", "key=value"),
    ("sera:max ratio=2", "key=value"),
    ("sera:max_ratio=", "key=value"),
    ("sera:max_ratio=2:max_ratio=3", "given twice"),
    ("sera:offset=1", "set by the experiment"),
    ("sera:max_rollouts=8", "set by the experiment"),
    ("sera:solver=milp", "quoted string"),
    ("sera:max_ratio=nan", "not a Python literal"),
    ("sera:solver='milp", "unbalanced"),
    ("gvm:alpha=(1,2", "unbalanced"),
    ("gvm:alpha=1)(", "unbalanced"),
])
def test_parse_arm_refuses_bad_specs_in_one_line(text, match):
    with pytest.raises(_harness.ArmSpecError, match=match) as info:
        _harness.parse_arm(text)
    assert isinstance(info.value, SeraOptError)
    assert "\n" not in str(info.value)


def test_parse_arms_splits_outside_quotes_and_refuses_the_same_arm_twice():
    specs = _harness.parse_arms("uniform, sera:solver='a,b' ,vip:gamma=0.001")
    assert [s.label for s in specs] == ["uniform", "sera:solver='a,b'", "vip:gamma=0.001"]
    assert specs[1].kwargs == {"solver": "a,b"}
    assert _harness.parse_arms(["uniform", "sera"]) == _harness.parse_arms("uniform,sera")
    for same in ("sera,sera", "vip:gamma=1,vip:gamma=1.0",
                 "gvm:alpha=1:beta=2,gvm:beta=2:alpha=1"):
        with pytest.raises(_harness.ArmSpecError, match="give each arm once"):
            _harness.parse_arms(same)
    with pytest.raises(_harness.ArmSpecError, match="empty"):
        _harness.parse_arms("uniform,,sera")
    # different options are different arms
    assert len(_harness.parse_arms("vip:gamma=1,vip:gamma=2")) == 2


def test_arm_build_is_get_policy_with_the_experiment_settings():
    import sera_opt

    bounds = dict(min_rollouts=2, max_rollouts=16, offset=1)
    p = np.random.default_rng(0).random(24)
    for text in ("sera", "vip:gamma=0.001", "hora:prior_strength=inf", "gvm:alpha=0.01"):
        spec = _harness.parse_arm(text)
        built = spec.build(**bounds)
        reference = sera_opt.get_policy(spec.policy, **spec.kwargs, **bounds)
        assert type(built) is type(reference)
        assert (built.min_rollouts, built.max_rollouts, built.offset) == (2, 16, 1)
        np.testing.assert_array_equal(built.allocate(p, 192).counts,
                                      reference.allocate(p, 192).counts)
    assert _harness.parse_arm("vip:gamma=0.001").build(**bounds).gamma == 0.001
    # max_ratio sets the cap only when the experiment gives none
    uncapped = _harness.parse_arm("sera:max_ratio=2").build(min_rollouts=2, max_rollouts=None,
                                                           offset=1)
    assert uncapped.max_ratio == 2
    assert uncapped.allocate(np.array([0.01, 0.5, 0.9, 0.99]), 16).counts.max() <= 8


def test_check_arms_runs_each_policy_once_with_warnings_as_errors():
    settings_ = dict(min_rollouts=2, max_rollouts=32, offset=1, num_prompts=16, budget=128)
    specs = _harness.check_arms("uniform,sera,hora:prior_strength=inf,vip:gamma=0.001",
                                **settings_)
    assert [s.policy for s in specs] == ["uniform", "sera", "hora", "vip"]
    for bad, match in (("sera:bogus=1", "has no option 'bogus'"),
                       ("vip:bogus=1", "bogus"),
                       ("vip:gamma=-1", "gamma"),
                       ("hora:prior_strength=0", "prior_strength"),
                       ("sera:max_ratio=2", "max_ratio has no effect")):
        with pytest.raises(_harness.ArmSpecError, match=match) as info:
            _harness.check_arms(f"uniform,{bad}", **settings_)
        assert repr(bad) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(_harness.ArmSpecError, match="'sera'"):
        # the budget cannot be met within the bounds: the trial allocation says so
        _harness.check_arms("sera", **{**settings_, "budget": 16 * 33})


def test_arm_colors_are_distinct_and_keep_the_fixed_ones():
    labels = ["uniform", "sera", "sera-fair:alpha=0", "sera-fair:alpha=1", "hora",
              "vip:gamma=0.001"]
    colors = _harness.arm_colors(labels)
    assert colors["uniform"] == _harness.POLICY_COLORS["uniform"]
    assert colors["hora"] == _harness.POLICY_COLORS["hora"]
    assert len(set(colors.values())) == len(labels)
    # no grey (the warm-up's colour) among the spare ones
    assert not any("gray" in c or "grey" in c for c in colors.values())


# ---------------------------------------------------------------------------
# shared harness: paired intervals


def test_paired_difference_hand_computed():
    # differences 0.1, 0.3, 0.2: mean 0.2, sd 0.1, se 0.1 / sqrt(3); with 2 degrees of
    # freedom Student's t has the closed form F(t) = 1/2 + t / (2 sqrt(t^2 + 2)).
    baseline = np.array([0.5, 0.25, 0.125])
    candidate = baseline + np.array([0.1, 0.3, 0.2])
    out = _harness.paired_difference(candidate, baseline)
    se = 0.1 / math.sqrt(3)
    t_crit = 0.95 * math.sqrt(2 / (1 - 0.95 ** 2))  # F(t_crit) = 0.975
    t_stat = 0.2 / se  # = 2 sqrt(3)
    assert out["n"] == 3
    assert out["mean"] == pytest.approx(0.2, abs=1e-15)
    assert out["std"] == pytest.approx(0.1, rel=1e-12)
    assert out["ci_low"] == pytest.approx(0.2 - t_crit * se, rel=1e-12)
    assert out["ci_high"] == pytest.approx(0.2 + t_crit * se, rel=1e-12)
    assert out["statistic"] == pytest.approx(2 * math.sqrt(3), rel=1e-12)
    assert out["p_value"] == pytest.approx(1 - t_stat / math.sqrt(t_stat ** 2 + 2), rel=1e-10)
    assert (out["ahead"], out["behind"], out["tied"]) == (3, 0, 0)
    assert out["note"] is None and out["confidence"] == 0.95


def test_paired_difference_counts_ties_and_columns():
    candidate = np.array([[0.5, 0.2], [0.4, 0.3], [0.3, 0.1], [0.2, 0.4]])
    baseline = np.array([[0.5, 0.1], [0.5, 0.3], [0.2, 0.2], [0.2, 0.2]])
    out = _harness.paired_difference(candidate, baseline)
    np.testing.assert_array_equal(out["ahead"], [1, 2])
    np.testing.assert_array_equal(out["behind"], [1, 1])
    np.testing.assert_array_equal(out["tied"], [2, 1])
    at = _harness.paired_difference_at(out, (1, 2, 16))
    assert set(at) == {"pass@1", "pass@2"}  # no column 16
    assert at["pass@2"]["ahead"] == 2 and isinstance(at["pass@2"]["mean"], float)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(1, 4), st.integers(0, 2 ** 32 - 1),
       st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_paired_difference_matches_scipy_ttest_rel(n, width, seed, confidence):
    rng = np.random.default_rng(seed)
    baseline = rng.random((n, width))
    candidate = np.clip(baseline + rng.normal(0.02, 0.1, size=(n, width)), 0, 1)
    out = _harness.paired_difference(candidate, baseline, confidence=confidence)
    diff = candidate - baseline
    varying = diff.std(axis=0) > 1e-9
    if not varying.any():
        return
    ref = stats.ttest_rel(candidate[:, varying], baseline[:, varying])
    low, high = ref.confidence_interval(confidence_level=confidence)
    np.testing.assert_allclose(out["statistic"][varying], ref.statistic, rtol=1e-9)
    np.testing.assert_allclose(out["p_value"][varying], ref.pvalue, rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(out["ci_low"][varying], low, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(out["ci_high"][varying], high, rtol=1e-9, atol=1e-15)
    np.testing.assert_array_equal(out["n"], n)


def test_paired_difference_with_one_seed_is_undefined_not_zero_width():
    out = _harness.paired_difference([[0.4, 0.5]], [[0.3, 0.5]])
    assert np.isnan(out["ci_low"]).all() and np.isnan(out["ci_high"]).all()
    assert np.isnan(out["p_value"]).all() and np.isnan(out["std"]).all()
    assert "undefined" in out["note"]
    np.testing.assert_allclose(out["mean"], [0.1, 0.0])
    np.testing.assert_array_equal(out["ahead"], [1, 0])
    np.testing.assert_array_equal(out["tied"], [0, 1])
    table = _harness.paired_table({"sera": _harness.paired_difference_at(out, (1, 2))})
    assert "no interval" in table and "undefined" in table


def test_paired_difference_edge_cases():
    # the same non-zero difference on every seed: zero width (what the data say) and
    # p = 0, as scipy reports; all ties: NaN p-value
    same = _harness.paired_difference([0.3, 0.4, 0.5], [0.1, 0.2, 0.3])
    assert same["ci_low"] == pytest.approx(0.2) and same["ci_high"] == pytest.approx(0.2)
    tied = _harness.paired_difference([0.3, 0.4], [0.3, 0.4])
    assert tied["mean"] == 0 and np.isnan(tied["p_value"]) and tied["tied"] == 2
    # a NaN (an empty group on one seed) leaves that seed out of its column only
    out = _harness.paired_difference([[0.5, np.nan], [0.6, 0.2], [0.7, 0.4]],
                                     [[0.4, 0.1], [0.4, 0.1], [0.4, 0.1]])
    np.testing.assert_array_equal(out["n"], [3, 2])
    np.testing.assert_allclose(out["mean"], [0.2, 0.2])
    ref = stats.ttest_rel([0.2, 0.4], [0.1, 0.1])
    assert out["p_value"][1] == pytest.approx(ref.pvalue, rel=1e-9)
    with pytest.raises(SeraOptError, match="shapes"):
        _harness.paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(SeraOptError, match="confidence"):
        _harness.paired_difference([1.0, 2.0], [1.0, 1.5], confidence=95)


def test_mean_interval_matches_scipy():
    values = np.array([0.71, 0.74, 0.69, 0.80, 0.77])
    out = _harness.mean_interval(values, unit="batch")
    low, high = stats.t.interval(0.95, len(values) - 1, loc=values.mean(),
                                 scale=stats.sem(values))
    assert out["ci_low"] == pytest.approx(low, rel=1e-12)
    assert out["ci_high"] == pytest.approx(high, rel=1e-12)
    assert out["n"] == 5 and out["note"] is None
    single = _harness.mean_interval([0.7], unit="batch")
    assert np.isnan(single["ci_low"]) and "batch" in single["note"]


def test_format_interval():
    assert _harness.format_interval(0.0123, -0.004, 0.0284) == "+0.012 [-0.004, +0.028]"
    assert _harness.format_interval(-0.5, np.nan, np.nan) == "-0.500 [no interval]"


# ---------------------------------------------------------------------------
# shared harness: comparing result files


def test_compare_payloads_finds_every_changed_number_and_skips_timings():
    before = {"machine": {"cpu": "a"}, "command": "x", "summary": {"sera": [0.1, 0.2]},
              "runs": [{"wall_time": 1.0, "pass_at_k": [0.5], "arm": "sera"}],
              "timings": {"total_s": 3.0}, "seeds": [0, 1]}
    same = json.loads(json.dumps(before))
    same["machine"] = {"cpu": "b"}
    same["runs"][0]["wall_time"] = 9.0
    same["timings"] = {}
    same["summary"]["sera_interval"] = [0.0, 0.3]
    differences, additions = compare_payloads(before, same)
    assert differences == [] and additions == ["summary.sera_interval"]
    changed = json.loads(json.dumps(before))
    changed["summary"]["sera"][1] = 0.2000000001
    changed["runs"][0]["arm"] = "hora"
    del changed["seeds"]
    differences, _ = compare_payloads(before, changed)
    assert len(differences) == 3
    assert any(d.startswith("summary.sera[1]:") for d in differences)
    assert any(d.startswith("runs[0].arm:") for d in differences)
    assert "seeds: missing after" in differences
    changed = json.loads(json.dumps(before))
    changed["summary"]["sera"].append(0.3)
    assert compare_payloads(before, changed)[0] == ["summary.sera: 2 entries before, 3 after"]


def test_every_arm_takes_rounds_and_a_first_round():
    spec = _harness.parse_arm("sera-fair:alpha=1:rounds=4:first=2")
    assert (spec.policy, spec.kwargs, spec.rounds, spec.first) == ("sera-fair", {"alpha": 1}, 4, 2)
    assert _harness.parse_arm("uniform").rounds == 1
    assert _harness.parse_arm("uniform:rounds=3").first is None
    # the same policy in rounds and static are two arms
    assert len(_harness.parse_arms("uniform,uniform:rounds=4,uniform:rounds=4:first=2")) == 3
    with pytest.raises(_harness.ArmSpecError, match="give each arm once"):
        _harness.parse_arms("uniform:rounds=4,uniform:rounds=4")
    for bad, match in [("uniform:rounds=0", "whole number >= 1"),
                       ("uniform:rounds=1.5", "whole number >= 1"),
                       ("uniform:rounds=4:rounds=2", "given twice"),
                       ("uniform:first=2", "add rounds=R")]:
        with pytest.raises(_harness.ArmSpecError, match=match):
            _harness.parse_arm(bad)
    # an arm whose first round does not fit the budget is refused before training
    with pytest.raises(_harness.ArmSpecError, match="first round needs"):
        _harness.check_arms("uniform:rounds=2:first=9", min_rollouts=2, max_rollouts=32,
                            offset=1, num_prompts=4, budget=32)


def test_reinforce_ada_is_an_arm_with_its_own_options_and_a_matched_budget():
    spec = _harness.parse_arm("reinforce-ada:matched=True")
    assert spec.is_reinforce_ada and spec.kwargs == {"matched": True}
    rule, cap = spec.build_rule(num_prompts=32, budget=256)
    # the paper's 4 rounds shrunk to the budget: 256 // (32 * 4) = 2 per active prompt
    assert (rule.per_round, rule.max_rounds, rule.keep, rule.exit, cap) == (2, 4, 4, "balanced", 256)
    rule, cap = _harness.parse_arm("reinforce-ada").build_rule(num_prompts=32, budget=256)
    assert (rule.per_round, cap) == (8, None)
    rule, _ = _harness.parse_arm("reinforce-ada:matched=True:per_round=3:exit='positive'") \
        .build_rule(num_prompts=32, budget=256)
    assert (rule.per_round, rule.exit) == (3, "positive")
    assert _harness.parse_arm("reinforce-ada:matched=True:max_rounds=2").build_rule(
        num_prompts=32, budget=256)[0].per_round == 4
    assert len(_harness.parse_arms("uniform,reinforce-ada,reinforce-ada:matched=True")) == 3
    for bad, match in [("reinforce-ada:rounds=4", "its own rule"),
                       ("reinforce-ada:alpha=1", "its own rule"),
                       ("reinforce-ada:min_rollouts=2", "its own rule")]:
        with pytest.raises(_harness.ArmSpecError, match=match):
            _harness.parse_arm(bad)
    for bad, match in [("reinforce-ada:matched=1", "True or False"),
                       ("reinforce-ada:exit='sometimes'", "exit must be one of"),
                       ("reinforce-ada:keep=1", "keep")]:
        with pytest.raises(_harness.ArmSpecError, match=match):
            _harness.parse_arm(bad).build_rule(num_prompts=4, budget=32)
    with pytest.raises(_harness.ArmSpecError, match="build_rule"):
        spec.build(min_rollouts=2, max_rollouts=32, offset=1)
    with pytest.raises(_harness.ArmSpecError, match="allocation policy; use build"):
        _harness.parse_arm("uniform").build_rule(num_prompts=4, budget=32)
    # check_arms builds the rule and opens a session before anything trains
    specs = _harness.check_arms("uniform,reinforce-ada:matched=True", min_rollouts=2,
                                max_rollouts=32, offset=1, num_prompts=4, budget=32)
    assert [s.label for s in specs] == ["uniform", "reinforce-ada:matched=True"]


def test_reinforce_ada_arms_train_in_the_maze(tmp_path):
    import json

    from sera_opt.benchmarks import maze

    arms = "uniform,reinforce-ada:matched=True,reinforce-ada"
    assert maze.main(["--quick", "--arms", arms, "--steps", "3", "--seeds", "1", "--out",
                      str(tmp_path), "--workers", "1", "--no-progress"]) == 0
    runs = {r["arm"]: r for r in json.loads((tmp_path / "maze.json").read_text())["runs"]}
    budget = 16 * 8  # the quick preset: 16 mazes a step, 8 rollouts each on average
    matched = runs["reinforce-ada:matched=True"]["curves"]["rounds"]
    own = runs["reinforce-ada"]["curves"]["rounds"]
    assert len(matched) == len(own) == 3
    for step in matched:  # rounds of 128 // (16 * 4) = 2, never above the budget
        assert step["round_0_budget"] == 32 and sum(
            step[f"round_{r}_budget"] for r in range(int(step["rounds"]))) <= budget
        assert "mean_scale" not in step
    assert all(step["round_0_budget"] == 16 * 8 for step in own)  # rounds of 8 per maze


def test_cost_grid_evaluates_the_weights_reached_within_each_amount():
    from sera_opt.benchmarks._harness import CostGrid, at_cost, common_amounts

    weights = {"w": 0}
    evaluated = []

    def evaluate(state):
        evaluated.append(state["w"])
        return state["w"]

    grid = CostGrid({"cpu_s": [0.5, 2.0, 2.5, 9.0], "calls": [1.0, 4.0]}, evaluate,
                    lambda: dict(weights))
    for step, (cpu, calls) in enumerate([(1.0, 4.0), (3.0, 8.0)], start=1):
        weights["w"] = step  # the step's update
        grid.step_end(step, {"cpu_s": cpu, "calls": calls})
    # 0.5 s and 1 call were crossed in step 1: the warm start is what was reached by then;
    # 2.0 s, 2.5 s and 4 calls in step 2 (4 calls were spent exactly at step 1's end).
    assert [(p["at"], p["step"], p["value"]) for p in grid.points["cpu_s"]] == [
        (0.5, 0, 0), (2.0, 1, 1), (2.5, 1, 1)]
    assert [(p["at"], p["step"], p["spent"]) for p in grid.points["calls"]] == [
        (1.0, 0, 0.0), (4.0, 1, 4.0)]
    assert evaluated == [0, 1]  # one evaluation per state, whatever number of grids need it
    assert at_cost(grid.points["cpu_s"], 9.0) is None  # never reached: no value
    other = [{"at": 0.5, "value": 1}]
    assert common_amounts([0.5, 2.0, 9.0], [grid.points["cpu_s"], other]) == [0.5]


def test_each_arm_records_what_its_steps_spend_and_its_equal_cost_points():
    from sera_opt.benchmarks import maze

    config = _tiny_config(arms=("uniform", "uniform:rounds=2"), seeds=1,
                          cpu_grid_s=(1e-6, 1e3), move_grid=(1.0, 1e9), call_grid=(2.0, 3.0))
    result = maze.run(config, show_progress=False)
    runs = {r["arm"]: r["curves"] for r in result["runs"]}
    assert runs["uniform"]["walk_calls"] == [1] * 4
    assert runs["uniform:rounds=2"]["walk_calls"] == [2] * 4
    for arm, curves in runs.items():
        cpu = np.asarray(curves["cpu_s"])
        assert len(cpu) == 4 and (np.diff(cpu) > 0).all() and cpu[0] > 0, arm
        # Every rollout walks at least one move and at most the horizon.
        budget = config.budget
        assert all(budget <= m <= budget * config.horizon for m in curves["moves"]), arm
        spent = {"cpu_s": cpu, "moves": np.cumsum(curves["moves"]),
                 "calls": np.cumsum(curves["walk_calls"])}
        for cost, points in curves["at_cost"].items():
            for point in points:
                assert point["step"] == int((spent[cost] <= point["at"]).sum()), (arm, cost)
                assert len(point["value"]) == config.k_max
        # The first amounts were crossed in the first step, the last never.
        assert [p["at"] for p in curves["at_cost"]["cpu_s"]] == [1e-6]
        assert [p["at"] for p in curves["at_cost"]["moves"]] == [1.0]
    # Within 2 and 3 calls the static plan reached steps 2 and 3, two rounds a step step 1.
    assert [p["step"] for p in runs["uniform"]["at_cost"]["calls"]] == [2, 3]
    assert [p["step"] for p in runs["uniform:rounds=2"]["at_cost"]["calls"]] == [1, 1]
    # The warm start, evaluated at the first amounts, is the same weights in every arm.
    first = [r["at_cost"]["moves"][0]["value"] for r in runs.values()]
    assert first[0] == first[1]
    equal = result["summary"]["equal_cost"]
    assert equal["cpu_s"]["amounts"] == [1e-6] and equal["calls"]["amounts"] == [2.0, 3.0]
    assert set(equal["calls"]["paired_at"]) == {"uniform:rounds=2"}
