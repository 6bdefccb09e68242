"""Offline CPU demo of :class:`sera_opt.integrations.trl.SeraGRPOTrainer`.

Trains a randomly initialised 2-layer GPT-2 with a character-level tokenizer (both
built in code) on the "copy a digit" task of :mod:`sera_opt.integrations.trl_tiny`
for a few optimizer steps. It prints a header (the setting, and what each column
means), one line per step and a summary::

    step  reward    loss  min_factor  alignment  mean_scale  counts per prompt  per round
       1   0.250  -0.069       0.704      1.000       0.714  4 4 4 4            8+3+3+2

``--json`` prints one JSON line per step instead, and nothing else::

    {"step": 1, "prompts": [...], "allocated_counts": [...], "generated_counts": [...],
     "loss": ..., "reward": ..., "planned_min_factor": ..., ...}

``allocated_counts`` are the planner's counts for the step's prompts and
``generated_counts`` the completions the generation backend returned for each of
them; the demo exits with status 1 if they ever differ.

The ``loss`` is TRL's: the clipped surrogate at ratio 1, whose value is minus the
token-weighted mean advantage. MaxRL's advantages are centred on a baseline (the
prompt's success rate; with rounds, the first round's), so the value stays near 0
and is exactly 0.0 when they cancel, while its gradient is not 0: the printed loss
is not a measure of progress, and a 0.0 is not a bug.

Each step's completions are generated in ``--rounds R`` calls (default: the
trainer's, one call, the static plan; ``--rounds 4``: a first look, then the rest of
the same budget where the planner sends it); with R >= 2 each line also carries
``rounds`` (the rounds used), ``round_budgets`` (completions per round) and
``round_counts`` (per round, each prompt's completions).

Run: ``python -m sera_opt.integrations.trl_demo [--steps 6] [--loss-type dapo] [--rounds 4]``
(``--json`` for the raw lines).
Nothing is downloaded (``HF_HUB_OFFLINE=1`` is set before transformers loads).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence

# Diagnostics (``sera/<key>`` metrics) copied into each JSON line.
_LOGGED_DIAGNOSTICS = (
    "planned_min_factor",
    "min_factor",
    "weight_spread",
    "alignment_proxy",
    "signal_fraction",
    "mean_scale",
    "min_scale",
)


def _parser() -> argparse.ArgumentParser:
    import sera_opt

    parser = argparse.ArgumentParser(
        prog="python -m sera_opt.integrations.trl_demo",
        description="SERA rollout allocation + MaxRL advantages inside trl's GRPOTrainer, on a tiny CPU model.",
    )
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps (default 6)")
    parser.add_argument(
        "--num-prompts", type=int, default=8, help="prompts in the dataset (default 8)"
    )
    parser.add_argument(
        "--prompts-per-step",
        type=int,
        default=4,
        help="distinct prompts per generation batch (default 4)",
    )
    parser.add_argument(
        "--num-generations",
        type=int,
        default=4,
        help="mean completions per prompt, nbar (default 4)",
    )
    parser.add_argument(
        "--max-rollouts",
        type=int,
        default=None,
        help="most completions per prompt (default 3*nbar)",
    )
    parser.add_argument("--loss-type", default="dapo", help="GRPOConfig.loss_type (default dapo)")
    parser.add_argument(
        "--estimator",
        default="mean_centred",
        choices=sera_opt.ESTIMATORS,
        help="MaxRL estimator",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=(f"generation calls per step (default: the trainer's, {sera_opt.rounds.DEFAULT_ROUNDS}, "
              "the static plan; 4: a first look, then the rest where it is needed)"),
    )
    parser.add_argument(
        "--first-round",
        type=int,
        default=None,
        help="completions per prompt in the first round (default nbar // 2)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--json", action="store_true",
                        help="one JSON line per step (every field), and nothing else")
    return parser


LEGEND = """\
reward      mean reward of the step's completions (1: the digit copied)
loss        TRL's loss: the clipped surrogate at ratio 1, minus the token-weighted mean advantage.
            MaxRL's advantages are centred on a baseline, so it stays near 0 and is exactly 0.0
            when they cancel; its gradient is not 0. Not a measure of progress: watch reward.
min_factor  the smallest attenuation factor w_c(p_i, n_i) of the step's prompts, p_i estimated
            from the batch (1: the prompt's gradient arrives at full scale); SERA raises it
alignment   cosine of the batch's prompt weighting with equal weights (alignment_proxy; 1: every
            prompt counts the same, docs/estimator.md "Diagnostics")
mean_scale  mean expected scale of the prompts' likelihood gradients under the rounds drawn
            (RoundResult.factors; 1 is the most a prompt can get)
counts      completions per prompt, as allocated and as generated (always equal)"""


def _header(options, max_rollouts: int, rounds_text: str) -> str:
    return (
        "Rollout allocation (sera-fair, alpha 1) + MaxRL advantages inside TRL's GRPOTrainer: a\n"
        "2-layer GPT-2 built in code learns to copy a digit (offline, CPU).\n"
        f"{options.steps} steps; {options.prompts_per_step} prompts a step, "
        f"{options.prompts_per_step * options.num_generations} completions a step "
        f"({options.num_generations} per prompt on average, at most {max_rollouts}),\n"
        f"{rounds_text}; estimator {options.estimator}, loss_type {options.loss_type}.\n\n"
        f"{LEGEND}\n"
    )


_COLUMNS = (f"{'step':>4}  {'reward':>6}  {'loss':>6}  {'min_factor':>10}  {'alignment':>9}  "
            f"{'mean_scale':>10}  {'counts per prompt':<17}  per round")


def _row(line: dict) -> str:
    def number(key):
        value = line.get(key)
        return "-" if value is None else f"{value:.3f}"

    counts = " ".join(str(c) for c in line["allocated_counts"])
    rounds = "+".join(str(b) for b in line.get("round_budgets", [sum(line["allocated_counts"])]))
    return (f"{line['step']:>4}  {line['reward']:6.3f}  {line['loss']:6.3f}  "
            f"{number('min_factor'):>10}  {number('alignment_proxy'):>9}  "
            f"{number('mean_scale'):>10}  {counts:<17}  {rounds}")


def _summary(lines: list[dict]) -> str:
    if not lines:
        return "Summary: no step was logged."
    bad = [line["step"] for line in lines if not line["counts_match"]]
    total = sum(sum(line["generated_counts"]) for line in lines)
    rewards = [line["reward"] for line in lines]
    half = max(1, len(lines) // 2)
    factors = [line["min_factor"] for line in lines if "min_factor" in line]
    text = (f"Summary: {len(lines)} steps, {total} completions; "
            + ("every step generated exactly the allocated counts" if not bad else
               f"steps {bad} generated other counts than allocated (a bug: please report it)")
            + f"; mean reward {sum(rewards) / len(rewards):.3f} (first {half} steps "
            f"{sum(rewards[:half]) / half:.3f}, last {len(lines) - half} "
            f"{sum(rewards[half:]) / max(1, len(lines) - half):.3f})")
    if factors:
        text += f"; smallest min_factor {min(factors):.3f}"
    return text + ". A few steps of a random tiny model show the plumbing, not learning."


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0 when every step generated the allocated counts."""
    options = _parser().parse_args(argv)
    if options.steps < 1 or options.prompts_per_step < 1 or options.num_generations < 2:
        print(
            "--steps and --prompts-per-step must be >= 1 and --num-generations >= 2",
            file=sys.stderr,
        )
        return 2
    if (options.rounds is not None and options.rounds < 1) or (
        options.first_round is not None and options.first_round < 1
    ):
        print("--rounds and --first-round must be >= 1", file=sys.stderr)
        return 2
    if options.first_round is not None and (options.rounds or 1) < 2:
        # The trainer's default is one call per step, which has no first round to size.
        print("--first-round needs --rounds 2 or more (for example --rounds 4): by default each "
              "step is generated in one call", file=sys.stderr)
        return 2
    if options.num_prompts < options.prompts_per_step:
        print("--num-prompts must be at least --prompts-per-step", file=sys.stderr)
        return 2
    if not 0 <= options.seed < 2**32:
        print("--seed must be a whole number from 0 to 2**32 - 1", file=sys.stderr)
        return 2
    if options.max_rollouts is not None and options.max_rollouts < options.num_generations:
        print("--max-rollouts must be at least --num-generations (the mean count)",
              file=sys.stderr)
        return 2
    if not (options.learning_rate > 0 and options.learning_rate < float("inf")):
        print("--learning-rate must be a finite number above 0", file=sys.stderr)
        return 2

    from sera_opt.integrations.trl_tiny import (
        build_tiny_model,
        build_tokenizer,
        copy_digit_reward,
        make_prompts,
        offline_transformers,
        prompt_dataset,
    )

    offline_transformers()
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig

    import sera_opt
    from sera_opt.integrations.trl import SeraGRPOTrainer

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=options.seed)
    dataset = prompt_dataset(make_prompts(options.num_prompts, seed=options.seed))

    offset = sera_opt.ESTIMATOR_OFFSETS[options.estimator]
    max_rollouts = options.max_rollouts or 3 * options.num_generations
    # Allocation by the tracker's estimates, sera-fair at alpha 1 (the trainer's own default
    # planner allocates uniformly: docs/benchmarks.md, "A default chosen on cost").
    planner = sera_opt.RolloutPlanner(
        "sera-fair", alpha=1.0, min_rollouts=1 + offset, max_rollouts=max_rollouts, offset=offset
    )
    rows = options.prompts_per_step * options.num_generations
    state = {"ok": True}
    logged: list[dict] = []
    if not options.json:
        rounds = options.rounds or sera_opt.rounds.DEFAULT_ROUNDS
        rounds_text = ("drawn in one generation call" if rounds == 1 else
                       f"drawn in up to {rounds} generation rounds (a first look at every prompt, "
                       f"then the rest of the budget where it is needed)")
        print(_header(options, max_rollouts, rounds_text))
        print(_COLUMNS)

    with tempfile.TemporaryDirectory(prefix="sera_trl_demo_") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            report_to="none",
            seed=options.seed,
            num_generations=options.num_generations,
            per_device_train_batch_size=rows,
            max_completion_length=4,
            max_steps=options.steps,
            learning_rate=options.learning_rate,
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            loss_type=options.loss_type,
            dataloader_num_workers=0,
        )

        class _PrintSteps(TrainerCallback):
            def on_log(self, args, trainer_state, control, logs=None, **kwargs):
                if not logs or "loss" not in logs or not trainer.sera_history:
                    return
                record = trainer.sera_history[-1]
                ok = record["allocated_counts"] == record["generated_counts"]
                state["ok"] = state["ok"] and ok
                by_id = dict(zip(dataset["prompt_id"], dataset["prompt"], strict=True))
                line = {
                    "step": int(trainer_state.global_step),
                    "prompts": [by_id[i] for i in record["prompt_ids"]],
                    "allocated_counts": record["allocated_counts"],
                    "generated_counts": record["generated_counts"],
                    "counts_match": ok,
                    "loss": float(logs["loss"]),
                    "reward": float(logs.get("reward", float("nan"))),
                }
                if "rounds" in record:
                    line["rounds"] = record["rounds"]
                    line["round_counts"] = record["round_counts"]
                    line["round_budgets"] = [sum(counts) for counts in record["round_counts"]]
                for key in _LOGGED_DIAGNOSTICS:
                    if f"sera/{key}" in logs:
                        line[key] = round(float(logs[f"sera/{key}"]), 6)
                logged.append(line)
                print(json.dumps(line) if options.json else _row(line), flush=True)

        trainer = SeraGRPOTrainer(
            model=model,
            reward_funcs=copy_digit_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            planner=planner,
            estimator=options.estimator,
            rounds=options.rounds,
            first_round=options.first_round,
            callbacks=[_PrintSteps()],
        )
        # Only the demo's lines go to stdout (PrinterCallback would print every log dict).
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    if not options.json:
        print()
        print(_summary(logged))
    return 0 if state["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
