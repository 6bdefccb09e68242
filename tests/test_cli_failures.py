"""The `sera-opt` command where things go wrong: options that would do nothing, outputs
that cannot be written (checked before any work), closed or full streams, inputs without
end, and table cells that Python's float() reads but a CSV of probabilities should not.

Each failure is one line on stderr and exit status 2 (a reader that goes away is the one
quiet exception, tested in test_cli.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sera_opt import SeraOptError
from sera_opt.cli import main, read_success_probs

from .test_cli import P, assert_one_line_error, run, write


def _command(args, **kwargs):
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("timeout", 120)
    return subprocess.run([sys.executable, "-m", "sera_opt.cli", *args], **kwargs)


def _assert_one_line(result, *fragments, status=2):
    err = result.stderr.decode(errors="replace")
    assert result.returncode == status, f"exit status {result.returncode}; stderr: {err!r}"
    assert err.count("\n") == 1 and err.startswith("sera-opt"), f"not one line: {err!r}"
    assert "Traceback" not in err and "this is a bug" not in err, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from {err!r}"


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize("args, fragments", [
    (["--option", "foo=1"], ("'foo'", "continuous", "max_ratio", "remove it")),
    (["--option", "tol=1e-9", "--solver", "greedy"], ("'tol'", "greedy", "max_ratio")),
])
def test_an_option_nothing_uses_is_an_error_not_a_warning(args, fragments, capsys,
                                                          monkeypatch, recwarn):
    code, out, err = run(["allocate", "-", "--budget", "12", "-q", *args], capsys,
                         stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, *fragments)
    assert out == "" and len(recwarn) == 0, [str(w.message) for w in recwarn]


def test_an_ignored_option_fails_from_the_real_command_even_with_quiet(tmp_path):
    src = write(tmp_path, "p.json", json.dumps(P))
    result = _command(["allocate", src, "--budget", "12", "-q", "--option", "foo=1"])
    _assert_one_line(result, "'foo'")
    assert result.stdout == b""


# ----------------------------------------------------------------------------- streams


def test_a_closed_stdout_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdout", None)  # what Python sets when started with `>&-`
    monkeypatch.setattr("sera_opt.cli.read_success_probs", _never)
    code = main(["allocate", "-", "--budget", "12", "-q"])
    assert_one_line_error(code, capsys.readouterr().err, "stdout is closed", "-o FILE")


def _never(*args, **kwargs):
    raise AssertionError("the input was read although the output could not be written")


def test_a_closed_stdout_from_the_shell(tmp_path):
    src = write(tmp_path, "p.json", json.dumps(P))
    result = _command(["allocate", src, "--budget", "12", "-q"],
                      preexec_fn=_close_stdout)
    _assert_one_line(result, "stdout is closed")


def _close_stdout():
    import os

    os.close(1)


def test_a_full_stdout_is_one_line(tmp_path):
    src = write(tmp_path, "p.json", json.dumps(P))
    with open("/dev/full", "w") as full:
        result = _command(["allocate", src, "--budget", "12", "-q"], stdout=full)
    _assert_one_line(result, "cannot write the counts to stdout", "No space left")


def test_a_closed_stderr_does_not_fail_a_run_that_wrote_its_counts(tmp_path):
    src = write(tmp_path, "p.json", json.dumps(P))
    assert _command(["allocate", src, "--budget", "12", "-q"]).returncode == 0  # fill the cache
    result = _command(["allocate", src, "--budget", "12"],
                      preexec_fn=_close_stderr)
    assert result.returncode == 0
    # print(file=sys.stderr) with stderr None writes to stdout: the summary must not land
    # among the counts
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "count" and all(line.isdigit() for line in lines[1:]), lines


def _close_stderr():
    import os

    os.close(2)


# ----------------------------------------------------------------------------- endless input


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_dev_zero_is_refused_at_once(how):
    args = ["allocate", "/dev/zero" if how == "file" else "-", "--budget", "12", "-q"]
    with open("/dev/zero", "rb") as zero:
        result = _command(args, stdin=zero if how == "stdin" else subprocess.DEVNULL, timeout=60)
    _assert_one_line(result, "binary file")


class _Endless:
    """A text source without end, like `yes 0.5 |`, counting what was read from it."""

    def __init__(self):
        self.read_bytes = 0

    def read(self, size=-1):
        assert size > 0, "an unbounded read of an endless stream never returns"
        self.read_bytes += size
        return b"0.5\n" * (size // 4)


def test_endless_text_is_refused_at_the_size_limit(capsys, monkeypatch):
    endless = _Endless()
    monkeypatch.setattr("sera_opt.cli.MAX_INPUT_BYTES", 1 << 22)
    monkeypatch.setattr("sys.stdin", type("Stdin", (), {"buffer": endless,
                                                         "isatty": lambda self: False})())
    code = main(["allocate", "-", "--budget", "12", "-q"])
    assert_one_line_error(code, capsys.readouterr().err, "<stdin> is larger than 4 MiB",
                          "batches")
    assert endless.read_bytes <= (1 << 22) + (1 << 20)


def test_a_file_at_the_size_limit_is_read(tmp_path, monkeypatch):
    src = write(tmp_path, "p.txt", "0.5\n" * 256)  # exactly 1 KiB
    monkeypatch.setattr("sera_opt.cli.MAX_INPUT_BYTES", 1 << 10)
    assert read_success_probs(src).shape == (256,)
    write(tmp_path, "p.txt", "0.5\n" * 257)
    with pytest.raises(SeraOptError, match="larger than 1 KiB"):
        read_success_probs(src)


# ----------------------------------------------------------------------------- bench --out


class _Benchmark:
    """Stands in for a benchmark module: records that it ran and with what."""

    def __init__(self):
        self.argv = None

    def main(self, argv):
        self.argv = argv
        return 0

    demo = main


@pytest.fixture
def fake_benchmark(monkeypatch):
    fake = _Benchmark()
    monkeypatch.setattr("sera_opt.cli.import_module", lambda name: fake)
    return fake


@pytest.mark.parametrize("command", [["bench", "solvers"], ["bench", "alignment"], ["demo"]])
@pytest.mark.parametrize("where, fragment", [
    ("file", "is a file; give a folder"),
    ("file/sub", "is a file, not a folder"),
    ("/proc/results", "cannot write into '/proc'"),
])
def test_an_unusable_results_folder_is_refused_before_the_run(command, where, fragment, tmp_path,
                                                              capsys, fake_benchmark):
    (tmp_path / "file").write_text("")
    out = where if where.startswith("/") else str(tmp_path / where)
    for spelling in (["--out", out], [f"--out={out}"]):
        code, _, err = run([*command, "--quick", *spelling], capsys)
        assert_one_line_error(code, err, fragment, repr(out))
        assert fake_benchmark.argv is None, "the benchmark ran although its results would be lost"


def test_a_usable_results_folder_reaches_the_benchmark(tmp_path, capsys, fake_benchmark):
    out = str(tmp_path / "new" / "results")
    code, _, err = run(["bench", "solvers", "--quick", "--out", out], capsys)
    assert code == 0 and err == ""
    assert fake_benchmark.argv == ["--quick", "--out", out]
    assert not (tmp_path / "new").exists(), "the check must not create the folder"


def test_the_default_results_folder_is_checked_too(tmp_path, capsys, fake_benchmark, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmark-results").write_text("")
    code, _, err = run(["bench", "solvers", "--quick"], capsys)
    assert_one_line_error(code, err, "'benchmark-results' is a file")
    assert fake_benchmark.argv is None
    code, _, _ = run(["bench", "solvers", "--help"], capsys)  # help needs no folder
    assert code == 0 and fake_benchmark.argv == ["--help"]


def test_the_real_demo_refuses_its_folder_at_once():
    result = _command(["demo", "--out", "/proc/results"], timeout=60)
    _assert_one_line(result, "/proc")
    assert result.stdout == b""
