"""What a compile says (sera_opt._jit): every compile that takes a while starts with a line
naming the kernel and about how long it takes, and ends with one giving the seconds,
whatever the once-a-minute limit on the longer explanation."""

from __future__ import annotations

import pytest

from sera_opt import _jit


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(_jit, "_ANNOUNCED_AT", None)


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_the_first_compile_explains_and_says_how_long(fresh, capsys):
    _jit._announce_start("kernels.waterline.waterline_solve", 100.0)
    (line,) = _lines(capsys)
    assert line == f"{_jit.MESSAGE}: kernels.waterline.waterline_solve (about 15 s) ..."


def test_a_long_compile_within_the_minute_still_starts_with_a_line(fresh, capsys):
    _jit._announce_start("kernels.waterline.waterline_solve", 100.0)
    _jit._announce_done("kernels.waterline.waterline_solve", 100.0, 115.0)
    capsys.readouterr()
    # 22 s of bracket search right after: it was silent until it was done.
    _jit._announce_start("kernels.closed.bracket_solve", 116.0)
    assert _lines(capsys) == ["sera_opt: compiling kernels.closed.bracket_solve (about 20 s) ..."]
    _jit._announce_done("kernels.closed.bracket_solve", 116.0, 138.0)
    assert _lines(capsys) == ["sera_opt: compiled kernels.closed.bracket_solve in 22.0 s"]
    # A kernel not in the table gets a line too; one known to take under a second does not.
    _jit._announce_start("kernels.someday.new_kernel", 139.0)
    assert _lines(capsys) == ["sera_opt: compiling kernels.someday.new_kernel (a few seconds) ..."]
    _jit._announce_start("tracking.index_kernels.direct_insert", 140.0)
    assert _lines(capsys) == []


def test_after_the_minute_the_explanation_comes_again(fresh, capsys):
    _jit._announce_start("kernels.gains.prepare", 0.0)
    capsys.readouterr()
    _jit._announce_start("kernels.entries.solve", _jit.REPEAT_AFTER_S + 1.0)
    (line,) = _lines(capsys)
    assert line.startswith(_jit.MESSAGE) and line.endswith("kernels.entries.solve (about 20 s) ...")


def test_every_compile_second_estimate_names_a_kernel_that_exists():
    from importlib import import_module

    for name in _jit.COMPILE_SECONDS:
        module, _, function = name.rpartition(".")
        assert hasattr(import_module(f"sera_opt.{module}"), function), name
