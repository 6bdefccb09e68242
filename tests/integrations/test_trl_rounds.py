"""SeraGRPOTrainer with ``rounds=R``: each step generated in R backend calls at the fixed budget."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import warnings  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tests.markers import has_module, requires_trl  # noqa: E402

pytestmark = [requires_trl, pytest.mark.trl]

if has_module("trl"):
    from datasets import Dataset
    from trl import GRPOTrainer

    import sera_opt
    from sera_opt.exceptions import SeraOptError
    from sera_opt.integrations.trl import SeraGRPOTrainer
    from sera_opt.integrations.trl_tiny import build_tiny_model, build_tokenizer, make_prompts
    from tests.integrations.test_trl import (
        _DDP_SCRIPT,
        NUM_GENERATIONS,
        ROWS,
        _config,
        _dataset,
        _RecordingTrainer,
        _RewardRecorder,
        _seeded_planner,
        fake_vllm_server_trainer,
    )


ROUNDS = 3


def _trainer(
    args,
    tokenizer,
    prompts,
    *,
    cls=None,
    model=None,
    reward_funcs=None,
    train_dataset=None,
    **options,
):
    """A trainer on the tiny model and the seeded planner; ``options`` go to the trainer."""
    return (cls or SeraGRPOTrainer)(
        model=build_tiny_model(tokenizer) if model is None else model,
        reward_funcs=_RewardRecorder() if reward_funcs is None else reward_funcs,
        args=args,
        train_dataset=_dataset(prompts) if train_dataset is None else train_dataset,
        processing_class=tokenizer,
        **{"planner": _seeded_planner(), **options},
    )


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(4, seed=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer, prompts):
    recorder = _RewardRecorder()
    planner = _seeded_planner()
    trainer = _trainer(
        _config(tmp_path_factory.mktemp("rounds"), max_steps=3),
        tokenizer,
        prompts,
        cls=_RecordingTrainer,
        reward_funcs=recorder,
        planner=planner,
        rounds=ROUNDS,
        first_round=2,
    )
    observed_before = _observed(planner)
    trainer.train()
    return {"trainer": trainer, "recorder": recorder, "observed_before": observed_before}


def _observed(planner) -> float:
    state = planner.state_dict()["tracker"]
    return float(np.sum(state["successes"]) + np.sum(state["failures"]))


def _steps(trained):
    """Per step: the history record and the step's reward calls (one per round)."""
    trainer, calls = trained["trainer"], trained["recorder"].calls
    assert len(calls) == ROUNDS * len(trainer.sera_history)
    return [
        (record, calls[ROUNDS * step : ROUNDS * (step + 1)])
        for step, record in enumerate(trainer.sera_history)
    ]


def test_each_step_is_generated_in_r_calls_at_the_fixed_budget(trained, prompts):
    saw_unequal = False
    for record, calls in _steps(trained):
        assert record["rounds"] == ROUNDS
        assert sum(record["allocated_counts"]) == ROWS
        assert record["generated_counts"] == record["allocated_counts"]
        # Counted independently, from what the reward function was given round by round.
        seen = Counter(text for call in calls for text in call["prompts"])
        assert {prompts.index(t): n for t, n in seen.items() if n} == {
            i: n for i, n in zip(record["prompt_ids"], record["allocated_counts"], strict=True) if n
        }
        # The first round gives every prompt first_round = 2 completions.
        assert Counter(calls[0]["prompts"]) == {text: 2 for text in prompts}
        for r, call in enumerate(calls):
            counts = Counter(call["prompts"])
            expected = dict(zip(record["prompt_ids"], record["round_counts"][r], strict=True))
            assert {prompts.index(t): n for t, n in counts.items()} == {
                i: n for i, n in expected.items() if n
            }
        saw_unequal |= len(set(record["allocated_counts"])) > 1
    assert saw_unequal, "the later rounds should go to some prompts more than others"


def test_advantages_use_the_first_round_baseline(trained):
    trainer = trained["trainer"]
    for (record, calls), advantages in zip(
        _steps(trained), trainer.recorded_advantages, strict=True
    ):
        rewards = torch.tensor([r for call in calls for r in call["rewards"]], dtype=torch.float32)
        index = torch.tensor(record["prompt_index"])
        rounds = torch.tensor(record["round_index"])
        assert rounds.tolist() == [r for r, call in enumerate(calls) for _ in call["prompts"]]
        expected = sera_opt.maxrl_advantages(rewards, index, round_index=rounds)
        torch.testing.assert_close(advantages, expected.to(advantages.dtype))
        torch.testing.assert_close(torch.tensor(record["advantages"]), expected, check_dtype=False)


def test_the_planner_observes_every_rollout_once(trained):
    steps = len(trained["trainer"].sera_history)
    assert _observed(trained["trainer"].sera_planner) - trained["observed_before"] == steps * ROWS


def test_round_diagnostics_are_logged(trained):
    logged = [entry for entry in trained["trainer"].state.log_history if "loss" in entry]
    assert len(logged) == 3
    for entry, (record, _) in zip(logged, _steps(trained), strict=True):
        assert entry["sera/rounds"] == ROUNDS
        budgets = [entry[f"sera/round_{r}_budget"] for r in range(ROUNDS)]
        assert budgets == [sum(counts) for counts in record["round_counts"]]
        assert sum(budgets) == ROWS and budgets[0] == 2 * len(record["prompt_ids"])
        for r in range(ROUNDS):
            assert 0.0 <= entry[f"sera/round_{r}_active"] <= 1.0
        assert 0.0 < entry["sera/min_scale"] <= entry["sera/mean_scale"] <= 1.0
        assert np.isfinite(entry["loss"])


def test_trl_gets_one_fresh_row_per_completion_in_round_order(
    tmp_path, tokenizer, prompts, monkeypatch
):
    # The rows copied for each round's reward call are the batch TRL assembles: one
    # distinct dict per completion (TRL may write into a row), round by round, none of
    # them the dataset's own rows.
    handed = []
    assemble = GRPOTrainer._generate_and_score_completions

    def recording(self, inputs):
        handed.append(list(inputs))
        return assemble(self, inputs)

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", recording)
    trainer = _trainer(
        _config(tmp_path, max_steps=2), tokenizer, prompts, rounds=ROUNDS, first_round=2
    )
    dataset_rows = []
    sample = trainer._generate_and_score_completions

    def keep_inputs(inputs):
        dataset_rows.extend(inputs)
        return sample(inputs)

    trainer._generate_and_score_completions = keep_inputs
    trainer.train()
    assert len(handed) == len(trainer.sera_history) == 2
    for rows, record in zip(handed, trainer.sera_history, strict=True):
        assert len(rows) == ROWS and len({id(row) for row in rows}) == ROWS
        assert not {id(row) for row in rows} & {id(row) for row in dataset_rows}
        assert [row["prompt_id"] for row in rows] == [
            record["prompt_ids"][i] for i in record["prompt_index"]
        ]


def test_completion_length_metrics_describe_the_whole_step(tmp_path, tokenizer, prompts):
    # TRL logs completion lengths once per generation call and averages the entries of a
    # step: with rounds its minimum would be the mean of the rounds' minima. The logged
    # figures are the step's own, as one call would log them.
    class Recording(SeraGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            lengths = output["completion_mask"].sum(1)
            last = output["completion_ids"].gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
            ends = torch.tensor([tokenizer.eos_token_id, tokenizer.pad_token_id])
            self.lengths = [*getattr(self, "lengths", []), (lengths, ~torch.isin(last, ends))]
            return output

    trainer = _trainer(
        _config(tmp_path, max_steps=3, max_completion_length=8),
        tokenizer,
        prompts,
        cls=Recording,
        rounds=ROUNDS,
        first_round=2,
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "completions/min_length" in entry]
    assert len(logged) == len(trainer.lengths) == 3
    saw_unequal = False
    for entry, (lengths, clipped) in zip(logged, trainer.lengths, strict=True):
        lengths = lengths.float()
        saw_unequal |= bool(lengths.min() < lengths.max())
        terminated = lengths[~clipped] if bool((~clipped).any()) else torch.zeros(1)
        assert entry["completions/min_length"] == pytest.approx(float(lengths.min()))
        assert entry["completions/max_length"] == pytest.approx(float(lengths.max()))
        assert entry["completions/mean_length"] == pytest.approx(float(lengths.mean()))
        assert entry["completions/clipped_ratio"] == pytest.approx(float(clipped.float().mean()))
        assert entry["completions/min_terminated_length"] == pytest.approx(float(terminated.min()))
        assert entry["completions/max_terminated_length"] == pytest.approx(float(terminated.max()))
        assert entry["completions/mean_terminated_length"] == pytest.approx(
            float(terminated.mean())
        )
    assert saw_unequal  # otherwise every average would be right by accident


def test_one_round_is_the_static_trainer(tmp_path, tokenizer, prompts):
    # rounds=1: one generation and one reward call per step, with the counts of the
    # planner's plan() on the same evidence, as before rounds existed.
    recorder = _RewardRecorder()
    trainer = _trainer(
        _config(tmp_path, max_steps=2), tokenizer, prompts, reward_funcs=recorder, rounds=1
    )
    trainer.train()
    assert trainer.sera_rounds == 1 and len(recorder.calls) == 2
    replay = _seeded_planner()
    for record, call in zip(trainer.sera_history, recorder.calls, strict=True):
        planned = replay.plan(record["prompt_ids"], ROWS).counts.tolist()
        assert record["allocated_counts"] == planned
        assert call["prompts"] == [
            prompts[i] for i, n in zip(record["prompt_ids"], planned) for _ in range(n)
        ]
        replay.observe(
            [i for i, n in zip(record["prompt_ids"], planned) for _ in range(n)], call["rewards"]
        )
        assert "rounds" not in record


@pytest.fixture
def backend_calls(monkeypatch):
    """The global step of each call of the generation backend, in order."""
    calls = []
    original = GRPOTrainer._generate_single_turn

    def counted(self, *args, **kwargs):
        calls.append(self.state.global_step)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", counted)
    return calls


def test_the_default_is_one_generation_call_per_step(tmp_path, tokenizer, prompts, backend_calls):
    # No planner, no rounds: the static plan, one call of the generation backend and one
    # reward call per step (rounds are opt-in: each would be one more call).
    recorder = _RewardRecorder()
    trainer = _trainer(
        _config(tmp_path, max_steps=2), tokenizer, prompts, reward_funcs=recorder, planner=None
    )
    assert trainer.sera_rounds == sera_opt.rounds.DEFAULT_ROUNDS == 1
    assert trainer.sera_first_round is None
    planner = trainer.sera_planner
    # The default planner is uniform; its later rounds are the rounds decision's, uniform.
    assert (planner.policy.name, planner.round_policy.name) == ("uniform", "uniform")
    assert (planner.round_policy.offset, planner.round_policy.min_rollouts) == (1, 2)
    assert planner.round_policy.max_rollouts == 4 * NUM_GENERATIONS
    trainer.train()
    assert trainer.state.global_step == 2
    assert backend_calls == [0, 1] and len(recorder.calls) == 2
    for record, call in zip(trainer.sera_history, recorder.calls, strict=True):
        assert "rounds" not in record
        assert record["allocated_counts"] == record["generated_counts"]
        assert sum(record["allocated_counts"]) == ROWS == len(call["rewards"])


def test_rounds_asked_for_make_one_backend_call_each(tmp_path, tokenizer, prompts, backend_calls):
    # The counting above can fail: rounds=4 calls the backend once per round that samples.
    trainer = _trainer(_config(tmp_path, max_steps=1), tokenizer, prompts, planner=None, rounds=4)
    trainer.train()
    (record,) = trainer.sera_history
    assert record["rounds"] == 4
    counts = np.array(record["round_counts"])
    assert counts.shape == (4, 4) and counts.sum() == ROWS
    assert counts[0].tolist() == [NUM_GENERATIONS // 2] * 4
    assert len(backend_calls) == int((counts.sum(1) > 0).sum()) == 4


def test_the_default_runs_where_rounds_cannot_and_warns_nothing(
    tmp_path, tokenizer, prompts, monkeypatch
):
    def lookup(text: str) -> str:
        """Look a word up.

        Args:
            text: the word.
        """
        return text

    # The tiny tokenizer's chat template cannot render tool calls, which GRPOTrainer's own
    # constructor checks after the adapter's: stop there, the round switch is settled.
    monkeypatch.setattr(GRPOTrainer, "__init__", lambda self, *args, **kwargs: None)
    images = Dataset.from_dict(
        {"prompt": prompts, "prompt_id": list(range(4)), "image": [None] * 4}
    )
    # The default is one call, which tools and image prompts run as they are: no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", sera_opt.SeraOptWarning)
        assert _trainer(_config(tmp_path), tokenizer, prompts, tools=[lookup]).sera_rounds == 1
        for rounds in (None, 1):
            assert (
                _trainer(
                    _config(tmp_path), tokenizer, prompts, train_dataset=images, rounds=rounds
                ).sera_rounds
                == 1
            )
    # Rounds asked for are refused there, as before.
    with pytest.raises(SeraOptError, match="first_round is the first of several rounds.*rounds >= 2"):
        _trainer(_config(tmp_path), tokenizer, prompts, tools=[lookup], first_round=2)
    with pytest.raises(SeraOptError, match="rounds=2 is not available: tools.*Drop rounds"):
        _trainer(_config(tmp_path), tokenizer, prompts, tools=[lookup], rounds=2)
    with pytest.raises(SeraOptError, match="rounds=2 is not available: image prompts"):
        _trainer(_config(tmp_path), tokenizer, prompts, train_dataset=images, rounds=2)


@pytest.mark.parametrize(
    "options",
    [
        {"steps_per_generation": 2, "per_device_train_batch_size": ROWS // 2},
        {"num_iterations": 2},
        {"gradient_accumulation_steps": 2, "per_device_train_batch_size": ROWS // 2},
        {"beta": 0.1},
    ],
    ids=["steps_per_generation", "num_iterations", "grad_accum", "beta"],
)
def test_trl_options_work_with_rounds(tmp_path, tokenizer, prompts, options):
    recorder = _RewardRecorder()
    model = build_tiny_model(tokenizer)
    if options.get("beta"):
        model.save_pretrained(tmp_path / "tiny")
        tokenizer.save_pretrained(tmp_path / "tiny")
        model = str(tmp_path / "tiny")
    trainer = _trainer(
        _config(tmp_path, max_steps=2, **options),
        tokenizer,
        prompts,
        model=model,
        reward_funcs=recorder,
        rounds=2,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(recorder.calls) == 2 * len(trainer.sera_history)
    for step, record in enumerate(trainer.sera_history):
        assert record["generated_counts"] == record["allocated_counts"]
        assert sum(record["allocated_counts"]) == ROWS
        seen = Counter(
            t for call in recorder.calls[2 * step : 2 * step + 2] for t in call["prompts"]
        )
        assert {prompts.index(t): n for t, n in seen.items()} == {
            i: n for i, n in zip(record["prompt_ids"], record["allocated_counts"], strict=True) if n
        }
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(np.isfinite(losses))


def test_vllm_server_mode_sends_one_request_per_round(tmp_path, tokenizer, prompts):
    trainer, client = fake_vllm_server_trainer(tmp_path, tokenizer, prompts, rounds=ROUNDS)
    rows = [
        {"prompt": text, "prompt_id": i}
        for i, text in enumerate(prompts)
        for _ in range(NUM_GENERATIONS)
    ]
    output = trainer._generate_and_score_completions(rows)
    record = trainer.sera_history[-1]
    assert len(client.requests) == ROUNDS
    assert all(request["n"] == 1 for request in client.requests)
    assert [len(request["prompts"]) for request in client.requests] == [
        sum(counts) for counts in record["round_counts"]
    ]
    token_counts = Counter(tuple(p) for request in client.requests for p in request["prompts"])
    expected = {
        tuple(tokenizer(prompts[i])["input_ids"]): n
        for i, n in zip(record["prompt_ids"], record["allocated_counts"], strict=True)
        if n
    }
    assert dict(token_counts) == expected
    assert output["advantages"].shape == (ROWS,)
    assert output["completion_ids"].shape[0] == ROWS


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rounds": 0}, "rounds must be a positive integer"),
        ({"rounds": True}, "rounds must be a positive integer"),
        ({"rounds": 2.0}, "rounds must be a positive integer"),
        ({"rounds": 2, "first_round": 0}, "first_round must be None"),
        ({"rounds": 1, "first_round": 2}, "set rounds >= 2"),
        ({"first_round": 2}, "in one call by default; set rounds >= 2"),
        ({"rounds": "4"}, "rounds must be a positive integer"),
    ],
)
def test_rejects_bad_round_options(tmp_path, tokenizer, prompts, options, message):
    with pytest.raises(SeraOptError, match=message):
        _trainer(_config(tmp_path), tokenizer, prompts, **options)


def test_rejects_a_first_round_larger_than_the_budget(tmp_path, tokenizer, prompts):
    trainer = _trainer(
        _config(tmp_path, max_steps=1),
        tokenizer,
        prompts,
        rounds=2,
        first_round=NUM_GENERATIONS + 1,
    )
    with pytest.raises(SeraOptError, match="first"):
        trainer.train()


def test_rejects_rounds_with_image_prompts(tmp_path, tokenizer, prompts):
    trainer = _trainer(_config(tmp_path), tokenizer, prompts, rounds=2)
    trainer.model.train()
    rows = [
        {"prompt": text, "prompt_id": i, "image": None}
        for i, text in enumerate(prompts)
        for _ in range(NUM_GENERATIONS)
    ]
    with pytest.raises(SeraOptError, match="image prompts"):
        trainer._generate_and_score_completions(rows)


# ------------------------------------------------------------------------ two processes


@pytest.mark.slow
def test_two_processes_run_the_same_rounds(tmp_path):
    """torchrun, 2 CPU processes (gloo), rounds=2: each process's rounds line up with the
    other's collective calls, counts are honoured, advantages are global with the
    first-round baseline, and the planners stay identical."""
    import json
    import shutil
    import subprocess

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH")
    script = tmp_path / "ddp_script.py"
    script.write_text(_DDP_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    completed = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path), "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["tracker"] == ranks[1]["tracker"], "the planners diverged across processes"
    for step in range(2):
        rewards, index, round_index, offset = [], [], [], 0
        for rank in ranks:
            record = rank["history"][step]
            calls = rank["calls"][2 * step : 2 * step + 2]
            assert record["rounds"] == 2
            texts = [t for call in calls for t in call["prompts"]]
            unique = sorted(set(texts), key=texts.index)
            assert len(unique) == 2 and sum(record["allocated_counts"]) == 8
            assert record["generated_counts"] == record["allocated_counts"]
            assert [texts.count(t) for t in unique] == record["allocated_counts"]
            rewards += [r for call in calls for r in call["rewards"]]
            index += [offset + unique.index(t) for t in texts]
            round_index += [r for r, call in enumerate(calls) for _ in call["prompts"]]
            offset += len(unique)
        # Both processes ran rounds of the same sizes.
        assert [len(c["prompts"]) for c in ranks[0]["calls"][2 * step : 2 * step + 2]] == [
            len(c["prompts"]) for c in ranks[1]["calls"][2 * step : 2 * step + 2]
        ]
        expected = sera_opt.maxrl_advantages(
            torch.tensor(rewards), torch.tensor(index), round_index=torch.tensor(round_index)
        )
        actual = torch.tensor(ranks[0]["advantages"][step] + ranks[1]["advantages"][step])
        torch.testing.assert_close(actual, expected)
    log = ranks[0]["log"]
    assert len(log) == 2
    assert all(entry["sera/rounds"] == 2 for entry in log)
    assert all(entry["sera/round_0_budget"] + entry["sera/round_1_budget"] == 16 for entry in log)


# --------------------------------------------------------------------------------- the demo


@pytest.mark.parametrize("rounds", [1, 2])
def test_demo_prints_the_rounds_beside_equal_counts(capsys, rounds):
    import json

    from sera_opt.integrations import trl_demo

    assert trl_demo.main(["--steps", "2", "--rounds", str(rounds), "--json"]) == 0
    lines = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["counts_match"] and line["allocated_counts"] == line["generated_counts"]
        assert sum(line["allocated_counts"]) == 16
        if rounds == 1:
            assert "rounds" not in line
        else:
            assert line["rounds"] == rounds
            assert sum(line["round_budgets"]) == 16 and len(line["round_counts"]) == rounds
            assert [sum(c) for c in zip(*line["round_counts"], strict=True)] == line[
                "allocated_counts"
            ]


def test_demo_refuses_bad_rounds(capsys):
    from sera_opt.integrations import trl_demo

    assert trl_demo.main(["--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
    # A first round needs rounds: the default is one call per step.
    for argv in (["--first-round", "2"], ["--rounds", "1", "--first-round", "2"]):
        assert trl_demo.main(argv) == 2
        assert "--first-round needs --rounds 2 or more" in capsys.readouterr().err
