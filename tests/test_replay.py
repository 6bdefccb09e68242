"""The replay of a recorded run: reading both formats, the step-by-step loop, the scores
against a direct computation, and a one-line error for every malformed record."""

from __future__ import annotations

import json
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

import sera_opt
from sera_opt.replay import (
    EPOCH_RULE,
    RecordedRun,
    RecordError,
    ReplaySettings,
    beta_tail_moments,
    block_bootstrap_interval,
    read_record,
    replay,
    score_counts,
    write_table,
    write_verl_dump,
)


def _planner(name: str = "uniform", **options):
    return sera_opt.RolloutPlanner(name, offset=1, min_rollouts=2, **options)


def _drawn_run(steps: int = 12, prompts: int = 8, rollouts: int = 4, pool: int = 24,
               seed: int = 3) -> RecordedRun:
    rng = np.random.default_rng(seed)
    p = rng.beta(0.7, 1.0, pool)
    ids, rewards, order = [], [], []
    for _ in range(steps):
        while len(order) < prompts:
            order.extend(rng.permutation(pool).tolist())
        batch = np.asarray(order[:prompts])
        del order[:prompts]
        ids.extend(f"What is {i} + {i}?" for i in np.repeat(batch, rollouts))
        rewards.append((rng.random((prompts, rollouts)) < p[batch, None]).ravel())
    return RecordedRun.from_rollouts(np.repeat(np.arange(1, steps + 1), prompts * rollouts),
                                     ids, np.concatenate(rewards).astype(np.int8))


def _dump(run: RecordedRun, folder):
    steps = []
    for s in run.steps:
        texts = [run.prompt_keys[i] for i in np.repeat(s.prompts, s.counts)]
        steps.append((s.step, texts, ["42"] * len(texts), s.rewards.tolist()))
    return write_verl_dump(folder, steps)


# ------------------------------------------------------------------ a case by hand


def _tail(a: int, b: int, m: int, *, success: bool) -> Fraction:
    """E[p^m] (success) or E[(1-p)^m] under Beta(a, b), exactly."""
    out = Fraction(1)
    for j in range(m):
        out *= Fraction((a if success else b) + j, a + b + j)
    return out


def test_scores_match_a_direct_computation():
    # prompt A: 2 of 4 (Beta(3, 3)); prompt B: 0 of 4 (Beta(1, 5)); counts 4 and 4
    fail, win = beta_tail_moments([3.0, 1.0], [3.0, 5.0], 8)
    s = score_counts([4, 4], fail, win, offset=1)
    factor_a = 1 - _tail(3, 3, 3, success=False)
    factor_b = 1 - _tail(1, 5, 3, success=False)
    assert factor_b == Fraction(3, 8)
    mixed_a = 1 - _tail(3, 3, 4, success=False) - _tail(3, 3, 4, success=True)
    mixed_b = 1 - _tail(1, 5, 4, success=False) - _tail(1, 5, 4, success=True)
    assert mixed_b == Fraction(55, 126)
    np.testing.assert_allclose(s.factors, [float(factor_a), float(factor_b)], rtol=1e-13)
    assert s.min_factor == pytest.approx(0.375)
    assert s.mixed_prompts == pytest.approx(float(mixed_a + mixed_b), rel=1e-13)
    assert s.no_signal_rollouts == pytest.approx(float(4 * (2 - mixed_a - mixed_b)), rel=1e-13)
    # no rollouts: factor 0, no mixed group, left out of the minimum; one rollout: no signal
    s = score_counts([0, 1], fail, win, offset=1)
    assert s.factors.tolist() == [0.0, 0.0] and s.mixed.tolist() == [0.0, 0.0]
    assert s.active_prompts == 1


def test_expected_factor_agrees_with_the_librarys_beta_factor():
    from sera_opt.separable import expected_factors

    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.2, 20, 50), rng.uniform(0.2, 20, 50)
    counts = rng.integers(0, 40, 50)
    fail, win = beta_tail_moments(a, b, 40)
    for offset in (0, 1):
        ours = score_counts(counts, fail, win, offset=offset).factors
        np.testing.assert_allclose(ours, expected_factors(a, b, counts, offset), rtol=1e-10,
                                   atol=1e-14)


def test_a_replay_of_two_steps_is_the_direct_computation(tmp_path):
    # step 1: A 2/4, B 0/4; step 2: A 4/4, C 1/4
    rows = ["step,prompt_id,reward"]
    for step, prompt, rewards in ((1, "A", "1100"), (1, "B", "0000"), (2, "A", "1111"),
                                  (2, "C", "0100")):
        rows += [f"{step},{prompt},{r}" for r in rewards]
    path = tmp_path / "run.csv"
    path.write_text("\n".join(rows) + "\n")
    run = read_record(path)
    assert [s.counts.tolist() for s in run.steps] == [[4, 4], [4, 4]]
    assert [s.successes.tolist() for s in run.steps] == [[2, 0], [4, 1]]
    result = replay(run, {"uniform": _planner(), "fair": _planner("sera-fair", alpha=1.0)},
                    ReplaySettings(prior=(1.0, 1.0)))
    assert result.prior == (1.0, 1.0)
    # uniform: 4 each; step 2 by hand: A Beta(5, 1), C Beta(2, 4)
    mixed = (1 - _tail(5, 1, 4, success=False) - _tail(5, 1, 4, success=True)
             + 1 - _tail(2, 4, 4, success=False) - _tail(2, 4, 4, success=True))
    assert result.scores["uniform"]["mixed_prompts"][1] == pytest.approx(float(mixed), rel=1e-12)
    # the fair arm's step-2 plan is that of a planner that saw step 1 alone, and its scores
    # are those of its counts
    reference = _planner("sera-fair", alpha=1.0)
    reference.observe(["A"] * 4 + ["B"] * 4, [1, 1, 0, 0, 0, 0, 0, 0])
    counts = reference.plan(["A", "C"], 8, max_rollouts=8).counts
    assert result.counts["fair"][1].tolist() == counts.tolist()
    fail, win = beta_tail_moments([5.0, 2.0], [1.0, 4.0], 8)
    direct = score_counts(counts, fail, win)
    assert result.scores["fair"]["mean_factor"][1] == pytest.approx(direct.mean_factor)
    assert result.scores["fair"]["no_signal_rollouts"][1] == pytest.approx(
        direct.no_signal_rollouts)


class _Recording:
    """A planner that plans fixed counts and records what it is fed and told."""

    def __init__(self, counts):
        self.counts, self.fed, self.epochs = list(counts), [], 0

    def plan(self, ids, budget, max_rollouts=None):
        assert sum(self.counts) == budget and max(self.counts) <= max_rollouts
        return SimpleNamespace(counts=np.asarray(self.counts), active_set=None)

    def observe(self, ids, rewards):
        self.fed.append((np.asarray(ids).tolist(), np.asarray(rewards).tolist()))

    def end_epoch(self):
        self.epochs += 1


def test_an_arm_is_fed_its_own_draws_and_told_each_epoch():
    run = RecordedRun.from_rollouts([1] * 8 + [2] * 8, ["a"] * 4 + ["b"] * 4 + ["a"] * 4 +
                                    ["c"] * 4, [1, 0, 1, 1, 0, 0, 0, 1] * 2)
    assert [s.epoch for s in run.steps] == [0, 1]  # "a" again: a new pass
    arm = _Recording([2, 6])
    replay(run, {"arm": arm}, ReplaySettings(seed=1))
    ids, rewards = arm.fed[0]
    # a's first 2 recorded rewards; b's 4 recorded and 2 drawn beyond the record
    assert ids == [0, 0, 1, 1, 1, 1, 1, 1] and rewards[:6] == [1, 0, 0, 0, 0, 1]
    assert arm.epochs == 1
    arm = _Recording([2, 6])
    replay(run, {"arm": arm}, ReplaySettings(feed="record"))
    assert arm.fed[0] == ([0] * 4 + [1] * 4, [1, 0, 1, 1, 0, 0, 0, 1])


def test_the_record_gives_the_epochs_when_it_has_them(tmp_path):
    path = tmp_path / "run.jsonl"
    lines = [{"step": s, "prompt_id": p, "reward": r, "epoch": e}
             for s, p, r, e in ((1, 7, 1, 0), (1, 7, 0, 0), (2, 7, 1, 0), (2, 7, 1, 0),
                                (3, 8, 0, 1), (3, 8, 1, 1))]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = read_record(path)
    assert [s.epoch for s in run.steps] == [0, 0, 1] and run.epoch_source == "record"
    arm = _Recording([2])
    replay(run, {"arm": arm})
    assert arm.epochs == 1
    assert read_record(tmp_path / "run.jsonl").prompt_keys == (7, 8)
    assert EPOCH_RULE in RecordedRun.from_rollouts([1, 1], [1, 1], [0, 1]).epoch_source


# ------------------------------------------------------------------ both formats


def test_a_dump_and_a_table_of_the_same_run_replay_alike(tmp_path):
    run = _drawn_run()
    folder = _dump(run, tmp_path / "dump")
    assert sorted(p.name for p in folder.iterdir())[:2] == ["1.jsonl", "10.jsonl"]
    first = json.loads((folder / "1.jsonl").read_text().splitlines()[0])
    assert set(first) == {"input", "output", "gts", "score", "step"}
    dumped = read_record(folder)
    assert dumped.format == "verl" and dumped.num_rollouts == run.num_rollouts
    results = []
    for record in (dumped, read_record(write_table(tmp_path / "run.csv", run)),
                   read_record(write_table(tmp_path / "run.jsonl", run))):
        assert record.prompt_keys == run.prompt_keys
        results.append(replay(record, {"uniform": _planner(),
                                       "fair": _planner("sera-fair", alpha=1.0)}))
    for other in results[1:]:
        for arm in ("uniform", "fair"):
            for name, values in results[0].scores[arm].items():
                np.testing.assert_array_equal(values, other.scores[arm][name], err_msg=name)
    # uniform at the recorded counts: its no-signal rollouts are the expected all-same groups
    s = results[0].scores["uniform"]
    assert np.all(s["active_prompts"] == 8) and np.all(s["no_signal_rollouts"] > 0)


def test_parquet_when_pyarrow_is_installed(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"step": [1, 1, 1, 1], "prompt_id": ["x", "x", "y", "y"],
                      "reward": [1, 0, 0, 0]})
    pq.write_table(table, tmp_path / "run.parquet")
    run = read_record(tmp_path / "run.parquet")
    assert run.steps[0].successes.tolist() == [1, 0]


def test_an_id_field_names_the_prompts_of_a_dump(tmp_path):
    folder = tmp_path / "dump"
    folder.mkdir()
    lines = [{"input": "same text", "score": 1.0, "step": 1, "prompt_uid": u} for u in "ab"]
    (folder / "1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_record(folder).steps[0].counts.tolist() == [2]
    assert read_record(folder, id_field="prompt_uid").steps[0].counts.tolist() == [1, 1]


# ------------------------------------------------------------------ malformed records


def _verl(folder, lines_by_step):
    folder.mkdir(exist_ok=True)
    for step, lines in lines_by_step.items():
        (folder / f"{step}.jsonl").write_text("".join(
            (x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return folder


def _good(**changes):
    return {"input": "p", "output": "o", "gts": None, "score": 1.0, "step": 1, **changes}


@pytest.mark.parametrize("case, where, words", [
    ("csv_missing", "run.csv, line 3", "field 'reward' is missing"),
    ("csv_nonbinary", "run.csv, line 2", "field 'reward' is '0.5'"),
    ("csv_order", "run.csv, line 4", "field 'step' is 1 after step 2"),
    ("csv_empty", "run.csv", "the file is empty"),
    ("csv_header_only", "run.csv", "the file is empty"),
    ("csv_no_column", "run.csv, line 1", "no field 'reward'"),
    ("jsonl_missing", "run.jsonl, line 2", "field 'prompt_id' is missing"),
    ("jsonl_nonbinary", "run.jsonl, line 1", "field 'reward' is 2"),
    ("jsonl_order", "run.jsonl, line 3", "field 'step' is 3 after step 5"),
    ("jsonl_empty", "run.jsonl", "the file is empty"),
    ("jsonl_blank_line", "run.jsonl, line 2", "empty line"),
    ("jsonl_bad_step", "run.jsonl, line 1", "field 'step' is 'two'"),
    ("jsonl_epoch_within_step", "run.jsonl, line 2", "field 'epoch' is 1 within step 1"),
    ("verl_missing", "1.jsonl, line 2", "field 'score' is missing"),
    ("verl_nonbinary", "2.jsonl, line 1", "field 'score' is 0.7"),
    ("verl_step", "2.jsonl, line 1", "field 'step' is 3 in the file of step 2"),
    ("verl_empty", "2.jsonl", "the file is empty"),
    ("verl_not_json", "1.jsonl, line 1", "not JSON"),
])
def test_a_malformed_record_is_one_line_naming_the_line_and_field(tmp_path, case, where,
                                                                   words):
    kind = case.split("_")[0]
    if kind == "verl":
        lines = {
            "verl_missing": {1: [_good(), {"input": "p", "step": 1}]},
            "verl_nonbinary": {1: [_good()], 2: [_good(step=2, score=0.7)]},
            "verl_step": {1: [_good()], 2: [_good(step=3)]},
            "verl_empty": {1: [_good()], 2: []},
            "verl_not_json": {1: ["{not json"]},
        }[case]
        path = _verl(tmp_path / "dump", lines)
        if case == "verl_empty":
            (path / "2.jsonl").write_text("")
    elif kind == "csv":
        text = {
            "csv_missing": "step,prompt_id,reward\n1,a,1\n1,a,\n",
            "csv_nonbinary": "step,prompt_id,reward\n1,a,0.5\n",
            "csv_order": "step,prompt_id,reward\n1,a,1\n2,a,0\n1,b,1\n",
            "csv_empty": "",
            "csv_header_only": "step,prompt_id,reward\n",
            "csv_no_column": "step,prompt_id,score\n1,a,1\n",
        }[case]
        path = tmp_path / "run.csv"
        path.write_text(text)
    else:
        rows = {
            "jsonl_missing": [{"step": 1, "prompt_id": "a", "reward": 1},
                              {"step": 1, "reward": 0}],
            "jsonl_nonbinary": [{"step": 1, "prompt_id": "a", "reward": 2}],
            "jsonl_order": [{"step": 4, "prompt_id": "a", "reward": 1},
                            {"step": 5, "prompt_id": "a", "reward": 1},
                            {"step": 3, "prompt_id": "a", "reward": 1}],
            "jsonl_empty": [],
            "jsonl_blank_line": None,
            "jsonl_bad_step": [{"step": "two", "prompt_id": "a", "reward": 1}],
            "jsonl_epoch_within_step": [{"step": 1, "prompt_id": "a", "reward": 1, "epoch": 0},
                                        {"step": 1, "prompt_id": "b", "reward": 1,
                                         "epoch": 1}],
        }[case]
        path = tmp_path / "run.jsonl"
        if rows is None:
            path.write_text('{"step": 1, "prompt_id": "a", "reward": 1}\n\n')
        else:
            path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    with pytest.raises(RecordError) as info:
        read_record(path)
    message = str(info.value)
    assert "\n" not in message
    assert where in message, message
    assert words in message, message


def test_a_dump_folder_without_step_files_or_with_strays_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordError, match="no {step}.jsonl files"):
        read_record(tmp_path / "empty")
    folder = _verl(tmp_path / "dump", {1: [_good()]})
    (folder / "val.jsonl").write_text("")
    with pytest.raises(RecordError, match="val.jsonl"):
        read_record(folder)


def test_a_step_below_the_common_minimum_is_refused():
    run = RecordedRun.from_rollouts([1, 1, 1], ["a", "b", "b"], [1, 0, 1])
    with pytest.raises(sera_opt.SeraOptError, match="step 1 records 3 rollouts for 2 prompts"):
        replay(run, {"uniform": _planner()})


def test_the_fitted_prior_makes_the_recorded_arm_match_what_it_realized():
    """With the run's own prior, uniform's expected mixed groups (at the recorded counts)
    match the groups the record shows mixed, up to Monte Carlo noise; Laplace's prior
    overstates them on a run with many all-failure groups."""
    rng = np.random.default_rng(5)
    a, b, prompts, rollouts, steps = 0.4, 1.2, 64, 8, 200
    p = rng.beta(a, b, (steps, prompts))
    rewards = (rng.random((steps, prompts, rollouts)) < p[..., None]).astype(np.int8)
    ids = np.tile(np.repeat(np.arange(prompts), rollouts), steps) + np.repeat(
        np.arange(steps) * prompts, prompts * rollouts)  # fresh prompts: independent p
    run = RecordedRun.from_rollouts(np.repeat(np.arange(steps), prompts * rollouts),
                                    ids.tolist(), rewards.ravel())
    fitted = ReplaySettings().prior_of(run)
    assert fitted[0] / sum(fitted) == pytest.approx(a / (a + b), abs=0.02)
    assert sum(fitted) == pytest.approx(a + b, rel=0.25)
    k = rewards.sum(axis=2)
    realized = np.mean(np.sum((k > 0) & (k < rollouts), axis=1))
    sd = np.std(np.sum((k > 0) & (k < rollouts), axis=1)) / np.sqrt(steps)
    own = replay(run, {"uniform": _planner()}).scores["uniform"]["mixed_prompts"].mean()
    assert abs(own - realized) < 4 * sd + 0.3, (own, realized, sd)
    laplace = replay(run, {"uniform": _planner()}, ReplaySettings(prior=(1.0, 1.0)))
    assert laplace.scores["uniform"]["mixed_prompts"].mean() > realized + 10 * sd


def test_bad_settings_are_refused():
    for bad in ({"prior": "flat"}, {"prior": (0.0, 1.0)}, {"feed": "all"},
                {"min_rollouts": 1}, {"max_ratio": 0.5}):
        with pytest.raises(sera_opt.SeraOptError):
            ReplaySettings(**bad).check()


# ------------------------------------------------------------------ the summary


def test_the_block_bootstrap_interval_holds_the_mean():
    flat = block_bootstrap_interval(np.full(40, 3.0))
    assert flat["mean"] == flat["ci_low"] == flat["ci_high"] == 3.0
    assert flat["block"] == 4  # ceil(40 ** (1/3))
    values = np.random.default_rng(0).normal(1.0, 1.0, 500)
    out = block_bootstrap_interval(values, seed=1)
    assert out["ci_low"] < out["mean"] < out["ci_high"]
    assert out["ci_high"] - out["ci_low"] < 0.4
    assert np.isnan(block_bootstrap_interval([1.0])["ci_low"])


def test_the_summary_pairs_each_arm_with_uniform():
    result = replay(_drawn_run(), {"uniform": _planner(),
                                   "fair": _planner("sera-fair", alpha=1.0)})
    summary = result.summary()
    diff = summary["fair"]["mixed_prompts_minus_uniform"]
    direct = np.mean(result.scores["fair"]["mixed_prompts"]
                     - result.scores["uniform"]["mixed_prompts"])
    assert diff["mean"] == pytest.approx(direct)
    assert "mixed_prompts_minus_uniform" not in summary["uniform"]


# ------------------------------------------------------------------ the command


def test_sera_opt_replay_end_to_end(tmp_path, capsys):
    from sera_opt.cli import main

    folder = _dump(_drawn_run(steps=16), tmp_path / "dump")
    out = tmp_path / "out"
    status = main(["replay", str(folder), "--arms", "uniform,sera-paper,sera-fair:alpha=1",
                   "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert status == 0
    assert text.splitlines()[0].startswith("The replay measures the first-order effect only")
    assert "at most ceil(4 x B / M)" in text and "offset 1, at least 2" in text
    payload = json.loads((out / "replay.json").read_text())
    assert payload["arms"] == ["uniform", "sera-paper", "sera-fair:alpha=1"]
    assert payload["record"]["format"] == "verl" and payload["record"]["steps"] == 16
    assert len(payload["per_step"]["sera-paper"]["mixed_prompts"]) == 16
    assert "mixed_prompts_minus_uniform" in payload["summary"]["sera-paper"]
    assert (out / "replay.png").stat().st_size > 0


def test_sera_opt_replay_reports_a_malformed_record_in_one_line(tmp_path, capsys):
    from sera_opt.cli import main

    path = tmp_path / "run.csv"
    path.write_text("step,prompt_id,reward\n2,a,1\n1,a,0\n")
    status = main(["replay", str(path), "--arms", "uniform", "--out", str(tmp_path / "out"),
                   "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.count("\n") == 0 and "run.csv, line 3: field 'step' is 1 after step 2" in err


def test_arms_that_the_replay_cannot_run_are_refused(tmp_path, capsys):
    from sera_opt.cli import main

    folder = _dump(_drawn_run(steps=2), tmp_path / "dump")
    for arm, words in (("uniform:rounds=2", "draws in rounds"),
                       ("sera:max_ratio=2", "max_ratio is the replay's"),
                       ("reinforce-ada", "draws in rounds"), ("nonsense", "unknown policy")):
        status = main(["replay", str(folder), "--arms", arm, "--out", str(tmp_path),
                       "--no-progress", "--no-plot"])
        assert status == 2 and words in capsys.readouterr().err, arm


def test_the_sera_paper_arm_is_the_authors_planner_told_each_epoch():
    from sera_opt.benchmarks.replay import build_planners

    planners = build_planners("uniform,sera-paper", ReplaySettings())
    paper = planners["sera-paper"]
    assert paper.policy.name == "sera-paper"
    assert type(paper.tracker).__name__ == "EpochTracker"
    told = []
    end_epoch = paper.end_epoch

    def counted():  # the replay tells it at each boundary
        told.append(True)
        return end_epoch()

    paper.end_epoch = counted
    run = _drawn_run(steps=12, prompts=8, pool=24)  # 3 steps per pass: 4 epochs
    result = replay(run, planners)
    assert len(told) == run.num_epochs - 1 == 3
    assert result.has_active_set["sera-paper"] and not result.has_active_set["uniform"]
    counts = np.array(result.counts["sera-paper"])
    assert np.all(counts.sum(axis=1) == 32)
    assert np.all((counts == 0) | (counts >= 2))
    active = result.scores["sera-paper"]["active_prompts"]
    assert np.array_equal(active, (counts > 0).sum(axis=1))
