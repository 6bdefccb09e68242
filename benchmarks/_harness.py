"""Shared pieces of the benchmarks: options, timing, progress, results and plots.

Every benchmark exposes ``main(argv=None) -> int`` and is run as ``sera-opt
bench NAME`` or ``python -m sera_opt.benchmarks.NAME``. The speed benchmarks
are flat modules beside this one (``solvers``, ``estimator``, ``tracking``);
each experiment is a subpackage (``alignment``, ``maze``, ``arithmetic``) with
its task, model, training and runner. Results go to ``--out`` as
``NAME.json`` (machine-readable, with the machine's description) and
``NAME.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "common_parser",
    "machine_info",
    "median_time",
    "progress",
    "write_json",
    "save_figure",
    "pass_at_k",
    "pass_at_k_curve",
    "run_command",
]

DEFAULT_OUT = Path("benchmark-results")


def common_parser(name: str, description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares.

    ``--quick`` selects a small preset, ``--out`` the results folder, ``--seed``
    the random seed and ``--no-progress`` silences progress bars.
    """
    parser = argparse.ArgumentParser(prog=f"sera-opt bench {name}", description=description)
    parser.add_argument("--quick", action="store_true",
                        help="small preset that finishes in about a minute")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"folder for the JSON results and plots (default: {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for module in ("numba", "torch", "cvxpy", "scipy"):
        mod = sys.modules.get(module)
        if mod is not None:
            info[module] = getattr(mod, "__version__", "?")
    return info


def median_time(func: Callable[[], Any], *, repeats: int = 7, min_time: float = 0.0,
                warmup: int = 1, clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, float]:
    """Median, min and max time of ``func()`` over ``repeats`` calls.

    ``warmup`` calls run first and are not counted (JIT compilation, caches).
    Each repeat loops ``func`` enough times to last ``min_time`` seconds, so that
    microsecond calls are not dominated by timer resolution. ``clock`` is wall
    time by default; ``time.process_time`` (CPU time of this process) is the
    steadier choice for single-threaded code on a machine shared with other work.
    """
    for _ in range(warmup):
        func()
    loops = 1
    if min_time > 0:
        start = clock()
        func()
        once = max(clock() - start, 1e-9)
        loops = max(1, int(min_time / once))
    times = []
    for _ in range(repeats):
        start = clock()
        for _ in range(loops):
            func()
        times.append((clock() - start) / loops)
    arr = np.asarray(times)
    return {"median": float(np.median(arr)), "min": float(arr.min()), "max": float(arr.max()),
            "repeats": repeats, "loops": loops}


def progress(iterable: Iterable, *, desc: str, total: int | None = None,
             enabled: bool = True) -> Iterable:
    """Wrap ``iterable`` in a tqdm bar on stderr when tqdm is installed and enabled."""
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, leave=False)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def write_json(out_dir: Path, name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` plus the machine description to ``out_dir/name.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    body = {"benchmark": name, "machine": machine_info(), **payload}
    path.write_text(json.dumps(_jsonable(body), indent=2) + "\n")
    return path


def save_figure(fig, out_dir: Path, name: str) -> Path:
    """Save a matplotlib figure as ``out_dir/name.png`` and close it."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def pass_at_k(num_samples, num_correct, k) -> np.ndarray:
    """Unbiased pass@k from ``num_samples`` draws of which ``num_correct`` succeeded.

    ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021), computed as a running
    product so that it stays exact in floating point for large ``n``. Arrays
    broadcast; ``k`` must not exceed ``num_samples``.
    """
    n = np.asarray(num_samples, dtype=np.int64)
    c = np.asarray(num_correct, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    n, c, k = np.broadcast_arrays(n, c, k)
    if (k > n).any() or (k < 1).any():
        raise ValueError("pass@k needs 1 <= k <= num_samples.")
    if (c < 0).any() or (c > n).any():
        raise ValueError("num_correct must lie in [0, num_samples].")
    out = np.empty(n.shape, dtype=np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci, ki = int(n[idx]), int(c[idx]), int(k[idx])
        if ni - ci < ki:
            out[idx] = 1.0
        else:
            # prod_{j = n-c+1}^{n} (1 - k / j) = C(n-c, k) / C(n, k)
            j = np.arange(ni - ci + 1, ni + 1, dtype=np.float64)
            out[idx] = 1.0 - float(np.prod(1.0 - ki / j))
    return out


def pass_at_k_curve(successes, num_samples: int, k_max: int) -> np.ndarray:
    """Mean over prompts of the unbiased pass@k for k = 1..k_max.

    ``successes[i]`` is how many of ``num_samples`` draws of prompt ``i`` succeeded.
    """
    ks = np.arange(1, k_max + 1)
    table = pass_at_k(num_samples, np.asarray(successes)[:, None], ks[None, :])
    return table.mean(axis=0)


def run_command(name: str, main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Run a benchmark's ``main`` as a command: a :class:`~sera_opt.SeraOptError` becomes one
    line on stderr and exit status 2, as under ``sera-opt bench NAME``."""
    from sera_opt.exceptions import SeraOptError

    try:
        return int(main(sys.argv[1:] if argv is None else argv) or 0)
    except SeraOptError as exc:
        print(f"sera-opt bench {name}: error: {exc}", file=sys.stderr)
        return 2
