"""Tracker, planner and peer-policy speed, against numpy baselines in the same process.

Tracker: R rollouts (default 1,000,000) of prompts drawn uniformly from N
(default 1,000,000) dataset prompts, binary rewards. Timed per id kind: dataset
indices with ``num_prompts`` ("dense", also with ``decay=0.97``), the same
indices without it (direct table), sparse int64 ids (hashes: the hash table),
and strings, once as a numpy ``str`` array (the documented fast route) and once
as a list of ``str``. For each: a first ``update`` into an empty tracker (every
id new), a steady-state ``update`` (ids known), ``estimate`` of the same R ids,
and update + estimate together. Baseline: ``np.bincount(ids, weights=rewards,
minlength=N)`` over the same int64 indices, timed in the same rounds; the ratio
of medians is the number to read (issue target for sparse ids: update +
estimate within 20x).

Planner per training step: a tracker that holds N prompts (each seen four
times), batches of M in {64, 256, 1024, 4096} distinct prompts, 8 rollouts per
prompt: ``RolloutPlanner.plan(ids, 8 M)`` then ``observe`` of the rollouts,
only through the planner's public API; beside it the policy alone
(``allocate`` on the same estimates) and the tracker alone (``estimate`` or
``posterior`` of the batch plus ``update`` of its rollouts). Medians and means
over rounds: the mean includes the tracker's periodic O(N) refreshes.

Policies: every policy of this module's family ("knapsack", "vip", "hora",
"gvm", "sera-bayes", "sera-fair" at its default alpha = 1; "sera" and "uniform"
for reference) at M in {1024, 65536,
1,000,000}, the setup of ``benchmarks/solvers.py`` (p uniform on (0, 1), budget
8 per prompt, bounds 1..64), against ``np.sort`` of the same array.

CPU times are the calling thread's (``time.thread_time``; the machine may be
shared); wall times are reported beside them. Rounds interleave the cases.

    sera-opt bench tracking [--quick] [--out DIR] [--seed N] [--rounds K]
"""

from __future__ import annotations

import sys
import time

import numpy as np

import sera_opt
from sera_opt.benchmarks import _harness

#: Every registered policy, in the registry's order.
POLICY_NAMES = sera_opt.available_policies()
POLICY_SIZES = (1024, 65536, 1_000_000)
STEP_SIZES = (64, 256, 1024, 4096)
STEP_POLICIES = ("sera", "sera-fair", "sera-bayes")
PER_PROMPT = 8
MIN_ROLLOUTS = 1
MAX_ROLLOUTS = 64
BASELINE = "np.bincount (baseline)"
CASE_NAMES = ("dense (num_prompts=N)", "dense, decay=0.97", "int ids (direct table)",
              "sparse int64 ids (hash table)", "string ids, numpy str array",
              "string ids, list of str")


def _clock(func, *args, **kwargs):
    """(wall seconds, thread CPU seconds) of one call ``func(*args, **kwargs)``."""
    wall = time.perf_counter()
    cpu = time.thread_time()
    func(*args, **kwargs)
    return time.perf_counter() - wall, time.thread_time() - cpu


def _first_update(make, ids, rewards):
    make().update(ids, rewards)


def _update_and_estimate(tracker, ids, rewards):
    tracker.update(ids, rewards).estimate(ids)


def _stats(samples: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, pairs in samples.items():
        arr = np.asarray(pairs)
        out[name] = {"wall_s": float(np.median(arr[:, 0])), "cpu_s": float(np.median(arr[:, 1])),
                     "wall_mean_s": float(arr[:, 0].mean()), "cpu_mean_s": float(arr[:, 1].mean()),
                     "wall_min_s": float(arr[:, 0].min()), "rounds": int(arr.shape[0])}
    return out


def tracker_cases(rollouts: int, prompts: int, rng) -> dict:
    import sera_opt

    index = rng.integers(0, prompts, rollouts)
    rewards = (rng.random(rollouts) < rng.beta(0.6, 0.8, prompts)[index]).astype(np.int8)
    hashed = index * np.int64(1_000_003) + np.int64(7 << 40)
    names = np.array([f"prompt-{i}" for i in range(prompts)])
    strings = names[index]
    cases = {
        CASE_NAMES[0]: (lambda: sera_opt.SuccessTracker(num_prompts=prompts), index),
        CASE_NAMES[1]: (lambda: sera_opt.SuccessTracker(num_prompts=prompts, decay=0.97), index),
        CASE_NAMES[2]: (sera_opt.SuccessTracker, index),
        CASE_NAMES[3]: (sera_opt.SuccessTracker, hashed),
        CASE_NAMES[4]: (sera_opt.SuccessTracker, strings),
        CASE_NAMES[5]: (sera_opt.SuccessTracker, strings.tolist()),
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
        tracker = make()  # warm-up: pays the kernels' compilation or cache load
        tracker.update(ids, rewards)
        tracker.estimate(ids)
        warm[name] = tracker
    for _ in _harness.progress(range(rounds), desc="tracker rounds", enabled=show):
        record(BASELINE, _clock(np.bincount, index, weights=rewards, minlength=prompts))
        for name, (make, ids) in data["cases"].items():
            record(f"{name} | first update", _clock(_first_update, make, ids, rewards))
            tracker = warm[name]
            record(f"{name} | update", _clock(tracker.update, ids, rewards))
            record(f"{name} | estimate", _clock(tracker.estimate, ids))
            record(f"{name} | update + estimate",
                   _clock(_update_and_estimate, tracker, ids, rewards))
    stats = _stats(samples)
    base = stats[BASELINE]
    rows = []
    for name, s in stats.items():
        rows.append({"case": name, **s, "ratio_wall": s["wall_s"] / base["wall_s"],
                     "ratio_cpu": s["cpu_s"] / max(base["cpu_s"], 1e-9)})
    return {"rollouts": rollouts, "prompts": prompts, "rows": rows}


def time_planner_steps(prompts: int, sizes, rounds: int, rng, show: bool) -> list[dict]:
    """Per-step cost of plan + observe with a tracker of ``prompts`` prompts."""
    import sera_opt

    rows = []
    for name in STEP_POLICIES:
        tracker = sera_opt.SuccessTracker()
        seen = np.repeat(np.arange(prompts), 4)
        tracker.update(seen, rng.random(seen.size) < rng.beta(0.6, 0.8, prompts)[seen])
        planner = sera_opt.RolloutPlanner(name, tracker=tracker, max_rollouts=MAX_ROLLOUTS)
        policy = sera_opt.get_policy(name, max_rollouts=MAX_ROLLOUTS)
        for m in _harness.progress(sizes, desc=f"planner steps ({name})", enabled=show):
            budget = PER_PROMPT * m
            samples: dict[str, list] = {}
            steps = rounds * max(1, 1024 // m)  # more rounds where one costs little
            for step in range(steps + 3):
                ids = rng.choice(prompts, m, replace=False)
                wall, cpu = time.perf_counter(), time.thread_time()
                counts = planner.plan(ids, budget).counts
                plan_t = (time.perf_counter() - wall, time.thread_time() - cpu)
                rollout_ids = np.repeat(ids, counts)
                rewards = rng.random(rollout_ids.size) < 0.4
                observe_t = _clock(planner.observe, rollout_ids, rewards)
                # The same work split: the tracker alone, then the policy alone.
                if planner.uses_posterior:
                    read = _clock(tracker.posterior, ids)
                    alpha, beta = tracker.posterior(ids)
                    alone = _clock(policy.allocate, None, budget, posterior=(alpha, beta))
                else:
                    read = _clock(tracker.estimate, ids)
                    alone = _clock(policy.allocate, tracker.estimate(ids), budget)
                update = _clock(tracker.update, rollout_ids, rewards)
                if step < 3:
                    continue  # warm-up: compilation, first growth of scratch buffers
                for key, value in (("plan", plan_t), ("observe", observe_t),
                                   ("plan + observe", tuple(map(sum, zip(plan_t, observe_t)))),
                                   ("policy alone", alone),
                                   ("tracker alone", tuple(map(sum, zip(read, update))))):
                    samples.setdefault(key, []).append(value)
            for key, s in _stats(samples).items():
                rows.append({"policy": name, "prompts": m, "tracker_prompts": prompts,
                             "case": key, **s})
            if show:
                got = {r["case"]: r for r in rows if r["policy"] == name and r["prompts"] == m}
                print(f"{name:10s} M={m:>5d}  plan + observe {got['plan + observe']['cpu_s'] * 1e6:8.1f}"
                      f" us  (policy {got['policy alone']['cpu_s'] * 1e6:8.1f} us, tracker "
                      f"{got['tracker alone']['cpu_s'] * 1e6:8.1f} us)", file=sys.stderr)
    return rows


def time_policies(sizes, rounds: int, rng, show: bool) -> list[dict]:
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
        stats = _stats(samples)
        base = stats.pop("np.sort")
        for name, s in stats.items():
            rows.append({"policy": name, "prompts": m, **s, "sort_wall_s": base["wall_s"],
                         "ratio_to_sort": s["wall_s"] / base["wall_s"]})
            if show:
                print(f"{name:10s} M={m:>9,d} {s['wall_s'] * 1e3:9.2f} ms "
                      f"(cpu {s['cpu_s'] * 1e3:8.2f} ms) {s['wall_s'] / base['wall_s']:7.1f} x sort",
                      file=sys.stderr)
    return rows


def plot(result: dict, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s, ax_p) = plt.subplots(1, 3, figsize=(18, 4.8))
    rows = [r for r in result["tracker"]["rows"] if "|" in r["case"]]
    kinds = list(dict.fromkeys(r["case"].split(" | ")[0] for r in rows))
    ops = ["first update", "update", "estimate", "update + estimate"]
    width = 0.8 / len(ops)
    for j, op in enumerate(ops):
        vals = [next(r["cpu_s"] for r in rows if r["case"] == f"{k} | {op}") for k in kinds]
        ax_t.barh(np.arange(len(kinds)) + j * width, vals, height=width, label=op)
    base = next(r["cpu_s"] for r in result["tracker"]["rows"] if r["case"] == BASELINE)
    ax_t.axvline(base, color="k", ls=":", label="np.bincount (baseline)")
    ax_t.axvline(20 * base, color="r", lw=0.8, label="20 x baseline")
    ax_t.set_yticks(np.arange(len(kinds)) + 0.3, kinds, fontsize=8)
    ax_t.set_xscale("log")
    ax_t.set(xlabel="median CPU seconds",
             title=f"tracker, {result['tracker']['rollouts']:,} rollouts")
    ax_t.legend(fontsize=7)
    for name in STEP_POLICIES:
        for case, style in (("plan + observe", "-o"), ("policy alone", "--s"),
                            ("tracker alone", ":^")):
            pts = sorted((r["prompts"], r["cpu_s"] * 1e6) for r in result["planner_steps"]
                         if r["policy"] == name and r["case"] == case)
            if pts:
                ax_s.loglog(*zip(*pts), style, label=f"{name}: {case}")
    ax_s.axhline(1000, color="r", lw=0.8, label="1 ms")
    ax_s.set(xlabel="prompts per batch M", ylabel="median CPU microseconds per step",
             title=f"one training step, tracker of {result['setup']['prompts']:,} prompts")
    ax_s.legend(fontsize=7)
    for name in POLICY_NAMES:
        pts = sorted((r["prompts"], r["wall_s"]) for r in result["policies"]
                     if r["policy"] == name)
        if pts:
            ax_p.loglog(*zip(*pts), "-o", label=name)
    sort_pts = sorted({(r["prompts"], r["sort_wall_s"]) for r in result["policies"]})
    ax_p.loglog(*zip(*sort_pts), "k:", label="np.sort (baseline)")
    ax_p.set(xlabel="prompts M", ylabel="median wall seconds", title="policy solve time")
    ax_p.legend(fontsize=7)
    return _harness.save_figure(fig, out_dir, "tracking")


def main(argv=None) -> int:
    parser = _harness.common_parser("tracking", __doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=_harness.at_least(1), default=1_000_000)
    parser.add_argument("--prompts", type=_harness.at_least(1), default=1_000_000)
    parser.add_argument("--rounds", type=_harness.at_least(1), default=9)
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
            print(f"{r['case']:52s} {r['cpu_s'] * 1e3:9.2f} ms (wall {r['wall_s'] * 1e3:8.2f} ms) "
                  f"{r['ratio_cpu']:7.1f} x bincount", file=sys.stderr)
    steps = time_planner_steps(prompts, STEP_SIZES, 5 * rounds, rng, show)
    policies = time_policies(sizes, rounds, rng, show)
    result = {
        "setup": {"rollouts": rollouts, "prompts": prompts, "rounds": rounds, "seed": args.seed,
                  "quick": args.quick, "policy_sizes": list(sizes), "step_sizes": list(STEP_SIZES),
                  "per_prompt": PER_PROMPT, "min_rollouts": MIN_ROLLOUTS,
                  "max_rollouts": MAX_ROLLOUTS, "clock": "thread_time (CPU) and perf_counter"},
        "machine": _harness.machine_info(),
        "tracker": tracker,
        "planner_steps": steps,
        "policies": policies,
    }
    path = _harness.write_json(args.out, "tracking", result)
    png = plot(result, args.out)
    print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(_harness.run_command("tracking", main))
