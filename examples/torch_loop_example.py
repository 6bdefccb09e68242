"""Train a tiny policy with SERA-planned rollouts and the MaxRL loss, on CPU, in a few seconds.

The task: a prompt is a pair of digits (a, b); the policy answers one digit; the
answer is right (reward 1) when it equals (a + b) mod 10. The policy is a small
MLP over the one-hot digits, so it starts near chance (success probability about
0.1 on most prompts) and has to learn each prompt's answer: 16 pairs, 8 per step,
8 rollouts per pair on average.

Each step takes a batch of prompts and follows the library's default, the static
step ``sera_opt.integrations.torch_loop.maxrl_step``: the planner decides every
count before sampling, the ``budget`` rollouts are drawn in one sampling call; then
advantages, loss, backward, and the rewards go back to the planner. ``--rounds R``
(opt-in, R >= 2) follows ``maxrl_round_step`` instead: a first look at every prompt,
then the rest where no answer has been right yet, one sampling call per round.

The planner allocates with ``sera-fair`` at alpha 1 (``--policy`` names another; the library's
default planner, ``RolloutPlanner()``, allocates uniformly).

Run: ``python examples/torch_loop_example.py [--steps 40] [--policy sera|uniform] [--rounds 4]``
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

import sera_opt
from sera_opt.integrations.torch_loop import RolloutPlan, maxrl_round_step, maxrl_step
from sera_opt.rounds import DEFAULT_ROUNDS


class DigitSumPolicy(nn.Module):
    """pi(answer | a, b): an MLP over the one-hot encodings of a and b."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, hidden), nn.Tanh(), nn.Linear(hidden, 10))

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        features = torch.cat(
            [nn.functional.one_hot(pairs[:, 0], 10), nn.functional.one_hot(pairs[:, 1], 10)], dim=1
        ).float()
        return torch.log_softmax(self.net(features), dim=-1)


def train(
    steps: int = 40,
    num_prompts: int = 16,
    prompts_per_batch: int = 8,
    rollouts_per_prompt: int = 8,
    policy: str = "sera-fair",
    seed: int = 0,
    learning_rate: float = 0.05,
    verbose: bool = True,
    rounds: int = DEFAULT_ROUNDS,
) -> list[dict]:
    """Train and return one record per step (success rate, counts, loss).

    Parameters
    ----------
    steps : int
        Optimizer steps.
    num_prompts : int
        Distinct (a, b) pairs in the dataset.
    prompts_per_batch : int
        Prompts per step, M.
    rollouts_per_prompt : int
        Mean rollouts per prompt; the budget is ``M * rollouts_per_prompt``.
    policy : str
        Allocation policy of the planner (a registered name): ``"sera-fair"`` (alpha 1,
        allocation by the tracker's estimates) unless told otherwise; ``"uniform"`` is the
        library's default (``sera_opt.planner.DEFAULT_POLICY``).
    rounds : int
        Rounds per step (default ``sera_opt.rounds.DEFAULT_ROUNDS``, 1: one plan
        before sampling, one generation call; ``rounds=4`` is opt-in and costs four
        calls per step).
    """
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    all_pairs = np.array([(a, b) for a in range(10) for b in range(10)])
    pairs = torch.as_tensor(all_pairs[rng.choice(len(all_pairs), size=num_prompts, replace=False)])
    answers = (pairs[:, 0] + pairs[:, 1]) % 10

    model = DigitSumPolicy()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    # The loss uses the mean-centred estimator: plan for its offset c (1), which also means
    # >= 2 rollouts per prompt, since one rollout carries no signal with c = 1.
    offset = sera_opt.ESTIMATOR_OFFSETS["mean_centred"]
    planner = sera_opt.RolloutPlanner(
        policy, min_rollouts=1 + offset, max_rollouts=4 * rollouts_per_prompt, offset=offset
    )

    def rollout(plan: RolloutPlan):
        rows = torch.as_tensor(plan.row_prompt_ids, dtype=torch.long)
        log_probs = model(pairs[rows])  # (B, 10), with gradients
        with torch.no_grad():
            sampled = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)
        rewards = (sampled == answers[rows]).float()
        # One token per answer: the sequence log-probability is that token's.
        return log_probs.gather(1, sampled[:, None]).squeeze(1), rewards

    history = []
    order = rng.permutation(num_prompts)
    for step in range(steps):
        start = (step * prompts_per_batch) % num_prompts
        batch = np.take(order, np.arange(start, start + prompts_per_batch), mode="wrap")
        budget = prompts_per_batch * rollouts_per_prompt
        if rounds > 1:
            out = maxrl_round_step(planner, batch, budget, rollout, rounds=rounds)
            counts, extra = out.counts, out.diagnostics()
            extra = {"rounds": int(extra["rounds"]), "mean_scale": round(extra["mean_scale"], 4)}
        else:
            out = maxrl_step(planner, batch, budget, rollout)
            counts, extra = out.plan.counts, {"min_factor": round(out.diagnostics["min_factor"], 4)}
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        with torch.no_grad():
            greedy_accuracy = (model(pairs).argmax(dim=1) == answers).float().mean().item()
        record = {
            "step": step + 1,
            "counts": counts.tolist(),
            "batch_success_rate": round(float(out.rewards.mean()), 4),
            "greedy_accuracy": round(greedy_accuracy, 4),
            "loss": round(float(out.loss.detach()), 6),
            **extra,
        }
        history.append(record)
        if verbose:
            print(json.dumps(record), flush=True)
    return history


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--policy", choices=sera_opt.available_policies(), default="sera-fair",
                        help="allocation policy (default: sera-fair at alpha 1; the library's "
                             "default is uniform)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help=f"rounds per step (default {DEFAULT_ROUNDS}: one plan per step; "
                             "4: a first look, then the rest where it is needed)")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    history = train(steps=options.steps, policy=options.policy, seed=options.seed,
                    rounds=options.rounds)
    print(
        f"greedy accuracy: {history[0]['greedy_accuracy']:.3f} -> {history[-1]['greedy_accuracy']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
