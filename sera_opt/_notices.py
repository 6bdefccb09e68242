"""The library's notices (a kernel is compiling, the kernel cache cannot be used):
log records of the ``sera_opt.notices`` logger, written to standard error and never
to standard output, so that a command's output stays clean.

That logger has its own handler, which writes the bare message to whatever
``sys.stderr`` is when the notice is emitted (nothing when standard error is
closed: ``print(file=sys.stderr)`` would then write to standard output), and it
does not propagate, so that an application that configures the root logger does
not see each notice twice. Silence the notices with
``logging.getLogger("sera_opt").setLevel(logging.ERROR)`` (or the same on
``"sera_opt.notices"``); send them elsewhere by replacing the logger's handlers
(or set ``propagate = True`` and remove ours). The package's other loggers
(``sera_opt.integrations.*``) are left as the logging module makes them: they
propagate to the application's handlers.

A notice never shares a line with a progress bar: while a tqdm bar draws on the same
standard error, the notice is written through ``tqdm.write`` on a terminal (the bar is
cleared, the notice printed, the bar redrawn below it), and elsewhere (a log file, a pipe,
where the bar's ``\r`` does not return to the start of a line) on a line of its own after
the bar's.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOGGER", "notice"]

LOGGER = logging.getLogger("sera_opt.notices")
#: The package's logger: a level set on it (to silence the notices) is honoured too.
_PACKAGE = logging.getLogger("sera_opt")


class _StderrHandler(logging.StreamHandler):
    """A stream handler bound to the current ``sys.stderr`` (pytest's capture, a
    redirected stream) rather than the one of the moment it was made."""

    def __init__(self, level=logging.NOTSET):
        logging.Handler.__init__(self, level)  # StreamHandler would fix the stream now

    @property
    def stream(self):
        return sys.stderr

    def emit(self, record):
        stream = sys.stderr
        if stream is None:  # started with standard error closed (`2>&-`)
            return
        if not _bar_on(stream):
            try:
                stream.write(self.format(record) + self.terminator)
            except UnicodeEncodeError:
                # A path the stream's encoding cannot show (PYTHONIOENCODING=ascii): escape it.
                self.flush()
                stream.write(_escaped(self.format(record), stream) + self.terminator)
            except Exception:
                self.handleError(record)
                return
            self.flush()
            return
        try:
            message = _escaped(self.format(record), stream)
            if _is_terminal(stream):
                from tqdm import tqdm

                tqdm.write(message, file=stream)
            else:
                # The bar's text is still on the current line: end it first.
                stream.write(f"\n{message}\n")
            self.flush()
        except Exception:
            self.handleError(record)

    def flush(self):
        if sys.stderr is not None:
            super().flush()


def _bar_on(stream) -> bool:
    """Whether a tqdm bar is drawing on ``stream`` now (tqdm is never imported for this:
    without it loaded there is no bar)."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return False
    try:
        bars = list(getattr(std.tqdm, "_instances", ()))
    except RuntimeError:  # the set changed while it was copied: a bar is coming or going
        return True
    for bar in bars:
        target = getattr(bar, "fp", None)
        if getattr(bar, "disable", False) or target is None:
            continue
        if getattr(target, "_wrapped", target) is stream:  # tqdm wraps the file it is given
            return True
    return False


def _escaped(text: str, stream) -> str:
    encoding = getattr(stream, "encoding", None) or "ascii"
    return text.encode(encoding, "backslashreplace").decode(encoding, "replace")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


if not any(isinstance(handler, _StderrHandler) for handler in LOGGER.handlers):
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    LOGGER.addHandler(_handler)
    LOGGER.propagate = False
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)


def notice(message: str, *, level: int = logging.WARNING) -> None:
    """Emit ``message`` (one line, starting with ``"sera_opt: "``) on the notices' logger,
    unless a level set on the package's logger is above ``level``."""
    if _PACKAGE.level > level:
        return
    LOGGER.log(level, message)
