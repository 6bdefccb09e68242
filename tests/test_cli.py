"""The `sera-opt` command: outputs, policies, and one clear line for every bad input.

Classes of bad input, as a new user meets them (each has tests below):

1. the command line itself: non-integers, out-of-range choices, missing values, unknown words;
2. the source: missing file, a folder, an unreadable file, stdin left at a terminal;
3. the bytes: binary or non-UTF-8 files;
4. JSON: syntax errors, entries that are not numbers (strings, null, booleans, nested lists);
5. tables: a one-line list, several columns with no --column, rows of the wrong length,
   headerless tables, empty cells or files, a byte-order mark, quoted fields, --column where
   there is no table;
6. .npy: not an .npy file, pickles and object arrays, truncated files, wrong shape or dtype;
7. values: NaN, inf, outside [0, 1] (the library's validation, named with the source);
8. the output: a missing or unwritable folder, a folder as the file, a full device, a closed pipe;
9. policies and options: unknown names, options or values, options a solver would ignore;
10. failures sera_opt did not foresee: one line, status 1, the traceback kept in a file.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import SeraOptError
from sera_opt.cli import build_parser, main, read_success_probs
from sera_opt.cli.tables import from_table as _from_table
from sera_opt.cli.tables import from_table_rows as _from_table_rows

P = [0.669, 0.201, 0.576, 0.600, 0.953]


def run(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        if isinstance(stdin, bytes):
            stream = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
        else:
            stream = io.StringIO(stdin)
        monkeypatch.setattr("sys.stdin", stream)
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code, err, *fragments, status=2):
    assert code == status, f"exit status {code}, expected {status}; stderr: {err!r}"
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line: {err!r}"
    assert "Traceback" not in err and err.startswith("sera-opt"), err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from {err!r}"


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


# ----------------------------------------------------------------------------- outputs


def test_csv_in_csv_out(tmp_path, capsys):
    src = write(tmp_path, "p.csv", "success_prob\n" + "\n".join(map(str, P)) + "\n")
    code, out, err = run(["allocate", src, "--budget", "12", "--max", "9"], capsys)
    assert code == 0
    assert out.split() == ["count", "2", "5", "2", "2", "1"]
    assert "min factor 0.6744" in err and "uniform" in err


def test_json_stdin_json_out(capsys, monkeypatch):
    code, out, err = run(["allocate", "-", "--per-prompt", "4", "--offset", "1", "--format", "json",
                          "--max", "9", "-q"], capsys, stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert code == 0
    payload = json.loads(out)
    assert sum(payload["counts"]) == 20
    assert min(payload["counts"]) >= 2
    summary = payload["summary"]
    assert summary["min_factor"] >= summary["uniform_min_factor"]
    assert summary["policy"] == "sera" and summary["max_rollouts"] == 9
    assert err == ""


def test_readme_example(capsys, monkeypatch):
    code, out, _ = run(["allocate", "-", "--budget", "24", "--max", "16"], capsys,
                       stdin="[0.9, 0.5, 0.05]", monkeypatch=monkeypatch)
    assert code == 0 and out.split() == ["count", "2", "6", "16"]


def test_npy_input_and_output_file(tmp_path, capsys):
    src = tmp_path / "p.npy"
    np.save(src, np.array(P))
    dst = tmp_path / "counts.csv"
    code, out, _ = run(["allocate", str(src), "--budget", "12", "--max", "9", "-o", str(dst)],
                       capsys)
    assert code == 0 and out == ""
    assert dst.read_text().split() == ["count", "2", "5", "2", "2", "1"]


def test_named_column(tmp_path):
    src = write(tmp_path, "p.csv", "id,p\na,0.1\nb,0.9\n")
    assert read_success_probs(src, column="p").tolist() == [0.1, 0.9]


def test_default_policy_is_sera_with_its_defaults(capsys, monkeypatch):
    probs = [0.9, 0.5, 0.01]
    expected = sera_opt.get_policy("sera").allocate(probs, 60).counts.tolist()
    for args in ([], ["--policy", "sera"]):
        code, out, _ = run(["allocate", "-", "--budget", "60", "--format", "json", "-q", *args],
                           capsys, stdin=json.dumps(probs), monkeypatch=monkeypatch)
        assert code == 0
        payload = json.loads(out)
        assert payload["counts"] == expected
        assert payload["summary"]["policy"] == "sera"
        assert payload["summary"]["max_rollouts"] == 80  # the cap, ceil(4 * 60 / 3)
    code, out, _ = run(["allocate", "-", "--budget", "60", "--option", "max_ratio=None", "-q"],
                       capsys, stdin=json.dumps(probs), monkeypatch=monkeypatch)
    uncapped = sera_opt.get_policy("sera", max_ratio=None).allocate(probs, 60).counts
    assert code == 0 and out.split()[1:] == [str(c) for c in uncapped]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["allocate", "-", "--budget", "100", "--max", "9"], "infeasible"),
        (["allocate", "-"], "exactly one of --budget and --per-prompt"),
        (["allocate", "missing.csv", "--budget", "5"], "no such file"),
        (["allocate", "-", "--budget", "12", "--solver", "nope"], "unknown solver"),
    ],
)
def test_library_errors_are_one_line(argv, match, capsys, monkeypatch):
    code, _, err = run(argv, capsys, stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, match)


# ----------------------------------------------------------------------------- 1. command line


@pytest.mark.parametrize(
    "args, match",
    [
        (["--budget", "1e20x"], "'1e20x' is not a number"),
        (["--budget", "2.5"], "not a whole number"),
        (["--budget", "nan"], "not a finite number"),
        (["--budget", "inf"], "not a finite number"),
        (["--budget", "1e5000"], "more than 1000 digits"),
        (["--per-prompt", "1.5"], "--per-prompt"),
        (["--budget", "12", "--min", "two"], "--min"),
        (["--budget", "12", "--offset", "2"], "invalid choice"),
        (["--budget"], "expected one argument"),
        (["--budget", "12", "--bogus"], "unrecognized arguments: --bogus"),
        (["--budget", "12", "extra.csv"], "unrecognized arguments: extra.csv"),
        (["--budget", "12", "--format", "xml"], "invalid choice"),
    ],
)
def test_command_line_errors_are_one_line(args, match, capsys, monkeypatch):
    code, out, err = run(["allocate", "-", *args], capsys, stdin=json.dumps(P),
                         monkeypatch=monkeypatch)
    assert_one_line_error(code, err, match, "--help")
    assert out == ""


@pytest.mark.parametrize("args", [["--budget", "12", "--budget", "24"], ["--max", "8", "--max", "16"],
                                  ["--budget", "12", "--offset", "0", "--offset", "1"],
                                  ["--budget", "12", "-o", "a.csv", "--output", "b.csv"],
                                  ["--budget", "12", "--format", "csv", "--format", "json"]])
def test_an_option_given_twice_is_refused_not_overridden(args, capsys, monkeypatch):
    code, out, err = run(["allocate", "-", *args], capsys, stdin=json.dumps(P),
                         monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "is given twice")
    assert out == ""


@pytest.mark.parametrize("argv", [[], ["alocate"], ["bench", "nope"]])
def test_subcommand_errors_are_one_line(argv, capsys):
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, "error:", "--help")


@pytest.mark.parametrize(
    "text, value",
    [("24", 24), ("1_000", 1000), ("1e6", 10**6), ("24.0", 24), ("1e20", 10**20),
     ("123456789012345678901234567890", 123456789012345678901234567890), ("-3", -3)],
)
def test_whole_numbers_are_read_exactly(text, value):
    budget = build_parser().parse_args(["allocate", "--budget", text]).budget
    assert type(budget) is int and budget == value


def test_big_budget_reaches_the_library_as_an_int(capsys, monkeypatch):
    # 1e20 through a float would print as 1e+20; the library must see the exact integer.
    code, _, err = run(["allocate", "-", "--budget", "1e20", "--max", "2"], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "budget")
    assert "e+20" not in err


def test_huge_budget_does_not_end_in_a_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    code, _, err = run(["allocate", "-", "--budget", str(10**30)], capsys, stdin=json.dumps(P),
                       monkeypatch=monkeypatch)
    # The library rejects the budget itself: a wrong input (2), never an unexpected error (1).
    assert_one_line_error(code, err, "budget")


# ----------------------------------------------------------------------------- 2. the source


def test_folder_as_input(tmp_path, capsys):
    code, _, err = run(["allocate", str(tmp_path), "--budget", "12"], capsys)
    assert_one_line_error(code, err, "is a folder")


def test_unreadable_input(tmp_path, capsys, monkeypatch):
    src = write(tmp_path, "p.csv", "0.5\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr("pathlib.Path.open", denied)
    code, _, err = run(["allocate", src, "--budget", "12"], capsys)
    assert_one_line_error(code, err, "permission denied")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="file permissions do not bind root")
def test_unreadable_input_for_real(tmp_path, capsys):
    src = tmp_path / "p.csv"
    src.write_text("0.5\n")
    src.chmod(0)
    code, _, err = run(["allocate", str(src), "--budget", "12"], capsys)
    assert_one_line_error(code, err, "permission denied")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_stdin_at_a_terminal_is_refused_not_waited_on(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", _Terminal("0.5\n"))
    code, _, err = run(["allocate", "--budget", "12"], capsys)
    assert_one_line_error(code, err, "no input", "pipe")


# ----------------------------------------------------------------------------- 3. bytes


@pytest.mark.parametrize(
    "content, match",
    [
        (bytes(range(128, 256)) * 4, "not UTF-8 text"),
        (b"0.5\n\x00\x01\x02\n", "binary file"),
        ("0.5\n0.25\n".encode("utf-16"), "UTF-16"),
    ],
)
def test_binary_input(content, match, tmp_path, capsys):
    src = write(tmp_path, "p.csv", content)
    code, _, err = run(["allocate", src, "--budget", "12"], capsys)
    assert_one_line_error(code, err, match)


# ----------------------------------------------------------------------------- 4. JSON


def test_malformed_json(tmp_path, capsys):
    src = write(tmp_path, "p.json", "[0.9, 0.5")
    code, _, err = run(["allocate", src, "--budget", "12"], capsys)
    assert_one_line_error(code, err, "not valid JSON", "line 1, column 10")


@pytest.mark.parametrize(
    "payload, match",
    [
        ('[0.9, "x", 0.5]', 'entry 1 of the list is the string "x"'),
        ('[0.9, "0.5"]', "without quotes"),
        ("[0.9, null]", "entry 1 of the list is null"),
        ("[true, 0.5]", "entry 0 of the list is the boolean true"),
        ("[[0.9], [0.5]]", "entry 0 of the list is a list"),
        ('[0.5, {"p": 1}]', "entry 1 of the list is an object"),
        ('{"success_probs": [0.5, false]}', "entry 1 of the 'success_probs' list"),
        ('{"p": [0.5]}', "its keys are 'p'"),
        ('{"success_probs": [0.5], "budget": 24}', "also has 'budget'"),
        ('"0.5"', "must be a list"),
        ("0.5", "must be a list"),
        ("[1e400, 0.5]", "non-finite"),
        ("[" + "9" * 400 + "]", "too large"),
    ],
)
def test_json_entries_that_are_not_numbers(payload, match, tmp_path, capsys, monkeypatch):
    code, _, err = run(["allocate", write(tmp_path, "p.json", payload), "--budget", "12"], capsys)
    assert_one_line_error(code, err, match, "p.json")
    if payload.startswith("["):  # stdin is read as JSON by its first character
        code, _, err = run(["allocate", "-", "--budget", "12"], capsys, stdin=payload,
                           monkeypatch=monkeypatch)
        assert_one_line_error(code, err, match, "<stdin>")


# ----------------------------------------------------------------------------- 5. tables


@pytest.mark.parametrize("line", ["0.9,0.5,0.05", "0.9, 0.5, 0.05", "0.9 0.5 0.05",
                                  "0.9;0.5;0.05", "0.9\t0.5\t0.05", "0.9,0.5,0.05\n\n"])
def test_one_line_list_is_several_prompts(line, tmp_path, capsys, monkeypatch):
    assert read_success_probs(write(tmp_path, "p.csv", line)).tolist() == [0.9, 0.5, 0.05]
    code, out, _ = run(["allocate", "-", "--budget", "24", "--max", "16", "-q"], capsys,
                       stdin=line, monkeypatch=monkeypatch)
    assert code == 0 and out.split() == ["count", "2", "6", "16"]


def test_several_columns_need_column(tmp_path, capsys):
    # Numeric ids: reading the first column would "work" and allocate on the ids.
    src = write(tmp_path, "p.csv", "id,success_prob\n0,0.5\n1,0.25\n")
    code, _, err = run(["allocate", src, "--budget", "12"], capsys)
    assert_one_line_error(code, err, "2 columns ('id', 'success_prob')", "--column")
    assert read_success_probs(src, column="success_prob").tolist() == [0.5, 0.25]


@pytest.mark.parametrize(
    "content, column, match",
    [
        ("0.1,0.2\n0.3\n", None, "line 2 has 1 field(s) but line 1 has 2"),
        ("id,p\na,0.1\nb\n", "p", "line 3 has 1 field(s) but the header has 2"),
        ("id,p\na,0.1,7\n", "p", "line 2 has 3 field(s)"),
        ("0.1 0.2\n0.3 0.4\n", None, "no header row"),
        ("0.1,0.2\n0.3,0.4\n", None, "no header row"),
        ("0,5\n0,25\n", None, "decimal commas"),
        ("0.5\n0.25\n", "p", "has no header row, so it has no column named 'p'"),
        ("id,p\na,0.1\n", "q", "has no column 'q'; its columns are 'id', 'p'"),
        ("p,p\n0.1,0.2\n", "p", "2 columns named 'p'"),
        ("p\n0.5\nabc\n", None, "line 3, column 'p' holds 'abc', which is not a number"),
        ("0.5\n\n\n0.5x\n", None, "line 4 holds '0.5x'"),
        ("id,p\na,\n", "p", "line 2, column 'p' is empty"),
        ("0.5,,0.25", None, "line 1, field 2 is empty"),
        ('id,p\n"a,b",0.1\n"c,0.2\n', "p", "line 3"),
        ("p\n", None, "has a header row ('p') but no rows"),
        ("", None, "is empty"),
        (" \n\t\n", None, "is empty"),
        (",,\n,\n", None, "only empty fields"),
        ("p\n0.5\nnan\n", None, "holds 'nan', which is not a probability"),
        ("p\n0.5\ninf\n", None, "holds 'inf', which is not a probability"),
        ("p\n0.5\n1.5\n", None, "must lie in [0, 1]"),
    ],
)
def test_table_errors(content, column, match, tmp_path, capsys):
    src = write(tmp_path, "p.csv", content)
    argv = ["allocate", src, "--budget", "12"] + ([] if column is None else ["--column", column])
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, match, "p.csv")


@pytest.mark.parametrize(
    "content, column, expected",
    [
        ("\ufeff0.5\n0.25\n", None, [0.5, 0.25]),  # a byte-order mark is not a header
        ("\ufeffp\n0.5\n", "p", [0.5]),
        ('prompt,p\n"What is 2, plus 2?",0.5\n"Say ""hi""",0.25\n', "p", [0.5, 0.25]),
        ("id\tp\na, b\t0.5\n", "p", [0.5]),
        ("id,p\na,0.5\n,\n\n", "p", [0.5]),  # spreadsheets end with empty rows
        ("p\r\n0.5\r\n0.25\r\n", None, [0.5, 0.25]),
        ("  0.5  \n\n 0.25\n", None, [0.5, 0.25]),
        ("id p\na 0.5\nb 0.25\n", "p", [0.5, 0.25]),
    ],
)
def test_tables_read_as_written(content, column, expected, tmp_path):
    assert read_success_probs(write(tmp_path, "p.csv", content), column=column).tolist() == expected


def test_column_is_refused_where_there_is_no_table(tmp_path, capsys):
    src = write(tmp_path, "p.json", json.dumps(P))
    code, _, err = run(["allocate", src, "--budget", "12", "--column", "p"], capsys)
    assert_one_line_error(code, err, "--column", "JSON")


_CELLS = st.sampled_from(["0.5", "1", "0", "0.25", " 0.75 ", "1e-3", "nan", "-0.1", "p", "q",
                          "abc", "", "  ", "0.25 0.5", "p q", "0.5,0.25", ",", "\t0.5"])


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_CELLS, min_size=1, max_size=8), newline=st.sampled_from(["\n", "\r\n"]),
       column=st.sampled_from([None, "p", "q"]))
def test_fast_single_column_read_matches_the_row_reader(lines, newline, column):
    text = newline.join(lines)
    if not text.strip():
        return  # empty input is refused before tables are parsed

    def outcome(reader):
        try:
            return [repr(v) for v in reader(text, "t", column)]
        except SeraOptError as exc:
            return str(exc)

    assert outcome(_from_table) == outcome(_from_table_rows), repr(text)


_PROBS = st.lists(st.floats(0, 1), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(probs=_PROBS, layout=st.sampled_from(["lines", "header", "comma", "spaces", "json",
                                              "object", "table", "npy"]))
def test_every_layout_reads_back_exactly(probs, layout, tmp_path_factory):
    folder = tmp_path_factory.mktemp("layout")
    column = None
    if layout == "npy":
        path = folder / "p.npy"
        np.save(path, np.array(probs))
    else:
        text = {
            "lines": "\n".join(map(repr, probs)) + "\n",
            "header": "success_prob\n" + "\n".join(map(repr, probs)),
            "comma": ",".join(map(repr, probs)),
            "spaces": " ".join(map(repr, probs)),
            "json": json.dumps(probs),
            "object": json.dumps({"success_probs": probs}),
            "table": "id,p\n" + "\n".join(f"{i},{p!r}" for i, p in enumerate(probs)),
        }[layout]
        path = folder / "p.txt"
        path.write_text(text)
        column = "p" if layout == "table" else None
    np.testing.assert_array_equal(read_success_probs(str(path), column=column), probs)


# ----------------------------------------------------------------------------- 6. .npy


def test_npy_errors(tmp_path, capsys):
    cases = {
        "matrix.npy": (np.full((2, 2), 0.5), "must be 1-D"),
        "flags.npy": (np.array([True, False]), "booleans"),
        "words.npy": (np.array(["a", "b"]), "numeric"),
        "objects.npy": (np.array([0.5, None], dtype=object), "pickle"),
    }
    for name, (array, match) in cases.items():
        np.save(tmp_path / name, array, allow_pickle=True)
        code, _, err = run(["allocate", str(tmp_path / name), "--budget", "12"], capsys)
        assert_one_line_error(code, err, match, name)
    (tmp_path / "pickled.npy").write_bytes(pickle.dumps([0.5, 0.25]))
    code, _, err = run(["allocate", str(tmp_path / "pickled.npy"), "--budget", "12"], capsys)
    assert_one_line_error(code, err, "not a NumPy .npy file")
    np.save(tmp_path / "whole.npy", np.array(P))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "whole.npy").read_bytes()[:-8])
    code, _, err = run(["allocate", str(tmp_path / "cut.npy"), "--budget", "12"], capsys)
    assert_one_line_error(code, err, "cut.npy")


def test_npy_through_stdin(capsys, monkeypatch):
    buffer = io.BytesIO()
    np.save(buffer, np.array([0.9, 0.5, 0.05]))
    code, out, _ = run(["allocate", "-", "--budget", "24", "--max", "16", "-q"], capsys,
                       stdin=buffer.getvalue(), monkeypatch=monkeypatch)
    assert code == 0 and out.split() == ["count", "2", "6", "16"]


# ----------------------------------------------------------------------------- 8. output


def test_output_into_a_missing_folder(tmp_path, capsys, monkeypatch):
    dst = tmp_path / "no" / "such" / "counts.csv"
    code, _, err = run(["allocate", "-", "--budget", "12", "-o", str(dst)], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "does not exist", "mkdir -p")
    assert not dst.parent.exists()


def test_output_that_is_a_folder_or_under_a_file(tmp_path, capsys, monkeypatch):
    code, _, err = run(["allocate", "-", "--budget", "12", "-o", str(tmp_path)], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "is a folder")
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(["allocate", "-", "--budget", "12", "-o", str(blocker / "x.csv")], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "is a file, not a folder")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_write_failure(capsys, monkeypatch):
    code, _, err = run(["allocate", "-", "--budget", "12", "-o", "/dev/full"], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "cannot write the counts to '/dev/full'")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="file permissions do not bind root")
def test_output_into_an_unwritable_folder(tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    code, _, err = run(["allocate", "-", "--budget", "12", "-o", str(locked / "c.csv")], capsys,
                       stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "permission denied")


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_closed_stdout_pipe_stops_quietly(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(P)))
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    code = main(["allocate", "-", "--budget", "12", "-q"])
    assert code == 1 and capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- 9. policies


@pytest.mark.parametrize("name", sera_opt.available_policies())
def test_every_registered_policy_runs_from_the_command_line(name, capsys, monkeypatch):
    probs = [0.9, 0.6, 0.3, 0.05]
    code, out, err = run(["allocate", "-", "--budget", "40", "--offset", "1", "--policy", name,
                          "--format", "json"], capsys, stdin=json.dumps(probs),
                         monkeypatch=monkeypatch)
    assert code == 0, err
    payload = json.loads(out)
    expected = sera_opt.get_policy(name, offset=1).allocate(probs, 40).counts.tolist()
    assert payload["counts"] == expected and payload["summary"]["policy"] == name
    assert f"policy {name}" in err


@pytest.mark.parametrize(
    "name, args, options",
    [
        ("sera-bayes", ["prior_strength=16"], {"prior_strength": 16}),
        ("sera-bayes", ["prior_strength=inf"], {"prior_strength": float("inf")}),
        ("sera", ["max_ratio=None", "continuous=False"], {"max_ratio": None, "continuous": False}),
        ("sera", ["max_ratio=2"], {"max_ratio": 2}),
        ("vip", ["gamma=1e-2"], {"gamma": 1e-2}),
        ("gvm", ["gradient_norms=[1, 2, 3, 4]", "beta=1.5"],
         {"gradient_norms": [1, 2, 3, 4], "beta": 1.5}),
    ],
)
def test_policy_options_are_python_literals(name, args, options, capsys, monkeypatch):
    probs = [0.9, 0.6, 0.3, 0.05]
    argv = ["allocate", "-", "--budget", "40", "--min", "2", "--policy", name, "-q"]
    for item in args:
        argv += ["--option", item]
    code, out, err = run(argv, capsys, stdin=json.dumps(probs), monkeypatch=monkeypatch)
    assert code == 0, err
    expected = sera_opt.get_policy(name, min_rollouts=2, **options).allocate(probs, 40).counts
    assert out.split()[1:] == [str(c) for c in expected]


def test_solver_choice_for_sera(capsys, monkeypatch):
    for argv in (["--solver", "greedy"], ["--policy", "sera", "--solver", "greedy"]):
        code, out, err = run(["allocate", "-", "--budget", "24", "--max", "16", *argv], capsys,
                             stdin="[0.9, 0.5, 0.05]", monkeypatch=monkeypatch)
        assert code == 0 and out.split() == ["count", "2", "6", "16"] and "greedy" in err


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--policy", "nope"], ("unknown policy 'nope'", "'uniform'")),
        (["--policy", "gvm", "--option", "foo=1"], ("foo", "gradient_norms")),
        (["--policy", "vip", "--option", "gamma=abc"], ("gamma", "'abc'")),
        (["--policy", "uniform", "--option", "max_ratio=2"], ("max_ratio",)),
        (["--option", "continous=False"], ("continous",)),
        (["--option", "gamma=1e-3x"], ("not a Python literal",)),
        (["--option", "max_ratio=true"], ("write True, False or None",)),
        (["--option", "alpha"], ("--option takes KEY=VALUE",)),
        (["--option", "=2"], ("--option takes KEY=VALUE",)),
        (["--option", "min_rollouts=2"], ("set min_rollouts with --min",)),
        (["--option", "solver=milp"], ("set solver with --solver",)),
        (["--option", "max_ratio=2", "--option", "max_ratio=3"], ("given twice",)),
        (["--policy", "uniform", "--solver", "greedy"], ("policy 'uniform' has none",)),
        (["--policy", "sera-bayes", "--option", "prior_strength=-1"], ("prior_strength",)),
    ],
)
def test_policy_errors_are_one_line(args, fragments, capsys, monkeypatch):
    code, out, err = run(["allocate", "-", "--budget", "12", *args], capsys, stdin=json.dumps(P),
                         monkeypatch=monkeypatch)
    assert_one_line_error(code, err, *fragments)
    assert out == ""


class _StrictPolicy(sera_opt.UniformPolicy):
    """A policy whose constructor rejects options the way plain Python does."""

    name = "strict-test"
    option_names = ("width",)

    def __init__(self, width: float = 1.0, *, min_rollouts=None, max_rollouts=None, offset=0):
        super().__init__(min_rollouts=min_rollouts, max_rollouts=max_rollouts, offset=offset)
        self.width = float(width)


@pytest.mark.parametrize(
    "option, fragments",
    [("depth=2", ("depth", "width")),
     ("width='wide'", ("rejected width='wide'", "could not convert"))],
)
def test_policy_constructor_errors_are_one_line(option, fragments, capsys, monkeypatch):
    from sera_opt.policies import POLICIES

    monkeypatch.setitem(POLICIES._entries, _StrictPolicy.name, _StrictPolicy)
    code, _, err = run(["allocate", "-", "--budget", "12", "--policy", "strict-test", "--option",
                        option], capsys, stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert_one_line_error(code, err, *fragments)


# ----------------------------------------------------------------------------- 10. unforeseen


def _boom(self, *args, **kwargs):
    raise RuntimeError("boom\nsecond line")


def test_unexpected_failure_is_one_line_with_the_traceback_kept(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(sera_opt.SERAPolicy, "allocate", _boom)
    code, out, err = run(["allocate", "-", "--budget", "12"], capsys, stdin=json.dumps(P),
                         monkeypatch=monkeypatch)
    assert_one_line_error(code, err, "RuntimeError: boom second line", "bug", status=1)
    assert out == ""
    (saved,) = tmp_path.glob("sera-opt-traceback-*.txt")
    assert saved.name in err
    assert "Traceback" in saved.read_text() and "_boom" in saved.read_text()


def test_traceback_flag_shows_the_traceback(monkeypatch):
    monkeypatch.setattr(sera_opt.SERAPolicy, "allocate", _boom)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(P)))
    with pytest.raises(RuntimeError, match="boom"):
        main(["--traceback", "allocate", "-", "--budget", "12"])


def test_missing_module_and_interrupt(capsys, monkeypatch, tmp_path):
    def missing(group, name):
        raise ModuleNotFoundError("No module named 'sklearn'", name="sklearn")

    monkeypatch.setattr("sera_opt.cli.commands.load_entry", missing)
    code, _, err = run(["bench", "alignment"], capsys)
    assert_one_line_error(code, err, "No module named 'sklearn'", "pip install", status=1)

    def broken(group, name):
        raise ImportError("cannot import name 'x' from 'sera_opt.solvers'", name="sera_opt.solvers")

    monkeypatch.setattr("sera_opt.cli.commands.load_entry", broken)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    code, _, err = run(["bench", "alignment"], capsys)  # a bug, not a missing install
    assert_one_line_error(code, err, "unexpected error: ImportError", "bug", status=1)

    def interrupted(group, name):
        raise KeyboardInterrupt

    monkeypatch.setattr("sera_opt.cli.commands.load_entry", interrupted)
    code, _, err = run(["demo"], capsys)
    assert_one_line_error(code, err, "interrupted", status=130)


def test_a_benchmark_without_its_entry_point_says_how_to_get_it(capsys, monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **selection: ())
    code, _, err = run(["bench", "solvers", "--quick"], capsys)
    assert_one_line_error(code, err, "no 'sera_opt.benchmarks' entry point named 'solvers'",
                          "pip install -e .", status=2)


# ----------------------------------------------------------------------------- the real command


def _command(args, **kwargs):
    return subprocess.run([sys.executable, "-m", "sera_opt.cli", *args], capture_output=True,
                          text=True, timeout=120, **kwargs)


def test_the_command_prints_one_line_and_exits_2(tmp_path):
    bad = write(tmp_path, "bad.json", "[0.9, 0.5")
    for args in (["allocate", bad, "--budget", "12"], ["allocate", str(tmp_path), "--budget", "12"],
                 ["allocate", bad, "--budget", "1e20x"]):
        result = _command(args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr


def test_the_command_stops_quietly_when_the_reader_goes_away(tmp_path):
    src = write(tmp_path, "p.json", json.dumps(P))
    # a first run fills numba's cache, so that the run below has nothing to announce
    assert _command(["allocate", src, "--budget", "12", "-q"]).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "sera_opt.cli", "allocate", src, "--budget",
                             "12", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the counts are written (`... | true`)
    try:
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 1
    finally:
        proc.kill()
    assert err == ""
