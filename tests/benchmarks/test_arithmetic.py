"""The arithmetic experiment: task generator and verifier, tiny transformer, end-to-end preset."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from scipy import stats  # noqa: E402

from sera_opt.benchmarks import arithmetic  # noqa: E402
from sera_opt.benchmarks.arithmetic import task  # noqa: E402
from sera_opt.benchmarks.arithmetic.model import (  # noqa: E402
    ModelConfig,
    TinyTransformer,
    answer_mask,
    completion_logprobs,
    generate,
)
from sera_opt.exceptions import SeraOptError  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------- task


def _reference_correct(text: str, a: int, b: int) -> float:
    """Obviously-correct check: digits before the first '.', read backwards, canonical, equal a+b."""
    if "." not in text:
        return 0.0
    body = text.split(".", 1)[0]
    if not body or not body.isdigit():
        return 0.0
    forward = body[::-1]
    if len(forward) > 1 and forward[0] == "0":
        return 0.0
    return float(int(forward) == a + b)


def test_split_is_deterministic_disjoint_and_distinct():
    train1, test1 = task.make_split(5, 300, 100, 3)
    train2, test2 = task.make_split(5, 300, 100, 3)
    np.testing.assert_array_equal(train1.a, train2.a)
    np.testing.assert_array_equal(train1.b, train2.b)
    np.testing.assert_array_equal(test1.a, test2.a)
    assert len(train1.pairs()) == 300 and len(test1.pairs()) == 100
    assert not train1.pairs() & test1.pairs()
    _, test3 = task.make_split(6, 300, 100, 3)
    assert test3.pairs() != test1.pairs()
    # the test set does not depend on the size of the training pool
    _, test4 = task.make_split(5, 50, 100, 3)
    assert test4.pairs() == test1.pairs()


def test_operands_cover_every_digit_count_and_respect_bounds():
    rng = np.random.default_rng(0)
    problems = task.sample_problems(rng, 4000, 4)
    assert problems.a.min() >= 0 and problems.a.max() < 10**4
    digits_a = np.array([len(str(x)) for x in problems.a])
    counts = np.bincount(digits_a, minlength=5)[1:]
    # digit counts are uniform on 1..4: 1000 expected each, sd about 27
    assert np.all(np.abs(counts - 1000) < 150), counts
    np.testing.assert_array_equal(
        problems.digits(), np.maximum(digits_a, [len(str(x)) for x in problems.b]))


def test_sample_problems_excludes_and_is_deterministic():
    exclude = {(a, b) for a in range(10) for b in range(10)}
    p1 = task.sample_problems(np.random.default_rng(3), 500, 2, exclude=exclude)
    p2 = task.sample_problems(np.random.default_rng(3), 500, 2, exclude=exclude)
    np.testing.assert_array_equal(p1.a, p2.a)
    assert not p1.pairs() & exclude
    with pytest.raises(SeraOptError, match="distinct"):
        task.sample_problems(np.random.default_rng(0), 101, 1, distinct=True)
    with pytest.raises(SeraOptError, match="max_digits"):
        task.sample_problems(np.random.default_rng(0), 5, 0)


def test_prompts_and_answers_format():
    problems = task.AdditionProblems(np.array([3, 999, 0]), np.array([49, 1, 0]), 3)
    assert problems.prompts() == ["   3+49=", "  999+1=", "    0+0="]
    assert problems.answers() == ["25.", "0001.", "0."]
    assert {len(p) for p in problems.prompts()} == {problems.prompt_width}
    assert max(len(a) for a in problems.answers()) <= problems.answer_width
    np.testing.assert_array_equal(problems.carries(), [1, 3, 0])
    np.testing.assert_array_equal(task.verify(problems.answers(), problems), [1, 1, 1])
    with pytest.raises(SeraOptError, match="operands"):
        task.AdditionProblems(np.array([1000]), np.array([1]), 3)


@settings(max_examples=300, deadline=None)
@given(a=st.integers(0, 9999), b=st.integers(0, 9999),
       text=st.text(alphabet=task.VOCAB, max_size=7))
def test_verify_matches_reference(a, b, text):
    problems = task.AdditionProblems(np.array([a]), np.array([b]), 4)
    got = task.verify([text], problems)[0]
    assert got == _reference_correct(text, a, b)
    correct = str(a + b)[::-1]
    assert task.verify([correct + "."], problems)[0] == 1.0
    assert task.verify([correct + ".12"], problems)[0] == 1.0  # text after the end marker is ignored
    assert task.verify([correct], problems)[0] == 0.0  # no end marker
    assert task.verify([correct + "0."], problems)[0] == 0.0  # a leading zero is wrong
    assert task.verify([correct[::-1] + "."], problems)[0] == float(correct == correct[::-1])


@settings(max_examples=200, deadline=None)
@given(a=st.integers(0, 99999), b=st.integers(0, 99999))
def test_carries_match_column_addition(a, b):
    problems = task.AdditionProblems(np.array([a]), np.array([b]), 5)
    expected, carry = 0, 0
    for da, db in zip(f"{a:05d}"[::-1], f"{b:05d}"[::-1]):
        carry = int(int(da) + int(db) + carry >= 10)
        expected += carry
    assert problems.carries()[0] == expected


def test_tokenizer_round_trip_and_errors():
    tok = task.Tokenizer()
    text = "  12+345=753."
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == len(task.VOCAB) == 14
    with pytest.raises(SeraOptError, match="vocabulary"):
        tok.encode("1-2")
    with pytest.raises(SeraOptError, match="completions"):
        task.verify(["1."], task.AdditionProblems(np.array([1, 2]), np.array([0, 0]), 1))


# --------------------------------------------------------------------------- model


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=14, max_len=16, d_model=32, n_layers=2, n_heads=4, **kw)
    return TinyTransformer(cfg)


def test_forward_shapes_and_cache_matches_full_recompute():
    model = _model().eval()
    tokens = torch.randint(0, 14, (5, 12))
    logits, cache = model(tokens)
    assert logits.shape == (5, 12, 14)
    assert len(cache) == 2 and cache[0][0].shape == (5, 4, 12, 8)
    # feeding the last 4 tokens against a cache of the first 8 gives the same logits
    _, prefix = model(tokens[:, :8])
    tail, _ = model(tokens[:, 8:], prefix)
    torch.testing.assert_close(tail, logits[:, 8:], rtol=1e-5, atol=1e-5)
    # and so does one token at a time
    _, cache1 = model(tokens[:, :1])
    steps = [model(tokens[:, :1])[0][:, 0]]
    for t in range(1, 12):
        out, cache1 = model(tokens[:, t:t + 1], cache1)
        steps.append(out[:, 0])
    torch.testing.assert_close(torch.stack(steps, 1), logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(SeraOptError, match="max_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(SeraOptError, match="multiple"):
        ModelConfig(vocab_size=14, max_len=16, d_model=30, n_heads=4)


def test_generate_is_reproducible_and_matches_teacher_forcing():
    model = _model()
    prompts = torch.randint(0, 14, (6, 10))
    out1 = generate(model, prompts, 5, generator=torch.Generator().manual_seed(1))
    out2 = generate(model, prompts, 5, generator=torch.Generator().manual_seed(1))
    out3 = generate(model, prompts, 5, generator=torch.Generator().manual_seed(2))
    assert out1.shape == (6, 5) and out1.dtype == torch.long
    assert torch.equal(out1, out2) and not torch.equal(out1, out3)
    assert int(out1.min()) >= 0 and int(out1.max()) < 14
    assert model.training  # generate restores the mode
    logp = completion_logprobs(model, prompts, out1)
    assert logp.shape == (6, 5) and bool((logp <= 0).all())
    # the same log-probabilities by an explicit full forward pass per position
    tokens = torch.cat([prompts, out1], 1)
    logits, _ = model(tokens)
    ref = torch.log_softmax(logits[:, 9:14], -1).gather(2, out1[:, :, None])[:, :, 0]
    torch.testing.assert_close(logp, ref)
    logp.sum().backward()
    assert model.tok.weight.grad is not None and model.tok.weight.grad.abs().sum() > 0
    with pytest.raises(SeraOptError, match="temperature"):
        generate(model, prompts, 1, temperature=0.0)


def test_generate_samples_from_the_softmax_at_temperature_one():
    model = _model(seed=3)
    with torch.no_grad():
        model.tok.weight.mul_(40.0)  # a non-uniform next-token distribution
    prompt = torch.randint(0, 14, (1, 6))
    with torch.no_grad():
        probs = torch.softmax(model(prompt)[0][0, -1].double(), -1).numpy()
    draws = 20000
    out = generate(model, prompt.expand(draws, -1), 1,
                   generator=torch.Generator().manual_seed(0))[:, 0].numpy()
    freq = np.bincount(out, minlength=14) / draws
    tol = 5 * np.sqrt(probs * (1 - probs) / draws) + 1e-4
    assert probs.max() > 0.2  # the check is not vacuous
    assert np.all(np.abs(freq - probs) <= tol), (freq, probs)


def test_answer_mask_stops_after_the_first_end_marker():
    end = 13
    completions = torch.tensor([[1, 2, end, 4, end], [end, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    assert torch.equal(answer_mask(completions, end), expected)


# --------------------------------------------------------------------------- experiment


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_pass_at_k_curve_matches_combinatorics(n, data):
    correct = np.array(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=4)))
    max_k = data.draw(st.integers(1, n))
    curve = arithmetic.pass_at_k_curve(correct, n, max_k)
    for k in range(1, max_k + 1):
        ref = np.mean([1 - math.comb(n - c, k) / math.comb(n, k) for c in correct])
        assert curve[k - 1] == pytest.approx(ref, abs=1e-12)
    assert np.all(np.diff(curve) >= -1e-12)


def test_config_validation():
    with pytest.raises(SeraOptError, match="eval_samples"):
        replace(arithmetic.PRESETS["quick"], eval_samples=32).validate()
    with pytest.raises(SeraOptError, match="uniform"):
        replace(arithmetic.PRESETS["quick"], policies=("sera",)).validate()
    with pytest.raises(SeraOptError, match="min_rollouts"):
        replace(arithmetic.PRESETS["quick"], min_rollouts=1).validate()
    with pytest.raises(SeraOptError, match="estimator"):
        replace(arithmetic.PRESETS["quick"], estimator="mean").validate()
    with pytest.raises(SeraOptError, match="loss_mode"):
        replace(arithmetic.PRESETS["quick"], loss_mode="mean").validate()
    assert arithmetic.PRESETS["quick"].offset == 1
    assert replace(arithmetic.PRESETS["quick"], estimator="success_average").offset == 0
    parser = arithmetic.build_parser()
    with pytest.raises(SeraOptError, match="disagree"):
        arithmetic.config_from_args(parser.parse_args(["--quick", "--preset", "large"]))
    cfg = arithmetic.config_from_args(parser.parse_args(["--policies", "uniform, hora"]))
    assert cfg.policies == ("uniform", "hora")
    cfg = arithmetic.config_from_args(parser.parse_args(
        ["--arms", "uniform,hora:prior_strength=inf,vip:gamma=0.001"]))
    assert cfg.policies == ("uniform", "hora:prior_strength=inf", "vip:gamma=0.001")
    for bad, match in (("uniform,no-such", "unknown policy"), ("uniform,vip:bogus=1", "bogus"),
                       ("uniform,sera:max_ratio=2", "max_ratio has no effect"),
                       ("uniform,sera:solver=milp", "quoted string"),
                       ("uniform,hora,hora", "give each arm once")):
        with pytest.raises(SeraOptError, match=match):
            arithmetic.config_from_args(parser.parse_args(["--quick", "--arms", bad]))
    with pytest.raises(SeraOptError, match="bogus"):
        replace(arithmetic.PRESETS["quick"], policies=("uniform", "sera:bogus=1")).validate()
    assert arithmetic.resolve_device("cpu") == "cpu"
    with pytest.raises(SeraOptError, match="device"):
        arithmetic.resolve_device("tpu")


def _tiny(cfg_name="quick", **kw):
    base = dict(num_train=48, num_test=24, sft_steps=15, sft_batch=32, rl_steps=3,
                prompts_per_step=8, eval_samples=8, max_k=8, curve_every=2, curve_samples=2)
    base.update(kw)
    return replace(arithmetic.PRESETS[cfg_name], **base)


def test_report_arms_and_seeds():
    assert arithmetic.PRESETS["default"].seeds == 10
    # the default configuration is the one the report runs used
    assert arithmetic.PRESETS["default"].policies == arithmetic.REPORT_ARMS
    cfg = arithmetic.PRESETS["default"].validate()
    assert cfg.policies[0] == "uniform" and len(cfg.policies) == 6
    # the configurations that check a pipeline include the library's default allocation
    for name in ("quick", "large"):
        assert "sera-fair:alpha=1" in arithmetic.PRESETS[name].policies


def test_experiment_is_reproducible_from_its_seed(monkeypatch):
    import sera_opt

    built = []

    class RecordingPlanner(sera_opt.RolloutPlanner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.policy)

    monkeypatch.setattr(sera_opt, "RolloutPlanner", RecordingPlanner)
    cfg = _tiny(policies=("uniform", "sera", "vip:gamma=0.01"), seeds=2)
    first = arithmetic.run_experiment(cfg, seed=4, show_progress=False)
    second = arithmetic.run_experiment(cfg, seed=4, show_progress=False)
    for a, b in zip(first["runs"], second["runs"]):
        assert a["warm_start"]["correct"] == b["warm_start"]["correct"]
        for policy in cfg.policies:
            pa, pb = a["policies"][policy], b["policies"][policy]
            assert pa["correct"] == pb["correct"]
            assert pa["curves"]["mean_reward"] == pb["curves"]["mean_reward"]
            assert pa["curves"]["loss"] == pb["curves"]["loss"]
    # the arm's options and the configuration's bounds reach the planner's policy
    vips = [p for p in built if p.name == "vip"]
    assert len(vips) == 4 and all(p.gamma == 0.01 for p in vips)
    assert all((p.min_rollouts, p.max_rollouts, p.offset) == (2, 32, 1) for p in built)
    # the paired summary against scipy on the per-seed curves
    summary = first["summary"]
    uniform = np.array([run["policies"]["uniform"]["pass_at_k"] for run in first["runs"]])
    for policy in ("sera", "vip:gamma=0.01"):
        rows = np.array([run["policies"][policy]["pass_at_k"] for run in first["runs"]])
        paired = summary[policy]["paired_vs_uniform"]
        np.testing.assert_allclose(paired["mean"], (rows - uniform).mean(axis=0), atol=1e-15)
        varying = (rows - uniform).std(axis=0) > 0
        if varying.any():
            ref = stats.ttest_rel(rows[:, varying], uniform[:, varying])
            np.testing.assert_allclose(paired["p_value"][varying], ref.pvalue, rtol=1e-9)
            low, high = ref.confidence_interval()
            np.testing.assert_allclose(paired["ci_low"][varying], low, rtol=1e-9)
            np.testing.assert_allclose(paired["ci_high"][varying], high, rtol=1e-9)
        np.testing.assert_array_equal(paired["ahead"] + paired["behind"] + paired["tied"], 2)


def test_quick_preset_end_to_end(tmp_path, capsys):
    argv = ["--quick", "--sft-steps", "40", "--rl-steps", "4", "--out", str(tmp_path),
            "--seed", "1", "--no-progress"]
    assert arithmetic.main(argv) == 0
    payload = json.loads((tmp_path / "arithmetic.json").read_text())
    assert (tmp_path / "arithmetic.png").stat().st_size > 0
    assert (tmp_path / "arithmetic_training.png").stat().st_size > 0
    cfg = arithmetic.PRESETS["quick"]
    assert payload["benchmark"] == "arithmetic"
    assert payload["ks"] == list(range(1, 65))
    assert payload["seeds"] == [1]
    (run,) = payload["runs"]
    assert set(run["policies"]) == set(cfg.policies)
    for policy, result in run["policies"].items():
        curve = np.array(result["pass_at_k"])
        assert curve.shape == (64,)
        assert np.all((curve >= 0) & (curve <= 1)) and np.all(np.diff(curve) >= -1e-12)
        assert len(result["correct"]) == cfg.num_test
        assert max(result["correct"]) <= cfg.eval_samples
        diagnostics = result["curves"]["diagnostics"]
        assert len(diagnostics) == 4
        # every policy spends exactly the same rollout budget each step
        assert all(row["num_rollouts"] == cfg.budget for row in diagnostics), policy
        assert all(0 <= row["zero_success_fraction"] <= 1 for row in diagnostics)
        if policy == "uniform":
            assert all(row["min_count"] == row["max_count"] == cfg.rollouts_per_prompt
                       for row in diagnostics)
    summary = payload["summary"]
    assert set(summary["table_mean_std"]) == {"warm_start", *cfg.policies}
    # one seed has no spread: null in the JSON and n/a in the table, not 0
    assert summary["uniform"]["pass_at_k_std"] == [None] * 64
    out = capsys.readouterr().out
    assert "± n/a" in out and "no interval" in out and "0.000 ± 0.000" not in out
    assert len(summary["sera"]["difference_vs_uniform_mean"]) == 64
    # one seed: the paired interval is undefined (null plus a note), never zero-width
    for policy in cfg.policies:
        if policy == "uniform":
            assert "paired_vs_uniform" not in summary[policy]
            continue
        at = summary[policy]["paired_vs_uniform_at"]
        assert set(at) == {"pass@1", "pass@16", "pass@64"}
        diff = (np.array(run["policies"][policy]["pass_at_k"])
                - np.array(run["policies"]["uniform"]["pass_at_k"]))
        for k, cell in at.items():
            kk = int(k.split("@")[1])
            assert cell["mean"] == pytest.approx(diff[kk - 1], abs=1e-15)
            assert cell["ci_low"] is None and cell["p_value"] is None and cell["note"]


def test_round_and_reinforce_ada_arms_train_with_their_budgets():
    arms = ("uniform", "uniform:rounds=3", "reinforce-ada:matched=True", "reinforce-ada")
    cfg = _tiny(policies=arms, seeds=1)
    out = arithmetic.run_experiment(cfg, seed=2, show_progress=False)
    (run,) = out["runs"]
    budget = cfg.budget  # 8 prompts x 8
    for arm in arms:
        curves = run["policies"][arm]["curves"]
        assert len(curves["loss"]) == cfg.rl_steps and np.isfinite(curves["loss"]).all(), arm
        spent = [row["num_rollouts"] for row in curves["diagnostics"]]
        if arm.startswith("uniform"):
            assert spent == [budget] * cfg.rl_steps  # a fixed budget, in rounds too
        elif arm == "reinforce-ada:matched=True":
            # rounds of 64 // (8 * 4) = 2 per active prompt, never above the budget
            assert all(n <= budget for n in spent)
            for step in curves["rounds"]:
                assert step["round_budgets"][0] == 16 and sum(step["round_budgets"]) <= budget
        else:  # its own budget: rounds of 8, up to 32 per prompt
            assert all(step["round_budgets"][0] == 64 for step in curves["rounds"])
            assert all(n <= 32 * 8 for n in spent)
    assert "mean_scale" in run["policies"]["uniform:rounds=3"]["curves"]["rounds"][0]
    assert "mean_scale" not in run["policies"]["reinforce-ada"]["curves"]["rounds"][0]


def test_each_policy_records_what_its_steps_spend_and_its_equal_cost_points():
    cfg = _tiny(policies=("uniform", "uniform:rounds=2"), seeds=1,
                cpu_grid_s=(1e-6, 1e4), token_grid=(1.0, 1e12), call_grid=(2.0, 3.0))
    out = arithmetic.run_experiment(cfg, seed=2, show_progress=False)
    (run,) = out["runs"]
    curves = {arm: run["policies"][arm]["curves"] for arm in cfg.policies}
    assert curves["uniform"]["generation_calls"] == [1] * cfg.rl_steps
    assert curves["uniform:rounds=2"]["generation_calls"] == [2] * cfg.rl_steps
    for arm, c in curves.items():
        cpu = np.asarray(c["cpu_s"])
        assert len(cpu) == cfg.rl_steps and (np.diff(cpu) > 0).all() and cpu[0] > 0, arm
        # A completion is 1 to answer_width tokens long, its end marker included.
        width = cfg.max_digits + 2
        assert all(cfg.budget <= t <= cfg.budget * width for t in c["tokens"]), arm
        spent = {"cpu_s": cpu, "tokens": np.cumsum(c["tokens"]),
                 "calls": np.cumsum(c["generation_calls"])}
        for cost, points in c["at_cost"].items():
            assert [p["at"] for p in points] == [
                t for t in getattr(cfg, {"cpu_s": "cpu_grid_s", "tokens": "token_grid",
                                         "calls": "call_grid"}[cost]) if t < spent[cost][-1]]
            for point in points:
                assert point["step"] == int((spent[cost] <= point["at"]).sum()), (arm, cost)
                assert len(point["value"]) == cfg.max_k
    # Within 2 calls the static plan reached step 2, two rounds a step step 1; 3 calls are
    # the static plan's whole run, which it never went past: no point there.
    assert [p["step"] for p in curves["uniform"]["at_cost"]["calls"]] == [2]
    assert [p["step"] for p in curves["uniform:rounds=2"]["at_cost"]["calls"]] == [1, 1]
    equal = out["summary"]["equal_cost"]
    assert equal["tokens"]["amounts"] == [1.0] and equal["calls"]["amounts"] == [2.0]
    assert set(equal["calls"]["paired_at"]) == {"uniform:rounds=2"}
    assert out["summary"]["uniform:rounds=2"]["cost"]["calls_per_step"] == 2.0
