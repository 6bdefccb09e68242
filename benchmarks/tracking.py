"""Tracker throughput and the exact peer policies' solve times, against numpy baselines.

Tracker: R rollouts (default 1,000,000) of prompts drawn uniformly from N
(default 1,000,000) dataset prompts, binary rewards. Timed per id kind: dataset
indices with ``num_prompts`` ("dense"), the same indices without it (direct
table), sparse int64 ids (hashes: sorted keys) and strings. For each: a first
``update`` into an empty tracker (every id new), a steady-state ``update`` (ids
known), ``estimate`` of the same R ids, and update + estimate together (the
target: under 1 s). Baseline: ``np.bincount(ids, weights=rewards)`` over the
same int64 arrays, timed in the same rounds.

Policies: every policy of this module's family ("knapsack", "vip", "hora",
"gvm", "sera-bayes"; "sera" and "uniform" for reference) at M in {1024, 65536,
1,000,000}, the setup of ``benchmarks/solvers.py`` (p uniform on (0, 1), budget
8 per prompt, bounds 1..64), against ``np.sort`` of the same array. Also the
planner's ``plan`` for a batch of 65,536 prompts out of a tracker of N.

Rounds interleave the cases; the tables report medians of wall time and of
process CPU time (the machine may be shared).

    sera-opt bench tracking [--quick] [--out DIR] [--seed N] [--rounds K]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from sera_opt.benchmarks import _harness

POLICY_NAMES = ("knapsack", "vip", "hora", "gvm", "sera-bayes", "sera", "uniform")
POLICY_SIZES = (1024, 65536, 1_000_000)
PER_PROMPT = 8
MIN_ROLLOUTS = 1
MAX_ROLLOUTS = 64


def _clock(func, *args, **kwargs):
    """(wall seconds, process CPU seconds) of one call ``func(*args, **kwargs)``."""
    wall = time.perf_counter()
    cpu = time.process_time()
    func(*args, **kwargs)
    return time.perf_counter() - wall, time.process_time() - cpu


def _first_update(make, ids, rewards):
    make().update(ids, rewards)


def _update_and_estimate(tracker, ids, rewards):
    tracker.update(ids, rewards).estimate(ids)


def _medians(samples: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, pairs in samples.items():
        arr = np.asarray(pairs)
        out[name] = {"wall_s": float(np.median(arr[:, 0])), "cpu_s": float(np.median(arr[:, 1])),
                     "wall_min_s": float(arr[:, 0].min()), "rounds": int(arr.shape[0])}
    return out


def tracker_cases(rollouts: int, prompts: int, rng) -> dict:
    import sera_opt

    index = rng.integers(0, prompts, rollouts)
    rewards = (rng.random(rollouts) < rng.beta(0.6, 0.8, prompts)[index]).astype(np.int8)
    hashed = index * np.int64(1_000_003) + np.int64(7 << 40)
    names = np.array([f"prompt-{i}" for i in range(prompts)])
    strings = names[index].tolist()
    cases = {
        "dense (num_prompts=N)": (lambda: sera_opt.SuccessTracker(num_prompts=prompts), index),
        "int ids (direct table)": (sera_opt.SuccessTracker, index),
        "int ids, decay=0.99": (lambda: sera_opt.SuccessTracker(decay=0.99), index),
        "sparse int64 ids (sorted keys)": (sera_opt.SuccessTracker, hashed),
        "string ids": (sera_opt.SuccessTracker, strings),
    }
    return {"index": index, "rewards": rewards, "cases": cases}


def time_tracker(rollouts: int, prompts: int, rounds: int, rng, show: bool) -> dict:
    data = tracker_cases(rollouts, prompts, rng)
    index, rewards = data["index"], data["rewards"]
    samples: dict[str, list] = {}

    def record(name, value):
        samples.setdefault(name, []).append(value)

    warm = {}
    for name, (make, ids) in data["cases"].items():
        tracker = make()
        tracker.update(ids, rewards)
        tracker.estimate(ids)
        warm[name] = tracker
    for _ in _harness.progress(range(rounds), desc="tracker rounds", enabled=show):
        record("np.bincount (baseline)",
               _clock(np.bincount, index, weights=rewards, minlength=prompts))
        for name, (make, ids) in data["cases"].items():
            record(f"{name} | first update", _clock(_first_update, make, ids, rewards))
            tracker = warm[name]
            record(f"{name} | update", _clock(tracker.update, ids, rewards))
            record(f"{name} | estimate", _clock(tracker.estimate, ids))
            record(f"{name} | update + estimate",
                   _clock(_update_and_estimate, tracker, ids, rewards))
    stats = _medians(samples)
    base = stats["np.bincount (baseline)"]
    rows = []
    for name, s in stats.items():
        rows.append({"case": name, **s, "ratio_wall": s["wall_s"] / base["wall_s"],
                     "ratio_cpu": s["cpu_s"] / max(base["cpu_s"], 1e-9)})
    return {"rollouts": rollouts, "prompts": prompts, "rows": rows}


def time_policies(sizes, rounds: int, rng, show: bool, prompts: int) -> list[dict]:
    import sera_opt

    rows = []
    for m in _harness.progress(sizes, desc="policy sizes", enabled=show):
        p = rng.uniform(np.finfo(float).tiny, 1.0, m)
        budget = PER_PROMPT * m
        policies = {name: sera_opt.get_policy(name) for name in POLICY_NAMES}
        for policy in policies.values():  # warm-up: pays compilation or the cache load
            policy.allocate(p, budget, min_rollouts=MIN_ROLLOUTS, max_rollouts=MAX_ROLLOUTS)
        samples: dict[str, list] = {}
        for _ in range(rounds if m < 1_000_000 else max(3, rounds // 3)):
            samples.setdefault("np.sort", []).append(_clock(np.sort, p))
            for name, policy in policies.items():
                samples.setdefault(name, []).append(_clock(
                    policy.allocate, p, budget, min_rollouts=MIN_ROLLOUTS,
                    max_rollouts=MAX_ROLLOUTS))
        stats = _medians(samples)
        base = stats.pop("np.sort")
        for name, s in stats.items():
            rows.append({"policy": name, "prompts": m, **s, "sort_wall_s": base["wall_s"],
                         "ratio_to_sort": s["wall_s"] / base["wall_s"]})
            if show:
                print(f"{name:10s} M={m:>9,d} {s['wall_s'] * 1e3:9.2f} ms "
                      f"(cpu {s['cpu_s'] * 1e3:8.2f} ms) {s['wall_s'] / base['wall_s']:7.1f} x sort",
                      file=sys.stderr)
    # The planner end to end: estimates (or posteriors) for a batch, then the policy.
    tracker = sera_opt.SuccessTracker()
    ids = rng.integers(0, prompts, prompts)
    tracker.update(ids, (rng.random(ids.size) < 0.4).astype(np.int8))
    batch = rng.choice(prompts, 65536, replace=False)
    for name in ("sera", "sera-bayes", "knapsack"):
        planner = sera_opt.RolloutPlanner(name, tracker=tracker, max_rollouts=MAX_ROLLOUTS)
        planner.plan(batch, PER_PROMPT * batch.size)
        samples = {name: [_clock(planner.plan, batch, PER_PROMPT * batch.size)
                          for _ in range(rounds)]}
        s = _medians(samples)[name]
        rows.append({"policy": f"planner.plan ({name})", "prompts": int(batch.size), **s})
    return rows


def plot(result: dict, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(13, 4.8))
    rows = [r for r in result["tracker"]["rows"] if "|" in r["case"]]
    kinds = list(dict.fromkeys(r["case"].split(" | ")[0] for r in rows))
    ops = ["first update", "update", "estimate", "update + estimate"]
    width = 0.8 / len(ops)
    for j, op in enumerate(ops):
        vals = [next(r["wall_s"] for r in rows if r["case"] == f"{k} | {op}") for k in kinds]
        ax_t.barh(np.arange(len(kinds)) + j * width, vals, height=width, label=op)
    base = next(r["wall_s"] for r in result["tracker"]["rows"] if r["case"].startswith("np.bin"))
    ax_t.axvline(base, color="k", ls=":", label="np.bincount (baseline)")
    ax_t.axvline(1.0, color="r", lw=0.8, label="target: 1 s")
    ax_t.set_yticks(np.arange(len(kinds)) + 0.3, kinds, fontsize=8)
    ax_t.set_xscale("log")
    ax_t.set(xlabel="median wall seconds", title=f"tracker, {result['tracker']['rollouts']:,} rollouts")
    ax_t.legend(fontsize=7)
    for name in POLICY_NAMES:
        pts = sorted((r["prompts"], r["wall_s"]) for r in result["policies"]
                     if r["policy"] == name)
        if pts:
            ax_p.loglog(*zip(*pts), "-o", label=name)
    sort_pts = sorted({(r["prompts"], r["sort_wall_s"]) for r in result["policies"]
                       if "sort_wall_s" in r})
    ax_p.loglog(*zip(*sort_pts), "k:", label="np.sort (baseline)")
    ax_p.axhline(1.0, color="r", lw=0.8)
    ax_p.set(xlabel="prompts M", ylabel="median wall seconds", title="policy solve time")
    ax_p.legend(fontsize=7)
    return _harness.save_figure(fig, out_dir, "tracking")


def main(argv=None) -> int:
    parser = _harness.common_parser("tracking", __doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    show = not args.no_progress
    rollouts = 100_000 if args.quick else args.rollouts
    prompts = 100_000 if args.quick else args.prompts
    rounds = 3 if args.quick else args.rounds
    sizes = (1024, 65536) if args.quick else POLICY_SIZES
    tracker = time_tracker(rollouts, prompts, rounds, rng, show)
    if show:
        for r in tracker["rows"]:
            print(f"{r['case']:48s} {r['wall_s'] * 1e3:9.2f} ms (cpu {r['cpu_s'] * 1e3:8.2f} ms) "
                  f"{r['ratio_wall']:7.1f} x bincount", file=sys.stderr)
    policies = time_policies(sizes, rounds, rng, show, prompts)
    result = {
        "setup": {"rollouts": rollouts, "prompts": prompts, "rounds": rounds, "seed": args.seed,
                  "quick": args.quick, "policy_sizes": list(sizes), "per_prompt": PER_PROMPT,
                  "min_rollouts": MIN_ROLLOUTS, "max_rollouts": MAX_ROLLOUTS},
        "tracker": tracker,
        "policies": policies,
    }
    path = _harness.write_json(args.out, "tracking", result)
    png = plot(result, args.out)
    print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
