"""Reading the benchmarks' result JSON back: a file is a whole result of the benchmark it is
given as, or it is refused in one line.

The decision tools (:mod:`~sera_opt.benchmarks.cost_decision`,
:mod:`~sera_opt.benchmarks.rounds_decision`), ``trl-coverage --merge`` and
:mod:`~sera_opt.benchmarks.compare` read files a person names on a command line: a wrong,
truncated or foreign file must stop them before they judge, with a message that says
which file and what is wrong, never a traceback or a verdict on the wrong runs.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.exceptions import SeraOptError

__all__ = ["ARM_FIELDS", "ResultFileError", "check_output", "check_preset", "curve",
           "preset_differences", "presets", "read_json", "read_result", "run_tool",
           "same_files"]


class ResultFileError(SeraOptError):
    """A result file, or an output path, that a benchmark tool cannot use."""


def read_json(path: Path, *, flag: str) -> Any:
    """The JSON value in ``path``, or a :class:`ResultFileError` naming ``flag`` and what is
    wrong (absent, unreadable, empty, truncated, not JSON). A path ending in ``.gz`` is read
    through gzip (the committed shards under docs/results/ are compressed)."""
    path = Path(path)
    if not path.is_file():
        raise ResultFileError(f"{flag}: no file {str(path)!r}; give the JSON its run wrote")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                text = f.read()
        else:
            text = path.read_text(encoding="utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ResultFileError(f"{flag}: cannot read {str(path)!r}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise ResultFileError(f"{flag}: {str(path)!r} is empty; give the JSON its run wrote "
                              "(a run that was stopped writes none)")
    try:
        # NaN and Infinity are not JSON; the benchmarks write them as null.
        return json.loads(text, parse_constant=_refuse_constant)
    except _Constant as exc:
        raise ResultFileError(f"{flag}: {str(path)!r} holds {exc}, which is not a number a "
                              "result can be judged on (the benchmarks write none)") from None
    except ValueError as exc:
        where = (f" at line {exc.lineno}, column {exc.colno}"
                 if isinstance(exc, json.JSONDecodeError) else "")
        # A result is an object: text that opens one and stops before its brace is cut off.
        truncated = text.lstrip().startswith("{") and not text.rstrip().endswith("}")
        reason = ("it ends before the JSON does (truncated: copy it again or rerun)"
                  if truncated else f"it is not JSON{where}: {exc.msg if where else exc}")
        raise ResultFileError(f"{flag}: {str(path)!r} cannot be read as a result: "
                              f"{reason}") from None


class _Constant(ValueError):
    """NaN or Infinity in a file: Python's json reads them, JSON does not have them."""


def _refuse_constant(name: str):
    raise _Constant(name)


def read_result(path: Path, *, flag: str, benchmark: str | Sequence[str],
                keys: Iterable[str] = ("config", "runs", "summary")) -> dict[str, Any]:
    """A result file of ``benchmark`` (one name or several) holding every one of ``keys``.

    Raises
    ------
    ResultFileError
        When the file is absent, empty, truncated, not a JSON object, the result of another
        benchmark (or of none), or lacks one of ``keys``; ``config`` and ``summary`` must be
        objects and ``runs`` a non-empty list.
    """
    payload = read_json(path, flag=flag)
    names = (benchmark,) if isinstance(benchmark, str) else tuple(benchmark)
    wanted = " or ".join(repr(n) for n in names)
    if not isinstance(payload, dict):
        raise ResultFileError(f"{flag}: {str(path)!r} holds a JSON {_kind(payload)}, not the "
                              f"object a {wanted} run writes")
    if not payload:
        raise ResultFileError(f"{flag}: {str(path)!r} is an empty JSON object, not a {wanted} "
                              "result")
    found = payload.get("benchmark")
    if found not in names:
        what = (f"the result of the {found!r} benchmark" if isinstance(found, str)
                else "not a benchmark's result (it names no benchmark)")
        raise ResultFileError(f"{flag}: {str(path)!r} is {what}; {flag} takes a {wanted} "
                              "result")
    for key in keys:
        if key not in payload:
            raise ResultFileError(f"{flag}: {str(path)!r} has no {key!r}: it is not a whole "
                                  f"{found} result; give the JSON its run wrote")
        expected = list if key == "runs" else dict if key in ("config", "summary") else None
        if expected is not None and not isinstance(payload[key], expected):
            raise ResultFileError(f"{flag}: {str(path)!r} has a {_kind(payload[key])} as "
                                  f"{key!r}, where its run writes a JSON "
                                  f"{'list' if expected is list else 'object'}")
        if key == "runs" and not payload[key]:
            raise ResultFileError(f"{flag}: {str(path)!r} holds no runs")
    return payload


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean",
            type(None): "null"}.get(type(value), "number")


def same_files(paths: Mapping[str, Path | None]) -> None:
    """Refuse one file given for two configurations (by path or by content)."""
    seen: dict[Any, str] = {}
    for flag, path in paths.items():
        if path is None or not Path(path).is_file():
            continue
        path = Path(path)
        for key in (("path", os.path.realpath(path)), ("bytes", path.read_bytes())):
            if key in seen:
                raise ResultFileError(
                    f"{seen[key]} and {flag} are given the same "
                    f"{'file' if key[0] == 'path' else 'runs'} ({str(path)!r}); each "
                    "configuration is a run of its own")
            seen[key] = flag


def check_output(path: Path | None, *, flag: str, suffix: str) -> None:
    """Refuse, before any work, an output path that cannot be written: a wrong suffix, a
    folder, a file on the way (``out.json/summary.json``) or a folder without write
    permission."""
    if path is None:
        return
    path = Path(path)
    if path.suffix != suffix:
        raise ResultFileError(f"{flag} names a {suffix} file; got {str(path)!r}")
    if path.is_dir():
        raise ResultFileError(f"{flag}: {str(path)!r} is a folder; name a {suffix} file in it")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ResultFileError(f"{flag}: cannot write {str(path)!r}: {str(parent)!r} is a file, "
                              "not a folder")
    if not os.access(parent, os.W_OK):
        raise ResultFileError(f"{flag}: cannot write {str(path)!r}: permission denied on "
                              f"{str(parent)!r}")


def curve(values: Any, *, where: str, k: int) -> np.ndarray:
    """A pass@k curve of at least ``k`` finite values in [0, 1] (``null`` is a NaN the run
    wrote), as float64; else a :class:`ResultFileError` naming ``where``."""
    if not isinstance(values, list) or not all(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
            for v in values):
        raise ResultFileError(f"{where}: a pass@k curve is a list of numbers, got "
                              f"{_kind(values)}")
    if len(values) < k:
        raise ResultFileError(f"{where}: pass@{k} needs {k} samples per problem; the run "
                              f"drew {len(values)} (a --quick run?), so it cannot be judged at "
                              f"pass@{k}; run the configuration the rule names")
    bad = [i + 1 for i, v in enumerate(values[:k]) if v is None or not math.isfinite(v)
           or not 0 <= v <= 1]
    if bad:
        raise ResultFileError(f"{where}: pass@k is NaN or outside [0, 1] at k = "
                              f"{', '.join(map(str, bad[:5]))}{' ...' if len(bad) > 5 else ''}"
                              "; a run with NaN pass@k cannot be judged")
    return np.asarray(values, dtype=np.float64)


def preset_differences(config: Mapping[str, Any], preset: Mapping[str, Any], *,
                       ignore: Iterable[str] = ()) -> list[str]:
    """The fields in which a run's ``config`` (as its JSON holds it) differs from a preset's
    (a dataclass's ``asdict``), ``ignore`` left out: ``["steps: 200, not 400", ...]``."""
    ignore = set(ignore)
    canonical = json.loads(json.dumps(preset, default=list))
    out = []
    for key, value in canonical.items():
        if key in ignore:
            continue
        if key not in config:
            out.append(f"{key}: absent, not {value!r}")
        elif config[key] != value:
            out.append(f"{key}: {config[key]!r}, not {value!r}")
    return out


#: The configuration field that lists a benchmark's arms.
ARM_FIELDS = {"trl_coverage": "arms", "maze": "arms", "arithmetic": "policies"}


def presets(kind: str) -> dict[str, dict[str, Any]]:
    """The presets of benchmark ``kind`` (trl_coverage, maze, arithmetic) as a result's
    ``config`` holds them."""
    if kind == "trl_coverage":
        from sera_opt.benchmarks.trl_coverage.train import PRESETS
    elif kind == "maze":
        from sera_opt.benchmarks.maze.train import PRESETS
    elif kind == "arithmetic":
        from dataclasses import asdict

        from sera_opt.benchmarks.arithmetic.train import PRESETS

        return {name: {**asdict(cfg), "budget": cfg.budget} for name, cfg in PRESETS.items()}
    else:
        raise ResultFileError(f"no presets are known for the {kind!r} benchmark")
    return {name: cfg.to_dict() for name, cfg in PRESETS.items()}


def check_preset(payload: Mapping[str, Any], *, kind: str, preset: str, label: str, name: str,
                 command: str) -> None:
    """Refuse a result that is not a run of ``kind``'s ``preset`` with only its arms and seeds
    changed (what a decision rule fixes before its runs): the message names the preset the
    file is a run of, or the fields that differ, and the command that makes the right file."""
    if payload.get("benchmark") != kind:
        raise ResultFileError(f"{label} is a {payload.get('benchmark')!r} result, but {name} "
                              f"is a {kind!r} run: {command}")
    known = presets(kind)
    ignore = ("seeds", ARM_FIELDS[kind])
    config = payload.get("config")
    if not isinstance(config, Mapping):
        raise ResultFileError(f"{label} has no configuration ('config'); give the JSON its "
                              "run wrote")
    differences = preset_differences(config, known[preset], ignore=ignore)
    if differences:
        others = [other for other, values in known.items() if other != preset
                  and not preset_differences(config, values, ignore=ignore)]
        what = (f"a run of the {others[0]!r} preset" if others else
                f"not the {preset!r} preset ({'; '.join(differences[:3])}"
                f"{'; ...' if len(differences) > 3 else ''})")
        raise ResultFileError(f"{label} is {what}; {name} is {kind}'s {preset!r} preset, "
                              f"nothing changed but the arms and seeds: {command}")


def run_tool(prog: str, main: Callable[[list[str] | None], int],
             argv: list[str] | None = None) -> int:
    """Run a tool's ``main``: a :class:`SeraOptError` becomes one line on stderr and exit
    status 2, as does a refused command line (its parser printed the line)."""
    try:
        return int(main(argv) or 0)
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            return int(exc.code or 0)
        raise
    except SeraOptError as exc:
        message = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
