"""bench replay: the drawn run of the speed row, the row itself, and the recorder that writes
the arithmetic experiment's rollouts in verl's dump format."""

from __future__ import annotations

import json

import numpy as np

from sera_opt.benchmarks import replay as bench
from sera_opt.replay import read_record, write_verl_dump


def test_the_drawn_run_is_uniform_passes_over_a_pool():
    run = bench.synthetic_run(9, 16, 4, seed=2)
    assert run.num_steps == 9 and run.num_rollouts == 9 * 16 * 4
    assert all(s.counts.tolist() == [4] * 16 for s in run.steps)
    # a pool of 64 prompts: 4 steps per pass, so 3 epochs in 9 steps
    assert [s.epoch for s in run.steps] == [0] * 4 + [1] * 4 + [2]
    again = bench.synthetic_run(9, 16, 4, seed=2)
    assert all(np.array_equal(a.rewards, b.rewards) for a, b in zip(run.steps, again.steps))


def test_the_speed_row_reads_back_what_it_replays(tmp_path, capsys):
    row = bench.speed_row(3, 16, 4, "uniform,sera-fair:alpha=1", seed=0, show_progress=False)
    assert row["rollouts_total"] == 3 * 16 * 4
    assert row["replay_s"] > 0 and row["read_s"] > 0
    # Both baselines are timed in the same run, and the ratios are theirs.
    assert row["read_vs_loadtxt"] == row["read_s"] / row["loadtxt_s"]
    assert row["replay_vs_uniform_alone"] == row["replay_s"] / row["uniform_alone_s"]
    assert set(row["mixed_prompts"]) == {"uniform", "sera-fair:alpha=1"}
    assert bench.main(["--steps", "2", "--arms", "uniform", "--out", str(tmp_path),
                       "--no-progress"]) == 0
    payload = json.loads((tmp_path / "replay_speed.json").read_text())
    assert payload["speed"]["steps"] == 2 and payload["speed"]["prompts"] == 256
    out = capsys.readouterr().out
    assert "replay of 2 steps x 256 prompts x 16 rollouts" in out
    assert "the uniform arm replayed alone" in out and "numpy.loadtxt" in out


class _Tokenizer:
    def decode(self, row):
        return "".join(str(t) for t in row)


def test_the_recorder_writes_what_verl_would(tmp_path):
    import torch

    recorded = []
    hook = bench._recorder(recorded, ["1+1=", "2+2=", "3+3="], _Tokenizer())
    hook(0, np.array([2, 2, 0]), np.array([1.0, 0.0, 1.0]), torch.tensor([[4], [5], [2]]))
    hook(1, np.array([1, 1]), np.array([0.0, 0.0]), torch.tensor([[3], [9]]))
    assert recorded[0] == (1, ["3+3=", "3+3=", "1+1="], ["4", "5", "2"], [1.0, 0.0, 1.0])
    run = read_record(write_verl_dump(tmp_path / "dump", recorded))
    assert run.prompt_keys == ("3+3=", "1+1=", "2+2=")
    assert [s.step for s in run.steps] == [1, 2]
    assert run.steps[0].successes.tolist() == [1, 1]
    line = json.loads((tmp_path / "dump" / "1.jsonl").read_text().splitlines()[0])
    assert line == {"input": "3+3=", "output": "4", "gts": None, "score": 1.0, "step": 1}
