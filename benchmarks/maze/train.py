"""The learning side of the maze experiment: policy, rollouts, warm-up, MaxRL arms, evaluation.

One *run* (a seed) draws its mazes, builds a policy, warms it up, and then
trains one copy of the warmed-up policy per *arm* (an allocation rule) under
the same rollout budget and the same sequence of training batches:

1. **Warm-up (shared by all arms).** A few steps of on-policy imitation of the
   shortest-path teacher (DAgger-style: the policy walks, the teacher labels
   the states it visits). Kept short on purpose, so that the policy solves
   small mazes and fails on large ones: per-maze success probabilities then
   spread over (0, 1), which is the regime where allocation matters.
2. **MaxRL training (one per arm).** Each step takes ``mazes_per_step`` training
   mazes, asks the arm's :class:`sera_opt.RolloutPlanner` for counts summing
   to ``budget = rollouts_per_maze * mazes_per_step``, walks that many
   rollouts at once, turns the binary successes into advantages with
   :func:`sera_opt.maxrl_advantages` (multiplicity correction on), forms the
   loss with :func:`sera_opt.aggregate_loss` and takes an Adam step; the
   planner's tracker then observes the successes. The step is
   :func:`sera_opt.integrations.torch_loop.maxrl_step`.
3. **Evaluation.** ``eval_samples`` rollouts on each held-out maze give the
   unbiased pass@k for k = 1..k_max.

Everything random comes from generators seeded by the run's seed, and each
run uses one thread, so a run's numbers do not depend on how many runs go in
parallel.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from sera_opt.benchmarks import _coverage, _harness
from sera_opt.benchmarks._cost import StepCost
from sera_opt.benchmarks.maze.env import MazeBatch, MazeEnv, generate_maze_sets

__all__ = ["MazeConfig", "PRESETS", "make_policy", "rollout", "warm_up", "train_arm",
           "evaluate", "run_seed_warmup", "run_arm"]


@dataclass(frozen=True)
class MazeConfig:
    """Everything that defines a maze run (the JSON records it)."""

    # mazes
    sizes: tuple[int, int] = (3, 8)
    num_train: int = 256
    num_test: int = 128
    min_path: int = 3
    horizon: int = 48
    view_radius: int = 2
    # policy
    hidden: int = 128
    # warm-up (shared by the arms)
    warmup_steps: int = 40
    warmup_mazes: int = 64
    warmup_lr: float = 3e-3
    # MaxRL training (per arm)
    steps: int = 150
    mazes_per_step: int = 32
    rollouts_per_maze: int = 8
    min_rollouts: int = 2
    max_rollouts: int = 32
    lr: float = 1e-3
    estimator: str = "mean_centred"
    loss_mode: str = "seq-mean-token-sum"
    multiplicity_correction: bool = True
    tracker_decay: float = 1.0
    # Arm specifications (see sera_opt.benchmarks._harness.parse_arm); by default the
    # arms of the runs that decided the library's default allocation (REPORT_ARMS).
    arms: tuple[str, ...] = _harness.REPORT_ARMS
    # evaluation
    eval_samples: int = 128
    k_max: int = 64
    eval_every: int = 20
    curve_samples: int = 16
    # Equal cost: each arm is also evaluated (eval_samples per held-out maze) where it
    # crosses these amounts of CPU seconds (training and walking, one thread, evaluations
    # excluded), moves walked (the task's generated tokens) and walk calls (generation
    # calls: one per round), on the weights it had reached within each amount.
    cpu_grid_s: tuple[float, ...] = (3.0, 5.0, 7.0)
    move_grid: tuple[float, ...] = (400_000.0, 800_000.0)
    call_grid: tuple[float, ...] = (50.0, 100.0, 150.0)
    # runs (16 seeds: the number the decision rule of docs/benchmarks.md fixes)
    seeds: int = 16
    device: str = "cpu"
    # False: each step draws its mazes at random; True: the steps walk passes over a
    # shuffled training set (every maze once per pass), the epochs of the authors' SERA
    epoch_order: bool = False
    # samples per training maze for the warm-up's success rates (the regime check's
    # input); None: curve_samples
    train_probe_samples: int | None = None

    def __post_init__(self):
        from sera_opt.exceptions import SeraOptError

        lo, hi = self.sizes
        problems = []
        if not 2 <= lo <= hi:
            problems.append(f"sizes={self.sizes} must satisfy 2 <= min <= max")
        if self.mazes_per_step > self.num_train or self.warmup_mazes > self.num_train:
            problems.append("mazes_per_step and warmup_mazes cannot exceed num_train")
        if not self.min_rollouts * self.mazes_per_step <= self.budget <= (
                self.max_rollouts * self.mazes_per_step):
            problems.append(f"rollouts_per_maze={self.rollouts_per_maze} must lie in "
                            f"[min_rollouts, max_rollouts] = [{self.min_rollouts}, "
                            f"{self.max_rollouts}]")
        if self.estimator == "mean_centred" and self.min_rollouts < 2:
            problems.append("the mean-centred estimator needs min_rollouts >= 2")
        if not 1 <= self.k_max <= self.eval_samples:
            problems.append(f"k_max={self.k_max} must lie in [1, eval_samples={self.eval_samples}]")
        if self.curve_samples < 1 or self.seeds < 1 or self.steps < 1:
            problems.append("curve_samples, seeds and steps must be positive")
        for name in ("cpu_grid_s", "move_grid", "call_grid"):
            grid = list(getattr(self, name))
            if any(t <= 0 for t in grid) or grid != sorted(set(grid)):
                problems.append(f"{name} must hold positive, increasing amounts")
        if "uniform" not in self.arms:
            problems.append(f"arms={self.arms} must include 'uniform', the baseline")
        if self.epoch_order and self.num_train % self.mazes_per_step:
            problems.append("epoch_order needs num_train to be a multiple of mazes_per_step (a "
                            "step within one pass)")
        if self.train_probe_samples is not None and self.train_probe_samples < 1:
            problems.append("train_probe_samples must be positive (or None)")
        if problems:
            raise SeraOptError("invalid maze configuration: " + "; ".join(problems) + ".")

    @property
    def budget(self) -> int:
        return self.rollouts_per_maze * self.mazes_per_step

    @property
    def offset(self) -> int:
        """The estimator's offset c (docs/theory.md section 2)."""
        return 1 if self.estimator == "mean_centred" else 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["budget"] = self.budget
        d["offset"] = self.offset
        return d


PRESETS: dict[str, MazeConfig] = {
    "default": MazeConfig(),
    "quick": MazeConfig(num_train=96, num_test=48, warmup_steps=20, steps=30,
                        mazes_per_step=16, eval_samples=64, eval_every=10, seeds=3,
                        arms=("uniform", "sera", "sera-fair:alpha=1"), cpu_grid_s=(0.2, 0.4),
                        move_grid=(20_000.0, 40_000.0), call_grid=(10.0, 20.0)),
    # Larger mazes for the same horizon and half the rollouts: many mazes stay
    # near zero success, the regime where max-min allocation is most exposed.
    "hard": MazeConfig(sizes=(4, 10), horizon=64, rollouts_per_maze=4),
    # The hard mazes with the paper's settings (issue 51): N0 = 16 rollouts per maze on
    # average, the authors' bounds 2 and 4 N0 = 64, passes over the training mazes (its
    # estimates are frozen per pass), a forgetting tracker for sera-fair, and the
    # coverage arms. The rule: docs/decisions/2026-12-07-coverage-expansion-rule.md.
    "paper": MazeConfig(sizes=(4, 10), horizon=64, rollouts_per_maze=16, max_rollouts=64,
                        tracker_decay=0.97, epoch_order=True, train_probe_samples=64,
                        cpu_grid_s=(10.0, 20.0, 30.0), move_grid=(2_000_000.0, 4_000_000.0),
                        call_grid=(50.0, 100.0, 150.0), arms=_coverage.COVERAGE_ARMS),
    # For a GPU: more mazes, larger grids, a longer horizon and more steps.
    # lr 1e-3 made the first Adam step of this wider network lose a third of
    # its held-out pass@1 (a CPU check of the first steps); 3e-4 does not.
    "large": MazeConfig(sizes=(4, 12), num_train=2048, num_test=512, horizon=120,
                        hidden=256, warmup_steps=80, warmup_mazes=256, steps=1000,
                        mazes_per_step=128, lr=3e-4, eval_samples=256, eval_every=100,
                        seeds=5, cpu_grid_s=(), move_grid=(), call_grid=()),
}


def make_policy(observation_size: int, hidden: int):
    """A two-hidden-layer MLP from a walker's observation to logits over the four moves."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Linear(observation_size, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 4),
    )


def rollout(policy, env: MazeEnv, generator, *, teacher: bool = False, grad: bool = True):
    """Walk every walker of ``env`` until all are done, sampling moves from ``policy``.

    Returns
    -------
    log_probs : tensor (R, T)
        Log-probability of each sampled move (the per-"token" terms of the score).
    mask : bool tensor (R, T)
        True where the walker was still walking at that step.
    success : bool tensor (R,)
    teacher_loss : tensor or None
        With ``teacher=True``, the mean cross-entropy between the policy and the
        shortest-path move over all visited states (the warm-up's loss).
    """
    import torch

    obs = env.reset()
    log_probs, masks, ce_terms = [], [], []
    with torch.set_grad_enabled(grad):
        for _ in range(env.horizon):
            alive = ~env.done
            if not bool(alive.any()):
                break
            logp_all = torch.log_softmax(policy(obs), dim=-1)
            move = torch.multinomial(logp_all.detach().exp(), 1, generator=generator).squeeze(1)
            if teacher:
                expert = env.expert_moves()
                ce_terms.append((-logp_all.gather(1, expert[:, None]).squeeze(1)) * alive)
            log_probs.append(logp_all.gather(1, move[:, None]).squeeze(1))
            masks.append(alive)
            obs = env.step(move)
    mask = torch.stack(masks, dim=1)
    teacher_loss = None
    if teacher:
        teacher_loss = torch.stack(ce_terms, dim=1).sum() / mask.sum().clamp(min=1)
    return torch.stack(log_probs, dim=1), mask, env.success.clone(), teacher_loss


def _setup_torch(seed: int, device: str):
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    if torch.device(device).type == "cpu":
        # One thread per run: reproducible sums, and parallel runs do not compete.
        torch.set_num_threads(1)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch, generator


def _mazes(config: MazeConfig, seed: int):
    train, test = generate_maze_sets(config.num_train, config.num_test, sizes=config.sizes,
                                     min_path=config.min_path, seed=seed)
    size = config.sizes[1]
    return (MazeBatch(train, size=size, device=config.device),
            MazeBatch(test, size=size, device=config.device))


def warm_up(policy, train: MazeBatch, config: MazeConfig, rng: np.random.Generator, generator):
    """On-policy imitation of the shortest-path teacher; returns the per-step teacher losses."""
    import torch

    optimizer = torch.optim.Adam(policy.parameters(), lr=config.warmup_lr)
    losses = []
    for _ in range(config.warmup_steps):
        ids = rng.choice(train.num_mazes, size=config.warmup_mazes, replace=False)
        env = MazeEnv(train, np.repeat(ids, 2), horizon=config.horizon,
                      view_radius=config.view_radius)
        _, _, _, loss = rollout(policy, env, generator, teacher=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def evaluate(policy, mazes: MazeBatch, config: MazeConfig, generator, *, samples: int,
             chunk: int = 16384) -> np.ndarray:
    """Successes out of ``samples`` rollouts on every maze of ``mazes`` (int array, shape (N,))."""
    index = np.repeat(np.arange(mazes.num_mazes), samples)
    successes = np.zeros(mazes.num_mazes, dtype=np.int64)
    for start in range(0, len(index), chunk):
        part = index[start:start + chunk]
        env = MazeEnv(mazes, part, horizon=config.horizon, view_radius=config.view_radius)
        _, _, success, _ = rollout(policy, env, generator, grad=False)
        np.add.at(successes, part, success.cpu().numpy().astype(np.int64))
    return successes


pass_at_k_curve = _harness.pass_at_k_curve


def _seed_everything(config: MazeConfig, seed: int):
    torch, generator = _setup_torch(seed, config.device)
    train, test = _mazes(config, seed)
    obs_size = (2 * config.view_radius + 1) ** 2 * 6 + 8
    return torch, generator, train, test, obs_size


def run_seed_warmup(config: MazeConfig, seed: int) -> dict:
    """Warm up the policy of run ``seed``; returns its weights and the warm-up's record."""
    start, cpu_start = time.perf_counter(), time.process_time()
    torch, generator, train, test, obs_size = _seed_everything(config, seed)
    policy = make_policy(obs_size, config.hidden).to(config.device)
    rng = np.random.default_rng([seed, 1])
    losses = warm_up(policy, train, config, rng, generator)
    eval_gen = torch.Generator(device=config.device)
    eval_gen.manual_seed(seed + 10_000)
    test_successes = evaluate(policy, test, config, eval_gen, samples=config.eval_samples)
    probes = config.train_probe_samples or config.curve_samples
    train_successes = evaluate(policy, train, config, eval_gen, samples=probes)
    return {
        "seed": seed,
        "state_dict": {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()},
        "teacher_loss": losses,
        "test_successes": test_successes,
        "train_success_probs": train_successes / probes,
        # The warm-up's half of the regime check, before any arm trains.
        "regime": _coverage.warm_start_regime(train_successes / probes),
        "test_shortest_path": test.shortest_path.cpu().numpy(),
        "pass_at_k": pass_at_k_curve(test_successes, config.eval_samples, config.k_max),
        "wall_time": time.perf_counter() - start,
        # CPU time of this task (one torch thread): steady where the machine is shared
        "cpu_time": time.process_time() - cpu_start,
    }


def _planner(arm: str, config: MazeConfig):
    """The planner of arm ``arm`` (see :func:`sera_opt.benchmarks._coverage.parse_loop_arm`):
    the policy with the configuration's bounds and offset and a fresh tracker, or the
    authors' whole configuration for a ``sera-paper`` arm."""
    return _coverage.build_planner(_coverage.parse_loop_arm(arm),
                                   min_rollouts=config.min_rollouts,
                                   max_rollouts=config.max_rollouts, offset=config.offset,
                                   tracker_decay=config.tracker_decay)


def _grpo_step(planner, ids, budget: int, walk, mode: str):
    """One static step with GRPO's advantages: uniform counts, the walks, TRL's
    group-normalized advantages and the same loss aggregation as the MaxRL arms."""
    import sera_opt
    from sera_opt.integrations import torch_loop

    plan = torch_loop.plan_rollouts(planner, ids, budget)
    log_probs, rewards, mask = walk(plan)
    index = plan.prompt_index_tensor(rewards.device)
    advantages = sera_opt.grpo_advantages(rewards, index)
    loss = sera_opt.policy_gradient_loss(log_probs, advantages, mask, mode)
    diagnostics = {k: float(v) for k, v in sera_opt.advantage_diagnostics(rewards, index).items()}
    torch_loop.observe(planner, plan, rewards)
    return torch_loop.StepOutput(loss=loss, advantages=advantages, rewards=rewards, plan=plan,
                                 diagnostics=diagnostics)


def train_arm(policy, planner, train: MazeBatch, test: MazeBatch, config: MazeConfig,
              rng: np.random.Generator, generator, eval_generator, *,
              show_progress: bool = False, spec=None) -> dict:
    """MaxRL training of ``policy`` with counts from ``planner``; returns the training curves.

    One step is :func:`sera_opt.integrations.torch_loop.maxrl_step`: plan the
    counts, walk the rollouts (each move's log-probability is one "token"), form
    the multiplicity-corrected MaxRL loss, and let the planner observe the
    successes. An arm in rounds (``spec.rounds > 1``) takes
    :func:`~sera_opt.integrations.torch_loop.maxrl_round_step` instead: one walk per
    round, the first-round baseline, and the session's expected scales as the planned
    diagnostics. The Reinforce-Ada peer (``spec.is_reinforce_ada``) takes
    :func:`~sera_opt.integrations.torch_loop.reinforce_ada_step`: its rounds, its kept
    group and its update; the planner's tracker observes every rollout.
    """
    import torch

    import sera_opt
    from sera_opt.integrations import torch_loop

    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    curves: dict[str, list] = {"success_rate": [], "maze_success_rate": [], "counts_max": [],
                               "counts_std": [], "counts_at_min_fraction": [], "loss": [], "diagnostics": [],
                               "planned_diagnostics": [],
                               "eval_step": [], "eval_pass_at_1": [], "eval_pass_at_k_max": []}

    def walk(plan):
        env = MazeEnv(train, plan.row_prompt_ids, horizon=config.horizon,
                      view_radius=config.view_radius)
        log_probs, mask, success, _ = rollout(policy, env, generator)
        cost.count("moves", float(mask.sum()))
        cost.count("calls", 1)
        return log_probs, success.to(torch.float32), mask

    evaluator = copy.deepcopy(policy)

    def evaluate_state(state) -> list[float]:
        evaluator.load_state_dict(state)
        # The same evaluation stream at every point and in every arm (common random numbers).
        grid_generator.manual_seed(grid_seed)
        succ = evaluate(evaluator, test, config, grid_generator, samples=config.eval_samples)
        return pass_at_k_curve(succ, config.eval_samples, config.k_max).tolist()

    grid_generator = torch.Generator(device=config.device)
    grid_seed = eval_generator.initial_seed() + 5_000  # the run's seed, not the arm's
    grid = _harness.CostGrid(
        {"cpu_s": config.cpu_grid_s, "moves": config.move_grid, "calls": config.call_grid},
        evaluate_state, lambda: {k: v.detach().clone() for k, v in policy.state_dict().items()})
    # What each step spends: CPU seconds (evaluations taken out), moves walked (the task's
    # generated tokens) and walk calls (the generation calls: one per round).
    cost = StepCost(curves, {"moves": ("moves", float), "calls": ("walk_calls", int)})

    # A coverage arm (LoopArm) names its estimator; its allocation spec is None for the
    # authors' configuration (a static plan) and uniform's for grpo.
    loop_arm = spec if isinstance(spec, _coverage.LoopArm) else None
    grpo = loop_arm is not None and loop_arm.estimator == "grpo"
    if loop_arm is not None:
        spec = loop_arm.spec
    epochs = _coverage.EpochClock(train.num_mazes)
    order: list[int] = []
    in_rounds = spec is not None and (spec.rounds > 1 or spec.is_reinforce_ada)
    rule, cap = (spec.build_rule(num_prompts=config.mazes_per_step, budget=config.budget)
                 if spec is not None and spec.is_reinforce_ada else (None, None))
    steps = _harness.progress(range(config.steps), desc="MaxRL steps", total=config.steps,
                              enabled=show_progress)
    for step in steps:
        cost.begin_step()
        if config.epoch_order:
            # Passes over a shuffled training set: every maze once per pass.
            while len(order) < config.mazes_per_step:
                order.extend(rng.permutation(train.num_mazes).tolist())
            ids = np.asarray(order[:config.mazes_per_step], dtype=np.int64)
            del order[:config.mazes_per_step]
        else:
            ids = rng.choice(train.num_mazes, size=config.mazes_per_step, replace=False)
        # The estimates the planner allocates from, read before the step observes.
        estimates = np.asarray(planner.tracker.estimate(ids.tolist()), dtype=np.float64)
        if rule is not None:
            out = torch_loop.reinforce_ada_step(rule, ids, walk, budget=cap,
                                                mode=config.loss_mode, planner=planner)
            prompt_index = out.prompt_index
        elif grpo:
            out = _grpo_step(planner, ids, config.budget, walk, config.loss_mode)
            prompt_index = out.plan.prompt_index
        elif in_rounds:
            out = torch_loop.maxrl_round_step(
                planner, ids, config.budget, walk, rounds=spec.rounds, first_round=spec.first,
                mode=config.loss_mode, estimator=config.estimator,
                multiplicity_correction=config.multiplicity_correction)
            prompt_index = out.prompt_index
        else:
            out = torch_loop.maxrl_step(planner, ids, config.budget, walk, mode=config.loss_mode,
                                        estimator=config.estimator,
                                        multiplicity_correction=config.multiplicity_correction)
            prompt_index = out.plan.prompt_index
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        rewards = out.rewards.cpu().numpy()
        counts = out.counts if in_rounds else out.plan.counts
        per_maze = np.bincount(prompt_index, weights=rewards,
                               minlength=len(counts)) / counts
        curves["success_rate"].append(float(rewards.mean()))
        curves["maze_success_rate"].append(float(per_maze.mean()))
        curves["counts_max"].append(int(counts.max()))
        curves["counts_std"].append(float(counts.std()))
        curves["counts_at_min_fraction"].append(float(np.mean(counts == config.min_rollouts)))
        curves["loss"].append(float(out.loss.detach()))
        index_t = torch.as_tensor(np.array(prompt_index), device=out.rewards.device)
        if in_rounds:
            curves["diagnostics"].append({k: float(v) for k, v in sera_opt.advantage_diagnostics(
                out.rewards, index_t, estimator=config.estimator,
                multiplicity_correction=config.multiplicity_correction).items()})
            curves.setdefault("rounds", []).append(out.diagnostics())
        else:
            curves["diagnostics"].append(out.diagnostics)
        # Effective weights judged by the planner's own estimates rather than by
        # the batch's outcomes: what the allocation set out to equalize.
        planned = sera_opt.advantage_diagnostics(
            out.rewards, index_t, estimator=config.estimator,
            multiplicity_correction=config.multiplicity_correction,
            success_probs=torch.as_tensor(estimates[prompt_index], device=out.rewards.device))
        curves["planned_diagnostics"].append(
            {k: float(planned[k]) for k in ("min_factor", "mean_factor", "weight_spread",
                                            "alignment_proxy")})
        curves.setdefault("active_set", []).append(_coverage.active_set_row(
            None if in_rounds else out.plan.allocation))
        if epochs.advance(len(ids)):
            # A pass over the training mazes ended: the authors' estimates take its outcomes.
            planner.end_epoch()
        # Everything below is evaluation: its CPU time is taken out of the arm's.
        with cost.end_step() as spent:
            grid.step_end(step + 1, spent)
            if config.eval_every and (step + 1) % config.eval_every == 0:
                succ = evaluate(policy, test, config, eval_generator,
                                samples=config.curve_samples)
                curve = pass_at_k_curve(succ, config.curve_samples, config.curve_samples)
                curves["eval_step"].append(step + 1)
                curves["eval_pass_at_1"].append(float(curve[0]))
                curves["eval_pass_at_k_max"].append(float(curve[-1]))
    curves["at_cost"] = grid.points
    return curves


def run_arm(config: MazeConfig, seed: int, arm: str, state_dict, show_progress: bool = False) -> dict:
    """Train arm ``arm`` of run ``seed`` from the warmed-up ``state_dict``; evaluate it."""
    start, cpu_start = time.perf_counter(), time.process_time()
    torch, generator, train, test, obs_size = _seed_everything(config, seed)
    policy = make_policy(obs_size, config.hidden).to(config.device)
    policy.load_state_dict(state_dict)
    # The same batch sequence and sampling seed for every arm of a run.
    rng = np.random.default_rng([seed, 2])
    generator.manual_seed(seed + 1)
    eval_gen = torch.Generator(device=config.device)
    eval_gen.manual_seed(seed + 20_000)
    planner = _planner(arm, config)
    curves = train_arm(policy, planner, train, test, config, rng, generator, eval_gen,
                       show_progress=show_progress, spec=_coverage.parse_loop_arm(arm))
    eval_gen.manual_seed(seed + 30_000)
    test_successes = evaluate(policy, test, config, eval_gen, samples=config.eval_samples)
    return {
        "seed": seed,
        "arm": arm,
        "curves": curves,
        "test_successes": test_successes,
        "pass_at_k": pass_at_k_curve(test_successes, config.eval_samples, config.k_max),
        "wall_time": time.perf_counter() - start,
        # CPU time of this task (one torch thread): steady where the machine is shared
        "cpu_time": time.process_time() - cpu_start,
    }


def with_overrides(config: MazeConfig, **overrides) -> MazeConfig:
    """``config`` with the given fields replaced (None values are ignored)."""
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


