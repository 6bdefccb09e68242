"""How ``sera-opt`` fails: one line on stderr, exit status 2 for a wrong command line or
input, 1 (with the traceback in a file) for a failure sera_opt did not foresee."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr, exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message.rstrip('.')}; see `{self.prog} --help`.\n")


def stderr(line: str) -> None:
    """Print one line on stderr; with stderr closed (`2>&-`) only the exit status speaks
    (the summary is not worth failing a run whose counts were written)."""
    if sys.stderr is None:
        return
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass


def one_line(message) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def report_unexpected(exc: BaseException) -> None:
    try:
        fd, path = tempfile.mkstemp(prefix="sera-opt-traceback-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        where = f"the traceback is in {path}"
    except OSError:
        where = "rerun as `sera-opt --traceback ...` to see the traceback"
    stderr(f"sera-opt: unexpected error: {type(exc).__name__}: {one_line(exc)} ({where}; "
            f"this is a bug in sera_opt, please report it with the command that caused it)")


def exit_status(exc: SystemExit) -> int:
    """The status ``sys.exit`` would give: a message is printed and means 1, as in Python."""
    if exc.code is None or isinstance(exc.code, int):
        return int(exc.code or 0)
    stderr(str(exc.code))
    return 1
