"""Benchmark: the MaxRL advantages against one ``index_add_`` over the same tensors.

``sera_opt.maxrl_advantages`` does one comparison, one integer add, one
histogram and one gather over the N rollouts (plus O(M) work per prompt, and a
few reductions when validating). Sparse ids (hashes, too wide for a direct
table) first get compact slots from the hashing rounds of
``sera_opt.estimator.hashing``: one scatter and one gather per rollout and
round, no sort of the rollouts. Targets, at N = 1,000,000 rollouts over
M = 100,000 prompts: the dense paths within 3x of a single
``torch.zeros(M).index_add_(0, prompt_index, rewards)``, the sparse-id path
within 5x, with memory O(N + M).

Method
------
* Cases: dense ids (0..M-1, shuffled; the default call, ``num_prompts``, and
  ``validate=False``), and the same prompts under sparse ids: an arithmetic
  progression ``id * 1,000,003 + 7`` (a best case for multiplicative hashing,
  no collisions) and random 64-bit ids (hash-like: about 16 % of the rollouts
  lose their bucket in the first round at this size), the latter also through
  the sort-based reference path (``torch.unique`` of the rollouts, what
  sera_opt did before the hashing) for comparison. Every case is checked to
  give the default call's advantages bit for bit before anything is timed.
* Time: every round times the baseline and each variant once, in turn, in the
  same process (so that load from other processes hits all of them alike); we
  report medians over the rounds of both wall time and process CPU time
  (``time.process_time``, which excludes time the process spends descheduled:
  the right measure on a shared machine, with one torch thread by default).
  Each case's ratio to the baseline is the ratio of the two medians; beside it
  the median of the rounds' own ratios (a round's time over the baseline's in
  the same round) is printed with a distribution-free 95 % interval (binomial
  order statistics), since a slow or fast stretch of the machine moves both
  members of a round.
  The machine's load average at the start and end is recorded with the results.
* First call: the sparse path on CPU uses numba kernels, compiled on first use
  and cached on disk; the wall time of the very first sparse call in the
  process (loading numba, and compiling unless cached) is reported separately.
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
  included; numpy arrays inside the numba path are not seen).

Run ``python benchmarks/estimator.py`` (or ``sera-opt bench estimator``);
``--quick`` uses N = 100,000 and M = 10,000.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys
import time

import numpy as np

from sera_opt.benchmarks import _harness

NAME = "estimator"


def _parser():
    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=_harness.at_least(1), default=None,
                        help="N (default 1,000,000; 100,000 with --quick)")
    parser.add_argument("--prompts", type=_harness.at_least(1), default=None,
                        help="M (default N / 10)")
    parser.add_argument("--rounds", type=_harness.at_least(1), default=None,
                        help="timing rounds (default 41; 15 with --quick)")
    parser.add_argument("--threads", type=_harness.at_least(1), default=1,
                        help="torch CPU threads (default 1)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the tensors (default cpu; 'cuda' times the GPU "
                             "path with a synchronisation around every call, by wall time)")
    return parser


def _make_batch(torch, num_rollouts, num_prompts, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    # Every prompt gets at least one rollout; the rest are spread at random, and
    # the rollouts are shuffled so that groups are not contiguous.
    extra = torch.randint(0, num_prompts, (num_rollouts - num_prompts,), generator=g)
    ids = torch.cat([torch.arange(num_prompts), extra])
    ids = ids[torch.randperm(num_rollouts, generator=g)]
    probs = torch.rand(num_prompts, generator=g)
    rewards = torch.bernoulli(probs[ids], generator=g)
    # Hash-like prompt ids: distinct random 64-bit values (redrawn until distinct).
    keys = torch.randint(-(2**63), 2**63 - 1, (num_prompts,), generator=g)
    while torch.unique(keys).numel() < num_prompts:
        keys = torch.randint(-(2**63), 2**63 - 1, (num_prompts,), generator=g)
    return rewards.to(device), ids.to(device), keys[ids].to(device)


BASELINE = "index_add_ (baseline)"
DENSE = "maxrl_advantages (default)"
SPARSE_CASES = ("sparse ids, progression (hashed)", "sparse ids, random 64-bit (hashed)",
                "sparse ids, random 64-bit (sort reference)")


def _sort_reference(sera_opt, rewards, ids):
    """The advantages by the sort-based slots (torch.unique of the rollouts)."""
    from sera_opt.estimator.groups import sorted_sparse_slots

    with sorted_sparse_slots():
        return sera_opt.maxrl_advantages(rewards, ids)


def _cases(torch, sera_opt, rewards, ids, hashes, num_prompts):
    progression = ids * 1_000_003 + 7
    return {
        BASELINE: lambda: torch.zeros(num_prompts, device=ids.device).index_add_(0, ids, rewards),
        DENSE: lambda: sera_opt.maxrl_advantages(rewards, ids),
        "num_prompts=M": lambda: sera_opt.maxrl_advantages(rewards, ids,
                                                           num_prompts=num_prompts),
        "num_prompts=M, validate=False": lambda: sera_opt.maxrl_advantages(
            rewards, ids, num_prompts=num_prompts, validate=False),
        "success_average, uncorrected": lambda: sera_opt.maxrl_advantages(
            rewards, ids, estimator="success_average", multiplicity_correction=False),
        SPARSE_CASES[0]: lambda: sera_opt.maxrl_advantages(rewards, progression),
        SPARSE_CASES[1]: lambda: sera_opt.maxrl_advantages(rewards, hashes),
        SPARSE_CASES[2]: lambda: _sort_reference(sera_opt, rewards, hashes),
    }


def _no_sync():
    return None


def _time_rounds(cases, rounds, show, sync=_no_sync):
    """Interleaved rounds: per case, lists of wall and CPU seconds and page faults.

    ``sync`` waits for the device (``torch.cuda.synchronize`` on a GPU), before
    each timing starts and before it stops.
    """
    for func in cases.values():  # warm up
        func()
    wall = {k: [] for k in cases}
    cpu = {k: [] for k in cases}
    faults = {k: [] for k in cases}
    for _ in _harness.progress(range(rounds), desc="rounds", enabled=show):
        for name, func in cases.items():
            sync()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0, w0 = time.process_time(), time.perf_counter()
            out = func()
            sync()
            w1, c1 = time.perf_counter(), time.process_time()
            del out
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            wall[name].append(w1 - w0)
            cpu[name].append(c1 - c0)
    return wall, cpu, faults


def _summarise(wall, cpu, faults, baseline):
    """Per case: medians, their ratio to the baseline's (the judged ratio), and the median
    of the rounds' own ratios (each round's time over the baseline's in that round) with
    a distribution-free 95 % interval: a slow or fast stretch of the machine moves both
    members of a round, so the paired ratio is the steadier of the two."""
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
        for measure, times in (("wall", wall), ("cpu", cpu)):
            paired = _harness.median_interval(np.asarray(times[name]) / np.asarray(times[baseline]))
            rows[name][f"{measure}_paired_ratio"] = paired["median"]
            rows[name][f"{measure}_paired_ratio_ci95"] = [paired["ci_low"], paired["ci_high"]]
    return rows


def _peak_bytes(torch, func, device=None):
    """Peak of allocated-minus-freed bytes during ``func()``: from the CPU profiler's
    memory events, or from the CUDA caching allocator's statistics on a GPU."""
    if device is not None and device.type == "cuda":
        func()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = func()
        torch.cuda.synchronize(device)
        del out
        return int(torch.cuda.max_memory_allocated(device) - before)
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


def _plot(sweep, out_dir, measure="cpu"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row["rollouts"] for row in sweep]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(sizes, [row[f"{measure}_ratio"] for row in sweep], "o-", label="dense ids")
    left.plot(sizes, [row[f"sparse_{measure}_ratio"] for row in sweep], "s-",
              label="random 64-bit ids (hashed)")
    left.axhline(3.0, color="C0", lw=1, ls=":", label="target 3x (dense)")
    left.axhline(5.0, color="C1", lw=1, ls=":", label="target 5x (sparse)")
    left.set_xscale("log")
    left.set_xlabel("rollouts N (M = N / 10)")
    left.set_ylabel(f"{measure} time / index_add_ {measure} time")
    left.set_title("maxrl_advantages vs one index_add_")
    left.legend(fontsize=8)
    right.plot(sizes, [row["peak_bytes"] / row["rollouts"] for row in sweep], "o-",
               label="dense ids")
    right.plot(sizes, [row["sparse_peak_bytes"] / row["rollouts"] for row in sweep], "s-",
               label="random 64-bit ids (torch tensors only)")
    right.plot(sizes, [row["baseline_peak_bytes"] / row["rollouts"] for row in sweep], "^--",
               label="index_add_")
    right.set_xscale("log")
    right.set_xlabel("rollouts N (M = N / 10)")
    right.set_ylabel("peak extra bytes per rollout")
    right.set_title("memory is O(N + M)")
    right.legend(fontsize=8)
    fig.tight_layout()
    return _harness.save_figure(fig, out_dir, NAME)


def _cpu_caches() -> dict[str, str]:
    """The CPU's cache sizes (Linux sysfs), on which these ratios depend; empty elsewhere."""
    caches = {}
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(root)):
            if not entry.startswith("index"):
                continue
            with open(f"{root}/{entry}/level") as fh:
                level = fh.read().strip()
            with open(f"{root}/{entry}/type") as fh:
                kind = fh.read().strip()
            with open(f"{root}/{entry}/size") as fh:
                caches[f"L{level} {kind}"] = fh.read().strip()
    except OSError:
        pass
    return caches


def _sparse_backend(num_rollouts: int) -> str:
    """How the sparse-id path assigns slots at this size on CPU."""
    from sera_opt.estimator.groups import sparse_slot_method

    return sparse_slot_method(num_rollouts)


def _first_sparse_call(sera_opt, rewards, hashes, sync=_no_sync) -> float:
    """Wall seconds of the process's first sparse-id call (on CPU: numba loaded, kernels
    compiled or read from the cache), before anything else has run."""
    sync()
    start = time.perf_counter()
    sera_opt.maxrl_advantages(rewards, hashes)
    sync()
    return time.perf_counter() - start


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
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else _no_sync
    # On a GPU the host's CPU time means nothing: ratios are of wall time there.
    measure = "wall" if on_gpu else "cpu"

    rewards, ids, hashes = _make_batch(torch, num_rollouts, num_prompts, args.seed, device)
    first_call = _first_sparse_call(sera_opt, rewards, hashes, sync)
    cases = _cases(torch, sera_opt, rewards, ids, hashes, num_prompts)
    reference = cases[DENSE]()
    for name, func in cases.items():
        if name in (BASELINE, "success_average, uncorrected"):
            continue  # another quantity; the tests check it against its reference
        if not torch.equal(func(), reference):
            raise AssertionError(f"{name} disagrees with the default path")

    default_alloc = _summarise(*_time_rounds(cases, rounds, show, sync), BASELINE)
    memory = {name: _peak_bytes(torch, func, device) for name, func in cases.items()}
    # The CUDA caching allocator already keeps freed memory.
    retained = not on_gpu and _retain_freed_memory()
    retain_alloc = (_summarise(*_time_rounds(cases, rounds, show, sync), BASELINE)
                    if retained else None)

    sweep = []
    if on_gpu:
        sizes = [100_000, 1_000_000] if args.quick else [100_000, 1_000_000, 10_000_000]
    else:
        sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000, 4_000_000]
    for n in _harness.progress(sizes, desc="sweep", enabled=show):
        m = max(1, n // 10)
        r, i, h = _make_batch(torch, n, m, args.seed, device)
        small = {BASELINE: lambda r=r, i=i, m=m: torch.zeros(m, device=device).index_add_(0, i, r),
                 "default": lambda r=r, i=i: sera_opt.maxrl_advantages(r, i),
                 "sparse": lambda r=r, h=h: sera_opt.maxrl_advantages(r, h)}
        rows = _summarise(*_time_rounds(small, max(7, rounds // 2), False, sync), BASELINE)
        sweep.append({"rollouts": n, "prompts": m,
                      "cpu_median_s": rows["default"]["cpu_median_s"],
                      "wall_median_s": rows["default"]["wall_median_s"],
                      "baseline_cpu_median_s": rows[BASELINE]["cpu_median_s"],
                      "baseline_wall_median_s": rows[BASELINE]["wall_median_s"],
                      "cpu_ratio": rows["default"]["cpu_ratio"],
                      "wall_ratio": rows["default"]["wall_ratio"],
                      "sparse_cpu_median_s": rows["sparse"]["cpu_median_s"],
                      "sparse_wall_median_s": rows["sparse"]["wall_median_s"],
                      "sparse_cpu_ratio": rows["sparse"]["cpu_ratio"],
                      "sparse_wall_ratio": rows["sparse"]["wall_ratio"],
                      "peak_bytes": _peak_bytes(torch, small["default"], device),
                      "sparse_peak_bytes": _peak_bytes(torch, small["sparse"], device),
                      "baseline_peak_bytes": _peak_bytes(torch, small[BASELINE], device)})

    ratios = {label: {name: row[f"{measure}_ratio"] for name, row in rows.items()}
              for label, rows in (("default_allocator", default_alloc),
                                  ("retained_memory_allocator", retain_alloc)) if rows}
    payload = {
        "command": "python benchmarks/estimator.py " + " ".join(argv if argv is not None
                                                               else sys.argv[1:]),
        "rollouts": num_rollouts, "prompts": num_prompts, "rounds": rounds,
        "threads": args.threads, "seed": args.seed, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if on_gpu else None,
        "ratios_of": f"{measure} time",
        "cpu_caches": _cpu_caches(),
        "load_average": {"start": load_start,
                         "end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "targets": {"dense_cpu_ratio": 3.0, "sparse_cpu_ratio": 5.0},
        "ratios": ratios,
        "sparse_backend": _sparse_backend(num_rollouts),
        "first_sparse_call_wall_s": first_call,
        "default_allocator": default_alloc,
        "retained_memory_allocator": retain_alloc,
        "peak_bytes": memory,
        "sweep": sweep,
    }
    path = _harness.write_json(args.out, NAME, payload)
    figure = _plot(sweep, args.out, measure)

    print(f"N = {num_rollouts:,} rollouts, M = {num_prompts:,} prompts on {device}, "
          f"{args.threads} thread(s), {rounds} rounds; medians, ratios to the baseline "
          f"(targets on CPU: dense 3x, sparse 5x)")
    header = f"{'case':44s} {'CPU ms':>8s} {'ratio':>6s} {'wall ms':>8s} {'ratio':>6s} " \
             f"{'faults':>7s} {'peak MB':>8s}  {measure} paired ratio [95 % CI]"
    for label, rows in (("default allocator", default_alloc),
                        ("freed memory retained", retain_alloc)):
        if rows is None:
            print(f"\n{label}: not available on this platform")
            continue
        print(f"\n{label}\n{header}")
        for name, row in rows.items():
            low, high = row[f"{measure}_paired_ratio_ci95"]
            print(f"{name:44s} {row['cpu_median_s'] * 1e3:8.2f} {row['cpu_ratio']:6.2f} "
                  f"{row['wall_median_s'] * 1e3:8.2f} {row['wall_ratio']:6.2f} "
                  f"{row['page_faults_per_call']:7.0f} {memory[name] / 1e6:8.2f}  "
                  f"{row[f'{measure}_paired_ratio']:.2f} [{low:.2f}, {high:.2f}]")
    print(f"\nfirst sparse call in the process (numba loaded, kernels compiled or cached): "
          f"{first_call:.2f} s wall; sparse path: {payload['sparse_backend']}")
    print("\nsweep (" + ("freed memory retained" if retained else "default allocator")
          + f"; sparse = random 64-bit ids; {measure} time):")
    for row in sweep:
        print(f"  N = {row['rollouts']:>10,}: default {row[f'{measure}_median_s'] * 1e3:.3f} ms "
              f"(ratio {row[f'{measure}_ratio']:.2f}), sparse "
              f"{row[f'sparse_{measure}_median_s'] * 1e3:.3f} ms "
              f"(ratio {row[f'sparse_{measure}_ratio']:.2f}), index_add_ "
              f"{row[f'baseline_{measure}_median_s'] * 1e3:.3f} ms; peak "
              f"{row['peak_bytes'] / row['rollouts']:.1f} / "
              f"{row['sparse_peak_bytes'] / row['rollouts']:.1f} B/rollout "
              f"(index_add_: {row['baseline_peak_bytes'] / row['rollouts']:.1f})")
    print(f"\nwrote {path} and {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
