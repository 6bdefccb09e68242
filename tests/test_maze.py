"""The maze experiment: generator, environment, and the quick pipeline end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

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


def test_cli_rejects_unknown_arms_before_running(tmp_path):
    from sera_opt.benchmarks import maze

    with pytest.raises(SeraOptError, match="unknown arm"):
        maze.main(["--quick", "--arms", "uniform,not-a-policy", "--out", str(tmp_path)])
    assert not (tmp_path / "maze.json").exists()


def test_pipeline_end_to_end_is_deterministic():
    from sera_opt.benchmarks import maze

    config = _tiny_config()
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
    assert {"warmup", "uniform", "sera"} <= set(summary)
    assert np.allclose(summary["uniform"]["difference_to_uniform"]["mean"], 0.0)
    assert np.all(summary["sera"]["min"] <= summary["sera"]["mean"] + 1e-12)
    above, below = summary["sera"]["seeds_above_uniform"], summary["sera"]["seeds_below_uniform"]
    assert np.all(above + below <= 2)
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
    assert (tmp_path / "maze.png").stat().st_size > 0
    assert (tmp_path / "maze_training.png").stat().st_size > 0
