"""Benchmark: planning a step in rounds, and the gradient scales it buys.

**Speed.** For M in {256, 1024, 4096} prompts (p ~ Beta(0.6, 1.2), 8 rollouts per
prompt, bounds 2..32, offset 1, ``rounds=4`` with the default first round), the
time a policy's session spends planning all rounds of one step (the sum of its
``next_round`` calls; the rewards are drawn outside the clock), and separately
the session's ``result()`` (which computes the expected scales). Baselines in
the same rounds: the same policy's static ``allocate`` of the whole budget, and
``np.sort`` and ``np.log1p`` of M floats (what the solver benchmark reports, so
that machines can be compared). Each round times every case once, in turn;
medians of thread CPU time over the rounds, and the ratio of medians.
Target (issue): every round of a step at M = 1,024 in well under 1 ms for the
default policy.

**Scales.** docs/theory.md section 9's simulation: 512 prompts, p ~ Beta(0.6, 1.2),
8 rollouts per prompt on average, known p (a policy's session), caps at 32, both
offsets. For each arm, over seeds: the mean and the smallest expected scale over
the prompts (``RoundResult.factors``; for static arms ``w_c(p, n)``), the mean
realized scale (``C1 - p / (1 - p) C0`` on the step's rewards, ``1{K >= 1}`` for
offset 0: an unbiased estimate of the mean scale that does not rest on the
session's scale computation), and the rollouts drawn. Arms: uniform and sera-fair (alpha 1) static and with ``rounds=4``, and the
per-prompt rule "2 each, then one at a time to a first success" (cap 25, by
exact enumeration; its cost is its expected rollouts, not the budget).

**Baselines.** Which mean-centred baseline a step in rounds should use (the
estimator's ``round_index``): for two rules (a first round of 4, then 4 per round
to a first success; Reinforce-Ada's balanced exit) and p in {0.1, 0.3, 0.5, 0.8},
Monte Carlo on a softmax policy (20,000 one-prompt episodes) of each estimator's
scale (along the unit likelihood gradient ``u``) and of its noise per unit of
signal, ``sqrt(E|g - E g|^2) / (kappa |grad log p|)``, beside the exact scale by
enumeration.

    sera-opt bench rounds [--quick] [--out DIR] [--seed N] [--rounds K]
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from sera_opt.benchmarks import _harness

SIZES = (256, 1024, 4096)
POLICIES = ("sera-fair", "uniform", "sera", "sera-bayes")
PER_PROMPT = 8
ROUNDS = 4
BOUNDS = (2, 32)
BASELINES = ("np.sort", "np.log1p")
TARGET_S = 1e-3  # all rounds of a step at M = 1,024, default policy


def _probs(m: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, m]).beta(0.6, 1.2, m)


def _session_times(policy, p, budget, rng, rounds=ROUNDS):
    """(thread CPU seconds planning every round, seconds in result()) of one session."""
    session = policy.start_rounds(p, budget, rounds=rounds)
    planning = 0.0
    rounds = iter(session)
    while True:
        # The driver loop of run_rounds, with the clock around the planning alone.
        start = time.thread_time()
        counts = next(rounds, None)
        planning += time.thread_time() - start
        if counts is None:
            break
        session.record(rng.random(int(counts.sum())) < np.repeat(p, counts))
    start = time.thread_time()
    session.result()
    return planning, time.thread_time() - start


def run_speed(sizes, repeats: int, seed: int) -> list[dict]:
    import sera_opt

    rng = np.random.default_rng(seed)
    rows = []
    for m in sizes:
        p = _probs(m, seed)
        budget = PER_PROMPT * m
        policies = {name: sera_opt.get_policy(name, min_rollouts=BOUNDS[0],
                                              max_rollouts=BOUNDS[1], offset=1)
                    for name in POLICIES}
        samples: dict[str, list[float]] = {}
        for policy in policies.values():  # compile and warm every path first
            _session_times(policy, p, budget, rng)
            policy.allocate(p, budget)
        for _ in range(repeats):
            for name in BASELINES:
                func = np.sort if name == "np.sort" else np.log1p
                start = time.thread_time()
                func(p)
                samples.setdefault(name, []).append(time.thread_time() - start)
            for name, policy in policies.items():
                start = time.thread_time()
                policy.allocate(p, budget)
                samples.setdefault(f"{name} static", []).append(time.thread_time() - start)
                planning, result = _session_times(policy, p, budget, rng)
                samples.setdefault(f"{name} rounds={ROUNDS}", []).append(planning)
                samples.setdefault(f"{name} result()", []).append(result)
        med = {k: float(np.median(v)) for k, v in samples.items()}
        for name in POLICIES:
            rows.append({
                "prompts": m, "policy": name,
                "static_s": med[f"{name} static"],
                "rounds_s": med[f"{name} rounds={ROUNDS}"],
                "result_s": med[f"{name} result()"],
                "rounds_vs_static": med[f"{name} rounds={ROUNDS}"] / med[f"{name} static"],
                "rounds_vs_sort": med[f"{name} rounds={ROUNDS}"] / med["np.sort"],
                "rounds_vs_log1p": med[f"{name} rounds={ROUNDS}"] / med["np.log1p"],
                "sort_s": med["np.sort"], "log1p_s": med["np.log1p"],
            })
    return rows


def _static_scales(p, counts, offset):
    import sera_opt

    return sera_opt.attenuation(p, counts, offset)


def realized_scales(out, p: np.ndarray) -> np.ndarray:
    """``E[g_i | rewards] / grad log p_i`` of each prompt: ``C1 - p / (1 - p) C0`` on the
    step's rewards (docs/theory.md section 9), for the session's offset and, at offset 1, the
    first-round baseline (the usual one when there is one round). Its mean over prompts
    is an unbiased estimate of the mean scale."""
    m = p.shape[0]
    wins = np.bincount(out.prompt_index, weights=out.rewards, minlength=m)
    hit = (wins > 0).astype(float)
    if out.offset == 0:
        return hit
    first = out.round_index == 0
    n0 = np.bincount(out.prompt_index[first], minlength=m).astype(float)
    k1 = np.bincount(out.prompt_index[first], weights=out.rewards[first], minlength=m)
    gate = (k1 > 0).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        c1 = hit - np.where(gate > 0, k1 / n0, 0.0)
        c0 = -np.where(gate > 0, (n0 - k1) / n0, 0.0)
    return c1 - p / (1 - p) * c0


def run_scales(seeds: int, seed: int, m: int = 512) -> list[dict]:
    import sera_opt
    from sera_opt.rounds import first_success_rule, rule_scale, run_rounds

    rows = []
    for offset in (0, 1):
        arms = {"uniform": ("uniform", 1), "sera-fair:alpha=1": ("sera-fair", 1),
                f"uniform:rounds={ROUNDS}": ("uniform", ROUNDS),
                f"sera-fair:alpha=1:rounds={ROUNDS}": ("sera-fair", ROUNDS)}
        stats: dict[str, list[tuple[float, float, float, float]]] = {}
        for s in range(seeds):
            rng = np.random.default_rng([seed, s, offset])
            p = rng.beta(0.6, 1.2, m)
            budget = PER_PROMPT * m
            for label, (name, rounds) in arms.items():
                policy = sera_opt.get_policy(name, min_rollouts=1 + offset, max_rollouts=32,
                                             offset=offset)
                out = run_rounds(policy.start_rounds(p, budget, rounds=rounds),
                                 lambda counts: rng.random(int(counts.sum())) < np.repeat(p, counts))
                factors = out.factors if rounds > 1 else _static_scales(p, out.counts, offset)
                stats.setdefault(label, []).append(
                    (float(factors.mean()), float(factors.min()),
                     float(realized_scales(out, p).mean()), float(out.counts.sum())))
            if offset == 0:
                rule = first_success_rule(2, 1, 25)
                scales = [rule_scale(float(q), rule, rounds=24).scale for q in p]
                cost = [rule_scale(float(q), rule, rounds=24).rollouts for q in p]
                stats.setdefault("2, then 1 to a first success (cap 25)", []).append(
                    (float(np.mean(scales)), float(np.min(scales)), float("nan"),
                     float(np.sum(cost))))
        for label, values in stats.items():
            arr = np.asarray(values)
            rows.append({"offset": offset, "arm": label, "seeds": len(values),
                         "mean_scale": float(arr[:, 0].mean()),
                         "min_scale": float(arr[:, 1].mean()),
                         "realized_hit_fraction": float(np.nanmean(arr[:, 2]))
                         if not np.isnan(arr[:, 2]).all() else None,
                         "rollouts": float(arr[:, 3].mean())})
    return rows


def _softmax_prompt(p: float, vocab: int = 6):
    """A softmax policy over ``vocab`` answers whose first two (the correct ones) hold mass
    ``p``, unevenly (so that no estimator's noise vanishes by symmetry): its
    probabilities, each answer's score, and the exact ``grad log p``."""
    wrong = np.arange(1, vocab - 1, dtype=float)
    pi = np.concatenate([[0.7 * p, 0.3 * p], (1 - p) * wrong / wrong.sum()])
    scores = np.eye(vocab) - pi
    grad = (pi[:2, None] * scores[:2]).sum(0) / p
    return pi, scores, grad


def _episodes(rule, rounds, pi, episodes, rng):
    answers, prompt, round_of = [], [], []
    for e in range(episodes):
        total = successes = first = 0
        for r in range(rounds):
            m = rule(r, total, successes, first)
            if not m:
                continue
            y = rng.choice(pi.shape[0], size=m, p=pi)
            wins = int((y < 2).sum())
            first = wins if r == 0 else first
            total += m
            successes += wins
            answers.append(y)
            prompt.append(np.full(m, e))
            round_of.append(np.full(m, r))
    return np.concatenate(answers), np.concatenate(prompt), np.concatenate(round_of)


def run_baselines(episodes: int, seed: int) -> list[dict]:
    """Scale and noise per unit of signal of the three estimators under two round rules
    (Monte Carlo on a softmax policy, one prompt per episode, no correction), beside the
    exact scale by enumeration."""
    import torch

    import sera_opt
    from sera_opt.rounds import balanced_rule, first_success_rule, rule_scale

    rules = {"4, then 4 per round to a first success (4 rounds)":
             (first_success_rule(4, 4, 16), 4),
             "Reinforce-Ada balanced exit (rounds of 8, at most 4)": (balanced_rule(8, 2, 2), 4)}
    estimators = (("success_average", None, 0, "first_round"),
                  ("mean_centred, pooled baseline", None, 1, "pooled"),
                  ("mean_centred, first-round baseline", True, 1, "first_round"))
    rows = []
    for rule_name, (rule, rounds) in rules.items():
        for p in (0.1, 0.3, 0.5, 0.8):
            rng = np.random.default_rng([seed, int(p * 100)])
            pi, scores, grad = _softmax_prompt(p)
            y, prompt, rnd = _episodes(rule, rounds, pi, episodes, rng)
            rewards = torch.as_tensor((y < 2).astype(float))
            n = np.bincount(prompt, minlength=episodes)
            unit = grad / np.linalg.norm(grad)
            for label, with_rounds, offset, baseline in estimators:
                kwargs = {"round_index": torch.as_tensor(rnd)} if with_rounds else {}
                adv = sera_opt.maxrl_advantages(
                    rewards, torch.as_tensor(prompt),
                    estimator="success_average" if offset == 0 else "mean_centred",
                    multiplicity_correction=False, **kwargs).numpy()
                g = np.zeros((episodes, scores.shape[1]))
                np.add.at(g, prompt, (adv / n[prompt])[:, None] * scores[y])
                along = g @ unit
                signal = np.linalg.norm(grad)
                exact = rule_scale(p, rule, rounds=rounds, offset=offset, baseline=baseline)
                spread = np.sqrt(((g - g.mean(0)) ** 2).sum(1).mean())
                rows.append({"rule": rule_name, "p": p, "estimator": label,
                             "scale_exact": exact.scale, "scale_mc": float(along.mean() / signal),
                             "scale_mc_se": float(along.std() / signal / np.sqrt(episodes)),
                             "noise_per_signal": float(spread / (exact.scale * signal)),
                             "rollouts": exact.rollouts})
    return rows


def _print(speed, scales) -> None:
    print(f"planning all {ROUNDS} rounds of a step (thread CPU, medians; bounds {BOUNDS}, offset 1)")
    print(f"{'M':>6} {'policy':<11} {'static':>10} {'rounds':>10} {'result()':>10} "
          f"{'x static':>9} {'x sort':>8} {'x log1p':>8}")
    for r in speed:
        print(f"{r['prompts']:>6} {r['policy']:<11} {r['static_s'] * 1e6:>8.1f}us "
              f"{r['rounds_s'] * 1e6:>8.1f}us {r['result_s'] * 1e6:>8.1f}us "
              f"{r['rounds_vs_static']:>9.2f} {r['rounds_vs_sort']:>8.1f} "
              f"{r['rounds_vs_log1p']:>8.1f}")
    if scales:
        print("\nexpected scales, known p ~ Beta(0.6, 1.2), M = 512, 8 per prompt, cap 32")
        print(f"{'c':>2} {'arm':<40} {'mean':>6} {'min':>6} {'realized':>9} {'rollouts':>9}")
        for r in scales:
            hit = "" if r["realized_hit_fraction"] is None else f"{r['realized_hit_fraction']:.3f}"
            print(f"{r['offset']:>2} {r['arm']:<40} {r['mean_scale']:>6.3f} "
                  f"{r['min_scale']:>6.3f} {hit:>9} {r['rollouts']:>9.0f}")


def main(argv=None) -> int:
    from sera_opt.benchmarks.solvers import cpu_info

    parser = _harness.common_parser("rounds", __doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=_harness.at_least(1), default=None,
                        help="timing rounds (default 31)")
    parser.add_argument("--no-scales", action="store_true", help="skip the scale simulation")
    args = parser.parse_args(argv)
    sizes = (256, 1024) if args.quick else SIZES
    repeats = args.rounds or (9 if args.quick else 31)
    speed = run_speed(sizes, repeats, args.seed)
    scales = [] if args.no_scales else run_scales(3 if args.quick else 10, args.seed)
    baselines = [] if args.no_scales else run_baselines(2000 if args.quick else 20000,
                                                        args.seed)
    _print(speed, scales)
    if baselines:
        print("\nestimators under round rules: scale (exact | Monte Carlo +- s.e.) and noise per "
              "unit of signal, sqrt(E|g - E g|^2) / (kappa |grad log p|)")
        for r in baselines:
            print(f"{r['rule'][:34]:<34} p={r['p']:.1f} {r['estimator']:<36} "
                  f"{r['scale_exact']:.3f} | {r['scale_mc']:.3f} +- {r['scale_mc_se']:.3f}  "
                  f"noise {r['noise_per_signal']:.2f}")
    default = next(r for r in speed if r["prompts"] == 1024 and r["policy"] == "sera-fair")
    met = default["rounds_s"] < TARGET_S
    print(f"\ntarget: all rounds at M = 1,024 (sera-fair) under {TARGET_S * 1e3:.0f} ms: "
          f"{default['rounds_s'] * 1e3:.3f} ms, {'met' if met else 'NOT met'}")
    payload = {"machine": _harness.machine_info(), "cpu": cpu_info(), "speed": speed,
               "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
               "scales": scales, "baselines": baselines, "rounds": ROUNDS, "repeats": repeats,
               "target": {"seconds": TARGET_S, "measured": default["rounds_s"], "met": met}}
    path = _harness.write_json(args.out, "rounds", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_harness.run_command("rounds", main))
