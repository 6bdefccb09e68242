"""The coverage-expansion experiments: their presets as issue 51 fixes them, each run end to end
for a few steps, and the pieces they share (arms, epochs, the regime check, the rule's
comparisons, the per-step cost bookkeeping). Results are read in the decision record, never
here."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from sera_opt.benchmarks import _coverage
from sera_opt.benchmarks._cost import StepCost, cost_per_step
from sera_opt.benchmarks._harness import ArmSpecError
from sera_opt.exceptions import SeraOptError
from tests.markers import requires_trl

# --------------------------------------------------------------------------- presets


def test_arithmetic_expand_preset_is_the_registered_regime():
    from sera_opt.benchmarks.arithmetic.task import make_split
    from sera_opt.benchmarks.arithmetic.train import PRESETS

    cfg = PRESETS["expand"].validate()
    assert (cfg.num_train, cfg.num_test, cfg.sft_target_success) == (2048, 1000, 0.20)
    assert cfg.rl_lr == 3e-4
    assert (cfg.rollouts_per_prompt, cfg.min_rollouts, cfg.max_rollouts) == (16, 2, 64)
    # every prompt visited 11 times: revisited at least 10 times
    assert cfg.rl_steps * cfg.prompts_per_step >= 11 * cfg.num_train
    assert cfg.seeds >= 16 and cfg.policies == _coverage.COVERAGE_ARMS
    train, test = make_split(cfg.data_seed, cfg.num_train, cfg.num_test, cfg.max_digits)
    assert not set(map(tuple, train.pairs())) & set(map(tuple, test.pairs()))
    with pytest.raises(SeraOptError, match="min_visits"):
        replace(cfg, rl_steps=300).validate()
    with pytest.raises(SeraOptError, match="multiple of prompts_per_step"):
        replace(cfg, num_train=2000).validate()


def test_maze_paper_preset_is_the_hard_mazes_with_the_papers_settings():
    from sera_opt.benchmarks.maze.train import PRESETS

    cfg, hard = PRESETS["paper"], PRESETS["hard"]
    assert (cfg.sizes, cfg.horizon) == (hard.sizes, hard.horizon)
    assert cfg.rollouts_per_maze >= 16
    assert (cfg.min_rollouts, cfg.max_rollouts) == (2, 4 * cfg.rollouts_per_maze)
    assert cfg.epoch_order and cfg.tracker_decay < 1 and cfg.arms == _coverage.COVERAGE_ARMS


def test_trl_expand_preset_has_the_lower_warm_start_and_a_constant_rate():
    from sera_opt.benchmarks.trl_coverage.train import PRESETS

    cfg = PRESETS["expand"].validate()
    assert cfg.sft_target_success == 0.12 and cfg.lr_scheduler_type == "constant"
    assert cfg.num_test >= 256 and cfg.tracker_decay is not None and cfg.tracker_decay < 1
    assert "sera-paper" in cfg.arms and "grpo" in cfg.arms and cfg.seeds >= 16


def test_a_sera_paper_arm_needs_the_authors_bounds():
    from sera_opt.benchmarks.arithmetic.train import PRESETS

    with pytest.raises(SeraOptError, match=r"\[2, 64\]"):
        replace(PRESETS["expand"], max_rollouts=32).validate()


# --------------------------------------------------------------------------- end to end


def _check_rule_block(coverage, arms):
    assert set(coverage) >= {"regime", "comparisons", "gains_by_bin"}
    primary = coverage["comparisons"]["primary"]
    assert [(r["candidate"], r["baseline"], r["k"]) for r in primary][0] == (
        "sera-paper", "uniform", 64)
    secondary = {(r["candidate"], r["baseline"]) for r in coverage["comparisons"]["secondary"]}
    assert ("uniform", "grpo") in secondary
    # One seed cannot pass: the interval of uniform's gain is undefined.
    assert coverage["regime"]["passes"] is False
    assert "decides nothing" in coverage["regime"]["verdict"]
    assert set(coverage["gains_by_bin"]) == set(arms) - {"uniform"}


def test_arithmetic_expand_runs_end_to_end_for_a_few_steps(capsys, tmp_path):
    from sera_opt.benchmarks.arithmetic.runner import _plot_coverage, _print_table, run_experiment
    from sera_opt.benchmarks.arithmetic.train import PRESETS

    arms = ("uniform", "grpo", "sera-paper", "sera-paper:cold_start=prior")
    # Two passes over a pool of 32: the authors' estimates are frozen, then used.
    cfg = replace(PRESETS["expand"], num_train=32, num_test=16, sft_steps=20, rl_steps=4,
                  prompts_per_step=16, min_visits=2, curve_every=2, curve_samples=2,
                  seeds=1, cpu_grid_s=(0.01,), token_grid=(10.0,), call_grid=(1.0,),
                  policies=arms).validate()
    start = time.perf_counter()
    payload = run_experiment(cfg, seed=101, out_dir=None, show_progress=True)
    assert time.perf_counter() - start < 120
    assert "regime check: warm start" in capsys.readouterr().out
    run = payload["runs"][0]
    assert 0 <= run["warm_start"]["regime"]["fraction_low"] <= 1
    for arm in arms:
        curves = run["policies"][arm]["curves"]
        assert len(curves["cpu_s"]) == len(curves["tokens"]) == len(curves["active_set"]) == 4
        assert curves["generation_calls"] == [1] * 4
    _check_rule_block(payload["summary"]["coverage"], arms)
    _print_table(cfg, payload)
    assert "the rule's comparisons" in capsys.readouterr().out
    assert _plot_coverage(cfg, payload["runs"], tmp_path).stat().st_size > 0


def test_maze_paper_runs_end_to_end_for_a_few_steps(tmp_path):
    from sera_opt.benchmarks.maze import runner
    from sera_opt.benchmarks.maze.train import PRESETS

    arms = ("uniform", "grpo", "sera-paper")
    cfg = replace(PRESETS["paper"], num_train=16, num_test=8, warmup_steps=2, warmup_mazes=8,
                  steps=4, mazes_per_step=8, eval_samples=64, eval_every=2, curve_samples=2,
                  train_probe_samples=4, seeds=1, cpu_grid_s=(0.01,), move_grid=(100.0,),
                  call_grid=(1.0,), arms=arms)
    result = runner.run(cfg, workers=1, show_progress=False)
    for run in result["runs"]:
        assert len(run["curves"]["active_set"]) == len(run["curves"]["walk_calls"]) == 4
    _check_rule_block(result["summary"]["coverage"], arms)
    assert "the rule's comparisons" in runner._table(cfg, result["summary"])
    assert runner._plot_coverage(cfg, result["runs"], tmp_path).stat().st_size > 0


def test_maze_seed_shards_merge_into_the_run_of_all_seeds(tmp_path, capsys):
    import gzip
    import json

    from sera_opt.benchmarks.maze import runner
    from sera_opt.benchmarks.maze.train import PRESETS

    cfg = replace(PRESETS["paper"], num_train=16, num_test=8, warmup_steps=2, warmup_mazes=8,
                  steps=2, mazes_per_step=8, eval_samples=64, eval_every=2, curve_samples=2,
                  train_probe_samples=4, cpu_grid_s=(0.01,), move_grid=(100.0,),
                  call_grid=(1.0,), arms=("uniform", "sera-paper"))
    # two shards as main writes them (its payload), one seed each
    for seed in (0, 1):
        result = runner.run(replace(cfg, seeds=1), workers=1, show_progress=False,
                            base_seed=seed)
        payload = {"preset": "paper", "command": "test", "seed": seed, "workers": 1,
                   "config": replace(cfg, seeds=1).to_dict(), **result}
        runner._harness.write_json(tmp_path / f"s{seed}", "maze", payload)
    whole = runner.run(replace(cfg, seeds=2), workers=1, show_progress=False)
    packed = tmp_path / "s1.json.gz"
    packed.write_bytes(gzip.compress((tmp_path / "s1" / "maze.json").read_bytes()))
    merged_cfg, merged = runner.merge([packed, tmp_path / "s0" / "maze.json"],
                                      tmp_path / "merged")
    assert merged["seeds"] == [0, 1] and merged_cfg.seeds == 2
    def plain(value):
        return json.loads(json.dumps(runner._harness._jsonable(value)))

    # what does not depend on timings is the run of both seeds' (the equal-CPU points do)
    for arm in ("uniform", "sera-paper"):
        np.testing.assert_array_equal(merged["summary"][arm]["mean"],
                                      whole["summary"][arm]["mean"])
    assert (plain(merged["summary"]["sera-paper"]["paired_vs_uniform"])
            == plain(whole["summary"]["sera-paper"]["paired_vs_uniform"]))
    for key in ("regime", "gains_by_bin", "active_set"):
        assert plain(merged["summary"]["coverage"][key]) == plain(whole["summary"]["coverage"][key])
    assert (tmp_path / "merged" / "maze.json").is_file()
    assert runner.main(["--merge", str(tmp_path / "s0" / "maze.json"), str(packed),
                        "--out", str(tmp_path / "again")]) == 0
    assert "merged 2 seeds" in capsys.readouterr().out
    with pytest.raises(SeraOptError, match="more than one file"):
        runner.merge([tmp_path / "s0" / "maze.json"] * 2, plots=False)
    other = json.loads((tmp_path / "s0" / "maze.json").read_text())
    other["config"]["lr"] = 1.0
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SeraOptError, match="differ in lr"):
        runner.merge([tmp_path / "other.json", tmp_path / "s1" / "maze.json"], plots=False)


@requires_trl
@pytest.mark.trl
def test_trl_expand_runs_end_to_end_for_a_few_steps(tmp_path):
    from sera_opt.benchmarks.trl_coverage import PRESETS, runner

    arms = ("grpo", "uniform", "sera-paper", "sera-fair:alpha=1")
    quick = PRESETS["quick"]
    cfg = replace(PRESETS["expand"], max_digits=1, num_train=8, num_test=8, sft_steps=60,
                  sft_lr=3e-3, sft_batch=64, sft_check_every=20, steps=4, prompts_per_step=4,
                  rollouts_per_prompt=4, eval_samples=64, eval_every=2,
                  cpu_grid_s=quick.cpu_grid_s, seeds=1, arms=arms).validate()
    result = runner.run(cfg, tmp_path, show=False)
    assert all("regime" in w for w in result["warm_starts"])
    summary = runner.summarize(cfg, result["seeds"], result["runs"], result["warm_starts"])
    assert set(summary["paired"]) == {"grpo", "uniform", "sera-paper"}
    _check_rule_block(summary["coverage"], arms)
    for run in result["runs"]:
        assert len(run["final_correct"]) == cfg.num_test
        assert len(run["steps"]["active_fraction"]) == cfg.steps
    assert "the rule's comparisons" in runner._table(cfg, summary)
    assert runner._plot_coverage(cfg, result["runs"], tmp_path).stat().st_size > 0


# --------------------------------------------------------------------------- shared pieces


def test_loop_arms_name_their_estimator_and_configuration():
    grpo, paper, fair = _coverage.parse_loop_arms(
        "grpo,sera-paper:rounding=exact:cold_start=prior,sera-fair:alpha=1")
    assert grpo.estimator == "grpo" and grpo.spec.policy == "uniform"
    assert paper.paper and paper.policy_options == (("rounding", "exact"),)
    assert paper.tracker_options == (("cold_start", "prior"),)
    assert fair.estimator == "maxrl" and fair.spec.kwargs == {"alpha": 1}
    for bad in ("grpo:alpha=1", "sera-paper:rounds=2", "sera-paper:min_rollouts=3",
                "sera-paper:rounding", "nope"):
        with pytest.raises(ArmSpecError):
            _coverage.parse_loop_arm(bad)
    with pytest.raises(ArmSpecError, match="once"):
        _coverage.parse_loop_arms("uniform,uniform")


def test_sera_paper_planner_is_the_authors_and_ends_epochs():
    import sera_opt

    arm = _coverage.parse_loop_arm("sera-paper:rounding=exact")
    planner = _coverage.build_planner(arm, min_rollouts=2, max_rollouts=64, offset=1,
                                      tracker_decay=0.97)
    assert planner.policy.name == "sera-paper"
    assert not isinstance(planner.tracker, sera_opt.SuccessTracker)
    fair = _coverage.build_planner(_coverage.parse_loop_arm("sera-fair:alpha=1"),
                                   min_rollouts=2, max_rollouts=64, offset=1, tracker_decay=0.9)
    assert isinstance(fair.tracker, sera_opt.SuccessTracker)
    assert (fair.policy.min_rollouts, fair.policy.max_rollouts) == (2, 64)


def test_epoch_clock_marks_each_pass():
    clock = _coverage.EpochClock(10)
    ends = [clock.advance(4) for _ in range(6)]  # 4, 8, 12, 16, 20, 24 prompts
    assert ends == [False, False, True, False, True, False]
    with pytest.raises(SeraOptError):
        _coverage.EpochClock(0)


def test_regime_check_passes_and_fails_as_registered():
    rates = np.array([0.0] * 5 + [0.05] * 25 + [0.5] * 70) / 1.0  # 5 % at 0, 25 % low
    assert _coverage.warm_start_regime(rates)["passes"]
    assert not _coverage.warm_start_regime(np.r_[np.zeros(15), rates[15:]])["passes"]
    warm = np.tile(np.linspace(0.1, 0.8, 64), (4, 1))
    gain = warm + np.array([0.04, 0.05, 0.045, 0.055])[:, None]
    check = _coverage.regime_check([rates] * 4, warm, gain)
    assert check["passes"] and check["verdict"].startswith("passes")
    small = warm + np.array([0.01, 0.02, 0.015, 0.025])[:, None]  # significant but < +0.03
    failed = _coverage.regime_check([rates] * 4, warm, small)
    assert not failed["passes"] and "decides nothing" in failed["verdict"]
    assert "regime check" in _coverage.format_regime(failed)


def test_holm_adjusts_step_down_and_keeps_nan():
    adjusted = _coverage.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": float("nan")})
    assert adjusted["a"] == pytest.approx(0.03)
    assert adjusted["c"] == pytest.approx(0.06) and adjusted["b"] == pytest.approx(0.06)
    assert np.isnan(adjusted["d"])


def test_rule_comparisons_pair_by_seed_and_correct_within_families():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, size=(16, 64))
    final = {"uniform": base, "grpo": base - 0.02 + rng.normal(0, 0.005, base.shape),
             "sera-paper": base + 0.03 + rng.normal(0, 0.005, base.shape),
             "sera-paper:rounding=exact": base + 0.03}
    out = _coverage.rule_comparisons(final, final, cpu_amount=10.0)
    primary = out["primary"]
    assert [(r["point"], r["k"]) for r in primary] == [("final", 64), ("cpu", 64)]
    assert all(r["significant"] and r["mean"] > 0 for r in primary)
    pairs = {(r["candidate"], r["baseline"], r["k"]) for r in out["secondary"]}
    assert {("uniform", "grpo", 1), ("sera-paper:rounding=exact", "sera-paper", 64),
            ("sera-paper:rounding=exact", "uniform", 64)} <= pairs
    assert all(r["p_holm"] >= r["p_value"] for r in out["secondary"])
    assert "p_holm" in _coverage.format_rule(out)


def test_gains_by_bin_attribute_a_gain_to_its_prompts():
    warm = [np.array([0, 0, 3, 3, 40, 40])] * 3  # of 64 samples: 0, (0, 0.1], (0.5, 1]
    base = [np.array([0, 0, 3, 3, 40, 40])] * 3
    cand = [np.array([8, 8, 3, 3, 40, 40])] * 3  # the gain is on the prompts at 0
    out = _coverage.gains_by_bin(warm, cand, base, samples=64, k=64)
    assert out["bins"]["0"]["mean"] == pytest.approx(1.0)
    assert out["bins"]["(0, 0.1]"]["mean"] == 0.0 and out["bins"]["(0.5, 1]"]["mean"] == 0.0
    assert np.isnan(out["bins"]["(0.1, 0.5]"]["mean"])
    assert out["bins"]["0"]["prompts_per_seed"] == 2


def test_paired_bands_pair_by_seed_where_every_seed_has_a_value():
    series = {"uniform": [{1: 0.5, 2: 0.6}, {1: 0.4, 2: 0.5, 3: 0.9}],
              "sera-paper": [{1: 0.6, 2: 0.8}, {1: 0.5, 2: 0.6, 3: 0.1}]}
    band = _coverage.paired_bands(series)["sera-paper"]
    assert band["x"] == [1.0, 2.0]  # step 3 is missing from one seed
    assert band["mean"] == pytest.approx([0.1, 0.15])
    assert band["low"][0] == pytest.approx(0.1) and band["low"][1] < 0.15 < band["high"][1]


def test_step_cost_takes_evaluations_out_and_counts_per_step():
    curves: dict = {}
    cost = StepCost(curves, {"tokens": ("tokens", float), "calls": ("calls", int)})
    for _ in range(3):
        with cost.excluded():
            _burn(0.02)
        cost.begin_step()
        cost.count("tokens", 5)
        cost.count("calls", 1)
        with cost.end_step() as spent:
            _burn(0.02)
    assert curves["tokens"] == [5.0] * 3 and curves["calls"] == [1] * 3
    assert spent["tokens"] == 15.0 and len(curves["step_wall_s"]) == 3
    # six evaluations of 20 ms each were excluded; the steps themselves did almost nothing
    assert cost.excluded_cpu_s >= 0.1 and curves["cpu_s"][-1] < cost.excluded_cpu_s
    summary = cost_per_step([curves], {"tokens": "tokens", "calls": "calls"})
    assert summary["tokens_per_step"] == 5.0 and summary["calls_per_step"] == 1.0
    with pytest.raises(ValueError):
        StepCost({}, {"cpu_s": ("cpu", float)})


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_arithmetic_seed_shards_merge_into_the_run_of_all_seeds(tmp_path):
    from sera_opt.benchmarks.arithmetic.runner import merge, run_experiment
    from sera_opt.benchmarks.arithmetic.train import PRESETS

    cfg = replace(PRESETS["quick"], num_train=32, num_test=8, sft_steps=10, rl_steps=2,
                  prompts_per_step=16, curve_every=0, eval_samples=8, max_k=8,
                  cpu_grid_s=(), token_grid=(), call_grid=(), policies=("uniform", "grpo"))
    for seed in (0, 1):
        run_experiment(replace(cfg, seeds=1), seed=seed, out_dir=tmp_path / f"s{seed}",
                       show_progress=False, plots=False)
    merged_cfg, merged = merge([tmp_path / "s1" / "arithmetic.json",
                                tmp_path / "s0" / "arithmetic.json"], plots=False)
    whole = run_experiment(replace(cfg, seeds=2), seed=0, out_dir=None, show_progress=False)
    assert merged["seeds"] == [0, 1] and merged_cfg.seeds == 2
    for arm in ("uniform", "grpo"):
        np.testing.assert_array_equal(merged["summary"][arm]["pass_at_k_mean"],
                                      whole["summary"][arm]["pass_at_k_mean"])
    with pytest.raises(SeraOptError, match="more than one file"):
        merge([tmp_path / "s0" / "arithmetic.json"] * 2, plots=False)
    # a gzip-compressed shard (as committed under docs/results/) merges the same
    import gzip

    packed = tmp_path / "s1.json.gz"
    packed.write_bytes(gzip.compress((tmp_path / "s1" / "arithmetic.json").read_bytes()))
    _, again = merge([packed, tmp_path / "s0" / "arithmetic.json"], plots=False)
    np.testing.assert_array_equal(again["summary"]["uniform"]["pass_at_k_mean"],
                                  merged["summary"]["uniform"]["pass_at_k_mean"])


def test_the_pilot_scan_reports_the_warm_start_half_per_level(capsys):
    from sera_opt.benchmarks.arithmetic import pilot

    rows = pilot.scan("quick", 3, [0.05])
    assert len(rows) == 1 and rows[0]["level"] == 0.05 and 0 <= rows[0]["fraction_zero"] <= 1
    assert pilot.main(["--preset", "quick", "--seed", "3", "--levels", "0.05"]) == 0
    assert "regime check: warm start" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        pilot.main(["--levels", "0.1,x"])
