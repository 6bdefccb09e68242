"""Compare two result files of a benchmark: are the numbers the same?

``python -m sera_opt.benchmarks.compare BEFORE.json AFTER.json`` walks both
payloads and reports every value that differs, every entry that one has and
the other lacks, and exits 1 if any value differs or any entry of BEFORE is
missing from AFTER. Numbers are compared exactly (a refactor must reproduce
them bit for bit); what depends on the machine or the moment is skipped: the
``machine`` description, ``timings``, the ``command`` line and every key that
names a wall or CPU time. Entries only AFTER has (a new statistic) are listed but are
not differences. A file that is absent, empty, truncated or not JSON, or two files of
different benchmarks, is refused in one line with exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sera_opt.benchmarks import _results

__all__ = ["IGNORED_KEYS", "compare_payloads", "main"]

#: Keys whose values depend on the machine, the moment or the command line.
IGNORED_KEYS = frozenset({"machine", "timings", "command"})


def _ignored(key: str) -> bool:
    return key in IGNORED_KEYS or "wall_time" in key or "cpu_time" in key


def compare_payloads(before: Any, after: Any, path: str = "") -> tuple[list[str], list[str]]:
    """``(differences, additions)`` between two JSON values, as ``path: description`` lines.

    ``differences`` holds values that differ and entries of ``before`` that
    ``after`` lacks; ``additions`` the entries only ``after`` has.
    """
    differences: list[str] = []
    additions: list[str] = []
    if isinstance(before, dict) and isinstance(after, dict):
        for key in before:
            if _ignored(key):
                continue
            sub = f"{path}.{key}" if path else str(key)
            if key not in after:
                differences.append(f"{sub}: missing after")
                continue
            d, a = compare_payloads(before[key], after[key], sub)
            differences += d
            additions += a
        additions += [f"{path}.{key}" if path else str(key)
                      for key in after if key not in before and not _ignored(key)]
    elif isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            differences.append(f"{path}: {len(before)} entries before, {len(after)} after")
        for i, (b, a) in enumerate(zip(before, after)):
            d, add = compare_payloads(b, a, f"{path}[{i}]")
            differences += d
            additions += add
    elif type(before) is not type(after) or before != after:
        differences.append(f"{path}: {before!r} before, {after!r} after")
    return differences, additions


PROG = "python -m sera_opt.benchmarks.compare"


def main(argv=None) -> int:
    """The command line: 0 when the numbers are the same, 1 when they differ, 2 when a file
    cannot be compared (one line on stderr)."""
    return _results.run_tool(PROG, _main, argv)


def _main(argv=None) -> int:
    from sera_opt.benchmarks import _harness
    from sera_opt.cli.errors import Parser

    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--show", type=_harness.at_least(0), default=20,
                        help="how many differences and additions to print (default 20)")
    args = parser.parse_args(argv)
    before = _results.read_json(args.before, flag="BEFORE")
    after = _results.read_json(args.after, flag="AFTER")
    kinds = [p.get("benchmark") if isinstance(p, dict) else None for p in (before, after)]
    if kinds[0] != kinds[1]:
        raise _results.ResultFileError(
            f"BEFORE is a {kinds[0]!r} result and AFTER a {kinds[1]!r} one: compare two runs "
            "of one benchmark")
    differences, additions = compare_payloads(before, after)
    for line in differences[:args.show]:
        print(f"differs: {line}")
    for line in additions[:args.show]:
        print(f"new: {line}")
    print(f"{args.before} -> {args.after}: {len(differences)} difference(s), "
          f"{len(additions)} new entr{'y' if len(additions) == 1 else 'ies'}")
    return 1 if differences else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
