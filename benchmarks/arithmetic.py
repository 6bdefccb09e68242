"""Reasoning coverage: a tiny transformer learns addition by MaxRL, uniform versus SERA.

Run as ``sera-opt bench arithmetic`` (4 seeds, about 8 minutes of CPU time on
one core), ``sera-opt bench arithmetic --quick`` (1 seed, under a minute) or
``sera-opt bench arithmetic --preset large --device auto`` (the larger
configuration, meant for a CUDA device). The results and their reading are in
docs/benchmarks.md, section "Arithmetic".

For each seed:

1. A character-level decoder-only transformer is warm-started by a short
   supervised phase on freshly drawn addition problems (see
   :mod:`sera_opt.benchmarks._arith_task`), stopped early so that the success
   rates of the training prompts spread from near 0 to near 1.
2. From that same warm start, one MaxRL run per allocation policy: each step
   takes the next ``prompts_per_step`` prompts of a fixed training pool (the
   same order for every policy), a :class:`sera_opt.RolloutPlanner` with its
   own :class:`sera_opt.SuccessTracker` splits the fixed budget of
   ``prompts_per_step * rollouts_per_prompt`` rollouts over them, the rollouts
   are sampled at temperature 1 and verified exactly, and the model takes one
   gradient step on the multiplicity-corrected mean-centred MaxRL loss
   (:func:`sera_opt.maxrl_advantages`, :func:`sera_opt.aggregate_loss`).
3. The held-out test set is sampled ``eval_samples`` times per problem and
   pass@k for k = 1..64 is computed with the unbiased estimator.

Results go to ``--out`` as ``arithmetic.json``, ``arithmetic.png`` (pass@k)
and ``arithmetic_training.png`` (the estimator's diagnostics during training).
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.benchmarks import _harness
from sera_opt.exceptions import SeraOptError

__all__ = ["ExperimentConfig", "PRESETS", "run_experiment", "main"]

NAME = "arithmetic"


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything that defines one run of the experiment (see :data:`PRESETS`)."""

    # task
    max_digits: int = 3
    num_train: int = 512
    num_test: int = 256
    data_seed: int = 2026
    # model
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    # supervised warm start: stop at the first check where the mean sampled success on the
    # training pool reaches sft_target_success (None: always run sft_steps)
    sft_steps: int = 1500
    sft_batch: int = 128
    sft_lr: float = 3e-3
    sft_target_success: float | None = 0.35
    sft_check_every: int = 20
    sft_probe_samples: int = 2
    # MaxRL
    policies: tuple[str, ...] = ("uniform", "sera", "knapsack", "hora")
    rl_steps: int = 400
    prompts_per_step: int = 32
    rollouts_per_prompt: int = 8
    min_rollouts: int = 2
    max_rollouts: int = 32
    # the policy improves while it trains, so the tracker forgets: each update keeps this
    # fraction of the earlier evidence (a prompt comes back every num_train / prompts_per_step
    # steps, 16 by default; evidence halves in about 23 steps)
    tracker_decay: float = 0.97
    # picked from {1e-3, 3e-4, 1e-4} on seed 0 by uniform's held-out pass@1
    rl_lr: float = 3e-4
    grad_clip: float = 1.0
    estimator: str = "mean_centred"
    loss_mode: str = "seq-mean-token-sum"
    multiplicity_correction: bool = True
    temperature: float = 1.0
    # evaluation
    eval_samples: int = 64
    max_k: int = 64
    curve_every: int = 25
    curve_samples: int = 8
    seeds: int = 4

    @property
    def budget(self) -> int:
        """Rollouts per step, the same for every policy."""
        return self.prompts_per_step * self.rollouts_per_prompt

    def validate(self) -> ExperimentConfig:
        if self.max_k > self.eval_samples:
            raise SeraOptError(
                f"max_k={self.max_k} exceeds eval_samples={self.eval_samples}: pass@k needs at "
                "least k samples per problem; raise eval_samples."
            )
        if self.prompts_per_step > self.num_train:
            raise SeraOptError(
                f"prompts_per_step={self.prompts_per_step} exceeds num_train={self.num_train}."
            )
        if not self.min_rollouts <= self.rollouts_per_prompt <= self.max_rollouts:
            raise SeraOptError(
                "rollouts_per_prompt must lie between min_rollouts and max_rollouts so that "
                "uniform allocation is feasible."
            )
        import sera_opt

        if self.estimator not in sera_opt.ESTIMATOR_OFFSETS:
            raise SeraOptError(
                f"unknown estimator {self.estimator!r}; use one of {sera_opt.ESTIMATORS}."
            )
        if self.loss_mode not in sera_opt.LOSS_MODES:
            raise SeraOptError(
                f"unknown loss_mode {self.loss_mode!r}; use one of {sera_opt.LOSS_MODES}."
            )
        if self.estimator == "mean_centred" and self.min_rollouts < 2:
            raise SeraOptError(
                "the mean-centred estimator needs min_rollouts >= 2 (one rollout carries no signal)."
            )
        if self.seeds < 1 or self.rl_steps < 0 or self.sft_steps < 0:
            raise SeraOptError("seeds must be positive and step counts non-negative.")
        if "uniform" not in self.policies:
            raise SeraOptError("policies must include 'uniform', the baseline of the comparison.")
        return self

    @property
    def offset(self) -> int:
        """The estimator's offset c, which the allocation policies equalize for."""
        import sera_opt

        return sera_opt.ESTIMATOR_OFFSETS[self.estimator]


#: Named configurations. "default" is the one documented in docs/benchmarks.md.
PRESETS: dict[str, ExperimentConfig] = {
    "default": ExperimentConfig(),
    "quick": ExperimentConfig(
        num_train=128, num_test=64, sft_steps=600, rl_steps=40, prompts_per_step=16,
        curve_every=10, curve_samples=4, seeds=1,
    ),
    "large": ExperimentConfig(
        max_digits=5, num_train=4096, num_test=1024, d_model=128, n_layers=4,
        sft_steps=4000, sft_batch=256, rl_steps=1000, prompts_per_step=128,
        max_rollouts=64, eval_samples=256, curve_every=50, curve_samples=16, seeds=5,
        policies=("uniform", "sera", "knapsack", "hora", "sera-bayes"),
    ),
}


# --------------------------------------------------------------------------- pieces


def _torch():
    import torch

    return torch


def _encode(tokenizer, texts, device):
    torch = _torch()
    return torch.tensor([tokenizer.encode(t) for t in texts], dtype=torch.long, device=device)


def _answer_targets(tokenizer, problems, device):
    """Correct completions, padded with end markers to the answer width."""
    width = problems.answer_width
    rows = [tokenizer.encode(a) for a in problems.answers()]
    rows = [r + [tokenizer.end_id] * (width - len(r)) for r in rows]
    torch = _torch()
    return torch.tensor(rows, dtype=torch.long, device=device)


def build_model(cfg: ExperimentConfig, device: str = "cpu"):
    """The tiny transformer for this configuration."""
    from sera_opt.benchmarks._arith_model import ModelConfig, TinyTransformer
    from sera_opt.benchmarks._arith_task import Tokenizer

    tokenizer = Tokenizer()
    width = 2 * cfg.max_digits + 2
    model_cfg = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        max_len=width + cfg.max_digits + 2,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
    )
    return TinyTransformer(model_cfg).to(device), tokenizer


def warm_start(model, tokenizer, cfg: ExperimentConfig, train, test, seed: int, device: str, *,
               show_progress: bool = True) -> dict[str, Any]:
    """Supervised phase: teacher-forced cross-entropy on fresh problems (test pairs excluded).

    Every ``sft_check_every`` steps the training pool is sampled
    ``sft_probe_samples`` times per prompt; the phase stops as soon as the mean
    success reaches ``sft_target_success`` (or after ``sft_steps``). Stopping
    on a level rather than a step count puts every seed at a comparable start:
    the supervised phase learns addition abruptly, at a step that varies a
    lot from seed to seed.
    """
    from sera_opt.benchmarks._arith_model import answer_mask, completion_logprobs
    from sera_opt.benchmarks._arith_task import sample_problems

    torch = _torch()
    rng = np.random.default_rng([seed, 11])
    exclude = test.pairs()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    losses: list[float] = []
    probe_gen = _device_generator(device, seed * 1000 + 47)
    probes: dict[str, list] = {"step": [], "mean_success": []}
    model.train()
    steps = _harness.progress(range(cfg.sft_steps), desc=f"seed {seed} warm start",
                              enabled=show_progress)
    for step in steps:
        if cfg.sft_target_success is not None and step % cfg.sft_check_every == 0 and step:
            correct = count_correct(model, tokenizer, train, cfg.sft_probe_samples, probe_gen,
                                    cfg, device)
            probes["step"].append(step)
            probes["mean_success"].append(float(correct.mean() / cfg.sft_probe_samples))
            model.train()
            if probes["mean_success"][-1] >= cfg.sft_target_success:
                break
        batch = sample_problems(rng, cfg.sft_batch, cfg.max_digits, exclude=exclude)
        prompts = _encode(tokenizer, batch.prompts(), device)
        targets = _answer_targets(tokenizer, batch, device)
        mask = answer_mask(targets, tokenizer.end_id)
        logp = completion_logprobs(model, prompts, targets)
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {"steps": len(losses), "losses": losses, "probes": probes}


def sample_and_verify(model, tokenizer, problems, prompt_index, generator, cfg, device):
    """Sample one completion per entry of ``prompt_index`` and verify it exactly.

    Returns (prompt tokens, completion tokens, rewards as a numpy array).
    """
    from sera_opt.benchmarks._arith_model import generate
    from sera_opt.benchmarks._arith_task import verify

    torch = _torch()
    base = _encode(tokenizer, problems.prompts(), device)
    index = torch.as_tensor(np.asarray(prompt_index), dtype=torch.long, device=device)
    prompts = base.index_select(0, index)
    completions = generate(model, prompts, problems.answer_width,
                           temperature=cfg.temperature, generator=generator)
    texts = [tokenizer.decode(row) for row in completions.cpu().tolist()]
    rewards = verify(texts, problems.subset(np.asarray(prompt_index)))
    return prompts, completions, rewards


def count_correct(model, tokenizer, problems, num_samples: int, generator, cfg, device, *,
                  chunk: int = 8192) -> np.ndarray:
    """Correct samples out of ``num_samples`` for each problem (temperature ``cfg.temperature``)."""
    correct = np.zeros(len(problems), dtype=np.int64)
    index = np.repeat(np.arange(len(problems)), num_samples)
    for start in range(0, index.size, chunk):
        part = index[start:start + chunk]
        _, _, rewards = sample_and_verify(model, tokenizer, problems, part, generator, cfg, device)
        np.add.at(correct, part, rewards.astype(np.int64))
    return correct


pass_at_k_curve = _harness.pass_at_k_curve


def _device_generator(device: str, seed: int):
    torch = _torch()
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


def _diagnostics_row(diag: dict) -> dict[str, float]:
    return {str(k): float(v) for k, v in diag.items()
            if isinstance(v, (int, float, np.floating, np.integer))}


def train_maxrl(model, tokenizer, cfg: ExperimentConfig, train, test, policy: str, seed: int,
                device: str, *, show_progress: bool = True) -> dict[str, Any]:
    """One MaxRL run from the warm start under ``policy``; returns its training curves."""
    import sera_opt
    from sera_opt.benchmarks._arith_model import answer_mask, completion_logprobs
    from sera_opt.integrations import torch_loop

    torch = _torch()
    tracker = sera_opt.SuccessTracker(decay=cfg.tracker_decay, num_prompts=cfg.num_train)
    planner = sera_opt.RolloutPlanner(
        policy, tracker=tracker, min_rollouts=cfg.min_rollouts,
        max_rollouts=cfg.max_rollouts, offset=cfg.offset,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.rl_lr)
    # the prompt order depends on the seed only, so every policy sees the same batches
    order_rng = np.random.default_rng([seed, 23])
    order: list[int] = []
    rollout_gen = _device_generator(device, seed * 1000 + 31)
    curve_gen_seed = seed * 1000 + 37
    curves: dict[str, list] = {
        "step": [], "mean_reward": [], "planned_min_factor": [], "max_count": [],
        "loss": [], "diagnostics": [], "diagnostics_planned": [],
    }
    checkpoints: dict[str, list] = {"step": [], "pass_at_1": [], "pass_at_max": []}

    def checkpoint(step: int) -> None:
        gen = _device_generator(device, curve_gen_seed)
        correct = count_correct(model, tokenizer, test, cfg.curve_samples, gen, cfg, device)
        curve = pass_at_k_curve(correct, cfg.curve_samples, cfg.curve_samples)
        checkpoints["step"].append(step)
        checkpoints["pass_at_1"].append(float(curve[0]))
        checkpoints["pass_at_max"].append(float(curve[-1]))

    model.train()
    steps = _harness.progress(range(cfg.rl_steps), desc=f"seed {seed} {policy}",
                              enabled=show_progress)
    for step in steps:
        if cfg.curve_every and step % cfg.curve_every == 0:
            checkpoint(step)
        while len(order) < cfg.prompts_per_step:
            order.extend(order_rng.permutation(cfg.num_train).tolist())
        prompt_ids = np.asarray(order[:cfg.prompts_per_step], dtype=np.int64)
        del order[:cfg.prompts_per_step]

        # the estimates the plan is made from, before this step's outcomes are observed
        planned_probs = np.asarray(tracker.estimate(prompt_ids.tolist()), dtype=np.float64)
        plan = torch_loop.plan_rollouts(planner, prompt_ids, cfg.budget)
        counts, prompt_index = plan.counts, plan.prompt_index
        rollout_ids = plan.row_prompt_ids
        prompts, completions, rewards = sample_and_verify(
            model, tokenizer, train, rollout_ids, rollout_gen, cfg, device)
        torch_loop.observe(planner, plan, rewards)

        rewards_t = torch.as_tensor(rewards, dtype=torch.float32, device=device)
        index_t = torch.as_tensor(prompt_index, dtype=torch.long, device=device)
        advantages = sera_opt.maxrl_advantages(
            rewards_t, index_t, estimator=cfg.estimator,
            multiplicity_correction=cfg.multiplicity_correction,
        )
        # the batch's own view (posterior mean from this step's rollouts) and the view of the
        # estimates the allocation was planned with
        diag = sera_opt.advantage_diagnostics(
            rewards_t, index_t, estimator=cfg.estimator,
            multiplicity_correction=cfg.multiplicity_correction)
        diag_planned = sera_opt.advantage_diagnostics(
            rewards_t, index_t, estimator=cfg.estimator,
            multiplicity_correction=cfg.multiplicity_correction,
            success_probs=torch.as_tensor(np.repeat(planned_probs, counts), device=device))

        mask = answer_mask(completions, tokenizer.end_id)
        per_token_loss = torch.zeros(completions.shape, dtype=torch.float32, device=device)
        active = torch.nonzero(advantages != 0).flatten()
        if active.numel():
            # rollouts with a zero advantage add nothing to the gradient; skip their forward pass
            logp = completion_logprobs(model, prompts[active], completions[active])
            per_token_loss = per_token_loss.index_put(
                (active,), -advantages[active].detach().unsqueeze(1) * logp)
        loss = sera_opt.aggregate_loss(per_token_loss, mask, cfg.loss_mode)
        optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad:
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()

        curves["step"].append(step)
        curves["mean_reward"].append(float(rewards.mean()))
        curves["planned_min_factor"].append(float(plan.allocation.min_factor))
        curves["max_count"].append(int(counts.max()))
        curves["loss"].append(float(loss.detach()))
        curves["diagnostics"].append(_diagnostics_row(diag))
        curves["diagnostics_planned"].append(_diagnostics_row(diag_planned))
    checkpoint(cfg.rl_steps)
    return {"curves": curves, "checkpoints": checkpoints}


def _evaluate(model, tokenizer, cfg, test, seed, device) -> dict[str, Any]:
    gen = _device_generator(device, seed * 1000 + 41)
    correct = count_correct(model, tokenizer, test, cfg.eval_samples, gen, cfg, device)
    digits = test.digits()
    by_digits = {
        int(d): pass_at_k_curve(correct[digits == d], cfg.eval_samples, cfg.max_k).tolist()
        for d in np.unique(digits)
    }
    return {
        "pass_at_k": pass_at_k_curve(correct, cfg.eval_samples, cfg.max_k).tolist(),
        "pass_at_k_by_digits": by_digits,
        "correct": correct.tolist(),
    }


def run_seed(cfg: ExperimentConfig, seed: int, device: str, *,
             show_progress: bool = True) -> dict[str, Any]:
    """Warm start, one MaxRL run per policy, and the held-out evaluation, for one seed."""
    from sera_opt.benchmarks._arith_task import make_split

    torch = _torch()
    train, test = make_split(cfg.data_seed, cfg.num_train, cfg.num_test, cfg.max_digits)
    torch.manual_seed(seed)
    model, tokenizer = build_model(cfg, device)
    start = time.perf_counter()
    sft = warm_start(model, tokenizer, cfg, train, test, seed, device,
                     show_progress=show_progress)
    losses = sft["losses"]
    out: dict[str, Any] = {
        "seed": seed,
        "warm_start": {
            "steps": sft["steps"],
            "probes": sft["probes"],
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "wall_time_s": time.perf_counter() - start,
            **_evaluate(model, tokenizer, cfg, test, seed, device),
        },
        "policies": {},
    }
    gen = _device_generator(device, seed * 1000 + 43)
    train_correct = count_correct(model, tokenizer, train, cfg.eval_samples, gen, cfg, device)
    out["warm_start"]["train_success_rates"] = (train_correct / cfg.eval_samples).tolist()
    warm_state = copy.deepcopy(model.state_dict())
    for policy in cfg.policies:
        model.load_state_dict(warm_state)
        torch.manual_seed(seed)
        start = time.perf_counter()
        trained = train_maxrl(model, tokenizer, cfg, train, test, policy, seed, device,
                              show_progress=show_progress)
        wall = time.perf_counter() - start
        out["policies"][policy] = {
            **trained,
            "wall_time_s": wall,
            **_evaluate(model, tokenizer, cfg, test, seed, device),
        }
    return out


def _summary(cfg: ExperimentConfig, runs: list[dict]) -> dict[str, Any]:
    ks = np.arange(1, cfg.max_k + 1)
    summary: dict[str, Any] = {}
    names = ["warm_start", *cfg.policies]
    curves = {}
    for name in names:
        rows = np.array([
            run["warm_start"]["pass_at_k"] if name == "warm_start"
            else run["policies"][name]["pass_at_k"] for run in runs
        ])
        curves[name] = rows
        summary[name] = {
            "pass_at_k_mean": rows.mean(axis=0),
            "pass_at_k_std": rows.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(len(ks)),
            "pass_at_k_min": rows.min(axis=0),
            "pass_at_k_max": rows.max(axis=0),
        }
    for name in cfg.policies:
        if name == "uniform":
            continue
        diff = curves[name] - curves["uniform"]
        summary[name]["difference_vs_uniform_mean"] = diff.mean(axis=0)
        summary[name]["difference_vs_uniform_per_seed"] = diff
        summary[name]["seeds_better_than_uniform"] = (diff > 0).sum(axis=0)
    table = {}
    for name in names:
        table[name] = {
            f"pass@{k}": [float(summary[name]["pass_at_k_mean"][k - 1]),
                          float(summary[name]["pass_at_k_std"][k - 1])]
            for k in (1, 4, 16, cfg.max_k) if k <= cfg.max_k
        }
    summary["table_mean_std"] = table
    return summary


# --------------------------------------------------------------------------- plots

_COLORS = {"warm_start": "0.5", "uniform": "tab:blue", "sera": "tab:red",
           "knapsack": "tab:green", "hora": "tab:purple", "vip": "tab:orange",
           "gvm": "tab:brown", "sera-bayes": "tab:pink"}


def _plot_pass_at_k(cfg, summary, runs, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(1, cfg.max_k + 1)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    ax = axes[0]
    for name in ["warm_start", *cfg.policies]:
        s = summary[name]
        color = _COLORS.get(name)
        ax.plot(ks, s["pass_at_k_mean"], label=name.replace("_", " "), color=color)
        ax.fill_between(ks, s["pass_at_k_min"], s["pass_at_k_max"], color=color, alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k on the held-out set")
    ax.set_title(f"mean over {len(runs)} seeds (band: min to max)")
    ax.legend()
    ax = axes[1]
    ax.axhline(0.0, color="tab:blue", lw=1)
    for name in cfg.policies:
        if name == "uniform":
            continue
        s = summary[name]
        color = _COLORS.get(name)
        per_seed = np.atleast_2d(s["difference_vs_uniform_per_seed"])
        ax.plot(ks, s["difference_vs_uniform_mean"], color=color, label=name)
        for row in per_seed:
            ax.plot(ks, row, color=color, alpha=0.3, lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k minus uniform's (same seed)")
    ax.set_title("paired difference (thin: single seeds)")
    ax.legend()
    ax = axes[2]
    names = ["warm_start", *cfg.policies]
    digit_keys = sorted(runs[0]["warm_start"]["pass_at_k_by_digits"], key=int)
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        values = []
        for d in digit_keys:
            rows = [run["warm_start"] if name == "warm_start" else run["policies"][name]
                    for run in runs]
            values.append(np.mean([row["pass_at_k_by_digits"][d][-1] for row in rows]))
        ax.bar(np.arange(len(digit_keys)) + (j - (len(names) - 1) / 2) * width, values, width,
               color=_COLORS.get(name), label=name.replace("_", " "))
    ax.set_xticks(np.arange(len(digit_keys)), [f"{d} digit{'s' if int(d) > 1 else ''}" for d in digit_keys])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(f"pass@{cfg.max_k}")
    ax.set_title(f"pass@{cfg.max_k} by the longer operand's digit count")
    fig.suptitle(f"MaxRL on {cfg.max_digits}-digit addition, budget {cfg.budget} rollouts/step, "
                 f"{cfg.rl_steps} steps")
    return _harness.save_figure(fig, out_dir, NAME)


def _mean_curve(runs, policy, getter):
    rows = [getter(run["policies"][policy]) for run in runs]
    return np.mean(np.array(rows, dtype=float), axis=0)


def _plot_training(cfg, runs, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12.6, 6.4))
    window = max(1, cfg.rl_steps // 20)
    kernel = np.ones(window) / window

    def smooth_plot(ax, y, **style):
        y = np.asarray(y, dtype=float)
        smooth = np.convolve(y, kernel, mode="valid") if y.size >= window else y
        ax.plot(np.arange(smooth.size) + (window - 1 if y.size >= window else 0), smooth,
                **style)

    for ax, (panel, title) in zip(axes.flat, _TRAINING_PANELS):
        for policy in cfg.policies:
            color = _COLORS.get(policy)
            if panel in ("pass_at_1", "pass_at_max"):
                steps = runs[0]["policies"][policy]["checkpoints"]["step"]
                y = _mean_curve(runs, policy, lambda r, key=panel: r["checkpoints"][key])
                ax.plot(steps, y, marker="o", ms=3, color=color, label=policy)
            elif panel == "mean_reward":
                smooth_plot(ax, _mean_curve(runs, policy, lambda r: r["curves"]["mean_reward"]),
                            color=color, label=policy)
            else:
                for source, style in (("diagnostics", "-"), ("diagnostics_planned", ":")):
                    if panel == "zero_success_fraction" and source == "diagnostics_planned":
                        continue  # the same count either way
                    y = _mean_curve(runs, policy, lambda r, key=panel, src=source: [
                        row.get(key, np.nan) for row in r["curves"][src]])
                    smooth_plot(ax, y, color=color, ls=style,
                                label=policy if source == "diagnostics" else None)
        ax.set_title(title.format(k=cfg.curve_samples), fontsize=10)
        ax.set_xlabel("MaxRL step")
    axes.flat[0].legend()
    fig.suptitle(f"training curves, mean over {len(runs)} seeds (moving average over {window} "
                 "steps; dotted: factors from the planner's estimates instead of the batch's)",
                 fontsize=10)
    fig.tight_layout()
    return _harness.save_figure(fig, out_dir, f"{NAME}_training")


#: (key, title) of the training plot's panels; the middle ones are keys of
#: sera_opt.advantage_diagnostics.
_TRAINING_PANELS = (
    ("mean_reward", "training reward (mean over the step's rollouts)"),
    ("zero_success_fraction", "prompts of the step with zero successes"),
    ("weight_spread", "spread (std/mean) of the prompts' factors"),
    ("min_factor", "smallest attenuation factor of the step"),
    ("pass_at_1", "held-out pass@1 (checkpoints)"),
    ("pass_at_max", "held-out pass@{k} (checkpoints)"),
)


# --------------------------------------------------------------------------- entry points


def resolve_device(name: str) -> str:
    """``auto`` picks CUDA when present, else the CPU."""
    torch = _torch()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SeraOptError("--device cuda was requested but torch sees no CUDA device; "
                           "use --device cpu or auto.")
    if name != "cpu" and not name.startswith("cuda"):
        raise SeraOptError(f"--device must be auto, cpu or cuda[:N], got {name!r}.")
    return name


def run_experiment(cfg: ExperimentConfig, *, seed: int = 0, device: str = "cpu",
                   out_dir: Path | None = None, show_progress: bool = True,
                   threads: int = 1, plots: bool = True) -> dict[str, Any]:
    """Run every seed, write ``arithmetic.json`` (and the plots) to ``out_dir``; return the payload."""
    torch = _torch()
    cfg.validate()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        seeds = [seed + i for i in range(cfg.seeds)]
        runs = [run_seed(cfg, s, device, show_progress=show_progress) for s in seeds]
    finally:
        torch.set_num_threads(previous_threads)
    from sera_opt.benchmarks._arith_task import make_split

    train, test = make_split(cfg.data_seed, cfg.num_train, cfg.num_test, cfg.max_digits)
    model, _ = build_model(cfg, "cpu")
    payload: dict[str, Any] = {
        "config": {**asdict(cfg), "budget": cfg.budget},
        "seeds": seeds,
        "device": device,
        "threads": threads,
        "model_parameters": model.num_parameters(),
        "test_set": {
            "digits_histogram": {int(d): int((test.digits() == d).sum())
                                 for d in np.unique(test.digits())},
            "carries_histogram": {int(c): int((test.carries() == c).sum())
                                  for c in np.unique(test.carries())},
        },
        "ks": list(range(1, cfg.max_k + 1)),
        "runs": runs,
        "summary": _summary(cfg, runs),
        "wall_time_s": time.perf_counter() - start,
    }
    if out_dir is not None:
        _harness.write_json(out_dir, NAME, payload)
        if plots:
            _plot_pass_at_k(cfg, payload["summary"], runs, out_dir)
            _plot_training(cfg, runs, out_dir)
    return payload


def _print_table(cfg: ExperimentConfig, payload: dict) -> None:
    table = payload["summary"]["table_mean_std"]
    keys = list(next(iter(table.values())).keys())
    print(f"{'':<12}" + "".join(f"{k:>16}" for k in keys))
    for name, row in table.items():
        print(f"{name:<12}" + "".join(f"{m:>9.3f} ± {s:<4.3f}" for m, s in row.values()))
    print(f"wall time {payload['wall_time_s']:.0f} s on {payload['device']} "
          f"({payload['threads']} thread(s))")


def build_parser() -> argparse.ArgumentParser:
    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="named configuration (default: 'default'; --quick means 'quick')")
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda[:N] or auto (CUDA when present); default cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: bit-reproducible on the CPU)")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (override)")
    parser.add_argument("--policies", default=None,
                        help="comma-separated allocation policies (override; must include uniform)")
    parser.add_argument("--rl-steps", type=int, default=None, help="MaxRL steps (override)")
    parser.add_argument("--sft-steps", type=int, default=None, help="warm-start steps (override)")
    return parser


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    if args.quick and args.preset not in (None, "quick"):
        raise SeraOptError("--quick and --preset disagree; give one of them.")
    cfg = PRESETS["quick" if args.quick else (args.preset or "default")]
    overrides: dict[str, Any] = {}
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    if args.policies is not None:
        overrides["policies"] = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if args.rl_steps is not None:
        overrides["rl_steps"] = args.rl_steps
    if args.sft_steps is not None:
        overrides["sft_steps"] = args.sft_steps
    return replace(cfg, **overrides).validate()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    device = resolve_device(args.device)
    if args.threads < 1:
        raise SeraOptError("--threads must be at least 1.")
    payload = run_experiment(cfg, seed=args.seed, device=device, out_dir=args.out,
                             show_progress=not args.no_progress, threads=args.threads)
    _print_table(cfg, payload)
    print(f"results: {Path(args.out) / (NAME + '.json')}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main())
