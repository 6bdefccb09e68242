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
        if sys.stderr is None:  # started with standard error closed (`2>&-`)
            return
        super().emit(record)

    def flush(self):
        if sys.stderr is not None:
            super().flush()


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
