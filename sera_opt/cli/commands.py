"""The subcommands: ``allocate`` (and where it writes), ``bench``, ``demo``, ``cache``
and the version text."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import warnings
from pathlib import Path

from ..exceptions import SeraOptError, SeraOptWarning
from ..policies import UniformPolicy
from .catalog import BENCHMARK_GROUP, COMMAND_GROUP, load_entry
from .catalog import BENCHMARKS as BENCHMARKS  # names and descriptions: one place
from .errors import Parser, stderr
from .options import build_policy
from .sources import read_success_probs

# The benchmarks' default --out (benchmarks/_harness.DEFAULT_OUT; a test keeps the two
# equal), named here so that the folder is checked before a benchmark is imported.
BENCH_DEFAULT_OUT = "benchmark-results"


def _check_destination(destination: str | None, source: str = "-") -> None:
    """Refuse an output path that cannot be written before any work is done."""
    if destination in (None, "-"):
        if sys.stdout is None:  # started with stdout closed (`>&-`)
            raise SeraOptError("stdout is closed, so the counts have nowhere to go; write them "
                               "to a file with -o FILE, or leave stdout open.")
        return
    if not destination.strip():
        raise SeraOptError("-o is given an empty name; give the file for the counts, e.g. "
                           "-o counts.csv, or drop -o to write them to stdout.")
    path = Path(destination)
    try:
        same = source != "-" and path.exists() and os.path.samefile(source, path)
    except OSError:
        same = False
    if same:
        raise SeraOptError(f"-o {destination!r} is the input file; writing the counts there "
                           f"would replace the probabilities. Choose another file for -o.")
    if path.is_dir():
        raise SeraOptError(f"-o {destination!r} is a folder; give a file name in it, e.g. "
                           f"{str(path / 'counts.csv')!r}.")
    folder = path.parent
    if not folder.is_dir():
        if folder.exists():
            raise SeraOptError(f"cannot write {destination!r}: {str(folder)!r} is a file, not "
                               f"a folder.")
        raise SeraOptError(f"cannot write {destination!r}: the folder {str(folder)!r} does not "
                           f"exist; create it first (mkdir -p {shlex.quote(str(folder))}).")
    target = path if path.exists() else folder
    if not os.access(target, os.W_OK):
        raise SeraOptError(f"cannot write {destination!r}: permission denied on "
                           f"{str(target)!r}; choose another place for the output.")


def _write_output(text: str, destination: str | None) -> None:
    if destination in (None, "-"):
        try:
            sys.stdout.write(text)
            sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        except BrokenPipeError:
            raise  # the reader went away: main stops quietly
        except (OSError, ValueError) as exc:  # a full disk, a closed descriptor
            raise SeraOptError(
                f"cannot write the counts to stdout: {getattr(exc, 'strerror', None) or exc}; "
                f"write them to a file with -o FILE instead."
            ) from None
        return
    try:
        with open(destination, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise SeraOptError(
            f"cannot write the counts to {destination!r}: {exc.strerror or exc}."
        ) from None


def _summary(policy, problem, alloc, uniform) -> dict:
    capped = policy.max_rollouts is not None or getattr(policy, "max_ratio", None) is not None
    return {
        "prompts": alloc.num_prompts,
        "budget": alloc.budget,
        "policy": policy.name,
        "solver": alloc.solver,
        "min_rollouts": int(problem.min_rollouts.min()),
        "max_rollouts": int(problem.max_rollouts.max()) if capped else None,
        "min_factor": alloc.min_factor,
        "factor_spread": alloc.factor_spread,
        "uniform_min_factor": uniform.min_factor,
        "uniform_factor_spread": uniform.factor_spread,
        "wall_time_s": alloc.wall_time,
    }


def cmd_allocate(args) -> int:
    # Defaults are filled in here, not by argparse, so that _Once can tell a repeat.
    args.offset = 0 if args.offset is None else args.offset
    args.format = "csv" if args.format is None else args.format
    if (args.budget is None) == (args.per_prompt is None):
        raise SeraOptError("give exactly one of --budget and --per-prompt.")
    policy = build_policy(args)
    _check_destination(args.output, args.input)
    probs = read_success_probs(args.input, column=args.column)
    budget = args.budget if args.budget is not None else args.per_prompt * len(probs)
    with warnings.catch_warnings():
        # An option that the policy or its solver ignores was typed for a reason.
        warnings.simplefilter("error", SeraOptWarning)
        problem = policy.problem(probs, budget)
        alloc = policy.allocate(probs, budget)
    # Uniform allocation on the same bounds, for the comparison in the summary.
    uniform = UniformPolicy(offset=args.offset).allocate(
        probs, budget, min_rollouts=problem.min_rollouts, max_rollouts=problem.max_rollouts)
    summary = _summary(policy, problem, alloc, uniform)
    if args.format == "json":
        text = json.dumps({"counts": alloc.counts.tolist(), "summary": summary}) + "\n"
    else:
        text = "count\n" + "".join(f"{int(c)}\n" for c in alloc.counts)
    _write_output(text, args.output)
    if not args.quiet:
        s = summary
        what = f"policy {s['policy']}" + (
            f" (solver {s['solver']})" if s["solver"] != s["policy"] else "")
        bounds = (f"at least {s['min_rollouts']} rollouts per prompt, no cap"
                  if s["max_rollouts"] is None
                  else f"{s['min_rollouts']} to {s['max_rollouts']} rollouts per prompt")
        stderr(
            f"{s['prompts']} prompts, budget {s['budget']}, {what}, {bounds}: "
            f"min factor {s['min_factor']:.4f}, "
            f"spread {s['factor_spread']:.4f} (uniform: min {s['uniform_min_factor']:.4f}, "
            f"spread {s['uniform_factor_spread']:.4f})"
        )
    return 0


def _out_option(rest: list[str]) -> str | None:
    """The value of the last ``--out`` in a benchmark's arguments (argparse keeps the last)."""
    value = None
    for i, word in enumerate(rest):
        if word == "--":
            break
        if word == "--out" and i + 1 < len(rest):
            value = rest[i + 1]
        elif word.startswith("--out="):
            value = word.partition("=")[2]
    return value


def _check_results_folder(folder: str, command: str) -> None:
    """Refuse a results folder that cannot be created or written, before a run of minutes."""
    path = Path(folder)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == path and not path.is_dir():
        raise SeraOptError(f"{command} --out {folder!r} is a file; give a folder for the "
                           f"results (it is created if missing).")
    if not existing.is_dir():
        raise SeraOptError(f"{command} cannot create the folder {folder!r}: {str(existing)!r} "
                           f"is a file, not a folder; choose another --out.")
    try:  # os.access says yes to root, and to a read-only file system
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise SeraOptError(f"{command} cannot write into {str(existing)!r} "
                           f"({exc.strerror or exc}), so the results of --out {folder!r} would "
                           f"be lost after the run; choose another --out.") from None


def _wants_help(rest: list[str]) -> bool:
    options = rest[:rest.index("--")] if "--" in rest else rest
    return "-h" in options or "--help" in options


class _OneLineErrors:
    """Make the benchmarks' own argument errors one line, exit status 2, like sera-opt's:
    their parsers are plain argparse ones, which print the whole usage first."""

    def __enter__(self):
        self._saved = argparse.ArgumentParser.error
        argparse.ArgumentParser.error = Parser.error
        return self

    def __exit__(self, *exc):
        argparse.ArgumentParser.error = self._saved
        return False


def cmd_bench(args, rest) -> int:
    if not _wants_help(rest):
        out = _out_option(rest)
        _check_results_folder(BENCH_DEFAULT_OUT if out is None else out,
                              f"sera-opt bench {args.name}")
    from .._background import ENV_VAR

    # A benchmark times the kernels a warm cache gives: each is compiled in this process
    # on first use, never served meanwhile by a smaller one (first-use benchmarks set the
    # default again for the fresh processes they measure).
    os.environ[ENV_VAR] = "0"
    run = load_entry(BENCHMARK_GROUP, args.name)
    with _OneLineErrors():
        return int(run(rest) or 0)


def cmd_replay(args, rest) -> int:
    """``sera-opt replay RECORD ...``: the replay's report (sera_opt.benchmarks.replay)."""
    if not _wants_help(rest):
        out = _out_option(rest)
        _check_results_folder(BENCH_DEFAULT_OUT if out is None else out, "sera-opt replay")
    run = load_entry(COMMAND_GROUP, "replay")
    with _OneLineErrors():
        return int(run(rest) or 0)


def cmd_demo(args, rest) -> int:
    out = _out_option(rest)
    if out is not None and not _wants_help(rest):
        _check_results_folder(out, "sera-opt demo")
    run = load_entry(COMMAND_GROUP, "demo")
    with _OneLineErrors():
        return int(run(rest) or 0)


def version_text() -> str:
    import platform
    from importlib import metadata

    from .. import _kernel_cache
    from .._version import __version__

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"sera_opt {__version__} (Python {platform.python_version()}, numpy "
            f"{version('numpy')}, numba {version('numba')}, torch {version('torch')})\n"
            f"{_kernel_cache.kernel_cache_info().summary()}")


def cmd_cache(args) -> int:
    from .. import _kernel_cache

    if args.action == "clear":
        removed, freed = _kernel_cache.clear_kernel_cache()
        base = _kernel_cache.kernel_cache_dir().parent
        print(f"removed {len(removed)} kernel cache entr{'y' if len(removed) == 1 else 'ies'} "
              f"({freed / 2**20:.1f} MiB) under {base}" if removed
              else f"nothing to remove: no kernel cache under {base}")
        return 0
    info = _kernel_cache.kernel_cache_info()
    print(info.summary())
    print(f"key: {info.key} (sera_opt version, numba version, hash of the kernel sources)")
    for name, count in info.cached.items():
        print(f"  {name}: {count} kernel{'' if count == 1 else 's'} cached")
    print("a kernel not cached compiles on its first call (seconds) and is cached for every "
          "later process; `sera-opt cache clear` removes the cache")
    return 0
