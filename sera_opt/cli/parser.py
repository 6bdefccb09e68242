"""The ``sera-opt`` argument parser and :func:`main`."""

from __future__ import annotations

import argparse
import io
import os
import sys
import textwrap

from ..exceptions import SeraOptError, SeraOptWarning
from ..policies import available_policies
from ..solvers import available_solvers
from .catalog import benchmark_list
from .commands import (
    BENCH_DEFAULT_OUT,
    BENCHMARKS,
    cmd_allocate,
    cmd_bench,
    cmd_cache,
    cmd_demo,
    cmd_replay,
    version_text,
)
from .errors import Parser, exit_status, one_line, report_unexpected, stderr
from .options import whole_number


class _Once(argparse.Action):
    """Store a value, refusing a second one: argparse would keep the last silently."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} is given twice ({getattr(namespace, self.dest)!r} "
                         f"and {values!r}); keep one")
        setattr(namespace, self.dest, values)


class _Version(argparse.Action):
    """``--version``: the versions and the kernel cache's place and state, then exit 0."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the versions and where the compiled kernels are cached, then exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The ``sera-opt`` argument parser (its errors are one line, exit status 2)."""
    parser = Parser(
        prog="sera-opt",
        description="Scale-Equalized Rollout Allocation for Maximum Likelihood RL.",
        epilog="Exit status: 0 done, 2 bad command line or input, 1 unexpected failure.",
    )
    parser.add_argument("--traceback", action="store_true",
                        help="on an unexpected failure, print the Python traceback")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "allocate", help="allocate a rollout budget over prompts",
        description="Allocate a rollout budget over prompts. Counts go to stdout (or -o), "
                    "a one-line summary against uniform allocation to stderr.")
    p.add_argument("input", nargs="?", default="-",
                   help="success probabilities: a CSV/text table (one number per line, all on "
                        "one line, or a column under a header), JSON (a list, or an object with "
                        "'success_probs') or a .npy array; '-' (default) reads stdin")
    p.add_argument("--column", action=_Once,
                   help="header name of the CSV column holding the probabilities (needed when "
                        "the table has several columns)")
    counts = "a whole number (1e6 and 24.0 are read exactly)"
    p.add_argument("--budget", action=_Once, type=whole_number, help=f"total rollouts, {counts}")
    p.add_argument("--per-prompt", action=_Once, type=whole_number,
                   help="average rollouts per prompt (budget = M * this)")
    p.add_argument("--min", action=_Once, type=whole_number, default=None,
                   help="minimum rollouts per prompt (default: the policy's, 1 + offset for SERA)")
    p.add_argument("--max", action=_Once, type=whole_number, default=None,
                   help="maximum rollouts per prompt (default: the policy's cap; for SERA "
                        "max_ratio times the mean count, --option max_ratio=None for none)")
    p.add_argument("--offset", action=_Once, type=int, choices=(0, 1),
                   help="0: success-average estimator (default), 1: mean-centred")
    p.add_argument("--policy", action=_Once, default=None,
                   help=f"allocation policy, one of {', '.join(available_policies())} "
                        f"(default: sera); what is not given here keeps the policy's defaults")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the policy, repeatable; VALUE is a Python literal "
                        "(2, 1e-3, None, [1, 2], 'text'; inf and bare names need no quotes), "
                        "e.g. --policy sera-bayes --option prior_strength=16")
    p.add_argument("--solver", action=_Once, default=None,
                   help=f"SERA's solver (default waterline; available: "
                        f"{', '.join(available_solvers())})")
    p.add_argument("--format", action=_Once, choices=("csv", "json"),
                   help="output format (default: csv)")
    p.add_argument("--output", "-o", action=_Once,
                   help="write the counts here instead of stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary on stderr")

    # add_help=False: `bench NAME --help` belongs to the benchmark; `bench --help` alone is
    # answered in main() with this parser's help, which lists every benchmark.
    b = sub.add_parser(
        "bench", help="run a benchmark; `sera-opt bench --help` lists them",
        add_help=False, usage="sera-opt bench NAME [options]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Run a benchmark: it writes its JSON results and plots under --out (default "
            f"{BENCH_DEFAULT_OUT}). `sera-opt bench NAME --help` gives a benchmark's options; "
            "--quick runs a small preset.", 88, break_on_hyphens=False) + "\n\nbenchmarks:\n" + benchmark_list())
    b.add_argument("name", nargs="?", choices=BENCHMARKS, metavar="NAME",
                   help="the benchmark to run (listed above)")
    b.set_defaults(bench_parser=b)

    sub.add_parser("demo", help="quick alignment comparison on scikit-learn's digits",
                   add_help=False)

    sub.add_parser("replay", help="replay a recorded run (verl's rollout dump, or a table of "
                                  "step, prompt_id, reward) under allocation policies; "
                                  "`sera-opt replay --help` for its options",
                   add_help=False)

    c = sub.add_parser(
        "cache", help="where the compiled kernels are cached and whether they are there; "
                      "`cache clear` removes them",
        description="The numba kernels are compiled once and cached outside the installed "
                    "package, under a key of the sera_opt version, the numba version and a "
                    "hash of the kernel sources. SERA_OPT_CACHE_DIR (or NUMBA_CACHE_DIR) moves "
                    "the cache.")
    c.add_argument("action", nargs="?", choices=("info", "clear"), default="info",
                   help="info (default): the directory, its key and what it holds; clear: "
                        "remove every sera_opt kernel cache under its base directory")
    return parser


def _escape_what_cannot_be_encoded() -> None:
    """A path or a name that the terminal's encoding cannot show (a non-ASCII cache folder
    under ``PYTHONIOENCODING=ascii``) is written as Python's escapes (``\\xe9``) instead of
    failing the command with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError, io.UnsupportedOperation):
                pass


def main(argv=None) -> int:
    """Run ``sera-opt`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    _escape_what_cannot_be_encoded()
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help, or a one-line usage error already printed
        return exit_status(exc)
    try:
        if args.command == "allocate":
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            return cmd_allocate(args)
        if args.command == "bench":
            if args.name is None:
                bench = args.bench_parser
                if "-h" in rest or "--help" in rest:
                    bench.print_help()
                    return 0
                bench.error("name a benchmark first: sera-opt bench NAME [options], NAME one of "
                            f"{', '.join(BENCHMARKS)}")
            return cmd_bench(args, rest)
        if args.command == "replay":
            return cmd_replay(args, rest)
        if args.command == "cache":
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            return cmd_cache(args)
        return cmd_demo(args, rest)
    except SystemExit as exc:  # an argument error, or a benchmark's own parser
        return exit_status(exc)
    except (SeraOptError, SeraOptWarning) as exc:
        stderr(f"sera-opt: error: {one_line(exc)}")
        return 2
    except KeyboardInterrupt:
        stderr("sera-opt: interrupted")
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`sera-opt allocate ... | head`): stop quietly,
        # and point stdout at /dev/null so that Python's final flush does not complain.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass
        return 1
    except ModuleNotFoundError as exc:
        if args.traceback:
            raise
        if (exc.name or "sera_opt").partition(".")[0] == "sera_opt":
            report_unexpected(exc)  # a module of sera_opt itself is missing: a broken install
            return 1
        stderr(f"sera-opt: error: this command needs a module that is not installed: "
                f"{one_line(exc)}; install it (the benchmarks and the demo need the [bench] "
                f"extras: pip install \".[bench]\").")
        return 1
    except Exception as exc:
        if args.traceback:
            raise
        report_unexpected(exc)
        return 1
