"""The cost of rounds through a trainer's generation backend: SeraGRPOTrainer on CPU.

Rounds are the default of the trainers (4 generation calls per step instead of one,
docs/benchmarks.md). This measures what that costs where it can be measured without a
GPU: trl's ``GRPOTrainer`` generation path (transformers ``generate``) inside
:class:`sera_opt.integrations.trl.SeraGRPOTrainer`, on the demo's 2-layer GPT-2 and
character-level tokenizer (both built in code, nothing downloaded).

One process trains a fresh trainer (same seed, same batches) for each setting:
``rounds`` = 1, 2 and 4 (the default), and plain trl ``GRPOTrainer`` (no sera_opt) as
a second baseline; the settings alternate over the repeats (forwards, then
backwards). Each run's first optimizer step is a warm-up and is not counted. Per
setting it reports the median wall time of an optimizer step, the time spent in the
backend's generation calls (``GRPOTrainer._generate_single_turn``) and their number
per step, and the ratios to ``rounds=1`` in the same run. A third baseline, one
``np.sort`` of 10^6 floats, is timed in the same process. torch runs on one thread.

A second table splits each setting's median step into where its time goes (the
``breakdown`` of each row in the JSON, milliseconds and calls per step): transformers'
``generate``, trl's code around it per generation call (prompt padding, unwrapping the
model, the completions' post-processing), trl's tokenization, decoding and length
metrics, the reward functions, the log-probability passes, trl's assembly of the
scored batch, sera_opt's own code (the adapter and the planner, rounds included), and
the rest of the step (loss, backward, optimizer, callbacks). Each part is timed
exclusive of the others nested in it.

Not measured here: a GPU backend (vLLM, SGLang), where a generation call's fixed cost,
batching and the wait for the slowest sequence of each round weigh differently.

    sera-opt bench trl-rounds [--quick] [--out DIR] [--repeats K] [--steps S]
                              [--completion-length T] [--rounds 1,2,4]

The default: 3 repeats of 11 steps (10 measured) per setting, completions of up to 16
tokens; ``--quick``: 1 repeat of 3 steps, 8 tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from . import _harness
from .solvers import cpu_info

PROMPTS_PER_STEP = 8
NUM_GENERATIONS = 8
ROUNDS = (1, 2, 4)
# The tiny GPT-2 has 64 positions and the prompts take up to 7 tokens (5 digits, ':' and
# the end token): completions longer than this would run off its position table.
MAX_COMPLETION = 48
PLAIN = "trl GRPOTrainer"


#: The parts of a step the breakdown times: (label, owner's dotted path, method).
#: Exclusive times: a part nested in another (generate inside trl's call) is not
#: counted twice. The adapter's part holds everything sera_opt does in a step
#: (planning, rounds, the row checks, the merge, advantages, diagnostics).
BREAKDOWN_PARTS = (
    ("model generate", "transformers.generation.utils.GenerationMixin", "generate"),
    ("trl per-call setup", "trl.GRPOTrainer", "_generate_single_turn"),
    ("trl tokenize/decode", "trl.GRPOTrainer", "_generate"),
    ("reward functions", "trl.GRPOTrainer", "_calculate_rewards"),
    ("log-prob passes", "trl.GRPOTrainer", "_get_per_token_logps_and_entropies"),
    ("trl batch assembly", "trl.GRPOTrainer", "_generate_and_score_completions"),
    ("sera_opt", "sera_opt.integrations.trl.SeraGRPOTrainer", "_generate_and_score_completions"),
)
REST = "rest (loss, backward, optimizer)"


class _PartTimers:
    """Exclusive wall time and calls of the :data:`BREAKDOWN_PARTS`, installed on their
    classes for the duration of a ``with`` block (and removed after it)."""

    def __init__(self):
        self.seconds: dict[str, float] = {label: 0.0 for label, _, _ in BREAKDOWN_PARTS}
        self.calls: dict[str, int] = {label: 0 for label, _, _ in BREAKDOWN_PARTS}
        self._nested: list[float] = []
        self._saved: list[tuple[type, str, Any]] = []

    def _timed(self, label: str, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._nested.append(0.0)
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.seconds[label] += elapsed - self._nested.pop()
                self.calls[label] += 1
                if self._nested:
                    self._nested[-1] += elapsed
        return timed

    def __enter__(self):
        import importlib

        for label, owner_path, name in BREAKDOWN_PARTS:
            module, _, owner_name = owner_path.rpartition(".")
            owner = getattr(importlib.import_module(module), owner_name)
            original = owner.__dict__[name]
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(label, original))
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        return False

    def snapshot(self) -> tuple[dict[str, float], dict[str, int]]:
        return dict(self.seconds), dict(self.calls)


def _rounds_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--rounds takes positive integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1 or 1 not in values:
        raise argparse.ArgumentTypeError(
            f"--rounds needs positive integers including 1 (the ratios' baseline), got {text!r}")
    return values


def _run(setting, *, steps: int, completion_length: int, seed: int,
         timers: _PartTimers) -> dict:
    """Train one fresh trainer for ``steps`` optimizer steps; its per-step timings."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    import sera_opt
    from sera_opt.integrations.trl import SeraGRPOTrainer
    from sera_opt.integrations.trl_tiny import (
        build_tiny_model,
        build_tokenizer,
        copy_digit_reward,
        make_prompts,
        prompt_dataset,
    )

    base = GRPOTrainer if setting == PLAIN else SeraGRPOTrainer

    class Timed(base):
        """Times the backend's generation calls."""

        def _generate_single_turn(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                self.bench_generate.append(time.perf_counter() - start)

    step_times: list[float] = []
    generate_per_step: list[tuple[float, int]] = []
    parts_per_step: list[dict[str, tuple[float, int]]] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()
            self.generate_before = len(trainer.bench_generate)
            self.parts_before = timers.snapshot()

        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.perf_counter() - self.start)
            (seconds, calls), (seconds_0, calls_0) = timers.snapshot(), self.parts_before
            parts_per_step.append({label: (seconds[label] - seconds_0[label],
                                           calls[label] - calls_0[label]) for label in seconds})
            calls = trainer.bench_generate[self.generate_before:]
            generate_per_step.append((sum(calls), len(calls)))

    tokenizer = build_tokenizer()
    dataset = prompt_dataset(make_prompts(4 * PROMPTS_PER_STEP, seed=seed))
    with tempfile.TemporaryDirectory(prefix="sera_bench_trl_rounds_") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir, use_cpu=True, bf16=False, report_to="none", seed=seed,
            num_generations=NUM_GENERATIONS,
            per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS,
            max_completion_length=completion_length, max_steps=steps, learning_rate=3e-3,
            logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        )
        options = {} if setting == PLAIN else {
            "planner": sera_opt.RolloutPlanner(max_rollouts=4 * NUM_GENERATIONS),
            "rounds": setting,
        }
        trainer = Timed(model=build_tiny_model(tokenizer, seed=seed),
                        reward_funcs=copy_digit_reward, args=config, train_dataset=dataset,
                        processing_class=tokenizer, callbacks=[StepClock()], **options)
        trainer.remove_callback(PrinterCallback)  # trl's log lines would bury the table
        trainer.bench_generate = []
        trainer.train()
    measured = slice(1, None)  # the first step is a warm-up
    return {"step_s": step_times[measured],
            "generate_s": [g for g, _ in generate_per_step[measured]],
            "generate_calls": [n for _, n in generate_per_step[measured]],
            "parts": parts_per_step[measured]}


def _label(setting) -> str:
    return setting if setting == PLAIN else f"rounds={setting}"


def main(argv=None) -> int:
    parser = _harness.common_parser("trl-rounds", __doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=_harness.at_least(1), default=None,
                        help="runs per setting, alternating the order (default 3, --quick 1)")
    parser.add_argument("--steps", type=_harness.at_least(1), default=None,
                        help="optimizer steps per run, the first a warm-up (default 11, --quick 3)")
    parser.add_argument("--completion-length", type=_harness.at_least(1), default=None,
                        help="max_completion_length in tokens (default 16, --quick 8)")
    parser.add_argument("--rounds", type=_rounds_list, default=ROUNDS,
                        help="round settings, with 1 as the baseline (default 1,2,4)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    steps = args.steps or (3 if args.quick else 11)
    length = args.completion_length or (8 if args.quick else 16)
    if repeats < 1 or steps < 2 or not 1 <= length <= MAX_COMPLETION:
        parser.error(f"--repeats must be at least 1, --steps at least 2 and --completion-length "
                     f"between 1 and {MAX_COMPLETION} (the tiny model has 64 positions)")
    try:
        import trl  # noqa: F401
    except ImportError:
        parser.error("needs trl 1.16: pip install 'sera_opt[trl]'")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)

    x = np.random.default_rng(args.seed).random(1_000_000)
    sort_s = _harness.median_time(lambda: np.sort(x), repeats=7)["median"]
    settings = [*args.rounds, PLAIN]
    runs: dict[str, list[dict]] = {_label(s): [] for s in settings}
    with _PartTimers() as timers:
        for r in range(repeats):
            order = settings if r % 2 == 0 else settings[::-1]
            for setting in _harness.progress(order, desc=f"repeat {r + 1}/{repeats}",
                                             enabled=not args.no_progress):
                runs[_label(setting)].append(
                    _run(setting, steps=steps, completion_length=length, seed=args.seed,
                         timers=timers))

    rows = []
    for label, results in runs.items():
        step = [t for run in results for t in run["step_s"]]
        generate = [t for run in results for t in run["generate_s"]]
        calls = [n for run in results for n in run["generate_calls"]]
        parts = [p for run in results for p in run["parts"]]
        # Medians per part: they need not add up to the median step; the rest is the
        # median of each step's own remainder.
        breakdown = {label: {"ms": 1e3 * statistics.median(p[label][0] for p in parts),
                             "calls": statistics.median(p[label][1] for p in parts)}
                     for label, _, _ in BREAKDOWN_PARTS}
        breakdown[REST] = {"ms": 1e3 * statistics.median(
            t - sum(s for s, _ in p.values()) for t, p in zip(step, parts)), "calls": None}
        rows.append({"setting": label, "step_s": statistics.median(step),
                     "generate_s": statistics.median(generate),
                     "generate_calls_per_step": statistics.median(calls),
                     "steps_measured": len(step), "breakdown": breakdown})
    base = next(row for row in rows if row["setting"] == "rounds=1")
    for row in rows:
        row["step_vs_rounds_1"] = row["step_s"] / base["step_s"]
        row["generate_vs_rounds_1"] = row["generate_s"] / base["generate_s"]
        row["generate_share"] = row["generate_s"] / row["step_s"]
        row["step_vs_sort"] = row["step_s"] / sort_s
    payload = {
        "machine": {**_harness.machine_info(), "cpu": cpu_info(),
                    "trl": sys.modules["trl"].__version__,
                    "transformers": transformers.__version__, "torch_threads": 1},
        "setup": {"prompts_per_step": PROMPTS_PER_STEP, "num_generations": NUM_GENERATIONS,
                  "completions_per_step": PROMPTS_PER_STEP * NUM_GENERATIONS,
                  "max_completion_length": length, "steps_per_run": steps,
                  "warm_up_steps": 1, "repeats": repeats, "seed": args.seed,
                  "planner": "RolloutPlanner(max_rollouts=32), default policies"},
        "sort_1e6_s": sort_s, "rows": rows,
    }
    path = _harness.write_json(args.out, "trl_rounds", payload)
    print(f"SeraGRPOTrainer on CPU, {PROMPTS_PER_STEP * NUM_GENERATIONS} completions of up to "
          f"{length} tokens per step; np.sort of 1e6 floats: {sort_s * 1e3:.1f} ms")
    print(f"{'setting':<18}{'step ms':>9}{'x r=1':>7}{'generate ms':>13}{'x r=1':>7}"
          f"{'calls':>7}{'share':>7}{'x sort':>8}")
    for row in rows:
        print(f"{row['setting']:<18}{row['step_s'] * 1e3:9.1f}{row['step_vs_rounds_1']:7.2f}"
              f"{row['generate_s'] * 1e3:13.1f}{row['generate_vs_rounds_1']:7.2f}"
              f"{row['generate_calls_per_step']:7.0f}{row['generate_share']:7.2f}"
              f"{row['step_vs_sort']:8.2f}")
    print("\nwhere a step's time goes: median ms per step (calls per step), each part "
          "exclusive of the parts nested in it")
    print(f"{'part':<34}" + "".join(f"{row['setting']:>19}" for row in rows))
    for label in [*(label for label, _, _ in BREAKDOWN_PARTS), REST]:
        cells = []
        for row in rows:
            part = row["breakdown"][label]
            calls = "" if part["calls"] is None else f" ({part['calls']:g})"
            cells.append(f"{part['ms']:.1f}{calls}".rjust(19))
        print(f"{label:<34}" + "".join(cells))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_harness.run_command("trl-rounds", main))
