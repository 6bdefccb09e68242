"""Solver and policy speed against two numpy baselines on the same array.

For each prompt count M: success probabilities uniform on (0, 1), budget 8 per
prompt, bounds 1..64 (the defaults of the target, docs/theory.md section 3). Every solver and
every registered policy (and the alpha-fair family at alpha = 0, 1, 2) is timed
(median of repeats, after a warm-up call that pays any JIT compilation), next to
two baselines timed in the same process on the same array: ``np.sort(p)`` and
``np.log1p(-p)``. The ratios are the numbers to read. Two baselines, because
their cost differs between CPUs in different ways: ``np.sort`` of a million
floats takes 5 ms where numpy dispatches an AVX-512 sort and several times that
without one, while ``log1p`` is a scalar loop almost everywhere; the JSON
records the CPU's features and numpy's dispatch targets so that figures from
different machines can be compared. Slow solvers run only while one call stays
under ``--max-seconds``.

Times are the calling thread's CPU time (``time.thread_time``): numpy's sort
and the numba kernels run on that thread, and its CPU time neither counts the
time a shared machine spends on other work nor the idle spinning of the MILP
solver's worker threads. The MILP solver itself runs on several threads, so it
is timed in wall time. JIT compilation is measured separately (wall time), in fresh
processes: the first with an empty numba cache (compile and store), the second
with that cache (load only).

    sera-opt bench solvers [--quick] [--out DIR] [--seed N]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from sera_opt.benchmarks import _harness

PER_PROMPT = 8
MIN_ROLLOUTS = 1
MAX_ROLLOUTS = 64
SOLVER_SIZES = (256, 4096, 65536, 1_000_000)
POLICY_SIZES = (1024, 65536, 1_000_000)
QUICK_SIZES = (256, 4096, 65536)
# How a call's time grows with M, to skip sizes that would exceed --max-seconds:
# the MILP solves about one program per distinct level, each at least linear in M.
GROWTH_EXPONENT = {"milp": 2.0}
CLOCK = time.thread_time
MULTITHREADED = {"milp"}  # timed in wall time instead

_COMPILE_SNIPPET = """
import json, time
import numpy as np
t0 = time.perf_counter()
import sera_opt
p = np.random.default_rng(0).uniform(0, 1, 1024)
t1 = time.perf_counter()
sera_opt.allocate(p, 8 * 1024, max_rollouts=64)
t2 = time.perf_counter()
sera_opt.allocate(p, 8 * 1024, max_rollouts=64)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t2 - t1, "second_call_s": t3 - t2}))
"""


def compile_times() -> dict:
    """First-call cost of the numba kernels: cold cache, then warm cache, in new processes."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "SERA_OPT_CACHE_DIR": cache}
        runs = {}
        for label in ("cold_cache", "warm_cache"):
            out = subprocess.run([sys.executable, "-c", _COMPILE_SNIPPET], env=env,
                                 capture_output=True, text=True, check=True)
            runs[label] = json.loads(out.stdout.strip().splitlines()[-1])
    runs["compile_s"] = runs["cold_cache"]["first_call_s"] - runs["cold_cache"]["second_call_s"]
    runs["cache_load_s"] = runs["warm_cache"]["first_call_s"] - runs["warm_cache"]["second_call_s"]
    return runs


# Extra arms: the alpha-fair family beside its default (policy name, options, label).
FAMILY = (("sera-fair", {"alpha": 0.0}, "sera-fair:alpha=0"),
          ("sera-fair", {"alpha": 2.0}, "sera-fair:alpha=2"))
# The targets this benchmark checks at M = 10^6 and 1024 (docs/benchmarks.md).
TARGETS = {"sera_vs_sort": 5.0, "sera_vs_log1p": 10.0, "sera_1024_s": 50e-6,
           "peers_vs_sort": 10.0, "active_set_vs_sera_1024": 5.0, "active_set_vs_sort": 10.0}
#: The active set, timed in the authors' setting: the mean-centred factor, positive counts
#: in [2, 4 N0] (N0 = PER_PROMPT), against the same policy without it. Label, policy,
#: options.
ACTIVE_SET = (
    ("sera:offset=1", "sera", {}),
    ("sera:active_threshold=0.05", "sera", {"active_threshold": 0.05}),
    ("sera-paper:rounding=exact", "sera-paper", {"rounding": "exact"}),
    ("sera-paper", "sera-paper", {}),
    ("sera:rounding=paper", "sera", {"rounding": "paper"}),
)
ACTIVE_SET_SIZES = (1024, 65536, 1_000_000)


def cpu_info() -> dict:
    """The CPU's flags and numpy's SIMD dispatch: what the baselines' speed depends on."""
    info: dict = {"flags": []}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    info["flags"] = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    info["avx2"] = "avx2" in info["flags"]
    info["avx512f"] = "avx512f" in info["flags"]
    try:
        from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_features__

        info["numpy_cpu_features"] = sorted(k for k, v in __cpu_features__.items() if v)
        info["numpy_cpu_baseline"] = list(__cpu_baseline__)
    except ImportError:  # numpy < 2 keeps them elsewhere
        pass
    try:
        from numpy.lib.introspect import opt_func_info

        dispatch = opt_func_info(func_name="^(log|log1p|exp)$", signature="float64")
        info["numpy_dispatch"] = {name: targets.get("dd", {}).get("current")
                                  for name, targets in dispatch.items()}
    except (ImportError, AttributeError):
        pass
    return info


def targets(rows: list[dict]) -> dict:
    """Each target with the measured figure and whether it is met (None if not measured)."""
    def find(kind, name, m):
        for r in rows:
            if r["kind"] == kind and r["name"] == name and r["prompts"] == m and "median_s" in r:
                return r
        return None

    out = {}
    big = find("solver", "waterline", 1_000_000)
    if big:
        out["sera_vs_sort"] = {"value": big["ratio_to_sort"],
                               "met": big["ratio_to_sort"] <= TARGETS["sera_vs_sort"]}
        out["sera_vs_log1p"] = {"value": big["ratio_to_log1p"],
                                "met": big["ratio_to_log1p"] <= TARGETS["sera_vs_log1p"]}
    small = find("policy", "sera", 1024)
    if small:
        out["sera_1024_s"] = {"value": small["median_s"],
                              "met": small["median_s"] <= TARGETS["sera_1024_s"]}
    peers = [r for r in rows if r["kind"] == "policy" and r["prompts"] == 1_000_000
             and "median_s" in r and _has_peer_target(r["name"])]
    for r in peers:
        out[f"{r['name']}_vs_sort"] = {"value": r["ratio_to_sort"],
                                      "met": r["ratio_to_sort"] <= TARGETS["peers_vs_sort"]}
    return out


def time_active_set(sizes, *, repeats: int, rng, show: bool) -> list[dict]:
    """The active-set rule's cost (:data:`ACTIVE_SET`): each arm's median time, its ratio
    to the same SERA without an active set and to ``np.sort`` of the same array, both
    measured in this run."""
    import sera_opt

    rows = []
    for m in _harness.progress(sizes, desc="active set", enabled=show):
        p = instance(m, rng)
        budget = PER_PROMPT * m
        sort = _harness.median_time(lambda p=p: np.sort(p), repeats=repeats, min_time=0.05,
                                    clock=CLOCK)
        base = None
        for label, name, options in ACTIVE_SET:
            policy = sera_opt.get_policy(name, offset=1, min_rollouts=2, max_ratio=4.0,
                                         **options)

            def call(p=p, budget=budget, policy=policy):
                return policy.allocate(p, budget)

            first = call()  # warm-up: compiled kernels load here
            timing = _harness.median_time(call, repeats=repeats, min_time=0.02, warmup=0,
                                          clock=CLOCK)
            if base is None:
                base = timing["median"]
            active = first.num_active
            row = {"kind": "active-set", "name": label, "prompts": m,
                   "median_s": timing["median"], "repeats": timing["repeats"],
                   "sort_median_s": sort["median"],
                   "ratio_to_sort": timing["median"] / sort["median"],
                   "ratio_to_sera": timing["median"] / base, "active_prompts": active,
                   "forced": 0 if first.active_set is None else first.active_set.forced,
                   "min_factor": first.min_factor, "clock": "thread_cpu"}
            rows.append(row)
            if show:
                print(f"active-set {label:28s} M={m:>9,d}  {timing['median'] * 1e3:10.3f} ms  "
                      f"{row['ratio_to_sort']:8.2f} x sort  {row['ratio_to_sera']:6.2f} x sera "
                      f"(active {active:,})", file=sys.stderr)
    return rows


def active_set_targets(rows: list[dict]) -> dict:
    """The active set's targets: within 5x the same SERA at 1,024 prompts, within 10x
    ``np.sort`` at 10^6 (the library's exact rounding, the default of the option)."""
    out = {}
    for r in rows:
        if r["name"] != "sera:active_threshold=0.05":
            continue
        if r["prompts"] == 1024:
            out["active_set_vs_sera_1024"] = {
                "value": r["ratio_to_sera"],
                "met": r["ratio_to_sera"] <= TARGETS["active_set_vs_sera_1024"]}
        if r["prompts"] == 1_000_000:
            out["active_set_vs_sort"] = {"value": r["ratio_to_sort"],
                                         "met": r["ratio_to_sort"] <= TARGETS["active_set_vs_sort"]}
    return out


def _has_peer_target(label: str) -> bool:
    """Whether a policy row is held to the peers' 10x: the peers' rules (their classes live
    in ``sera_opt.policies.peers``) and ``sera-fair`` with its family arms; SERA has its
    own targets, and the other policies of sera_opt (``uniform``, ``sera-bayes``) none."""
    from sera_opt.policies import POLICIES

    name = label.partition(":")[0]
    return name == "sera-fair" or POLICIES.lookup(name).__module__ == "sera_opt.policies.peers"


def instance(m: int, rng: np.random.Generator) -> np.ndarray:
    # Open interval: p = 0 would pin a prompt at the maximum, which is not the case timed here.
    return rng.uniform(np.finfo(float).tiny, 1.0, m)


def time_allocators(sizes, *, max_seconds: float, repeats: int, rng, show: bool) -> list[dict]:
    import sera_opt

    rows = []
    # The reference solvers go last at each size: HiGHS leaves worker threads that
    # compete for the cores for a while after a solve.
    solvers = sorted(sera_opt.available_solvers(), key=lambda n: n in ("greedy", "milp"))
    allocators = [("solver", name, None) for name in solvers if name not in ("greedy", "milp")]
    allocators += [("solver", "waterline:continuous=False", None)]
    allocators += [("policy", name, (name, {})) for name in sera_opt.available_policies()]
    allocators += [("policy", label, (name, options)) for name, options, label in FAMILY]
    allocators += [("solver", name, None) for name in solvers if name in ("greedy", "milp")]
    too_slow: set[tuple[str, str]] = set()
    # Allocators called once already in this process: a first call may compile kernels
    # (numba, after an edit or on a fresh install), so its time says nothing of a call's.
    called: set[tuple[str, str]] = set()
    for m in _harness.progress(sizes, desc="sizes", enabled=show):
        p = instance(m, rng)
        budget = PER_PROMPT * m
        sort = _harness.median_time(lambda p=p: np.sort(p), repeats=repeats, min_time=0.05,
                                    clock=CLOCK)
        log1p = _harness.median_time(lambda p=p: np.log1p(-p), repeats=repeats, min_time=0.05,
                                     clock=CLOCK)
        for kind, name, spec in allocators:
            if kind == "policy" and m not in POLICY_SIZES and m not in QUICK_SIZES:
                continue
            if (kind, name) in too_slow:
                rows.append({"kind": kind, "name": name, "prompts": m, "skipped": "too slow"})
                continue
            if kind == "solver":
                solver, _, option = name.partition(":")
                options = {"continuous": False} if option == "continuous=False" else {}

                def call(p=p, budget=budget, solver=solver, options=options):
                    return sera_opt.allocate(p, budget, min_rollouts=MIN_ROLLOUTS,
                                             max_rollouts=MAX_ROLLOUTS, solver=solver, **options)
            else:
                policy = sera_opt.get_policy(spec[0], **spec[1])
                # A policy of the mean-centred estimator (offset 1, e.g. sera-paper) needs
                # two rollouts a prompt: the lowest minimum its offset allows.
                low = max(MIN_ROLLOUTS, int(policy.offset) + 1)

                def call(p=p, budget=budget, policy=policy, low=low):
                    return policy.allocate(p, budget, min_rollouts=low,
                                           max_rollouts=MAX_ROLLOUTS)
            clock = time.perf_counter if name in MULTITHREADED else CLOCK
            start = clock()
            try:
                first = call()  # warm-up: pays JIT compilation or cache loading
            except sera_opt.SeraOptError as exc:  # e.g. a policy whose rule needs other bounds
                rows.append({"kind": kind, "name": name, "prompts": m, "skipped": str(exc)})
                too_slow.add((kind, name))
                continue
            first_s = clock() - start
            if first_s < max_seconds / 10 or (kind, name) not in called:
                # Cheap enough, or the allocator's first call in the process: time a call
                # without the warm-up.
                start = clock()
                call()
                first_s = clock() - start
            called.add((kind, name))
            reps = repeats if first_s < 1.0 else max(1, min(repeats, int(max_seconds // first_s)))
            timing = (_harness.median_time(call, repeats=reps, min_time=0.02, warmup=0,
                                           clock=clock)
                      if first_s < max_seconds / 10 else {"median": first_s, "repeats": 1})
            row = {
                "kind": kind,
                "name": name,
                "prompts": m,
                "median_s": timing["median"],
                "repeats": timing["repeats"],
                "sort_median_s": sort["median"],
                "ratio_to_sort": timing["median"] / sort["median"],
                "log1p_median_s": log1p["median"],
                "ratio_to_log1p": timing["median"] / log1p["median"],
                "clock": "wall" if name in MULTITHREADED else "thread_cpu",
                "min_factor": first.min_factor,
            }
            rows.append(row)
            if show:
                print(f"{kind:6s} {name:26s} M={m:>9,d}  {timing['median'] * 1e3:10.3f} ms  "
                      f"{row['ratio_to_sort']:8.2f} x sort  {row['ratio_to_log1p']:8.2f} x log1p",
                      file=sys.stderr)
            following = [s for s in sizes if s > m]
            if following:
                growth = (following[0] / m) ** GROWTH_EXPONENT.get(name, 1.1)
                if first_s * growth > max_seconds:
                    too_slow.add((kind, name))
    return rows


def plot(rows: list[dict], out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = sorted({(r["kind"], r["name"]) for r in rows if "median_s" in r})
    for kind, name in names:
        pts = sorted((r["prompts"], r["median_s"], r["ratio_to_sort"]) for r in rows
                     if r["kind"] == kind and r["name"] == name and "median_s" in r)
        m, t, ratio = zip(*pts)
        style = "-o" if kind == "solver" else "--s"
        ax_t.loglog(m, t, style, label=f"{kind}: {name}")
        ax_r.loglog(m, ratio, style, label=f"{kind}: {name}")
    sort_pts = sorted({(r["prompts"], r["sort_median_s"]) for r in rows if "median_s" in r})
    ax_t.loglog(*zip(*sort_pts), "k:", label="np.sort (baseline)")
    log_pts = sorted({(r["prompts"], r["log1p_median_s"]) for r in rows if "median_s" in r})
    ax_t.loglog(*zip(*log_pts), "k-.", label="np.log1p (baseline)")
    ax_r.axhline(5, color="gray", lw=0.8, ls=":")
    ax_t.set(xlabel="prompts M", ylabel="median seconds per call (thread CPU; milp: wall)",
             title="time per allocation")
    ax_r.set(xlabel="prompts M", ylabel="time / np.sort time", title="ratio to np.sort, same process")
    ax_t.legend(fontsize=7)
    return _harness.save_figure(fig, out_dir, "solvers")


def main(argv=None) -> int:
    parser = _harness.common_parser("solvers", __doc__.split("\n\n")[0])
    parser.add_argument("--max-seconds", type=_harness.positive, default=60.0,
                        help="stop timing a solver at larger M once one call takes this long")
    parser.add_argument("--repeats", type=_harness.at_least(1), default=7)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    sizes = QUICK_SIZES if args.quick else tuple(sorted(set(SOLVER_SIZES) | set(POLICY_SIZES)))
    show = not args.no_progress
    if show:
        # The compile is timed in fresh processes with nothing to show for a while: say so.
        print("timing the numba compile in two fresh processes (cold cache, then warm): "
              "about 10 to 30 s before the first timings", file=sys.stderr, flush=True)
    compile_info = compile_times()
    if show:
        print(f"numba compile (cold cache): {compile_info['compile_s']:.2f} s; with the cache: "
              f"{compile_info['cache_load_s']:.3f} s", file=sys.stderr)
    rows = time_allocators(sizes, max_seconds=args.max_seconds if not args.quick else 5.0,
                           repeats=args.repeats if not args.quick else 3, rng=rng, show=show)
    active_rows = time_active_set(ACTIVE_SET_SIZES[:1] if args.quick else ACTIVE_SET_SIZES,
                                  repeats=args.repeats if not args.quick else 3, rng=rng,
                                  show=show)
    met = {**targets(rows), **active_set_targets(active_rows)}
    rows = rows + active_rows
    payload = {
        "setup": {"per_prompt": PER_PROMPT, "min_rollouts": MIN_ROLLOUTS,
                  "max_rollouts": MAX_ROLLOUTS, "success_probs": "uniform(0, 1)",
                  "seed": args.seed, "quick": args.quick},
        "cpu": cpu_info(),
        "compile": compile_info,
        "targets": {"goals": TARGETS, "measured": met},
        "results": rows,
    }
    path = _harness.write_json(args.out, "solvers", payload)
    png = plot(rows, args.out)
    print(_summary(rows, met, payload["cpu"]))
    print(f"wrote {path} and {png}")
    return 0


def _summary(rows: list[dict], met: dict, cpu: dict) -> str:
    """The M = 10^6 and M = 1024 lines and the targets, as a table on stdout."""
    lines = [f"CPU: avx2={cpu.get('avx2')} avx512f={cpu.get('avx512f')}; numpy log/log1p "
             f"dispatch: {cpu.get('numpy_dispatch')}"]
    for m in (1024, 1_000_000):
        sel = [r for r in rows if r["prompts"] == m and "median_s" in r]
        if not sel:
            continue
        lines.append(f"M = {m:,}: np.sort {sel[0]['sort_median_s'] * 1e3:.3f} ms, "
                     f"np.log1p {sel[0]['log1p_median_s'] * 1e3:.3f} ms")
        for r in sel:
            if r["kind"] == "active-set":
                lines.append(f"  active set {r['name']:28s} {r['median_s'] * 1e3:10.3f} ms  "
                             f"{r['ratio_to_sort']:7.2f} x sort  {r['ratio_to_sera']:6.2f} x "
                             f"sera:offset=1")
                continue
            lines.append(f"  {r['kind']:6s} {r['name']:26s} {r['median_s'] * 1e3:10.3f} ms  "
                         f"{r['ratio_to_sort']:7.2f} x sort  {r['ratio_to_log1p']:7.2f} x log1p")
    for key, value in met.items():
        goal = TARGETS.get(key, TARGETS["peers_vs_sort"])
        if key.endswith("_s"):
            shown, goal_shown = f"{value['value'] * 1e6:.1f} us", f"{goal * 1e6:g} us"
        else:
            shown, goal_shown = f"{value['value']:.2f}x", f"{goal:g}x"
        lines.append(f"target {key}: {shown} (goal {goal_shown}): "
                     f"{'met' if value['met'] else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
