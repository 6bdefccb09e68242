"""Reading result JSON back (benchmarks/_results.py) and the compare tool that reads two:
a file is a whole result of its benchmark, or it is refused in one line with exit 2."""

from __future__ import annotations

import json

import pytest

from sera_opt.benchmarks import _results, compare


def _one_line_refusal(capsys, match: str) -> None:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and match in lines[0], captured.err
    assert captured.out == ""


def test_compare_tells_equal_from_different_and_refuses_broken_files(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"benchmark": "maze", "x": 1}))
    b.write_text(json.dumps({"benchmark": "maze", "x": 2}))
    assert compare.main([str(a), str(a)]) == 0
    assert compare.main([str(a), str(b)]) == 1
    capsys.readouterr()
    b.write_text('{"benchmark": "maze", "x"')
    assert compare.main([str(a), str(b)]) == 2
    _one_line_refusal(capsys, "AFTER: ")
    assert compare.main([str(a), str(tmp_path / "absent.json")]) == 2
    _one_line_refusal(capsys, "no file")
    b.write_text(json.dumps({"benchmark": "arithmetic", "x": 1}))
    assert compare.main([str(a), str(b)]) == 2
    _one_line_refusal(capsys, "compare two runs of one benchmark")
    assert compare.main([str(a), str(a), "--show", "-1"]) == 2
    _one_line_refusal(capsys, "--show")


def test_outputs_are_checked_without_writing(tmp_path):
    (tmp_path / "file").write_text("x")
    _results.check_output(tmp_path / "new" / "deeper" / "s.json", flag="--out", suffix=".json")
    assert not (tmp_path / "new").exists()
    for path, match in ((tmp_path / "file" / "s.json", "is a file"),
                        (tmp_path, "names a .json file"),
                        (tmp_path / "s.png", "names a .json file")):
        with pytest.raises(_results.ResultFileError, match=match):
            _results.check_output(path, flag="--out", suffix=".json")


def test_preset_differences_name_each_field():
    preset = {"steps": 400, "grid": (1.0, 2.0), "seeds": 10}
    assert _results.preset_differences({"steps": 400, "grid": [1.0, 2.0], "seeds": 3}, preset,
                                       ignore=("seeds",)) == []
    assert _results.preset_differences({"grid": [1.0]}, preset, ignore=("seeds",)) == [
        "steps: absent, not 400", "grid: [1.0], not [1.0, 2.0]"]


@pytest.mark.parametrize("values, match", [
    ([0.5] * 8, "pass@64 needs 64 samples per problem; the run drew 8"),
    ([None] * 64, "NaN"), ([0.5] * 63 + [1.5], "outside"), ("0.5", "list of numbers"),
    ([True] * 64, "list of numbers")])
def test_curves_are_checked(values, match):
    with pytest.raises(_results.ResultFileError, match=match):
        _results.curve(values, where="here", k=64)
