"""The `sera-opt` command where things go wrong: options that would do nothing, outputs
that cannot be written (checked before any work), closed or full streams, inputs without
end, and table cells that Python's float() reads but a CSV of probabilities should not.

Each failure is one line on stderr and exit status 2 (a reader that goes away is the one
quiet exception, tested in test_cli.py).
"""

from __future__ import annotations

import argparse
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
    (["--option", "foo=1"], ("has no option 'foo'", "continuous", "max_ratio")),
    (["--option", "tol=1e-9", "--solver", "greedy"], ("has no option 'tol'", "milp_solver",
                                                      "max_ratio")),
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
    monkeypatch.setattr("sera_opt.cli.sources.MAX_INPUT_BYTES", 1 << 22)
    monkeypatch.setattr("sys.stdin", type("Stdin", (), {"buffer": endless,
                                                         "isatty": lambda self: False})())
    code = main(["allocate", "-", "--budget", "12", "-q"])
    assert_one_line_error(code, capsys.readouterr().err, "<stdin> is larger than 4 MiB",
                          "batches")
    assert endless.read_bytes <= (1 << 22) + (1 << 20)


def test_a_file_at_the_size_limit_is_read(tmp_path, monkeypatch):
    src = write(tmp_path, "p.txt", "0.5\n" * 256)  # exactly 1 KiB
    monkeypatch.setattr("sera_opt.cli.sources.MAX_INPUT_BYTES", 1 << 10)
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
    monkeypatch.setattr("sera_opt.cli.commands.load_entry", lambda group, name: fake.main)
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
    assert argparse.ArgumentParser.error is _ARGPARSE_ERROR, "argparse left patched"


_ARGPARSE_ERROR = argparse.ArgumentParser.error


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


# ----------------------------------------------------------------------------- tables


@pytest.mark.parametrize("content, column, expected", [
    ("# success probabilities, run 3\n0.5\n0.25\n", None, [0.5, 0.25]),
    ("# from the tracker\nid,p\n# a comment between rows\na,0.5\nb,0.25\n", "p", [0.5, 0.25]),
    ("  # indented\n0.5 0.25\n", None, [0.5, 0.25]),
    ("2024,id\n0.5,a\n0.25,b\n", "2024", [0.5, 0.25]),  # a column named with a number
    ("1\n0.5\n0.25\n", "1", [0.5, 0.25]),
    ("1\n0.5\n0.25\n", None, [1.0, 0.5, 0.25]),  # without --column, 1 is a probability
    ("p\n 0.5 \n+.5\n5e-1\n1.\n-0\n0.0e-400\n", None, [0.5, 0.5, 0.5, 1.0, 0.0, 0.0]),
])
def test_tables_that_were_misread_are_read_as_meant(content, column, expected, tmp_path):
    values = read_success_probs(write(tmp_path, "p.csv", content), column=column)
    assert values.tolist() == expected
    assert not np.signbit(values).any(), "-0 must read as 0"


@pytest.mark.parametrize("content, column, fragments", [
    ("p;x\n0,5;1\n0,9;2\n", "p", ("line 2, column 'p' holds '0,5', a decimal comma",
                                    "write '0.5'")),
    ("0,5;0,9;0,1\n", None, ("line 1, field 1 holds '0,5', a decimal comma",)),
    ("0,5\n0,9\n", None, ("decimal commas",)),
    ("p\t\n0,5\t\n", "p", ("a decimal comma",)),
    ("2024\n0.5\n0.9\n", None, ("must lie in [0, 1]", "--column 2024")),
    ("2,0.5,0.9\n", None, ("must lie in [0, 1]",)),
    ("2024,id\n0.5,a\n0.9,b\n", None, ("no header row", "--column too")),
    ("# only a comment\n", None, ("only comment lines",)),
    # a no-break space inside a delimited cell (where cells split on blanks, it separates)
    ("p;x\n0.5\u00a0;1\n", "p", ("holds '0.5\\xa0'", "not ASCII")),
])
def test_misdiagnosed_tables_get_the_right_diagnosis(content, column, fragments, tmp_path,
                                                     capsys):
    src = write(tmp_path, "p.csv", content)
    argv = ["allocate", src, "--budget", "12"] + ([] if column is None else ["--column", column])
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "p.csv", *fragments)


@pytest.mark.parametrize("cell, fragment", [
    ("0.5_0", "without underscores ('0.50')"),
    ("1_0e-1", "without underscores"),
    ("0x1p-1", "not a number"),
    ("nan", "not a probability"),
    ("NaN", "not a probability"),
    ("inf", "not a probability"),
    ("-Infinity", "not a probability"),
    ("1e-400", "too small for a float64"),
    ("0.001e-400", "too small for a float64"),
    ("\uff10.\uff15", "not ASCII"),  # full-width 0.5
    ("\u0660.\u0665", "not ASCII"),  # Arabic-Indic 0.5
    ("0,5", "a decimal comma"),
])
@pytest.mark.parametrize("layout", ["column", "header", "line"])
def test_cells_that_float_reads_but_a_table_should_not(cell, fragment, layout, tmp_path,
                                                       capsys):
    content = {"column": f"0.25\n{cell}\n", "header": f"id;p\na;0.25\nb;{cell}\n",
               "line": f"0.25;{cell}\n"}[layout]
    src = write(tmp_path, "p.csv", content)
    argv = ["allocate", src, "--budget", "12"] + (["--column", "p"] if layout == "header" else [])
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "p.csv", fragment)
    place = {"column": "line 2", "header": "line 3, column 'p'", "line": "line 1, field 2"}
    assert place[layout] in err, err


# ----------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("payload, fragment", [
    ('{"success_probs": [0.5], "success_probs": [0.9, 0.1]}', "appears 2 times"),
    ("[NaN, 0.5]", "NaN is not valid JSON"),
    ("[0.5, -Infinity]", "-Infinity is not valid JSON"),
    ("[1e-400, 0.5]", "too small for a float64"),
    ("[0.5, -0.001e-400]", "too small for a float64"),
])
def test_json_that_json_loads_takes_but_should_not(payload, fragment, capsys, monkeypatch):
    code, _, err = run(["allocate", "-", "--budget", "12"], capsys, stdin=payload,
                       monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "<stdin>", fragment)


def test_json_minus_zero_reads_as_zero(tmp_path):
    values = read_success_probs(write(tmp_path, "p.json", "[-0.0, 0.5]"))
    assert values.tolist() == [0.0, 0.5] and not np.signbit(values).any()


# ----------------------------------------------------------------------------- more outputs


def test_the_input_file_is_not_overwritten_by_the_counts(tmp_path, capsys):
    src = write(tmp_path, "p.csv", "0.5\n0.25\n")
    code, _, err = run(["allocate", src, "--budget", "12", "-o", src], capsys)
    assert_one_line_error(code, err, "is the input file")
    assert (tmp_path / "p.csv").read_text() == "0.5\n0.25\n"


def test_an_empty_output_name(capsys, monkeypatch):
    code, _, err = run(["allocate", "-", "--budget", "12", "-o", ""], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "-o is given an empty name")


@pytest.mark.parametrize("argv, fragment", [
    (["bench", "solvers", "--nope"], "unrecognized arguments: --nope"),
    (["bench", "solvers", "--seed", "x"], "'x' is not a whole number"),
    (["demo", "--seed", "x"], "'x' is not a whole number"),
])
def test_a_benchmarks_own_argument_errors_are_one_line(argv, fragment):
    result = _command(argv, timeout=120)
    _assert_one_line(result, fragment, "--help")


def test_a_huge_option_value_is_not_echoed_whole(capsys, monkeypatch):
    value = "9" * 5000  # beyond Python's int-string limit, so not a literal
    code, _, err = run(["allocate", "-", "--budget", "12", "--option", f"alpha={value}"], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "not a Python literal", "(5000 characters)")
    assert len(err) < 300, err


def test_the_checked_default_folder_is_the_benchmarks_default():
    harness = pytest.importorskip("sera_opt.benchmarks._harness")
    from sera_opt.cli import BENCH_DEFAULT_OUT

    assert str(harness.DEFAULT_OUT) == BENCH_DEFAULT_OUT


@pytest.mark.parametrize("argv", [["--version"], ["cache"], ["cache", "info"]])
def test_a_cache_path_the_terminal_cannot_encode_is_escaped_not_a_failure(tmp_path, argv):
    import os

    cache = tmp_path / "cache-é"
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "SERA_OPT_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-m", "sera_opt.cli", *argv], env=env,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode("ascii", "replace")
    assert b"unexpected" not in out.stderr and b"cache-\\xe9" in out.stdout, out


def test_a_notice_the_stream_cannot_encode_is_escaped(monkeypatch):
    import io
    import logging

    from sera_opt._notices import notice

    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr("sys.stderr", stream)
    notice("sera_opt: the kernel cache at /tmp/cache-é cannot be written", level=logging.INFO)
    stream.flush()
    assert stream.buffer.getvalue() == b"sera_opt: the kernel cache at /tmp/cache-\\xe9 cannot " \
                                       b"be written\n"
