"""Benchmark: the MaxRL advantages against one ``index_add_`` over the same tensors.

``sera_opt.maxrl_advantages`` does one comparison, one integer add, one
histogram and one gather over the N rollouts (plus O(M) work per prompt, and a
few reductions when validating). The target is at most 3x the time of a
single ``torch.zeros(M).index_add_(0, prompt_index, rewards)`` at
N = 1,000,000 rollouts over M = 100,000 prompts, with memory O(N + M).

Method
------
* Time: every round times the baseline and each variant once, in turn, in the
  same process (so that load from other processes hits all of them alike); we
  report medians over the rounds of both wall time and process CPU time
  (``time.process_time``, which excludes time the process spends descheduled:
  the right measure on a shared machine, with one torch thread by default).
* Allocator: torch's CPU tensors come from glibc ``malloc``, which returns
  large freed blocks to the kernel, so a fresh O(N) temporary is paid again in
  page faults on every call. We time twice: with the process's default
  allocator, and after ``mallopt`` tells glibc to keep freed memory (what a
  caching allocator, e.g. torch's CUDA one, does in steady state). Minor page
  faults per call are reported with each.
* Memory: ``tracemalloc`` does not see torch's allocations, so we record them
  with ``torch.profiler`` (``profile_memory=True``): every CPU allocation and
  free is an event with its size, and the peak of their running sum during the
  call is the peak extra memory the call needs (inputs excluded, output
  included).

Run ``python benchmarks/estimator.py`` (or ``sera-opt bench estimator``);
``--quick`` uses N = 100,000 and M = 10,000.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
import time

import numpy as np

from sera_opt.benchmarks import _harness

NAME = "estimator"


def _parser():
    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=None,
                        help="N (default 1,000,000; 100,000 with --quick)")
    parser.add_argument("--prompts", type=int, default=None,
                        help="M (default N / 10)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timing rounds (default 41; 15 with --quick)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1)")
    return parser


def _make_batch(torch, num_rollouts, num_prompts, seed):
    g = torch.Generator().manual_seed(seed)
    # Every prompt gets at least one rollout; the rest are spread at random, and
    # the rollouts are shuffled so that groups are not contiguous.
    extra = torch.randint(0, num_prompts, (num_rollouts - num_prompts,), generator=g)
    ids = torch.cat([torch.arange(num_prompts), extra])
    ids = ids[torch.randperm(num_rollouts, generator=g)]
    probs = torch.rand(num_prompts, generator=g)
    rewards = torch.bernoulli(probs[ids], generator=g)
    return rewards, ids


def _cases(torch, sera_opt, rewards, ids, num_prompts):
    wide = ids * 1_000_003 + 7  # ids too sparse for a table: the torch.unique path
    return {
        "index_add_ (baseline)": lambda: torch.zeros(num_prompts).index_add_(0, ids, rewards),
        "maxrl_advantages (default)": lambda: sera_opt.maxrl_advantages(rewards, ids),
        "num_prompts=M": lambda: sera_opt.maxrl_advantages(rewards, ids,
                                                           num_prompts=num_prompts),
        "num_prompts=M, validate=False": lambda: sera_opt.maxrl_advantages(
            rewards, ids, num_prompts=num_prompts, validate=False),
        "success_average, uncorrected": lambda: sera_opt.maxrl_advantages(
            rewards, ids, estimator="success_average", multiplicity_correction=False),
        "sparse ids (torch.unique)": lambda: sera_opt.maxrl_advantages(rewards, wide),
    }


def _time_rounds(cases, rounds, show):
    """Interleaved rounds: per case, lists of wall and CPU seconds and page faults."""
    for func in cases.values():  # warm up
        func()
    wall = {k: [] for k in cases}
    cpu = {k: [] for k in cases}
    faults = {k: [] for k in cases}
    for _ in _harness.progress(range(rounds), desc="rounds", enabled=show):
        for name, func in cases.items():
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0, w0 = time.process_time(), time.perf_counter()
            out = func()
            w1, c1 = time.perf_counter(), time.process_time()
            del out
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            wall[name].append(w1 - w0)
            cpu[name].append(c1 - c0)
    return wall, cpu, faults


def _summarise(wall, cpu, faults, baseline):
    base_wall, base_cpu = np.median(wall[baseline]), np.median(cpu[baseline])
    rows = {}
    for name in wall:
        w, c = float(np.median(wall[name])), float(np.median(cpu[name]))
        rows[name] = {
            "wall_median_s": w, "wall_min_s": float(np.min(wall[name])),
            "cpu_median_s": c, "cpu_min_s": float(np.min(cpu[name])),
            "wall_ratio": w / base_wall, "cpu_ratio": c / base_cpu,
            "page_faults_per_call": float(np.median(faults[name])),
        }
    return rows


def _peak_bytes(torch, func):
    """Peak of allocated-minus-freed CPU bytes during ``func()``, from profiler events."""
    from torch.profiler import ProfilerActivity, profile

    func()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = func()
        del out
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return int(peak)


def _retain_freed_memory() -> bool:
    """Ask glibc to keep freed memory (no trimming, no per-block mmap); False if unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok_mmap = libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest allowed value
        ok_trim = libc.mallopt(m_trim_threshold, 1 << 30)
        return bool(ok_mmap and ok_trim)
    except (OSError, AttributeError):
        return False


def _plot(sweep, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row["rollouts"] for row in sweep]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(sizes, [row["cpu_ratio"] for row in sweep], "o-", label="CPU time")
    left.plot(sizes, [row["wall_ratio"] for row in sweep], "s--", label="wall time")
    left.axhline(3.0, color="grey", lw=1, ls=":", label="target 3x")
    left.set_xscale("log")
    left.set_xlabel("rollouts N (M = N / 10)")
    left.set_ylabel("time / index_add_ time")
    left.set_title("maxrl_advantages (default) vs one index_add_")
    left.legend()
    right.plot(sizes, [row["peak_bytes"] / row["rollouts"] for row in sweep], "o-",
               label="maxrl_advantages")
    right.plot(sizes, [row["baseline_peak_bytes"] / row["rollouts"] for row in sweep], "s--",
               label="index_add_")
    right.set_xscale("log")
    right.set_xlabel("rollouts N (M = N / 10)")
    right.set_ylabel("peak extra bytes per rollout")
    right.set_title("memory is O(N + M)")
    right.legend()
    fig.tight_layout()
    return _harness.save_figure(fig, out_dir, NAME)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    import torch

    import sera_opt

    torch.set_num_threads(args.threads)
    num_rollouts = args.rollouts or (100_000 if args.quick else 1_000_000)
    num_prompts = args.prompts or max(1, num_rollouts // 10)
    rounds = args.rounds or (15 if args.quick else 41)
    show = not args.no_progress
    if num_prompts > num_rollouts:
        raise SystemExit("--prompts must not exceed --rollouts (every prompt needs a rollout)")

    rewards, ids = _make_batch(torch, num_rollouts, num_prompts, args.seed)
    cases = _cases(torch, sera_opt, rewards, ids, num_prompts)
    baseline = "index_add_ (baseline)"
    reference = cases["maxrl_advantages (default)"]()
    for name in ("num_prompts=M", "num_prompts=M, validate=False", "sparse ids (torch.unique)"):
        if not torch.equal(cases[name](), reference):
            raise AssertionError(f"{name} disagrees with the default path")

    default_alloc = _summarise(*_time_rounds(cases, rounds, show), baseline)
    memory = {name: _peak_bytes(torch, func) for name, func in cases.items()}
    retained = _retain_freed_memory()
    retain_alloc = _summarise(*_time_rounds(cases, rounds, show), baseline) if retained else None

    sweep = []
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000, 4_000_000]
    for n in _harness.progress(sizes, desc="sweep", enabled=show):
        m = max(1, n // 10)
        r, i = _make_batch(torch, n, m, args.seed)
        small = {baseline: lambda r=r, i=i, m=m: torch.zeros(m).index_add_(0, i, r),
                 "default": lambda r=r, i=i: sera_opt.maxrl_advantages(r, i)}
        rows = _summarise(*_time_rounds(small, max(7, rounds // 2), False), baseline)
        sweep.append({"rollouts": n, "prompts": m,
                      "cpu_median_s": rows["default"]["cpu_median_s"],
                      "baseline_cpu_median_s": rows[baseline]["cpu_median_s"],
                      "cpu_ratio": rows["default"]["cpu_ratio"],
                      "wall_ratio": rows["default"]["wall_ratio"],
                      "peak_bytes": _peak_bytes(torch, small["default"]),
                      "baseline_peak_bytes": _peak_bytes(torch, small[baseline])})

    payload = {
        "command": "python benchmarks/estimator.py " + " ".join(argv if argv is not None
                                                               else sys.argv[1:]),
        "rollouts": num_rollouts, "prompts": num_prompts, "rounds": rounds,
        "threads": args.threads, "seed": args.seed,
        "default_allocator": default_alloc,
        "retained_memory_allocator": retain_alloc,
        "peak_bytes": memory,
        "sweep": sweep,
    }
    path = _harness.write_json(args.out, NAME, payload)
    figure = _plot(sweep, args.out)

    print(f"N = {num_rollouts:,} rollouts, M = {num_prompts:,} prompts, {args.threads} thread(s), "
          f"{rounds} rounds; medians, ratios to the baseline")
    header = f"{'case':34s} {'CPU ms':>8s} {'ratio':>6s} {'wall ms':>8s} {'ratio':>6s} " \
             f"{'faults':>7s} {'peak MB':>8s}"
    for label, rows in (("default allocator", default_alloc),
                        ("freed memory retained", retain_alloc)):
        if rows is None:
            print(f"\n{label}: not available on this platform")
            continue
        print(f"\n{label}\n{header}")
        for name, row in rows.items():
            print(f"{name:34s} {row['cpu_median_s'] * 1e3:8.2f} {row['cpu_ratio']:6.2f} "
                  f"{row['wall_median_s'] * 1e3:8.2f} {row['wall_ratio']:6.2f} "
                  f"{row['page_faults_per_call']:7.0f} {memory[name] / 1e6:8.2f}")
    print("\nsweep (default path, " + ("freed memory retained" if retained else "default allocator") + "):")
    for row in sweep:
        print(f"  N = {row['rollouts']:>9,}: CPU {row['cpu_median_s'] * 1e3:.3f} ms vs "
              f"{row['baseline_cpu_median_s'] * 1e3:.3f} ms, ratio {row['cpu_ratio']:.2f}, wall ratio "
              f"{row['wall_ratio']:.2f}, peak {row['peak_bytes'] / row['rollouts']:.1f} B/rollout "
              f"(index_add_: {row['baseline_peak_bytes'] / row['rollouts']:.1f})")
    print(f"\nwrote {path} and {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
