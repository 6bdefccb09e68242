"""Offline CPU demo of :class:`sera_opt.integrations.trl.SeraGRPOTrainer`.

Trains a randomly initialised 2-layer GPT-2 with a character-level tokenizer (both
built in code) on the "copy a digit" task of :mod:`sera_opt.integrations._trl_tiny`
for a few optimizer steps, and prints one JSON line per step::

    {"step": 1, "prompts": [...], "allocated_counts": [...], "generated_counts": [...],
     "loss": ..., "reward": ..., "planned_min_factor": ..., ...}

``allocated_counts`` are the planner's counts for the step's prompts and
``generated_counts`` the completions the generation backend returned for each of
them; the demo exits with status 1 if they ever differ.

Each step's completions are generated in ``--rounds R`` calls (default: the
trainer's, 4 rounds: a first look, then the rest of the same budget where the
planner sends it; ``--rounds 1``: one call); with R >= 2 each line also carries
``rounds`` (the rounds used), ``round_budgets`` (completions per round) and
``round_counts`` (per round, each prompt's completions).

Run: ``python -m sera_opt.integrations.trl_demo [--steps 6] [--loss-type dapo] [--rounds 1]``.
Nothing is downloaded (``HF_HUB_OFFLINE=1`` is set before transformers loads).
"""

from __future__ import annotations

import argparse
import json
import os
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
        help=f"generation calls per step (default: the trainer's, {sera_opt.rounds.DEFAULT_ROUNDS})",
    )
    parser.add_argument(
        "--first-round",
        type=int,
        default=None,
        help="completions per prompt in the first round (default nbar // 2)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    return parser


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
    if options.num_prompts < options.prompts_per_step:
        print("--num-prompts must be at least --prompts-per-step", file=sys.stderr)
        return 2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    import transformers
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig

    import sera_opt
    from sera_opt.integrations._trl_tiny import (
        build_tiny_model,
        build_tokenizer,
        copy_digit_reward,
        make_prompts,
    )
    from sera_opt.integrations.trl import SeraGRPOTrainer

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=options.seed)
    prompts = make_prompts(options.num_prompts, seed=options.seed)
    dataset = Dataset.from_dict({"prompt": prompts, "prompt_id": list(range(len(prompts)))})

    offset = sera_opt.ESTIMATOR_OFFSETS[options.estimator]
    max_rollouts = options.max_rollouts or 3 * options.num_generations
    planner = sera_opt.RolloutPlanner(  # the library's default policy
        min_rollouts=1 + offset, max_rollouts=max_rollouts, offset=offset
    )
    rows = options.prompts_per_step * options.num_generations
    state = {"ok": True}

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
                print(json.dumps(line), flush=True)

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
        # Only the JSON lines go to stdout (PrinterCallback would print every log dict).
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return 0 if state["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
