"""The trl-coverage experiment: it runs end to end through TRL, counts the generation calls
of each arm, evaluates on its CPU-time grid without counting the evaluations, and pairs
the arms with both baselines. Its results are read in docs/benchmarks.md, never here."""

import json

import numpy as np
import pytest

from sera_opt.exceptions import SeraOptError
from tests.markers import requires_trl


@requires_trl
@pytest.mark.trl
def test_the_quick_preset_runs_every_arm_and_records_its_costs(tmp_path):
    from sera_opt.benchmarks import trl_coverage

    assert trl_coverage.main(["--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    payload = json.loads((tmp_path / "trl_coverage.json").read_text())
    assert (tmp_path / "trl_coverage.png").stat().st_size > 0
    assert (tmp_path / "trl_coverage_paired.png").stat().st_size > 0
    config = payload["config"]
    runs = {run["arm"]: run for run in payload["runs"]}
    assert list(runs) == list(trl_coverage.ARMS)
    # One backend call per round: stock GRPOTrainer and the static plans one, rounds=2 two,
    # the shipped default at most its four (a round the budget cannot fill is not drawn).
    calls = {arm: run["steps"]["generation_calls"] for arm, run in runs.items()}
    assert calls["grpo"] == calls["sera-fair:alpha=1"] == calls["uniform"] == [1] * 3
    assert calls["sera-fair:alpha=1:rounds=2"] == [2] * 3
    assert all(2 <= n <= 4 for n in calls["sera-fair:alpha=1:rounds=4"])
    for arm, run in runs.items():
        steps = run["steps"]
        assert len(steps["wall_s"]) == config["steps"] == 3, arm
        # Rounds are scored as they are generated: one reward call per generation call.
        assert steps["reward_calls"] == steps["generation_calls"], arm
        # Every completion is one row of the fixed budget, at least one token long.
        assert all(t >= config["budget"] for t in steps["generated_tokens"]), arm
        assert all(0 < g < w for g, w in zip(steps["generate_s"], steps["wall_s"])), arm
        cpu = np.asarray(steps["cpu_s"])
        assert (np.diff(cpu) > 0).all() and run["cpu_time_s"] == cpu[-1], arm
        # The evaluations ran but were not counted as training time.
        assert run["evaluation_cpu_s"] > 0, arm
        assert [p["step"] for p in run["at_steps"]] == config["eval_steps"] == [0, 2, 3]
        spent = {"cpu_s": cpu, "tokens": np.cumsum(steps["generated_tokens"]),
                 "calls": np.cumsum(steps["generation_calls"])}
        for cost, points in run["at_cost"].items():
            for point in points:
                # The weights reached within the amount: the last step end at or before it.
                assert point["spent"] <= point["at"], (arm, cost)
                assert point["step"] == int((spent[cost] <= point["at"]).sum()), (arm, cost)
                assert len(point["value"]) == config["eval_samples"]
    # Every arm of the seed started from the same warm start, evaluated once.
    assert len({json.dumps(run["at_steps"][0]) for run in runs.values()}) == 1
    summary = payload["summary"]
    assert summary["common_grids"] == {"cpu_s": [0.01, 0.03], "tokens": [30.0, 60.0],
                                       "calls": [1.0, 2.0]}
    assert set(summary["paired"]) == {"grpo", "uniform"}  # sera-paper is not an arm here
    for base in summary["paired"]:
        against = summary["paired"][base]
        assert set(against) == set(trl_coverage.ARMS) - {base}
        for cell in against.values():
            assert set(cell["final_step_at"]) == {"pass@1", "pass@8"}
            assert set(cell["at_cost"]["cpu_s"]) == {"0.01", "0.03"}
            assert set(cell["at_cost"]["calls"]) == {"1.0", "2.0"}
    warm = list((tmp_path / "warm_starts").glob("seed0_*.pt"))
    assert len(warm) == 1

    # The decision tool refuses this output in one line: it cannot judge pass@64 from
    # eval_samples = 8, and says so instead of raising IndexError.
    from sera_opt.benchmarks import cost_decision

    assert cost_decision.main(["--trl", str(tmp_path / "trl_coverage.json")]) == 2
    with pytest.raises(SeraOptError, match="pass@64 needs 64 samples per problem; the run drew 8"):
        cost_decision.summarize(payload)

    # A second run reuses the seed's cached warm start instead of training it again.
    before = warm[0].stat().st_mtime_ns
    assert trl_coverage.main(["--quick", "--arms", "grpo", "--out", str(tmp_path),
                              "--no-progress"]) == 0
    assert warm[0].stat().st_mtime_ns == before
    again = json.loads((tmp_path / "trl_coverage.json").read_text())
    assert again["warm_starts"] == payload["warm_starts"]


@pytest.mark.parametrize("text", ["trl", "sera:rounds=2", "sera:policy=uniform:rounds=1",
                                  "grpo:rounds=2", "uniform:rounds=0", "uniform:rounds=x",
                                  "nope", "uniform:first=2:rounds=1",
                                  "uniform:rounds=2:rounds=4", "sera-paper:rounds=2",
                                  "reinforce-ada"])
def test_bad_arms_are_refused_before_training(text):
    from sera_opt.benchmarks._harness import ArmSpecError
    from sera_opt.benchmarks.trl_coverage import parse_arm

    with pytest.raises(ArmSpecError):
        parse_arm(text)


def test_arms_parse_to_their_trainer_policy_and_rounds():
    from sera_opt.benchmarks._harness import ArmSpecError
    from sera_opt.benchmarks.trl_coverage import ARMS, parse_arm, parse_arms

    arms = parse_arms(",".join(ARMS))
    assert [a.trainer for a in arms] == ["trl", "sera", "sera", "sera", "sera"]
    assert [a.rounds for a in arms] == [None, 1, 1, 2, 4]
    assert [a.policy for a in arms] == [None, "uniform", "sera-fair", "sera-fair", "sera-fair"]
    assert arms[2].options == (("alpha", 1),)
    assert parse_arm("uniform:rounds=3:first=2").first == 2
    paper = parse_arm("sera-paper:rounding=exact:cold_start=prior")
    assert paper.paper and paper.options == (("rounding", "exact"),)
    assert paper.tracker_options == (("cold_start", "prior"),)
    with pytest.raises(ArmSpecError):
        parse_arms("grpo,grpo")


@pytest.mark.parametrize("old,new", [
    ("trl", "grpo"), ("sera:policy=uniform:rounds=1", "uniform"),
    ("sera:policy=sera-fair:rounds=2", "sera-fair:rounds=2"),
    ("sera:rounds=1", "sera-fair:alpha=1 (default then)"),
    ("sera:rounds=4", "sera-fair:alpha=1:rounds=4 (default then)"),
    ("uniform", "uniform")])
def test_earlier_labels_read_as_what_they_measured(old, new):
    from sera_opt.benchmarks.trl_coverage.train import legacy_label

    assert legacy_label(old) == new


@pytest.mark.parametrize("argv", [["--jobs", "0"], ["--cpu-grid", "5,x"], ["--cpu-grid", "10,5"],
                                  ["--cpu-grid", "0,5"], ["--steps", "0"], ["--seeds", "0"],
                                  ["--arms", "grpo,grpo"], ["--arms", "sera:rounds=1"],
                                  ["--preset", "expand", "--quick"]])
def test_bad_options_are_refused_before_any_work(argv, tmp_path):
    from sera_opt.cli import main

    assert main(["bench", "trl-coverage", *argv, "--quick", "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_merge_combines_seed_shards_and_refuses_overlaps(tmp_path):
    # Two shards written by hand (the merge trains nothing): the same runs under seeds 0 and 1.
    from sera_opt.benchmarks.trl_coverage import PRESETS, runner
    from sera_opt.exceptions import SeraOptError

    cfg = PRESETS["quick"]
    grid = {"cpu_s": cfg.cpu_grid_s, "tokens": cfg.token_grid, "calls": cfg.call_grid}
    curve = list(np.linspace(0.1, 0.9, cfg.eval_samples))

    def shard(seed, arms=("trl", "sera:policy=uniform:rounds=1")):
        runs = [{"seed": seed, "arm": arm, "final_pass_at_k": curve,
                 "at_steps": [{"step": 0, "pass_at_k": curve}],
                 "at_cost": {cost: [{"at": t, "step": 0, "spent": 0.0, "value": curve}
                                    for t in amounts] for cost, amounts in grid.items()},
                 "steps": {"wall_s": [1.0], "generate_s": [0.5], "generated_tokens": [10],
                           "generation_calls": [1], "reward_calls": [1], "cpu_s": [1.0]},
                 "cpu_time_s": 1.0, "wall_time_s": 1.0} for arm in arms]
        config = {**cfg.to_dict(), "arms": list(arms)}
        path = tmp_path / f"shard{seed}.json"
        path.write_text(json.dumps({"benchmark": "trl_coverage", "preset": "quick",
                                    "config": config, "seeds": [seed], "runs": runs,
                                    "warm_starts": [{"seed": seed}]}))
        return path

    merged_cfg, result, preset = runner._merge([shard(0), shard(1)])
    assert preset == "quick"
    assert result["seeds"] == [0, 1] and merged_cfg.seeds == 2
    # The earlier files' labels come back as what those arms ran.
    assert merged_cfg.arms == ("grpo", "uniform")
    summary = runner.summarize(merged_cfg, result["seeds"], result["runs"],
                               result["warm_starts"])
    cell = summary["paired"]["grpo"]["uniform"]["final_step_at"]["pass@1"]
    assert cell["n"] == 2 and cell["mean"] == 0.0
    assert "coverage" not in summary  # quick has no pass@64: no regime check to make
    with pytest.raises(SeraOptError, match="the same file"):
        runner._merge([shard(0), shard(0)])
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps({**json.loads(shard(0).read_text()), "command": "again"}))
    with pytest.raises(SeraOptError, match="more than one file"):
        runner._merge([shard(0), copy])
    with pytest.raises(SeraOptError, match="one configuration"):
        runner._merge([shard(0), shard(1, arms=("trl",))])


@pytest.mark.parametrize("text, match", [
    (None, "no file"), ("", "is empty"), ('{"benchmark": "trl_coverage", "con', "truncated"),
    ("[]", "holds a JSON list"), ('{"benchmark": "maze", "config": {}, "seeds": [0], '
                                  '"runs": [{}], "warm_starts": []}', "the 'maze' benchmark"),
    ('{"benchmark": "trl_coverage", "config": {}, "seeds": [0], "runs": [{"seed": 1}], '
     '"warm_starts": []}', "names seeds [0] but holds runs for [1]"),
])
def test_merge_refuses_missing_truncated_and_foreign_files_in_one_line(tmp_path, capsys, text,
                                                                       match):
    pytest.importorskip("trl")
    from sera_opt.cli import main

    path = tmp_path / "shard.json"
    if text is not None:
        path.write_text(text)
    assert main(["bench", "trl-coverage", "--merge", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and match in err and "unexpected" not in err, err
    assert not (tmp_path / "o").exists()


def test_merge_refuses_runs_that_are_not_whole(tmp_path, capsys):
    pytest.importorskip("trl")
    from sera_opt.benchmarks.trl_coverage import PRESETS
    from sera_opt.cli import main

    config = {**PRESETS["quick"].to_dict(), "arms": ["trl"]}
    path = tmp_path / "shard.json"
    path.write_text(json.dumps({"benchmark": "trl_coverage", "config": config, "seeds": [0],
                                "runs": [{"seed": 0, "arm": "trl"}], "warm_starts": []}))
    assert main(["bench", "trl-coverage", "--merge", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not whole trl-coverage runs" in err and len(err.splitlines()) == 1, err
