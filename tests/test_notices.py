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
