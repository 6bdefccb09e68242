"""First use: what a new process with an empty kernel cache pays, and where it goes.

A fresh process with an empty kernel cache (a new temporary ``SERA_OPT_CACHE_DIR``)
runs a first step of the planner by estimates, ``RolloutPlanner("sera-fair",
alpha=1.0, offset=1, min_rollouts=2).plan(ids, 8 M)`` for M prompts (the planner's
default until the cost rule of docs/benchmarks.md made it uniform allocation, which
compiles nothing),
``observe`` of the rollouts' rewards, and ``plan`` again. A second fresh process
with the now warm cache runs the same step: the difference is the compile time, the
warm figure is the cost of loading the cache. In the cold process numba's compile
events are recorded, so the time is reported per kernel and type signature
(inclusive of the kernels it calls, which numba compiles on the way; exclusive time
subtracts those). Baselines, timed in each process: ``import numpy`` (already
loaded; so instead one ``np.sort`` of 10^6 floats) and the import of numba itself.

The target (under 10 s) is for M = 64, a new user's first batch. Larger batches
solve by other kernels (the policy hands out up to
``STEPWISE_MAX_SPARE`` rollouts one at a time, more by the bracket search, from a
subsample at ``CLOSED_SUBSAMPLE_FROM`` prompts and more), so their first use
compiles more; ``--prompts`` measures them too (default 64, 256 and 1,024).

    sera-opt bench first-use [--quick] [--out DIR] [--repeats K] [--prompts 64,256]

``--quick`` runs one cold process for M = 64 only; by default each size runs three
times (three empty caches) and reports the median.

Every kernel is compiled in the measured process (``SERA_OPT_BACKGROUND_COMPILE=0``),
so that each one's compile time is recorded; what a new user meets by default, where
a larger spare's bracket search compiles in a background process while the
one-at-a-time kernel serves, is measured by ``sera-opt bench default-path``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from sera_opt.cache import BACKGROUND_COMPILE_ENV as BACKGROUND_ENV

from . import _harness

M = 64
SIZES = (64, 256, 1024)
PER_PROMPT = 8
TARGET_S = 10.0  # target for M = 64: plan + observe + plan in a fresh process, empty cache

_STEP = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
rng = np.random.default_rng(0)
x = rng.random(1_000_000)
s0 = time.perf_counter(); np.sort(x); sort_s = time.perf_counter() - s0
n0 = time.perf_counter(); import numba; numba_import_s = time.perf_counter() - n0
events = []
if sys.argv[1] == "record":
    from numba.core import event
    recorder = event.RecordingListener()
    event.register("numba:compile", recorder)
import sera_opt
t1 = time.perf_counter()
planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)
ids = np.arange(%(m)d)
first = planner.plan(ids, %(budget)d)
t2 = time.perf_counter()
rewards = (rng.random(int(first.counts.sum())) < 0.3).astype(np.float64)
planner.observe(np.repeat(ids, first.counts), rewards)
t3 = time.perf_counter()
second = planner.plan(ids, %(budget)d)
t4 = time.perf_counter()
if sys.argv[1] == "record":
    stack = []
    for stamp, ev in recorder.buffer:
        if ev.is_start:
            stack.append((stamp, ev, []))
            continue
        start, begun, children = stack.pop()
        d = begun.data["dispatcher"]
        total = stamp - start
        row = {"kernel": d.py_func.__module__ + "." + d.py_func.__qualname__,
               "signature": str(begun.data["args"]), "depth": len(stack),
               "inclusive_s": total, "exclusive_s": total - sum(children)}
        events.append(row)
        if stack:
            stack[-1][2].append(total)
print(json.dumps({"sort_1e6_s": sort_s, "numba_import_s": numba_import_s,
                  "import_s": t1 - t0, "plan_s": t2 - t1, "observe_s": t3 - t2,
                  "plan_again_s": t4 - t3, "step_s": t4 - t1,
                  "counts": second.counts.tolist(), "events": events}))
"""


def _run(cache: str, mode: str, m: int) -> dict:
    env = {**os.environ, "SERA_OPT_CACHE_DIR": cache, BACKGROUND_ENV: "0"}
    env.pop("NUMBA_CACHE_DIR", None)
    code = _STEP % {"m": m, "budget": PER_PROMPT * m}
    out = subprocess.run([sys.executable, "-c", code, mode], env=env, capture_output=True,
                         text=True, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _per_kernel(events: list[dict]) -> list[dict]:
    """Exclusive compile time per kernel (all its signatures), largest first."""
    table: dict[str, dict] = {}
    for row in events:
        entry = table.setdefault(row["kernel"], {"kernel": row["kernel"], "exclusive_s": 0.0,
                                                 "signatures": 0})
        entry["exclusive_s"] += row["exclusive_s"]
        entry["signatures"] += 1
    return sorted(table.values(), key=lambda r: -r["exclusive_s"])


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompts takes prompt counts separated by commas, e.g. 64,256; got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--prompts counts must be at least 1, got {text!r}")
    return sizes


def _measure(m: int, repeats: int) -> dict:
    """``repeats`` cold processes (each with an empty cache, the first recording the
    compile events) and a warm one after each, for a batch of ``m`` prompts."""
    cold, warm = [], []
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="sera-opt-first-use-") as cache:
            cold.append(_run(cache, "record" if r == 0 else "plain", m))
            warm.append(_run(cache, "plain", m))
        print(f"  M = {m}, run {r + 1}/{repeats}: cold step {cold[-1]['step_s']:.1f} s, warm "
              f"step {warm[-1]['step_s']:.2f} s", file=sys.stderr)
    assert all(c["counts"] == cold[0]["counts"] for c in cold + warm), "runs disagree"
    median = {key: statistics.median(run[key] for run in cold)
              for key in ("plan_s", "observe_s", "plan_again_s", "step_s", "sort_1e6_s",
                          "numba_import_s")}
    warm_median = {key: statistics.median(run[key] for run in warm)
                   for key in ("plan_s", "observe_s", "plan_again_s", "step_s", "sort_1e6_s")}
    return {
        "prompts": m, "budget": PER_PROMPT * m, "repeats": repeats,
        "cold": median, "warm": warm_median,
        "cold_runs_s": [run["step_s"] for run in cold],
        "cold_vs_sort": median["step_s"] / median["sort_1e6_s"],
        "cold_vs_numba_import": median["step_s"] / median["numba_import_s"],
        "compiled_signatures": len(cold[0]["events"]),
        "per_kernel": _per_kernel(cold[0]["events"]), "events": cold[0]["events"],
    }


def main(argv=None) -> int:
    parser = _harness.common_parser("first-use", __doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=_harness.at_least(1), default=None,
                        help="cold processes per size, each with an empty cache (default 3, "
                             "--quick 1)")
    parser.add_argument("--prompts", type=_sizes, default=None,
                        help="batch sizes M, separated by commas (default "
                             f"{','.join(map(str, SIZES))}; --quick {M})")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    sizes = args.prompts or ((M,) if args.quick else SIZES)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [_measure(m, repeats) for m in sizes]
    payload = {
        "machine": _harness.machine_info(),
        "setup": {"per_prompt": PER_PROMPT, "sizes": list(sizes), "repeats": repeats,
                  "policy": "RolloutPlanner('sera-fair', alpha=1.0, offset=1, min_rollouts=2)",
                  "target_prompts": M},
        "target_s": TARGET_S, "sizes": results,
    }
    path = _harness.write_json(args.out, "first_use", payload)
    for row in results:
        cold, warm = row["cold"], row["warm"]
        target = f"; target {TARGET_S:.0f} s" if row["prompts"] == M else ""
        print(f"M = {row['prompts']}, empty cache: plan {cold['plan_s']:.1f} s + observe "
              f"{cold['observe_s']:.1f} s + plan {cold['plan_again_s']:.2f} s = "
              f"{cold['step_s']:.1f} s ({row['cold_vs_sort']:.0f}x np.sort of 1e6 floats, "
              f"{row['cold_vs_numba_import']:.0f}x import numba{target}); warm cache: "
              f"{warm['step_s']:.2f} s")
        print(f"  {row['compiled_signatures']} kernel signatures compiled; exclusive time per "
              "kernel:")
        for kernel in row["per_kernel"][:10]:
            print(f"  {kernel['exclusive_s']:6.2f} s  {kernel['kernel']} ({kernel['signatures']} "
                  f"signature{'s' if kernel['signatures'] > 1 else ''})")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_harness.run_command("first-use", main))
