"""The allocation path by estimates: its kernels, the planner, ``allocate()`` and first use.

The planner measured is ``RolloutPlanner("sera-fair", alpha=1.0, offset=1,
min_rollouts=2)``, the planner's default until the cost rule of docs/benchmarks.md made
uniform allocation the default (whose plan solves nothing), and the allocation by
estimates to try first.

Measured in one process, each case against ``np.sort`` and ``np.partition`` of the
same array timed in the same rounds (medians of the calling thread's CPU time,
``time.thread_time``; every case is timed once per round, in turn, so that a burst
of load on a shared machine touches all of them alike):

* **kernels**: ``policy.allocate(p, 8 M, min_rollouts=1, max_rollouts=64)`` for
  ``sera-fair`` at alpha 0, 1 and 2 (the closed-form kinds), alpha 0.5 and
  ``sera-bayes`` (the general engine), and ``sera`` (the waterline), for
  ``p ~ U(0, 1)`` and M in 256, 1,024, 4,096, 65,536 and 10^6;
* **planner**: that planner's ``plan(ids, 8 M)`` (``max_rollouts=64``) at M = 1,024 with
  integer and with string ids (ids the tracker has seen once), the same for the library's
  default planner ``RolloutPlanner(max_rollouts=64)`` (uniform allocation), and the planning of
  a 4-round session (``start_rounds`` and every ``next_round``; rewards are drawn
  outside the clock); beside them, the closed-form kernel of ``sera-fair`` (alpha 1) on
  the same problem by the bracket search and by the one-at-a-time kernel that serves
  while a background process compiles the search;
* **allocate**: ``sera_opt.allocate(p, 8 M, min_rollouts=1, max_rollouts=64)``
  beside ``policy.allocate`` of the same arrays, at M = 1,024;
* **first use**: a fresh process with an empty kernel cache (a new
  ``SERA_OPT_CACHE_DIR``) runs ``plan`` + ``observe`` + ``plan`` + a 4-round
  session of that planner at M = 64 and at M = 1,024 (wall time; the
  notices it prints are recorded), as a new user meets it (the bracket search compiled
  in a background process while the one-at-a-time kernel serves) and with every kernel
  compiled in the process (``SERA_OPT_BACKGROUND_COMPILE=0``), with the time until every
  kernel is ready. (The timings above compile in the benchmark's process.)

The JSON records the CPU's flags (``/proc/cpuinfo``), what the baselines depend on.

    sera-opt bench default-path [--quick] [--out DIR] [--repeats K] [--no-first-use]

``--quick`` measures M up to 65,536 with fewer repeats and one first-use size pair.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from sera_opt.benchmarks import _harness
from sera_opt.cache import BACKGROUND_COMPILE_ENV as BACKGROUND_ENV

SIZES = (256, 1024, 4096, 65536, 1_000_000)
QUICK_SIZES = (256, 1024, 4096, 65536)
PER_PROMPT = 8
MIN_ROLLOUTS = 1
MAX_ROLLOUTS = 64
PLANNER_PROMPTS = 1024
FIRST_USE_SIZES = (64, 1024)
CLOCK = time.thread_time
#: (label, policy name, options): the default path's kinds and the general engine's.
KERNELS = (
    ("sera-fair:alpha=0", "sera-fair", {"alpha": 0.0}),
    ("sera-fair:alpha=1", "sera-fair", {"alpha": 1.0}),
    ("sera-fair:alpha=2", "sera-fair", {"alpha": 2.0}),
    ("sera-fair:alpha=0.5", "sera-fair", {"alpha": 0.5}),
    ("sera-bayes", "sera-bayes", {}),
    ("sera", "sera", {}),
)
TARGETS = {
    "closed_form_vs_sort_1e6": 5.0, "closed_form_1024_s": 50e-6, "general_vs_sort_1e6": 10.0,
    "plan_int_1024_s": 100e-6, "plan_str_1024_s": 200e-6, "rounds_1024_s": 0.3e-3,
    "allocate_vs_policy": 1.2, "first_use_ratio": 1.5, "first_use_1024_s": 10.0,
}

_FIRST_USE = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import sera_opt
m = int(sys.argv[1])
rng = np.random.default_rng(0)
t1 = time.perf_counter()
planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)
ids = np.arange(m)
first = planner.plan(ids, 8 * m)
t2 = time.perf_counter()
planner.observe(np.repeat(ids, first.counts), rng.random(int(first.counts.sum())) < 0.3)
second = planner.plan(ids, 8 * m)
t3 = time.perf_counter()
session = planner.start_rounds(ids, 8 * m, rounds=4)
while not session.done:
    counts = session.next_round()
    session.record(rng.random(int(counts.sum())) < 0.3)
t4 = time.perf_counter()
sera_opt.cache.wait_for_kernels()
t5 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "plan_s": t2 - t1, "observe_plan_s": t3 - t2,
                  "rounds_s": t4 - t3, "step_s": t4 - t1, "ready_s": t5 - t1,
                  "counts": second.counts.tolist()}))
"""

#: First use is measured as a new user meets it (a large kernel compiled in a background
#: process while an exact smaller one serves) and with every kernel compiled in the
#: process that needs it (``SERA_OPT_BACKGROUND_COMPILE=0``, the code before that).
FIRST_USE_MODES = (("background", "1"), ("in-process", "0"))


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def _loops(func, min_time: float) -> int:
    func()  # warm-up: compiles or loads kernels, fills caches
    start = CLOCK()
    func()
    once = max(CLOCK() - start, 1e-7)
    return max(1, int(min_time / once))


def interleaved(cases: dict, repeats: int, min_time: float) -> dict:
    """Median seconds per call of each case; each round times every case once, in turn."""
    loops = {name: _loops(func, min_time) for name, func in cases.items()}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, func in cases.items():
            start = CLOCK()
            for _ in range(loops[name]):
                func()
            times[name].append((CLOCK() - start) / loops[name])
    return {name: float(np.median(t)) for name, t in times.items()}


def measure_kernels(sizes, repeats: int, show: bool) -> list[dict]:
    import sera_opt

    rows = []
    for m in sizes:
        p = np.random.default_rng([0, m]).uniform(0, 1, m)
        budget = PER_PROMPT * m
        cases = {"np.sort": lambda p=p: np.sort(p),
                 "np.partition": lambda p=p, k=m // 2: np.partition(p, k)}
        for label, name, options in KERNELS:
            policy = sera_opt.get_policy(name, **options)
            cases[label] = (lambda p=p, b=budget, policy=policy: policy.allocate(
                p, b, min_rollouts=MIN_ROLLOUTS, max_rollouts=MAX_ROLLOUTS))
        min_time = 0.02 if m < 100_000 else 0.0
        reps = repeats if m < 100_000 else max(3, repeats // 3)
        medians = interleaved(cases, reps, min_time)
        sort = medians["np.sort"]
        for label, seconds in medians.items():
            rows.append({"case": label, "prompts": m, "median_s": seconds,
                         "sort_median_s": sort, "ratio_to_sort": seconds / sort,
                         "partition_median_s": medians["np.partition"],
                         "ratio_to_partition": seconds / medians["np.partition"]})
            if show:
                print(f"{label:22s} M={m:>9,d} {seconds * 1e6:12.1f} us "
                      f"{seconds / sort:8.2f} x sort", file=sys.stderr)
    return rows


def interim_cases(p, budget: int) -> dict:
    """The closed-form search and the one-at-a-time kernel that serves while a background
    process compiles it, called directly on the same problem (``sera-fair`` at alpha = 1,
    bounds ``MIN_ROLLOUTS..MAX_ROLLOUTS``): what a first call with a large spare costs."""
    from sera_opt.kernels import compiled
    from sera_opt.separable import AlphaFairUtility

    kernels = compiled("closed")
    objective = AlphaFairUtility(p, alpha=1.0)
    p0, p1, p2 = objective.kernel_params()
    m = p.shape[0]
    lo = np.full(m, MIN_ROLLOUTS, dtype=np.int64)
    hi = np.full(m, MAX_ROLLOUTS, dtype=np.int64)
    spare = budget - MIN_ROLLOUTS * m

    def call(kernel):
        return kernel(objective.kernel_kind, p0, p1, p2, objective.offset, lo, hi, spare,
                      np.zeros(4, dtype=np.int64), np.empty((4, 0), dtype=np.int64),
                      np.empty(0, dtype=np.int64))

    search, interim = kernels.bracket_solve, kernels.stepwise_counts
    assert np.array_equal(call(search), call(interim)), "the interim kernel's counts differ"
    return {"sera-fair kernel, bracket search": lambda: call(search),
            "sera-fair kernel, one at a time": lambda: call(interim)}


def measure_planner(repeats: int, show: bool) -> dict:
    import sera_opt

    m = PLANNER_PROMPTS
    budget = PER_PROMPT * m
    rng = np.random.default_rng(1)
    p = rng.uniform(0, 1, m)
    planners = {}
    for kind, ids in (("int", np.arange(m)), ("str", [f"prompt-{i}" for i in range(m)])):
        planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2,
                                          max_rollouts=MAX_ROLLOUTS)
        counts = planner.plan(ids, budget).counts
        planner.observe(np.repeat(np.asarray(ids), counts),
                        rng.random(int(counts.sum())) < np.repeat(p, counts))
        planners[kind] = (planner, ids)
        # The library's default planner, uniform allocation (the tracker still reads the ids).
        default = sera_opt.RolloutPlanner(max_rollouts=MAX_ROLLOUTS)
        default.observe(np.repeat(np.asarray(ids), counts),
                        rng.random(int(counts.sum())) < np.repeat(p, counts))
        planners[f"default {kind}"] = (default, ids)
    reward_rng = np.random.default_rng(2)

    def session(planner=planners["int"][0], ids=planners["int"][1]):
        spent = 0.0
        start = CLOCK()
        s = planner.start_rounds(ids, budget, rounds=4, observe=False)
        spent += CLOCK() - start
        while not s.done:
            start = CLOCK()
            counts = s.next_round()
            spent += CLOCK() - start
            s.record(reward_rng.random(int(counts.sum())) < 0.3)
        return spent

    policy = sera_opt.get_policy("sera", min_rollouts=MIN_ROLLOUTS, max_rollouts=MAX_ROLLOUTS)
    cases = {
        "np.sort": lambda: np.sort(p),
        "np.partition": lambda: np.partition(p, m // 2),
        "plan int ids": lambda: planners["int"][0].plan(planners["int"][1], budget),
        "plan str ids": lambda: planners["str"][0].plan(planners["str"][1], budget),
        "default plan int ids": lambda: planners["default int"][0].plan(planners["default int"][1],
                                                                        budget),
        "default plan str ids": lambda: planners["default str"][0].plan(planners["default str"][1],
                                                                        budget),
        "sera_opt.allocate": lambda: sera_opt.allocate(p, budget, min_rollouts=MIN_ROLLOUTS,
                                                       max_rollouts=MAX_ROLLOUTS),
        "policy.allocate": lambda: policy.allocate(p, budget),
    }
    cases.update(interim_cases(p, budget))
    medians = interleaved(cases, repeats, 0.02)
    # The session's own planning time (the rewards drawn between rounds are outside it).
    session()
    rounds = float(np.median([session() for _ in range(max(repeats, 15))]))
    medians["4-round session planning"] = rounds
    assert np.array_equal(
        sera_opt.allocate(p, budget, min_rollouts=MIN_ROLLOUTS, max_rollouts=MAX_ROLLOUTS).counts,
        policy.allocate(p, budget).counts), "allocate() and policy.allocate() disagree"
    if show:
        for name, seconds in medians.items():
            print(f"{name:26s} M={m:,d} {seconds * 1e6:10.1f} us", file=sys.stderr)
    return {"prompts": m, "budget": budget, "medians_s": medians,
            "allocate_vs_policy": medians["sera_opt.allocate"] / medians["policy.allocate"]}


def first_use(sizes, repeats: int, show: bool) -> list[dict]:
    """Fresh processes with an empty cache, each mode in turn for each size and repeat (so
    that a change of the machine's load touches both alike). ``step_s`` is the step's
    wall time; ``ready_s`` adds the wait for a kernel still compiling in a background
    process (``sera_opt.cache.wait_for_kernels``), which the process waits for before it ends
    so that the next one runs alone."""
    rows = []
    for m in sizes:
        runs: dict[str, list] = {mode: [] for mode, _ in FIRST_USE_MODES}
        for _ in range(repeats):
            for mode, setting in FIRST_USE_MODES:
                with tempfile.TemporaryDirectory(prefix="sera-opt-default-path-") as cache:
                    env = {**os.environ, "SERA_OPT_CACHE_DIR": cache,
                           BACKGROUND_ENV: setting}
                    env.pop("NUMBA_CACHE_DIR", None)
                    out = subprocess.run([sys.executable, "-c", _FIRST_USE, str(m)], env=env,
                                         capture_output=True, text=True, check=True,
                                         timeout=1800)
                run = json.loads(out.stdout.strip().splitlines()[-1])
                run["notices"] = [line for line in out.stderr.splitlines() if line.strip()]
                runs[mode].append(run)
                if show:
                    print(f"first use M={m} ({mode}): {run['step_s']:.1f} s, kernels ready "
                          f"after {run['ready_s']:.1f} s", file=sys.stderr)
        for mode, _ in FIRST_USE_MODES:
            rows.append({"prompts": m, "mode": mode, "runs": runs[mode],
                         "step_s": statistics.median(r["step_s"] for r in runs[mode]),
                         "ready_s": statistics.median(r["ready_s"] for r in runs[mode])})
    return rows


def main(argv=None) -> int:
    parser = _harness.common_parser("default-path", __doc__.split("\n\n")[0])
    # Whole numbers of at least 1, refused on the command line: 0 would read as "the
    # default" (15 rounds) or fail after the timings (a median of no first use).
    parser.add_argument("--repeats", type=_harness.at_least(1), default=None,
                        help="timing rounds per case (default 15, --quick 7)")
    parser.add_argument("--first-use-repeats", type=_harness.at_least(1), default=1,
                        help="fresh processes per first-use size (default 1)")
    parser.add_argument("--no-first-use", action="store_true",
                        help="skip the first-use processes")
    args = parser.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (7 if args.quick else 15)
    show = not args.no_progress
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = QUICK_SIZES if args.quick else SIZES
    kernels = measure_kernels(sizes, repeats, show)
    planner = measure_planner(repeats, show)
    first = [] if args.no_first_use else first_use(FIRST_USE_SIZES, args.first_use_repeats, show)
    payload = {
        "machine": {**_harness.machine_info(), "cpu_flags": cpu_flags()},
        "setup": {"sizes": list(sizes), "per_prompt": PER_PROMPT, "bounds": [MIN_ROLLOUTS,
                  MAX_ROLLOUTS], "repeats": repeats, "clock": "thread_cpu"},
        "targets": TARGETS, "kernels": kernels, "planner": planner, "first_use": first,
    }
    path = _harness.write_json(args.out, "default_path", payload)
    print(summary(payload))
    print(f"results: {path}")
    return 0


def summary(payload: dict) -> str:
    lines = ["| case | " + " | ".join(f"{m:,}" for m in payload["setup"]["sizes"]) + " |",
             "|---|" + "---|" * len(payload["setup"]["sizes"])]
    cases = list(dict.fromkeys(row["case"] for row in payload["kernels"]))
    for case in cases:
        cells = []
        for m in payload["setup"]["sizes"]:
            row = next(r for r in payload["kernels"] if r["case"] == case and r["prompts"] == m)
            cells.append(f"{_fmt(row['median_s'])} ({row['ratio_to_sort']:.1f}x)")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    planner = payload["planner"]
    lines.append("")
    for name, seconds in planner["medians_s"].items():
        lines.append(f"{name} at M = {planner['prompts']:,}: {_fmt(seconds)}")
    lines.append(f"allocate() / policy.allocate(): {planner['allocate_vs_policy']:.2f}")
    for row in payload["first_use"]:
        lines.append(f"first use, empty cache, M = {row['prompts']:,} ({row['mode']}): "
                     f"{row['step_s']:.1f} s; every kernel ready after {row['ready_s']:.1f} s")
    for mode, _ in FIRST_USE_MODES:
        steps = {row["prompts"]: row["step_s"] for row in payload["first_use"]
                 if row["mode"] == mode}
        if len(steps) == 2:
            small, large = sorted(steps)
            lines.append(f"first use ({mode}), M = {large:,} / M = {small:,}: "
                         f"{steps[large] / steps[small]:.2f}")
    return "\n".join(lines)


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_harness.run_command("default-path", main))
