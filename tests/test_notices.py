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


def test_a_notice_goes_to_stderr_and_not_to_the_root_logger(capsys, caplog):
    with caplog.at_level(logging.DEBUG):
        notice("sera_opt: a notice")
    out, err = capsys.readouterr()
    assert out == "" and err == "sera_opt: a notice\n", (out, err)
    assert not [r for r in caplog.records if r.name == LOGGER.name], "a notice reached the root logger"


def test_the_integrations_loggers_reach_the_applications_handlers(caplog):
    # A trainer adapter's warning (a missing planner file on resume) must reach the
    # handlers an application configured, as any library's log records do.
    with caplog.at_level(logging.WARNING):
        logging.getLogger("sera_opt.integrations.some_adapter").warning("resumed without a file")
    assert any(r.getMessage() == "resumed without a file" for r in caplog.records)


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
