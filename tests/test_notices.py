"""The notices' logger, and the package's other loggers beside it."""

from __future__ import annotations

import logging

import pytest

from sera_opt._notices import LOGGER, notice


@pytest.fixture
def package_level():
    package = logging.getLogger("sera_opt")
    before = package.level
    yield package
    package.setLevel(before)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def root_handler():
    """A handler on the root logger, as an application's logging configuration puts one
    (pytest's own ``caplog`` also sees loggers that do not propagate, so it cannot tell)."""
    root = logging.getLogger()
    handler, level = _Collect(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def test_a_notice_goes_to_stderr_and_not_to_the_root_logger(capsys, root_handler):
    notice("sera_opt: a notice")
    out, err = capsys.readouterr()
    assert out == "" and err == "sera_opt: a notice\n", (out, err)
    assert not [r for r in root_handler.records if r.name == LOGGER.name], \
        "a notice reached the root logger's handlers"


def test_the_integrations_loggers_reach_the_applications_handlers(root_handler):
    # A trainer adapter's warning (a missing planner file on resume) must reach the
    # handlers an application configured, as any library's log records do.
    logging.getLogger("sera_opt.integrations.some_adapter").warning("resumed without a file")
    assert any(r.getMessage() == "resumed without a file" for r in root_handler.records)


@pytest.mark.parametrize("name", ["sera_opt", "sera_opt.notices"])
def test_a_level_on_the_package_or_the_notices_logger_silences_them(name, capsys, package_level):
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        notice("sera_opt: compiling", level=logging.INFO)
        notice("sera_opt: the cache cannot be written")
    finally:
        logger.setLevel(before)
    assert capsys.readouterr().err == ""


def _bar_and_notice(monkeypatch, stream):
    tqdm = pytest.importorskip("tqdm").tqdm
    monkeypatch.setattr("sys.stderr", stream)
    bar = tqdm(range(10), desc="arms", file=stream, mininterval=0, leave=False)
    for i, _ in enumerate(bar):
        if i == 4:
            notice("sera_opt: compiling kernels.closed.bracket_solve ...", level=logging.INFO)
    bar.close()
    return stream.getvalue()


def test_a_notice_gets_a_line_of_its_own_beside_a_progress_bar(monkeypatch):
    import io

    # Without a terminal (a log file, CI) a bar returns with \r: the notice must not land
    # on the bar's line.
    text = _bar_and_notice(monkeypatch, io.StringIO())
    lines = [line for line in text.split("\n") if "bracket_solve" in line]
    assert lines == ["sera_opt: compiling kernels.closed.bracket_solve ..."], text


def test_on_a_terminal_the_bar_is_cleared_around_the_notice(monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    text = _bar_and_notice(monkeypatch, Terminal())
    # The notice's line, as a terminal shows it: what follows the last \r before it.
    (line,) = [line for line in text.split("\n") if "bracket_solve" in line]
    assert line.rsplit("\r", 1)[-1] == "sera_opt: compiling kernels.closed.bracket_solve ...", text
    assert "arms" not in line.rsplit("\r", 1)[-1]


def test_without_a_bar_a_notice_is_one_plain_line(capsys):
    notice("sera_opt: plain", level=logging.INFO)
    assert capsys.readouterr().err == "sera_opt: plain\n"
