"""The `sera-opt allocate` command."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from sera_opt.cli import main, read_success_probs

P = [0.669, 0.201, 0.576, 0.600, 0.953]


def run(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_csv_in_csv_out(tmp_path, capsys):
    src = tmp_path / "p.csv"
    src.write_text("success_prob\n" + "\n".join(map(str, P)) + "\n")
    code, out, err = run([ "allocate", str(src), "--budget", "12", "--max", "9"], capsys)
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
    assert err == ""


def test_npy_input_and_output_file(tmp_path, capsys):
    src = tmp_path / "p.npy"
    np.save(src, np.array(P))
    dst = tmp_path / "counts.csv"
    code, out, _ = run(["allocate", str(src), "--budget", "12", "--max", "9", "-o", str(dst)],
                       capsys)
    assert code == 0 and out == ""
    assert dst.read_text().split() == ["count", "2", "5", "2", "2", "1"]


def test_named_column(tmp_path):
    src = tmp_path / "p.csv"
    src.write_text("id,p\na,0.1\nb,0.9\n")
    assert read_success_probs(str(src), column="p").tolist() == [0.1, 0.9]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["allocate", "-", "--budget", "100", "--max", "9"], "infeasible"),
        (["allocate", "-"], "exactly one of --budget and --per-prompt"),
        (["allocate", "missing.csv", "--budget", "5"], "no such file"),
        (["allocate", "-", "--budget", "12", "--solver", "nope"], "unknown solver"),
    ],
)
def test_errors_are_reported_not_raised(argv, match, capsys, monkeypatch):
    code, _, err = run(argv, capsys, stdin=json.dumps(P), monkeypatch=monkeypatch)
    assert code == 2
    assert match in err
