"""Configuration, arms, warm start and one (seed, arm) run of the TRL coverage experiment.

An arm is named by what it runs:

* ``grpo``: stock ``trl.GRPOTrainer`` with its own defaults (loss type "dapo",
  rewards scaled per group, ``num_generations`` = rollouts per prompt);
* ``NAME[:key=value...][:rounds=R][:first=N]``, a registered policy with options
  (``uniform``, ``sera-fair:alpha=1``, ``sera-fair:alpha=1:rounds=4``):
  :class:`sera_opt.integrations.trl.SeraGRPOTrainer` with a planner of that policy
  within the trainer's default bounds ``[2, 4 N0]``, its tracker a
  :class:`sera_opt.SuccessTracker` that forgets at ``tracker_decay`` (none given: no
  forgetting), and ``rounds=R`` generation calls per step (1 unless given);
* ``sera-paper[:rounding=exact][:cold_start=prior]``: the authors' configuration,
  :meth:`sera_opt.RolloutPlanner.paper_sera` (its estimates frozen per epoch;
  :meth:`~sera_opt.RolloutPlanner.end_epoch` at each pass over the training prompts).

The labels of earlier result files (``trl``, ``sera:policy=NAME:rounds=R``, and
``sera:rounds=R``, which meant the default planner of its day) are read with the
names of what they measured (:func:`legacy_label`); new runs refuse them. Every arm of
a seed uses the same ``GRPOConfig``
(prompts per step, completions per step, optimizer, learning rate, loss type,
sampling settings, seed, so the same prompts in the same order) and starts from
the same supervised warm start.

:func:`run_arm` trains one arm and measures, per optimizer step, its wall time,
the wall time inside the backend's generation calls, the tokens generated, the
generation and reward calls, and the process's CPU time (training and
generation; the evaluations are taken out). It evaluates pass@k on the held-out
problems at fixed steps and on a grid of CPU seconds: the value at ``t`` seconds
is that of the weights the arm had reached when its CPU time was at most ``t``
(a copy of the weights is kept at every step end; evaluating it costs no
training time).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.benchmarks import _coverage, _harness
from sera_opt.benchmarks._cost import StepCost
from sera_opt.exceptions import SeraOptError

__all__ = ["CoverageConfig", "PRESETS", "ARMS", "BASELINES", "Arm", "parse_arm",
           "parse_arms", "legacy_label", "warm_start_seed", "run_arm"]

#: The arms of issue 41's comparison, named by what they ran, in the order they are run
#: and drawn: the default planner of that comparison was sera-fair at alpha 1.
ARMS = ("grpo", "uniform", "sera-fair:alpha=1", "sera-fair:alpha=1:rounds=2",
        "sera-fair:alpha=1:rounds=4")
#: The arms every other arm is compared with, seed by seed (those present).
BASELINES = ("grpo", "uniform", _coverage.PAPER)


@dataclass(frozen=True)
class CoverageConfig:
    """Everything that defines a run (the JSON records it)."""

    # task: the arithmetic experiment's addition problems
    max_digits: int = 3
    num_train: int = 256
    num_test: int = 64
    data_seed: int = 2026
    # model: the tiny GPT-2 of sera_opt.integrations.trl_tiny
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    # supervised warm start, shared by every arm of a seed
    sft_steps: int = 3000
    sft_batch: int = 128
    sft_lr: float = 1e-3
    sft_target_success: float = 0.3
    sft_check_every: int = 25
    sft_probe_samples: int = 2
    # reinforcement learning, the same for every arm
    steps: int = 600
    prompts_per_step: int = 16
    rollouts_per_prompt: int = 8
    learning_rate: float = 2e-4
    # transformers' schedule of the learning rate: "linear" (its default, decaying to 0 at
    # the last step) or "constant"
    lr_scheduler_type: str = "linear"
    # the sera-fair and other policy arms' tracker keeps this fraction of its evidence at
    # each update (None: SuccessTracker(), no forgetting)
    tracker_decay: float | None = None
    arms: tuple[str, ...] = ARMS
    # evaluation on the held-out problems
    eval_samples: int = 64
    eval_every: int = 100
    # the equal-cost grids: CPU seconds (training and generation, one thread), generated
    # tokens, generation calls; each arm is evaluated where it crosses one of them
    cpu_grid_s: tuple[float, ...] = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0)
    token_grid: tuple[float, ...] = (60_000.0, 120_000.0, 180_000.0, 240_000.0)
    call_grid: tuple[float, ...] = (100.0, 200.0, 400.0, 600.0)
    seeds: int = 10

    @property
    def answer_width(self) -> int:
        """Tokens a completion may take: the longest reversed sum and the end token."""
        return self.max_digits + 2

    @property
    def budget(self) -> int:
        """Completions per optimizer step, the same in every arm."""
        return self.prompts_per_step * self.rollouts_per_prompt

    @property
    def eval_steps(self) -> tuple[int, ...]:
        """The steps after which every arm is evaluated (0 is the warm start)."""
        marks = set(range(self.eval_every, self.steps + 1, self.eval_every)) if self.eval_every else set()
        return tuple(sorted({0, *marks, self.steps}))

    def validate(self) -> CoverageConfig:
        problems = []
        if self.rollouts_per_prompt < 2:
            problems.append("rollouts_per_prompt must be at least 2 (a group needs two rollouts)")
        if self.prompts_per_step > self.num_train:
            problems.append("prompts_per_step cannot exceed num_train")
        if self.eval_samples < 1 or self.steps < 1 or self.seeds < 1:
            problems.append("eval_samples, steps and seeds must be positive")
        if self.n_embd % self.n_head:
            problems.append("n_embd must be a multiple of n_head")
        if self.lr_scheduler_type not in ("linear", "constant"):
            problems.append("lr_scheduler_type must be 'linear' or 'constant'")
        if self.tracker_decay is not None and not 0 < self.tracker_decay <= 1:
            problems.append("tracker_decay must lie in (0, 1] (or be None)")
        arms = parse_arms(self.arms)
        if any(a.paper for a in arms) and self.num_train % self.prompts_per_step:
            problems.append("the sera-paper arms end an epoch at each pass over the training "
                            "prompts: num_train must be a multiple of prompts_per_step")
        for name in ("cpu_grid_s", "token_grid", "call_grid"):
            grid = list(getattr(self, name))
            if any(t <= 0 for t in grid) or grid != sorted(set(grid)):
                problems.append(f"{name} must be positive and increasing")
        if problems:
            raise SeraOptError("invalid trl-coverage configuration: " + "; ".join(problems) + ".")
        parse_arms(self.arms)
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(budget=self.budget, answer_width=self.answer_width,
                 eval_steps=list(self.eval_steps))
        return d

    def warm_start_key(self) -> str:
        """A digest of the fields the warm start depends on (names its cache file)."""
        fields = ("max_digits", "num_train", "num_test", "data_seed", "n_embd", "n_layer",
                  "n_head", "sft_steps", "sft_batch", "sft_lr", "sft_target_success",
                  "sft_check_every", "sft_probe_samples", "eval_samples")
        text = json.dumps({f: getattr(self, f) for f in fields}, sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


#: Named configurations. "default": one (seed, arm) run takes about 60-90 s of one core of
#: this project's 2-core CI-class machine (docs/benchmarks.md); "quick" is for a test;
#: "expand" is where training can raise coverage (issue 51): the warm start stopped at
#: 0.12 sampled success, a constant learning rate, 256 held-out problems, a forgetting
#: tracker for the policy arms and the coverage arms (the rule:
#: docs/decisions/2026-12-07-coverage-expansion-rule.md).
PRESETS: dict[str, CoverageConfig] = {
    "default": CoverageConfig(),
    "expand": CoverageConfig(num_test=256, sft_target_success=0.12,
                             lr_scheduler_type="constant", tracker_decay=0.97, eval_every=200,
                             cpu_grid_s=(15.0, 30.0, 45.0, 60.0), token_grid=(),
                             call_grid=(), seeds=16,
                             arms=("grpo", "uniform", _coverage.PAPER, "sera-fair:alpha=1",
                                   "sera-paper:rounding=exact", "sera-paper:cold_start=prior")),
    "quick": CoverageConfig(max_digits=1, num_train=32, num_test=8, sft_steps=120,
                            sft_lr=3e-3, sft_batch=64, sft_check_every=20, steps=3,
                            prompts_per_step=4, rollouts_per_prompt=4, eval_samples=8,
                            eval_every=2, cpu_grid_s=(0.01, 0.03), token_grid=(30.0, 60.0),
                            call_grid=(1.0, 2.0), seeds=1),
}


# --------------------------------------------------------------------------- arms


@dataclass(frozen=True)
class Arm:
    """One arm: stock ``GRPOTrainer`` (``trainer="trl"``) or ``SeraGRPOTrainer``.

    ``policy`` and ``options`` name a registered policy and its settings (None for
    ``grpo`` and for the authors' configuration, ``paper=True``, whose planner is
    :meth:`sera_opt.RolloutPlanner.paper_sera` with ``options`` for its policy and
    ``tracker_options`` for its tracker).
    """

    label: str
    trainer: str
    policy: str | None = None
    rounds: int | None = None
    first: int | None = None
    options: tuple[tuple[str, Any], ...] = ()
    paper: bool = False
    tracker_options: tuple[tuple[str, Any], ...] = ()


def legacy_label(label: str) -> str:
    """The name of what an arm label of an earlier result file measured.

    ``trl`` is ``grpo``; ``sera:policy=NAME[:rounds=R][:first=N]`` is ``NAME`` (with its
    rounds when more than one); a bare ``sera[:rounds=R]`` ran the default planner of its
    day, sera-fair at alpha 1, and reads ``sera-fair:alpha=1[:rounds=R] (default then)``.
    Any other label is returned as it is.
    """
    label = str(label).strip()
    if label == "trl":
        return "grpo"
    name, *options = label.split(":")
    if name != "sera":
        return label
    values = dict(option.partition("=")[::2] for option in options)
    policy = values.pop("policy", None)
    rest = "".join(f":{key}={values[key]}" for key in ("rounds", "first")
                   if key in values and not (key == "rounds" and values[key] == "1"))
    if policy is None:
        return f"sera-fair:alpha=1{rest} (default then)"
    return f"{policy}{rest}"


def parse_arm(text: str) -> Arm:
    """``"grpo"``, ``"sera-paper[:key=value...]"`` or ``"NAME[:key=value...][:rounds=R]
    [:first=N]"`` with NAME a registered policy (see the module's docstring)."""
    label = text.strip()
    name = _harness.arm_policy_name(label)
    if name in ("trl", "sera"):
        raise _harness.ArmSpecError(
            f"arm {label!r} is a label of earlier result files; name the arm by what it runs: "
            f"'grpo' for stock GRPOTrainer, the policy for a SeraGRPOTrainer arm (e.g. "
            f"'uniform', 'sera-fair:alpha=1:rounds=2'; a bare 'sera' was "
            f"{legacy_label(label)!r}).")
    if name == _coverage.GRPO:
        if label != _coverage.GRPO:
            raise _harness.ArmSpecError(
                f"arm {label!r}: the grpo arm is stock GRPOTrainer with its own defaults; it "
                "takes no options.")
        return Arm(label=label, trainer="trl")
    if name == _coverage.PAPER:
        loop = _coverage.parse_loop_arm(label)
        return Arm(label=label, trainer="sera", rounds=1, options=loop.policy_options,
                   paper=True, tracker_options=loop.tracker_options)
    spec = _harness.parse_arm(label)
    if spec.is_reinforce_ada:
        raise _harness.ArmSpecError(
            f"arm {label!r}: Reinforce-Ada's rounds are not a SeraGRPOTrainer planner; run it in "
            "the project's own loops (bench maze, bench arithmetic).")
    return Arm(label=label, trainer="sera", policy=spec.policy, rounds=spec.rounds,
               first=spec.first, options=spec.options)


def parse_arms(arms) -> tuple[Arm, ...]:
    """Parse a comma-separated string or a sequence of arm texts; repeated labels are refused."""
    texts = _harness._split_top_level(arms, ",") if isinstance(arms, str) else list(arms)
    parsed = tuple(parse_arm(t) for t in texts)
    labels = [a.label for a in parsed]
    if len(set(labels)) != len(labels) or not labels:
        raise _harness.ArmSpecError(f"give each arm once, and at least one: {labels}.")
    return parsed


# --------------------------------------------------------------------------- runs


def _setup(seed: int):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    # One thread per run: CPU seconds mean the same in every arm, and parallel runs do
    # not compete for cores.
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    return torch


def _data(cfg: CoverageConfig):
    from sera_opt.benchmarks.arithmetic.task import make_split

    return make_split(cfg.data_seed, cfg.num_train, cfg.num_test, cfg.max_digits)


def _evaluate(model, tokenizer, cfg: CoverageConfig, test, seed: int) -> dict[str, Any]:
    from sera_opt.benchmarks.trl_coverage.task import count_correct, prompts_and_answers

    prompts, answers = prompts_and_answers(test)
    correct = count_correct(model, tokenizer, prompts, answers, cfg.eval_samples,
                            max_new_tokens=cfg.answer_width, seed=seed * 1000 + 41)
    return {"pass_at_k": _harness.pass_at_k_curve(correct, cfg.eval_samples,
                                                  cfg.eval_samples).tolist(),
            "correct": correct.tolist()}


def _train_rates(model, tokenizer, cfg: CoverageConfig, train, seed: int) -> dict[str, Any]:
    """The warm start's sampled success rate of every training prompt (``eval_samples``
    samples each) and the warm start's half of the regime check."""
    from sera_opt.benchmarks.trl_coverage.task import count_correct, prompts_and_answers

    prompts, answers = prompts_and_answers(train)
    correct = count_correct(model, tokenizer, prompts, answers, cfg.eval_samples,
                            max_new_tokens=cfg.answer_width, seed=seed * 1000 + 43)
    rates = correct / cfg.eval_samples
    return {"train_success_rates": rates.tolist(),
            "regime": _coverage.warm_start_regime(rates)}


def warm_start_path(out_dir: Path, cfg: CoverageConfig, seed: int) -> Path:
    return Path(out_dir) / "warm_starts" / f"seed{seed}_{cfg.warm_start_key()}.pt"


def warm_start_seed(cfg: CoverageConfig, seed: int, out_dir: Path) -> dict[str, Any]:
    """The supervised warm start of ``seed``, trained once and cached under ``out_dir``.

    The cache file holds the weights and the record (steps, probes, CPU time,
    the held-out pass@k); it is named by the seed and a digest of the fields the
    warm start depends on, so a changed configuration trains a new one.
    """
    torch = _setup(seed)
    path = warm_start_path(out_dir, cfg, seed)
    from sera_opt.benchmarks.trl_coverage.task import build, warm_start

    train, test = _data(cfg)
    tokenizer, model = build(seed=seed, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                             n_head=cfg.n_head)
    if path.exists():
        saved = torch.load(path, weights_only=False)
        if "train_success_rates" in saved["record"]:
            return saved["record"]
        # A cache written before the regime check: add the training prompts' rates.
        model.load_state_dict(saved["state_dict"])
        record = {**saved["record"], **_train_rates(model, tokenizer, cfg, train, seed)}
    else:
        start, cpu_start = time.perf_counter(), time.process_time()
        sft = warm_start(model, tokenizer, cfg, train, test.pairs(), seed)
        record = {"seed": seed, "steps": sft["steps"], "probes": sft["probes"],
                  "loss_last": sft["losses"][-1] if sft["losses"] else None,
                  "wall_time_s": time.perf_counter() - start,
                  "cpu_time_s": time.process_time() - cpu_start,
                  **_evaluate(model, tokenizer, cfg, test, seed),
                  **_train_rates(model, tokenizer, cfg, train, seed)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"state_dict": model.state_dict(), "record": record}, tmp)
    os.replace(tmp, path)  # whole or absent, even with runs in parallel
    return record


def _grpo_config(cfg: CoverageConfig, seed: int, output_dir: str):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, report_to="none", seed=seed,
        num_generations=cfg.rollouts_per_prompt, per_device_train_batch_size=cfg.budget,
        max_completion_length=cfg.answer_width, max_steps=cfg.steps,
        learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler_type,
        temperature=1.0, logging_steps=max(1, cfg.steps),
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )


def _trainer_class(arm: Arm):
    from trl import GRPOTrainer

    from sera_opt.integrations.trl import SeraGRPOTrainer

    base = GRPOTrainer if arm.trainer == "trl" else SeraGRPOTrainer

    class Timed(base):
        """Counts and times the backend's generation calls."""

        def _generate_single_turn(self, *args, **kwargs):
            start = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            self.bench_generation.append((time.perf_counter() - start,
                                          sum(len(c) for c in completion_ids)))
            return completion_ids, logprobs

    return Timed


def _trainer_options(arm: Arm, cfg: CoverageConfig) -> dict[str, Any]:
    if arm.trainer == "trl":
        return {}
    import sera_opt
    from sera_opt.integrations.trl import default_planner

    if arm.paper:
        loop = _coverage.LoopArm(label=arm.label, estimator="maxrl", paper=True,
                                 policy_options=arm.options,
                                 tracker_options=arm.tracker_options)
        planner = _coverage.build_planner(loop, min_rollouts=2,
                                          max_rollouts=4 * cfg.rollouts_per_prompt, offset=1,
                                          tracker_decay=1.0)
    else:
        bounds = default_planner("mean_centred", cfg.rollouts_per_prompt).policy
        tracker = (None if cfg.tracker_decay is None
                   else sera_opt.SuccessTracker(decay=cfg.tracker_decay))
        try:
            planner = sera_opt.RolloutPlanner(arm.policy, **dict(arm.options),
                                              min_rollouts=bounds.min_rollouts,
                                              max_rollouts=bounds.max_rollouts,
                                              offset=bounds.offset, tracker=tracker)
        except (SeraOptError, TypeError, ValueError) as exc:
            raise _harness.ArmSpecError(f"arm {arm.label!r}: {_harness._one_line(exc)}") from None
    return {"planner": planner, "rounds": arm.rounds, "first_round": arm.first}


def _compile_planner(trainer, cfg: CoverageConfig) -> None:
    """Allocate once with the arm's policies before training, so that a first use's
    compilation (once per process) is not counted as the first step's CPU time."""
    planner = getattr(trainer, "sera_planner", None)
    if planner is None:
        return
    probs = np.linspace(0.05, 0.95, cfg.prompts_per_step)
    for policy in (planner.policy, getattr(planner, "round_policy", None)):
        if policy is not None:
            policy.allocate(probs, cfg.budget)


#: The arms this process has already trained once (see :func:`_warm_up`).
_WARMED: set[str] = set()


def _dataset(train):
    from datasets import Dataset

    from sera_opt.benchmarks.trl_coverage.task import prompts_and_answers

    prompts, answers = prompts_and_answers(train)
    return Dataset.from_dict({"prompt": prompts, "answer": answers,
                              "prompt_id": list(range(len(prompts)))})


def _make_trainer(arm: Arm, cfg: CoverageConfig, seed: int, model, tokenizer, dataset,
                  output_dir: str, reward_calls: list, callbacks: list):
    from transformers.trainer_callback import PrinterCallback

    from sera_opt.benchmarks.trl_coverage.task import make_reward

    trainer = _trainer_class(arm)(
        model=model, reward_funcs=make_reward(tokenizer.eos_token_id, reward_calls),
        args=_grpo_config(cfg, seed, output_dir), train_dataset=dataset,
        processing_class=tokenizer, callbacks=callbacks, **_trainer_options(arm, cfg))
    trainer.remove_callback(PrinterCallback)  # trl's log lines would bury the progress
    trainer.bench_generation = []
    _compile_planner(trainer, cfg)
    return trainer


def _warm_up(arm: Arm, cfg: CoverageConfig, seed: int, tokenizer, dataset) -> None:
    """Train a throwaway model for two steps of ``arm``, once per process and arm.

    A process's first step of an arm pays one-off costs (lazy imports, the first
    call of compiled kernels, allocator growth: over a second for the first SERA
    arm of a process); they are not what a step costs, and counted they would
    favour whichever arm a process happens to run later.
    """
    from sera_opt.benchmarks.trl_coverage.task import build

    if arm.label in _WARMED:
        return
    _, model = build(seed=seed, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head)
    with tempfile.TemporaryDirectory(prefix="sera_bench_trl_coverage_") as output_dir:
        _make_trainer(arm, replace(cfg, steps=2), seed, model, tokenizer, dataset, output_dir,
                      [], []).train()
    _WARMED.add(arm.label)


def run_arm(cfg: CoverageConfig, seed: int, arm_text: str, out_dir: Path) -> dict[str, Any]:
    """Train arm ``arm_text`` of ``seed`` from the seed's warm start; its record.

    The record holds per step ``wall_s``, ``generate_s``, ``generated_tokens``,
    ``generation_calls``, ``reward_calls``, ``mean_reward`` and ``cpu_s`` (the
    cumulative CPU time of training and generation at the step's end), the
    evaluations at fixed steps (``at_steps``) and on the equal-cost grids
    (``at_cost``: CPU seconds, generated tokens, generation calls; see
    :class:`sera_opt.benchmarks._harness.CostGrid`), and the totals.
    """
    torch = _setup(seed)
    from transformers import TrainerCallback

    from sera_opt.benchmarks.trl_coverage.task import build

    arm = parse_arm(arm_text)
    saved = torch.load(warm_start_path(out_dir, cfg, seed), weights_only=False)
    train, test = _data(cfg)
    dataset = _dataset(train)
    tokenizer, model = build(seed=seed, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                             n_head=cfg.n_head)
    _warm_up(arm, cfg, seed, tokenizer, dataset)
    torch.manual_seed(seed)
    model.load_state_dict(saved["state_dict"])
    _, evaluator = build(seed=seed, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head)
    reward_calls: list[tuple[int, float]] = []
    steps: dict[str, list] = {key: [] for key in (
        "generate_s", "reward_calls", "mean_reward", "active_fraction", "forced_activations")}
    at_steps: list[dict] = [{"step": 0, "cpu_s": 0.0,
                             "pass_at_k": saved["record"]["pass_at_k"]}]
    clock: dict[str, Any] = {}

    def evaluate(state_dict) -> list[float]:
        evaluator.load_state_dict(state_dict)
        result = _evaluate(evaluator, tokenizer, cfg, test, seed)
        clock["correct"] = result["correct"]
        return result["pass_at_k"]

    def snapshot():
        return copy.deepcopy(trainer.model.state_dict())

    class Measure(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock["grid"] = _harness.CostGrid(
                {"cpu_s": cfg.cpu_grid_s, "tokens": cfg.token_grid, "calls": cfg.call_grid},
                evaluate, snapshot)
            clock["cost"] = StepCost(steps, {"tokens": ("generated_tokens", int),
                                             "calls": ("generation_calls", int)},
                                     wall_key="wall_s")

        def on_step_begin(self, args, state, control, **kwargs):
            clock["cost"].begin_step()
            clock["calls"] = len(trainer.bench_generation)
            clock["rewards"] = len(reward_calls)

        def on_step_end(self, args, state, control, **kwargs):
            calls = trainer.bench_generation[clock["calls"]:]
            scored = reward_calls[clock["rewards"]:]
            cost = clock["cost"]
            cost.count("tokens", sum(c[1] for c in calls))
            cost.count("calls", len(calls))
            steps["generate_s"].append(sum(c[0] for c in calls))
            steps["reward_calls"].append(len(scored))
            steps["mean_reward"].append(sum(s[1] for s in scored)
                                        / max(1, sum(s[0] for s in scored)))
            # The planner's active set of the step, as the trainer logged it.
            metrics = getattr(trainer, "_metrics", {}).get("train", {})
            for key, logged in (("active_fraction", "sera/active_fraction"),
                                ("forced_activations", "sera/forced_activations")):
                values = metrics.get(logged) or [1.0 if key == "active_fraction" else 0.0]
                steps[key].append(float(values[-1]))
            step = int(state.global_step)
            planner = getattr(trainer, "sera_planner", None)
            if planner is not None and step * cfg.prompts_per_step % cfg.num_train == 0:
                # A pass over the training prompts ended: the authors' estimates take it in.
                planner.end_epoch()
            # Everything in the block is evaluation: its CPU time is taken out of the arm's.
            with cost.end_step() as spent:
                clock["grid"].step_end(step, spent)
                if step in cfg.eval_steps:
                    at_steps.append({"step": step, "cpu_s": spent["cpu_s"],
                                     "pass_at_k": evaluate(snapshot())})

    with tempfile.TemporaryDirectory(prefix="sera_bench_trl_coverage_") as output_dir:
        trainer = _make_trainer(arm, cfg, seed, model, tokenizer, dataset, output_dir,
                                reward_calls, [Measure()])
        wall_start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - wall_start
    return {"seed": seed, "arm": arm.label, "steps": steps, "at_steps": at_steps,
            "at_cost": clock["grid"].points, "final_pass_at_k": at_steps[-1]["pass_at_k"],
            "final_correct": clock.get("correct"),
            "cpu_time_s": steps["cpu_s"][-1] if steps["cpu_s"] else 0.0,
            "wall_time_s": wall, "evaluation_cpu_s": clock["cost"].excluded_cpu_s}


def with_overrides(cfg: CoverageConfig, **overrides) -> CoverageConfig:
    """``cfg`` with the given fields replaced (None values are ignored)."""
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
