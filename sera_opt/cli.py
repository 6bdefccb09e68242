"""The ``sera-opt`` command.

``sera-opt allocate``  allocate a budget over prompts read from CSV, JSON, .npy or stdin
``sera-opt bench NAME``  run a benchmark or experiment (solvers, estimator, alignment, ...)
``sera-opt demo``  the quick alignment comparison on scikit-learn's digits
``sera-opt cache [info|clear]``  where the compiled kernels are cached, whether they are there; remove them
``sera-opt --version``  the versions, and where the kernel cache is

Exit status: 0 on success; 2 when the command line or the input is wrong, with one line
on stderr that says what to fix; 1 when sera_opt fails in a way it did not foresee (one
line on stderr naming the exception and the file that holds its traceback;
``sera-opt --traceback ...`` prints the traceback instead); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import ast
import csv
import inspect
import io
import json
import operator
import os
import re
import shlex
import sys
import tempfile
import traceback
import warnings
from decimal import Decimal, InvalidOperation
from importlib import import_module
from pathlib import Path

import numpy as np

from .exceptions import SeraOptError, SeraOptWarning
from .policies import POLICIES, SERAPolicy, UniformPolicy, available_policies, get_policy
from .problem import validate_success_probs
from .solvers import available_solvers

__all__ = ["main", "build_parser", "read_success_probs"]

BENCHMARKS = ("solvers", "estimator", "tracking", "first-use", "alignment", "maze", "arithmetic")
# The benchmarks' default --out (benchmarks/_harness.DEFAULT_OUT; a test keeps the two
# equal), named here so that the folder is checked before a benchmark is imported.
BENCH_DEFAULT_OUT = "benchmark-results"

# Whole numbers on the command line are read exactly as Python ints; beyond this many
# digits no budget can be spent and Python refuses to print the number (its 4300-digit
# limit), so the parser stops there instead of in a library error message.
MAX_DIGITS = 1000

# The most ``allocate`` reads: a 10^8-prompt float64 .npy is 800 MB. It bounds what an
# endless source (/dev/zero, `yes 0.5 |`) can take before it is refused.
MAX_INPUT_BYTES = 1 << 30
_CHUNK = 1 << 20

_NPY_MAGIC = b"\x93NUMPY"
_FORMATS_HINT = "give the probabilities as CSV or JSON text (UTF-8) or as a NumPy .npy array"
# Options that have their own flag; taking them through --option too would let the two
# disagree silently.
_OPTION_FLAGS = {"min_rollouts": "--min", "max_rollouts": "--max", "offset": "--offset",
                 "solver": "--solver"}


# ----------------------------------------------------------------------------- input


def read_success_probs(source: str, *, column: str | None = None) -> np.ndarray:
    """Read and validate success probabilities from a file or stdin.

    Parameters
    ----------
    source : str
        A path, or ``"-"`` for stdin. The content decides the format, so a
        suffix is optional: a NumPy ``.npy`` array (its magic bytes; a
        ``.npy`` suffix requires them), JSON (a ``.json`` suffix, or text that
        starts with ``[`` or ``{``: a list of numbers, or an object with a
        ``"success_probs"`` list), or else a table: one number per line, all
        numbers on one line, or columns under a header row. Cells are
        separated by tabs, semicolons, commas or whitespace, whichever the
        first line uses (in that order); a cell holds a decimal number in
        ASCII (no underscores, nan, inf or decimal commas), and lines that
        start with ``#`` are comments. At most :data:`MAX_INPUT_BYTES` are
        read. docs/cli.md gives the details.
    column : str, optional
        Header name of the table column that holds the probabilities; required
        when the table has several columns, refused for JSON and ``.npy``. A
        first row holding this name is the header, even if the name is a number.

    Returns
    -------
    ndarray, shape (M,)
        The probabilities: float64, or float32 for a ``.npy`` array of float32 or
        float16 (as :func:`sera_opt.problem.validate_success_probs` keeps them).

    Raises
    ------
    SeraOptError
        With the source's name, the place in it and the fix, for anything that
        is not one finite probability in [0, 1] per prompt: unreadable or
        binary files, malformed JSON, entries that are not numbers (strings,
        null, booleans, nested lists), rows of the wrong length, tables whose
        column is ambiguous, pickles and arrays of the wrong shape or dtype.
    """
    name, data = _read_source(source)
    suffix = "" if source == "-" else Path(source).suffix.lower()
    is_npy = isinstance(data, bytes) and data.startswith(_NPY_MAGIC)
    if suffix == ".npy" and not is_npy:
        _refuse_not_npy(name)
    if is_npy:
        kind, values = "a .npy array", _from_npy(data, name)
    else:
        # Comment lines become empty lines, so that line numbers in messages still hold.
        text = _COMMENT.sub("", _decode(data, name))
        if not text.strip():
            raise SeraOptError(f"{name} holds only comment lines (starting with #); give one "
                               f"success probability per prompt.")
        if suffix == ".json" or _FIRST_LINE.search(text).group()[0] in "[{":
            kind, values = "JSON", _from_json(text, name)
        else:
            kind, values = "table", _from_table(text, name, column)
    if column is not None and kind != "table":
        raise SeraOptError(
            f"--column selects a column of a CSV table, but {name} is {kind}; drop --column."
        )
    try:
        return validate_success_probs(values)
    except SeraOptError as exc:
        hint = ""
        first_line = _FIRST_LINE.search(text).group().split() if kind == "table" else []
        if (len(first_line) == 1 and column is None and values.size > 1
                and _delimiter(text) is None and not 0 <= values[0] <= 1):
            hint = (f" If the first line is a header whose column name is a number, name it "
                    f"with --column {shlex.quote(first_line[0])}.")
        raise SeraOptError(f"{name}: {exc}{hint}") from None


def _read_source(source: str) -> tuple[str, bytes | str]:
    """The display name and the raw content (bytes; text where stdin is a text stream)."""
    if source == "-":
        stream = sys.stdin
        if stream is None:
            raise SeraOptError("no input: stdin is closed; give a file or pipe the "
                               "probabilities into `sera-opt allocate -`.")
        try:
            interactive = stream.isatty()
        except (AttributeError, ValueError):
            interactive = False
        if interactive:
            # Reading would wait for the user to type and press Ctrl-D, which reads as a hang.
            raise SeraOptError(
                "no input: give a file (CSV, JSON or .npy) or pipe the probabilities into "
                "stdin, e.g. echo '[0.9, 0.5, 0.05]' | sera-opt allocate - --budget 24."
            )
        buffer = getattr(stream, "buffer", None)
        try:
            return "<stdin>", _read_bounded(buffer if buffer is not None else stream, "<stdin>")
        except SeraOptError:
            raise
        except (OSError, ValueError) as exc:
            raise SeraOptError(f"cannot read stdin: {exc}") from None
    try:
        with Path(source).open("rb") as f:
            return repr(source), _read_bounded(f, repr(source),
                                               npy=Path(source).suffix.lower() == ".npy")
    except (FileNotFoundError, NotADirectoryError):
        raise SeraOptError(f"no such file: {source!r}; check the path.") from None
    except IsADirectoryError:
        raise SeraOptError(
            f"{source!r} is a folder, not a file; give the file that holds the probabilities."
        ) from None
    except PermissionError:
        raise SeraOptError(
            f"cannot read {source!r}: permission denied; make it readable or copy it."
        ) from None
    except OSError as exc:
        raise SeraOptError(f"cannot read {source!r}: {exc.strerror or exc}.") from None


def _refuse_not_npy(name: str) -> None:
    raise SeraOptError(
        f"{name} is not a NumPy .npy file (it does not start with the .npy header); save "
        f"the array with numpy.save, or rename the file if it holds CSV or JSON text."
    )


def _read_bounded(stream, name: str, *, npy: bool = False) -> bytes | str:
    """Everything ``stream`` holds, refused beyond :data:`MAX_INPUT_BYTES`; a binary
    stream that is not a .npy array is refused at its first chunk, not at its end."""
    chunks, size = [], 0
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        if not chunks and isinstance(chunk, bytes) and not _NPY_MAGIC.startswith(chunk[:6]):
            if npy:  # a .npy suffix promises the header
                _refuse_not_npy(name)
            _refuse_binary(chunk, name)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_INPUT_BYTES:
            raise SeraOptError(
                f"{name} is larger than {_size(MAX_INPUT_BYTES)}, the most sera-opt allocate "
                f"reads; is it the right file? Split the prompts into batches, or call "
                f"sera_opt.allocate from Python for larger inputs."
            )
    if not chunks:
        return b""
    return chunks[0][:0].join(chunks)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _refuse_binary(data: bytes, name: str) -> None:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise SeraOptError(f"{name} is UTF-16 text; save it as UTF-8 (or {_FORMATS_HINT}).")
    if b"\x00" in data:
        raise SeraOptError(f"{name} is a binary file, not text; {_FORMATS_HINT}.")


def _decode(data: bytes | str, name: str) -> str:
    if isinstance(data, bytes):
        _refuse_binary(data, name)
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise SeraOptError(
                f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                f"{_FORMATS_HINT}."
            ) from None
    text = data.removeprefix("\ufeff")
    if not text.strip():
        raise SeraOptError(
            f"{name} is empty; give one success probability per prompt (CSV, JSON or .npy)."
        )
    return text


def _from_npy(data: bytes, name: str) -> np.ndarray:
    try:
        array = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise SeraOptError(
                f"{name} holds Python objects (an object array, stored as a pickle), which "
                f"sera-opt does not load; save a float array: "
                f"numpy.save(path, numpy.asarray(probs, dtype=float))."
            ) from None
        raise SeraOptError(f"{name} is not a readable .npy array ({exc}); save it again "
                           f"with numpy.save.") from None
    except (EOFError, OSError) as exc:
        raise SeraOptError(f"{name} is a truncated or damaged .npy file ({exc}); save it "
                           f"again with numpy.save.") from None
    if array.dtype == np.bool_:
        raise SeraOptError(f"{name} holds booleans, not probabilities; save the probabilities "
                           f"as a float array.")
    return array


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, str):
        shown = value if len(value) <= 20 else value[:17] + "..."
        return f"the string {json.dumps(shown)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"the number {value!r}"


_JSON_HINTS = {
    str: " (write numbers without quotes)",
    type(None): " (estimate missing probabilities first, for example with sera_opt.SuccessTracker)",
    bool: " (true and false are not probabilities; write 1 or 0 if that is what you mean)",
    list: " (the list must be flat: one probability per prompt)",
    dict: "",
}


def _fits_float(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


class _JSONRefusal(Exception):
    """A JSON value that json.loads takes but a list of probabilities should not hold."""


def _json_constant(word: str):
    raise _JSONRefusal(f"{word} is not valid JSON and not a probability; estimate missing "
                       f"probabilities first (for example with sera_opt.SuccessTracker)")


def _json_float(text: str) -> float:
    value = float(text)
    if value == 0 and _underflows(text):
        raise _JSONRefusal(f"the number {text} is too small for a float64 and would read as 0; "
                           f"write 0 if that is what is meant")
    return value + 0.0  # -0 is 0


def _json_object(pairs):
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        # json.loads keeps the last silently; the first may be the one meant.
        raise _JSONRefusal(f"the key {repeated[0]!r} appears {keys.count(repeated[0])} times in "
                           f"one object; keep one")
    return dict(pairs)


def _from_json(text: str, name: str) -> np.ndarray:
    try:
        obj = json.loads(text, parse_constant=_json_constant, parse_float=_json_float,
                         object_pairs_hook=_json_object)
    except _JSONRefusal as exc:
        raise SeraOptError(f"{name}: {exc}.") from None
    except json.JSONDecodeError as exc:
        raise SeraOptError(
            f"{name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}; "
            f"give a list of numbers such as [0.9, 0.5, 0.05]."
        ) from None
    except RecursionError:
        raise SeraOptError(f"{name}: the JSON is nested too deeply; give a flat list of "
                           f"numbers.") from None
    where = "the list"
    if isinstance(obj, dict):
        if "success_probs" not in obj:
            keys = ", ".join(repr(k) for k in list(obj)[:10]) or "none"
            raise SeraOptError(
                f"{name}: a JSON object must hold the probabilities under the key "
                f"'success_probs'; its keys are {keys}."
            )
        others = [k for k in obj if k != "success_probs"]
        if others:
            # A "budget" or "max_rollouts" here would otherwise be ignored without a word.
            raise SeraOptError(
                f"{name}: a JSON object may hold only 'success_probs'; it also has "
                f"{', '.join(repr(k) for k in others[:10])}. Give the budget and the bounds as "
                f"options (--budget, --min, --max), or pass the list alone."
            )
        obj, where = obj["success_probs"], "the 'success_probs' list"
    if not isinstance(obj, list):
        raise SeraOptError(
            f"{name}: JSON input must be a list of probabilities (or an object with a "
            f"'success_probs' list), got {_json_kind(obj)}."
        )
    for i, value in enumerate(obj):
        # Exact types: bool is an int subclass and would pass as 0 or 1.
        if type(value) not in (int, float):
            raise SeraOptError(
                f"{name}: entry {i} of {where} is {_json_kind(value)}, not a number"
                f"{_JSON_HINTS[type(value)]}."
            )
    try:
        return np.array(obj, dtype=np.float64)
    except OverflowError:
        i = next(i for i, v in enumerate(obj) if isinstance(v, int) and not _fits_float(v))
        raise SeraOptError(
            f"{name}: entry {i} of {where} is an integer too large to be a probability in "
            f"[0, 1]."
        ) from None


def _looks_numeric(cell: str) -> bool:
    """A cell that is meant as a number, even if it is not written as one (0,5 or nan):
    a first row holding one is data, to be reported, not a header to be skipped."""
    return _is_number(cell) or _DECIMAL_COMMA.fullmatch(cell) is not None


def _not_a_probability(cell: str) -> str:
    """Why a table cell is refused, for the message."""
    cell = cell.strip(" \t")
    if not cell:
        return "is empty"
    if _DECIMAL_COMMA.fullmatch(cell):
        return (f"holds {cell!r}, a decimal comma; write {cell.replace(',', '.')!r} "
                f"(a point) instead")
    if _is_number(cell):
        low = cell.lower()
        if "nan" in low or "inf" in low:
            return (f"holds {cell!r}, which is not a probability; estimate it first (for "
                    f"example with sera_opt.SuccessTracker)")
        if "_" in cell:
            return f"holds {cell!r}; write numbers without underscores ({cell.replace('_', '')!r})"
        if not cell.isascii():
            return (f"holds {cell!r}, with characters that are not ASCII; write the number "
                    f"in ASCII digits")
        if _CELL.fullmatch(cell) and _underflows(cell):
            return (f"holds {cell!r}, which is too small for a float64 and would read as 0; "
                    f"write 0 if that is what is meant")
    return f"holds {cell!r}, which is not a number"


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


_FIRST_LINE = re.compile(r"\S[^\n\r]*")
# A line whose first non-blank character is #: no number or JSON text starts with one.
_COMMENT = re.compile(r"^[^\S\n\r]*#[^\n\r]*", re.MULTILINE)
# What a cell of probabilities may hold: a decimal number in ASCII, optionally signed and
# surrounded by blanks. Python's float() takes more (underscores, nan, inf, non-ASCII
# digits), none of which belongs in a CSV of probabilities.
_NUMBER = r"[ \t]*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t]*"
_CELL = re.compile(_NUMBER, re.ASCII)
# float() has taken every cell when this is asked, so a cell of only these characters
# is a decimal number as _CELL writes it (one scan of the text, not one match per cell).
_NOT_DECIMAL = re.compile(r"[^0-9eE.+\- \t]")
_DECIMAL_COMMA = re.compile(r"[ \t]*[+-]?[0-9]*,[0-9]+[ \t]*", re.ASCII)


def _underflows(number: str) -> bool:
    """Whether a decimal number that float() read as 0 is not 0 (1e-400, 0.001e-400)."""
    return re.search(r"[1-9]", re.split(r"[eE]", number, maxsplit=1)[0]) is not None
# Two fields on one line of a file without delimiters.
_TWO_FIELDS = re.compile(r"\S[^\S\n]+\S")


def _delimiter(text: str) -> str | None:
    """The delimiter the first non-blank line uses: tab, semicolon, comma, else whitespace."""
    first = _FIRST_LINE.search(text).group()
    return next((d for d in ("\t", ";", ",") if d in first), None)


def _table_rows(text: str, name: str, delimiter: str | None) -> list[list[str]]:
    """The cells of every non-blank row (CSV cells unstripped: float() ignores the spaces)."""
    if delimiter is None:
        return [cells for cells in map(str.split, text.splitlines()) if cells]
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise SeraOptError(f"{name}: line {reader.line_num} is not valid CSV ({exc}).") from None
    return [cells for cells in rows if "".join(cells).strip()]


def _line_number(text: str, delimiter: str | None, k: int) -> int:
    """The line on which non-blank row ``k`` ends; for messages only (it reads the text again)."""
    if delimiter is None:
        return [n for n, line in enumerate(text.splitlines(), 1) if line.split()][k]
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    count = -1
    for cells in reader:
        count += bool("".join(cells).strip())
        if count == k:
            break
    return reader.line_num


def _parse_floats(cells: list[str]) -> np.ndarray | int:
    """The cells as float64, or the index of the first cell that is not a decimal number
    in ASCII, or one that is not 0 but reads as 0 (1e-400)."""
    try:
        values = np.fromiter(map(float, cells), dtype=np.float64, count=len(cells))
    except ValueError:
        return next(k for k, cell in enumerate(cells) if not _is_number(cell))
    if _NOT_DECIMAL.search("".join(cells)):
        return next(k for k, cell in enumerate(cells) if not _CELL.fullmatch(cell))
    zeros = np.flatnonzero(values == 0)
    for k in zeros:
        if _underflows(cells[k]):
            return int(k)
    values[zeros] = 0.0  # -0 is 0; a -0.0 would show in the summary's factors
    return values


def _from_table(text: str, name: str, column: str | None) -> np.ndarray:
    if _delimiter(text) is None and _TWO_FIELDS.search(text) is None:
        # One field per line, the common single-column file: read it without building
        # rows. Only a clean read returns here; anything to report goes through the
        # row-by-row reader below, which is the reference (tests compare the two).
        tokens = text.split()
        has_header = not _looks_numeric(tokens[0]) or tokens[0] == column
        data = tokens[1:] if has_header else tokens
        if data and (column is None or (has_header and column == tokens[0])):
            values = _parse_floats(data)
            if isinstance(values, np.ndarray):
                return values
    return _from_table_rows(text, name, column)


def _from_table_rows(text: str, name: str, column: str | None) -> np.ndarray:
    delimiter = _delimiter(text)
    rows = _table_rows(text, name, delimiter)
    if not rows:
        raise SeraOptError(f"{name} holds only empty fields; give one success probability per "
                           f"prompt.")
    # A first row without a single number is a header; one with numbers is data, so a
    # mistyped value is reported instead of being taken for a column name.
    first = [c.strip() for c in rows[0]]
    # A name given with --column marks its row as the header even if it reads as a number.
    numeric = any(_looks_numeric(c) for c in first) and (column is None or column not in first)
    header = None if numeric else first
    skip = 0 if header is None else 1  # rows before the data
    data = rows[skip:]
    columns = None if header is None else ", ".join(repr(c) for c in header[:20]) + (
        ", ..." if len(header) > 20 else "")
    if not data:
        raise SeraOptError(f"{name} has a header row ({columns}) but no rows of probabilities.")

    def line(k):  # line number of data row k
        return _line_number(text, delimiter, skip + k)

    width = len(rows[0])
    if len(set(map(len, data))) > 1 or len(data[0]) != width:
        k = next(k for k, cells in enumerate(data) if len(cells) != width)
        reference = "the header" if header is not None else f"line {line(0)}"
        raise SeraOptError(
            f"{name}: line {line(k)} has {len(data[k])} field(s) but {reference} has {width}; "
            f"every row needs the same columns."
        )
    if header is None:
        if column is not None:
            raise SeraOptError(
                f"{name} has no header row, so it has no column named {column!r}; add a header "
                f"row naming the columns, or drop --column."
            )
        if len(data) == 1:  # all the probabilities on one line
            cells = data[0]

            def place(k):
                return f"line {line(0)}, field {k + 1}"
        elif width == 1:
            cells = [cells[0] for cells in data]

            def place(k):
                return f"line {line(k)}"
        else:
            raise SeraOptError(
                f"{name} is a table of {len(data)} rows and {width} columns with no header row, "
                f"so it does not say which column holds the probabilities; add a header row and "
                f"pass --column NAME (a header may name a column with a number: pass it as "
                f"--column too), or give one probability per line"
                f"{' (decimal commas: write 0.5, not 0,5)' if delimiter == ',' else ''}."
            )
    else:
        if column is None:
            if width > 1:
                raise SeraOptError(
                    f"{name} has {width} columns ({columns}); choose the one that holds the "
                    f"probabilities with --column NAME."
                )
            index = 0
        elif column not in header:
            raise SeraOptError(f"{name} has no column {column!r}; its columns are {columns}.")
        elif header.count(column) > 1:
            raise SeraOptError(f"{name} has {header.count(column)} columns named {column!r}; "
                               f"rename them so that the one to read is unique.")
        else:
            index = header.index(column)
        cells = list(map(operator.itemgetter(index), data))

        def place(k):
            return f"line {line(k)}, column {header[index]!r}"
    values = _parse_floats(cells)
    if not isinstance(values, np.ndarray):
        raise SeraOptError(f"{name}: {place(values)} {_not_a_probability(cells[values])}; "
                           f"every prompt needs a success probability.")
    return values


# ----------------------------------------------------------------------------- options


def _whole_number(text: str) -> int:
    """Parse a command-line count exactly: ``24``, ``1_000``, ``1e6`` and ``24.0`` are whole."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; give a whole number such as 24."
        ) from None
    if not value.is_finite():
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give a whole number.")
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number; rollouts are counted in whole numbers."
        )
    if value and value.adjusted() >= MAX_DIGITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} has more than {MAX_DIGITS} digits; no count that large can be allocated."
        )
    return int(value)


def _shortened(text: str, width: int = 60) -> str:
    """``text`` for a message: a value pasted by mistake can be megabytes long."""
    return text if len(text) <= width else f"{text[:width - 20]}...({len(text)} characters)"


def _option_value(key: str, text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    word = text.strip().lower()
    if word in ("inf", "+inf", "infinity", "-inf", "-infinity", "nan"):
        return float(word)
    if word in ("true", "false", "none", "null"):
        raise SeraOptError(f"--option {key}={text}: write True, False or None (capitalized, "
                           f"as in Python).")
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", text):
        return text  # a bare name, such as a solver's, needs no quotes
    raise SeraOptError(
        f"--option {key}={_shortened(text)}: the value is not a Python literal; write a "
        f"number, True, False, None, a quoted string or a list such as [1, 2]."
    )


def _parse_options(items: list[str]) -> dict:
    options: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise SeraOptError(f"--option takes KEY=VALUE (for example alpha=2), got {item!r}.")
        if key in _OPTION_FLAGS:
            raise SeraOptError(f"set {key} with {_OPTION_FLAGS[key]}, not with --option.")
        if key in options:
            raise SeraOptError(f"--option {key} is given twice; keep one.")
        options[key] = _option_value(key, text)
    return options


def _policy_parameters(cls) -> str:
    """The keyword options of a policy's constructor, for an error's hint."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return ""
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ""  # it takes more than it names
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in _OPTION_FLAGS]
    return f" Its options: {', '.join(names) or 'none'} (and --min, --max, --offset)."


def _build_policy(args):
    options = _parse_options(args.option)
    name = "sera" if args.policy is None else args.policy
    cls = POLICIES.lookup(name)  # an unknown name lists the known ones
    kwargs = {**options, "offset": args.offset}
    if args.min is not None:
        kwargs["min_rollouts"] = args.min
    if args.max is not None:
        kwargs["max_rollouts"] = args.max
    if args.solver is not None:
        if not issubclass(cls, SERAPolicy):
            raise SeraOptError(f"--solver chooses SERA's solver; policy {name!r} has none, so "
                               f"drop --solver (or use --policy sera).")
        kwargs["solver"] = args.solver
    try:
        with warnings.catch_warnings():
            # An option that the policy or its solver ignores was typed for a reason:
            # refuse it instead of printing Python's warning and running without it.
            warnings.simplefilter("error", SeraOptWarning)
            return get_policy(name, **kwargs)
    except SeraOptWarning as exc:
        takes = [n for n in cls.all_option_names() if n not in _OPTION_FLAGS]
        raise SeraOptError(
            f"{_one_line(exc).rstrip('.')}, so --option would have no effect; remove it. "
            f"Policy {name!r} takes --option {', '.join(takes) or '(none)'} "
            f"(and --min, --max, --offset"
            f"{', --solver' if issubclass(cls, SERAPolicy) else ''})."
        ) from None
    except SeraOptError:
        raise
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
        raise SeraOptError(f"policy {name!r} rejected {given}: {exc}."
                           f"{_policy_parameters(cls)}") from None


# ----------------------------------------------------------------------------- allocate


def _check_destination(destination: str | None, source: str = "-") -> None:
    """Refuse an output path that cannot be written before any work is done."""
    if destination in (None, "-"):
        if sys.stdout is None:  # started with stdout closed (`>&-`)
            raise SeraOptError("stdout is closed, so the counts have nowhere to go; write them "
                               "to a file with -o FILE, or leave stdout open.")
        return
    if not destination.strip():
        raise SeraOptError("-o is given an empty name; give the file for the counts, e.g. "
                           "-o counts.csv, or drop -o to write them to stdout.")
    path = Path(destination)
    try:
        same = source != "-" and path.exists() and os.path.samefile(source, path)
    except OSError:
        same = False
    if same:
        raise SeraOptError(f"-o {destination!r} is the input file; writing the counts there "
                           f"would replace the probabilities. Choose another file for -o.")
    if path.is_dir():
        raise SeraOptError(f"-o {destination!r} is a folder; give a file name in it, e.g. "
                           f"{str(path / 'counts.csv')!r}.")
    folder = path.parent
    if not folder.is_dir():
        if folder.exists():
            raise SeraOptError(f"cannot write {destination!r}: {str(folder)!r} is a file, not "
                               f"a folder.")
        raise SeraOptError(f"cannot write {destination!r}: the folder {str(folder)!r} does not "
                           f"exist; create it first (mkdir -p {shlex.quote(str(folder))}).")
    target = path if path.exists() else folder
    if not os.access(target, os.W_OK):
        raise SeraOptError(f"cannot write {destination!r}: permission denied on "
                           f"{str(target)!r}; choose another place for the output.")


def _write_output(text: str, destination: str | None) -> None:
    if destination in (None, "-"):
        try:
            sys.stdout.write(text)
            sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        except BrokenPipeError:
            raise  # the reader went away: main stops quietly
        except (OSError, ValueError) as exc:  # a full disk, a closed descriptor
            raise SeraOptError(
                f"cannot write the counts to stdout: {getattr(exc, 'strerror', None) or exc}; "
                f"write them to a file with -o FILE instead."
            ) from None
        return
    try:
        with open(destination, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise SeraOptError(
            f"cannot write the counts to {destination!r}: {exc.strerror or exc}."
        ) from None


def _summary(policy, problem, alloc, uniform) -> dict:
    capped = policy.max_rollouts is not None or getattr(policy, "max_ratio", None) is not None
    return {
        "prompts": alloc.num_prompts,
        "budget": alloc.budget,
        "policy": policy.name,
        "solver": alloc.solver,
        "min_rollouts": int(problem.min_rollouts.min()),
        "max_rollouts": int(problem.max_rollouts.max()) if capped else None,
        "min_factor": alloc.min_factor,
        "factor_spread": alloc.factor_spread,
        "uniform_min_factor": uniform.min_factor,
        "uniform_factor_spread": uniform.factor_spread,
        "wall_time_s": alloc.wall_time,
    }


def _cmd_allocate(args) -> int:
    # Defaults are filled in here, not by argparse, so that _Once can tell a repeat.
    args.offset = 0 if args.offset is None else args.offset
    args.format = "csv" if args.format is None else args.format
    if (args.budget is None) == (args.per_prompt is None):
        raise SeraOptError("give exactly one of --budget and --per-prompt.")
    policy = _build_policy(args)
    _check_destination(args.output, args.input)
    probs = read_success_probs(args.input, column=args.column)
    budget = args.budget if args.budget is not None else args.per_prompt * len(probs)
    with warnings.catch_warnings():
        # An option that the policy or its solver ignores was typed for a reason.
        warnings.simplefilter("error", SeraOptWarning)
        problem = policy.problem(probs, budget)
        alloc = policy.allocate(probs, budget)
    # Uniform allocation on the same bounds, for the comparison in the summary.
    uniform = UniformPolicy(offset=args.offset).allocate(
        probs, budget, min_rollouts=problem.min_rollouts, max_rollouts=problem.max_rollouts)
    summary = _summary(policy, problem, alloc, uniform)
    if args.format == "json":
        text = json.dumps({"counts": alloc.counts.tolist(), "summary": summary}) + "\n"
    else:
        text = "count\n" + "".join(f"{int(c)}\n" for c in alloc.counts)
    _write_output(text, args.output)
    if not args.quiet:
        s = summary
        what = f"policy {s['policy']}" + (
            f" (solver {s['solver']})" if s["solver"] != s["policy"] else "")
        bounds = (f"at least {s['min_rollouts']} rollouts per prompt, no cap"
                  if s["max_rollouts"] is None
                  else f"{s['min_rollouts']} to {s['max_rollouts']} rollouts per prompt")
        _stderr(
            f"{s['prompts']} prompts, budget {s['budget']}, {what}, {bounds}: "
            f"min factor {s['min_factor']:.4f}, "
            f"spread {s['factor_spread']:.4f} (uniform: min {s['uniform_min_factor']:.4f}, "
            f"spread {s['uniform_factor_spread']:.4f})"
        )
    return 0


def _out_option(rest: list[str]) -> str | None:
    """The value of the last ``--out`` in a benchmark's arguments (argparse keeps the last)."""
    value = None
    for i, word in enumerate(rest):
        if word == "--":
            break
        if word == "--out" and i + 1 < len(rest):
            value = rest[i + 1]
        elif word.startswith("--out="):
            value = word.partition("=")[2]
    return value


def _check_results_folder(folder: str, command: str) -> None:
    """Refuse a results folder that cannot be created or written, before a run of minutes."""
    path = Path(folder)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == path and not path.is_dir():
        raise SeraOptError(f"{command} --out {folder!r} is a file; give a folder for the "
                           f"results (it is created if missing).")
    if not existing.is_dir():
        raise SeraOptError(f"{command} cannot create the folder {folder!r}: {str(existing)!r} "
                           f"is a file, not a folder; choose another --out.")
    try:  # os.access says yes to root, and to a read-only file system
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise SeraOptError(f"{command} cannot write into {str(existing)!r} "
                           f"({exc.strerror or exc}), so the results of --out {folder!r} would "
                           f"be lost after the run; choose another --out.") from None


def _wants_help(rest: list[str]) -> bool:
    options = rest[:rest.index("--")] if "--" in rest else rest
    return "-h" in options or "--help" in options


class _OneLineErrors:
    """Make the benchmarks' own argument errors one line, exit status 2, like sera-opt's:
    their parsers are plain argparse ones, which print the whole usage first."""

    def __enter__(self):
        self._saved = argparse.ArgumentParser.error
        argparse.ArgumentParser.error = _Parser.error
        return self

    def __exit__(self, *exc):
        argparse.ArgumentParser.error = self._saved
        return False


def _cmd_bench(args, rest) -> int:
    if not _wants_help(rest):
        out = _out_option(rest)
        _check_results_folder(BENCH_DEFAULT_OUT if out is None else out,
                              f"sera-opt bench {args.name}")
    module = import_module(f"sera_opt.benchmarks.{args.name.replace('-', '_')}")
    with _OneLineErrors():
        return int(module.main(rest) or 0)


def _cmd_demo(args, rest) -> int:
    out = _out_option(rest)
    if out is not None and not _wants_help(rest):
        _check_results_folder(out, "sera-opt demo")
    module = import_module("sera_opt.benchmarks.alignment")
    with _OneLineErrors():
        return int(module.demo(rest) or 0)


# ----------------------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr, exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message.rstrip('.')}; see `{self.prog} --help`.\n")


class _Once(argparse.Action):
    """Store a value, refusing a second one: argparse would keep the last silently."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} is given twice ({getattr(namespace, self.dest)!r} "
                         f"and {values!r}); keep one")
        setattr(namespace, self.dest, values)


class _Version(argparse.Action):
    """``--version``: the versions and the kernel cache's place and state, then exit 0."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the versions and where the compiled kernels are cached, then exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version_text())
        parser.exit(0)


def _version_text() -> str:
    import platform
    from importlib import metadata

    from . import _kernel_cache
    from ._version import __version__

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"sera_opt {__version__} (Python {platform.python_version()}, numpy "
            f"{version('numpy')}, numba {version('numba')}, torch {version('torch')})\n"
            f"{_kernel_cache.kernel_cache_info().summary()}")


def _cmd_cache(args) -> int:
    from . import _kernel_cache

    if args.action == "clear":
        removed, freed = _kernel_cache.clear_kernel_cache()
        base = _kernel_cache.kernel_cache_dir().parent
        print(f"removed {len(removed)} kernel cache entr{'y' if len(removed) == 1 else 'ies'} "
              f"({freed / 2**20:.1f} MiB) under {base}" if removed
              else f"nothing to remove: no kernel cache under {base}")
        return 0
    info = _kernel_cache.kernel_cache_info()
    print(info.summary())
    print(f"key: {info.key} (sera_opt version, numba version, hash of the kernel sources)")
    for name, count in info.cached.items():
        print(f"  {name}: {count} kernel{'' if count == 1 else 's'} cached")
    print("a kernel not cached compiles on its first call (seconds) and is cached for every "
          "later process; `sera-opt cache clear` removes the cache")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``sera-opt`` argument parser (its errors are one line, exit status 2)."""
    parser = _Parser(
        prog="sera-opt",
        description="Scale-Equalized Rollout Allocation for Maximum Likelihood RL.",
        epilog="Exit status: 0 done, 2 bad command line or input, 1 unexpected failure.",
    )
    parser.add_argument("--traceback", action="store_true",
                        help="on an unexpected failure, print the Python traceback")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "allocate", help="allocate a rollout budget over prompts",
        description="Allocate a rollout budget over prompts. Counts go to stdout (or -o), "
                    "a one-line summary against uniform allocation to stderr.")
    p.add_argument("input", nargs="?", default="-",
                   help="success probabilities: a CSV/text table (one number per line, all on "
                        "one line, or a column under a header), JSON (a list, or an object with "
                        "'success_probs') or a .npy array; '-' (default) reads stdin")
    p.add_argument("--column", action=_Once,
                   help="header name of the CSV column holding the probabilities (needed when "
                        "the table has several columns)")
    counts = "a whole number (1e6 and 24.0 are read exactly)"
    p.add_argument("--budget", action=_Once, type=_whole_number, help=f"total rollouts, {counts}")
    p.add_argument("--per-prompt", action=_Once, type=_whole_number,
                   help="average rollouts per prompt (budget = M * this)")
    p.add_argument("--min", action=_Once, type=_whole_number, default=None,
                   help="minimum rollouts per prompt (default: the policy's, 1 + offset for SERA)")
    p.add_argument("--max", action=_Once, type=_whole_number, default=None,
                   help="maximum rollouts per prompt (default: the policy's cap; for SERA "
                        "max_ratio times the mean count, --option max_ratio=None for none)")
    p.add_argument("--offset", action=_Once, type=int, choices=(0, 1),
                   help="0: success-average estimator (default), 1: mean-centred")
    p.add_argument("--policy", action=_Once, default=None,
                   help=f"allocation policy, one of {', '.join(available_policies())} "
                        f"(default: sera); what is not given here keeps the policy's defaults")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the policy, repeatable; VALUE is a Python literal "
                        "(2, 1e-3, None, [1, 2], 'text'; inf and bare names need no quotes), "
                        "e.g. --policy sera-bayes --option prior_strength=16")
    p.add_argument("--solver", action=_Once, default=None,
                   help=f"SERA's solver (default waterline; available: "
                        f"{', '.join(available_solvers())})")
    p.add_argument("--format", action=_Once, choices=("csv", "json"),
                   help="output format (default: csv)")
    p.add_argument("--output", "-o", action=_Once,
                   help="write the counts here instead of stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary on stderr")

    b = sub.add_parser("bench", help="run a benchmark; `sera-opt bench NAME --help` for its options",
                       add_help=False)
    b.add_argument("name", choices=BENCHMARKS)

    sub.add_parser("demo", help="quick alignment comparison on scikit-learn's digits",
                   add_help=False)

    c = sub.add_parser(
        "cache", help="where the compiled kernels are cached and whether they are there; "
                      "`cache clear` removes them",
        description="The numba kernels are compiled once and cached outside the installed "
                    "package, under a key of the sera_opt version, the numba version and a "
                    "hash of the kernel sources. SERA_OPT_CACHE_DIR (or NUMBA_CACHE_DIR) moves "
                    "the cache.")
    c.add_argument("action", nargs="?", choices=("info", "clear"), default="info",
                   help="info (default): the directory, its key and what it holds; clear: "
                        "remove every sera_opt kernel cache under its base directory")
    return parser


def _stderr(line: str) -> None:
    """Print one line on stderr; with stderr closed (`2>&-`) only the exit status speaks
    (the summary is not worth failing a run whose counts were written)."""
    if sys.stderr is None:
        return
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass


def _one_line(message) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def _report_unexpected(exc: BaseException) -> None:
    try:
        fd, path = tempfile.mkstemp(prefix="sera-opt-traceback-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        where = f"the traceback is in {path}"
    except OSError:
        where = "rerun as `sera-opt --traceback ...` to see the traceback"
    _stderr(f"sera-opt: unexpected error: {type(exc).__name__}: {_one_line(exc)} ({where}; "
            f"this is a bug in sera_opt, please report it with the command that caused it)")


def _exit_status(exc: SystemExit) -> int:
    """The status ``sys.exit`` would give: a message is printed and means 1, as in Python."""
    if exc.code is None or isinstance(exc.code, int):
        return int(exc.code or 0)
    _stderr(str(exc.code))
    return 1


def main(argv=None) -> int:
    """Run ``sera-opt`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help, or a one-line usage error already printed
        return _exit_status(exc)
    try:
        if args.command == "allocate":
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            return _cmd_allocate(args)
        if args.command == "bench":
            return _cmd_bench(args, rest)
        if args.command == "cache":
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            return _cmd_cache(args)
        return _cmd_demo(args, rest)
    except SystemExit as exc:  # an argument error, or a benchmark's own parser
        return _exit_status(exc)
    except (SeraOptError, SeraOptWarning) as exc:
        _stderr(f"sera-opt: error: {_one_line(exc)}")
        return 2
    except KeyboardInterrupt:
        _stderr("sera-opt: interrupted")
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`sera-opt allocate ... | head`): stop quietly,
        # and point stdout at /dev/null so that Python's final flush does not complain.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass
        return 1
    except ModuleNotFoundError as exc:
        if args.traceback:
            raise
        if (exc.name or "sera_opt").partition(".")[0] == "sera_opt":
            _report_unexpected(exc)  # a module of sera_opt itself is missing: a broken install
            return 1
        _stderr(f"sera-opt: error: this command needs a module that is not installed: "
                f"{_one_line(exc)}; install it (the benchmarks and the demo need the [bench] "
                f"extras: pip install \".[bench]\").")
        return 1
    except Exception as exc:
        if args.traceback:
            raise
        _report_unexpected(exc)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
