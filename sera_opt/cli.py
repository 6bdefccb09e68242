"""The ``sera-opt`` command.

``sera-opt allocate``  allocate a budget over prompts read from CSV, JSON, .npy or stdin
``sera-opt bench NAME``  run a benchmark or experiment (solvers, estimator, alignment, ...)
``sera-opt demo``  the quick alignment comparison on scikit-learn's digits
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from importlib import import_module
from pathlib import Path

import numpy as np

from .api import allocate
from .exceptions import SeraOptError
from .policies import UniformPolicy
from .solvers import available_solvers

__all__ = ["main", "read_success_probs"]

BENCHMARKS = ("solvers", "estimator", "tracking", "alignment", "maze", "arithmetic")


def read_success_probs(source: str, *, column: str | None = None) -> np.ndarray:
    """Read success probabilities from a path (``.csv``, ``.json``, ``.npy``) or ``-`` (stdin).

    CSV: one number per line, or a table whose column is chosen by ``column``
    (default: the only or the first column; a header row is detected). JSON: a
    list of numbers, or an object with a ``"success_probs"`` list. Stdin is read
    as JSON when it starts with ``[`` or ``{``, otherwise as CSV/whitespace text.
    """
    if source == "-":
        text = sys.stdin.read()
        stripped = text.lstrip()
        if stripped.startswith(("[", "{")):
            return _from_json(json.loads(text))
        return _from_csv(text, column)
    path = Path(source)
    if not path.exists():
        raise SeraOptError(f"no such file: {source!r}")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if suffix == ".json":
        return _from_json(json.loads(path.read_text()))
    if suffix in (".csv", ".txt", ".tsv", ""):
        return _from_csv(path.read_text(), column)
    raise SeraOptError(
        f"cannot read {source!r}: use a .csv, .json or .npy file, or '-' for stdin."
    )


def _from_json(obj) -> np.ndarray:
    if isinstance(obj, dict):
        if "success_probs" not in obj:
            raise SeraOptError(
                "a JSON object must hold the probabilities under the key 'success_probs'."
            )
        obj = obj["success_probs"]
    if not isinstance(obj, list):
        raise SeraOptError("JSON input must be a list of probabilities.")
    return np.asarray(obj, dtype=np.float64)


def _from_csv(text: str, column: str | None) -> np.ndarray:
    rows = [line for line in text.replace("\t", ",").splitlines() if line.strip()]
    if not rows:
        raise SeraOptError("the input holds no success probabilities.")
    if all(len(r.split(",")) == 1 for r in rows) and len(rows) == 1:
        rows = rows[0].split()  # whitespace-separated on one line
    split = [[c.strip() for c in r.split(",")] for r in rows]
    header = None
    try:
        float(split[0][0])
    except ValueError:
        header, split = split[0], split[1:]
    idx = 0
    if column is not None:
        if header is None or column not in header:
            raise SeraOptError(f"column {column!r} not found; the header is {header}.")
        idx = header.index(column)
    try:
        return np.asarray([float(r[idx]) for r in split], dtype=np.float64)
    except (ValueError, IndexError) as exc:
        raise SeraOptError(f"could not parse the success probabilities: {exc}") from exc


def _summary(alloc, uniform) -> dict:
    return {
        "prompts": alloc.num_prompts,
        "budget": alloc.budget,
        "solver": alloc.solver,
        "min_factor": alloc.min_factor,
        "factor_spread": alloc.factor_spread,
        "uniform_min_factor": uniform.min_factor,
        "uniform_factor_spread": uniform.factor_spread,
        "wall_time_s": alloc.wall_time,
    }


def _cmd_allocate(args) -> int:
    probs = read_success_probs(args.input, column=args.column)
    if (args.budget is None) == (args.per_prompt is None):
        raise SeraOptError("give exactly one of --budget and --per-prompt.")
    budget = args.budget if args.budget is not None else args.per_prompt * len(probs)
    opts = dict(min_rollouts=args.min, max_rollouts=args.max, offset=args.offset)
    alloc = allocate(probs, budget, solver=args.solver, **opts)
    uniform = UniformPolicy(offset=args.offset).allocate(
        probs, budget, min_rollouts=args.min, max_rollouts=args.max)
    out = io.StringIO()
    if args.format == "json":
        json.dump({"counts": alloc.counts.tolist(), "summary": _summary(alloc, uniform)}, out)
        out.write("\n")
    else:
        out.write("count\n")
        out.writelines(f"{int(c)}\n" for c in alloc.counts)
    if args.output in (None, "-"):
        sys.stdout.write(out.getvalue())
    else:
        Path(args.output).write_text(out.getvalue())
    if not args.quiet:
        s = _summary(alloc, uniform)
        print(
            f"{s['prompts']} prompts, budget {s['budget']}, solver {s['solver']}: "
            f"min factor {s['min_factor']:.4f}, spread {s['factor_spread']:.4f} "
            f"(uniform: min {s['uniform_min_factor']:.4f}, spread "
            f"{s['uniform_factor_spread']:.4f})",
            file=sys.stderr,
        )
    return 0


def _cmd_bench(args, rest) -> int:
    module = import_module(f"sera_opt.benchmarks.{args.name}")
    return int(module.main(rest) or 0)


def _cmd_demo(args, rest) -> int:
    module = import_module("sera_opt.benchmarks.alignment")
    return int(module.demo(rest) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sera-opt",
        description="Scale-Equalized Rollout Allocation for Maximum Likelihood RL.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("allocate", help="allocate a rollout budget over prompts")
    p.add_argument("input", nargs="?", default="-",
                   help="success probabilities: a .csv, .json or .npy file, or '-' for stdin")
    p.add_argument("--column", help="CSV column holding the probabilities")
    p.add_argument("--budget", type=int, help="total rollouts")
    p.add_argument("--per-prompt", type=int, help="average rollouts per prompt (budget = M * this)")
    p.add_argument("--min", type=int, default=None,
                   help="minimum rollouts per prompt (default: 1 + offset)")
    p.add_argument("--max", type=int, default=None, help="maximum rollouts per prompt (default: no cap)")
    p.add_argument("--offset", type=int, choices=(0, 1), default=0,
                   help="0: success-average estimator, 1: mean-centred (default: 0)")
    p.add_argument("--solver", default="waterline",
                   help=f"solver name (available: {', '.join(available_solvers())})")
    p.add_argument("--format", choices=("csv", "json"), default="csv", help="output format")
    p.add_argument("--output", "-o", help="write the counts here instead of stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary on stderr")

    b = sub.add_parser("bench", help="run a benchmark; `sera-opt bench NAME --help` for its options",
                       add_help=False)
    b.add_argument("name", choices=BENCHMARKS)

    sub.add_parser("demo", help="quick alignment comparison on scikit-learn's digits",
                   add_help=False)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "allocate":
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            if args.min is None:
                args.min = 1 + args.offset
            return _cmd_allocate(args)
        if args.command == "bench":
            return _cmd_bench(args, rest)
        return _cmd_demo(args, rest)
    except SeraOptError as exc:
        print(f"sera-opt: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
