"""Parsing the probabilities out of JSON and CSV-like text, with errors that name the
line, the cell and the fix (decimal commas, comments, headers, non-numbers)."""

from __future__ import annotations

import csv
import io
import json
import operator
import re

import numpy as np

from ..exceptions import SeraOptError


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


def from_json(text: str, name: str) -> np.ndarray:
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


FIRST_LINE = re.compile(r"\S[^\n\r]*")


# A line whose first non-blank character is #: no number or JSON text starts with one.
COMMENT = re.compile(r"^[^\S\n\r]*#[^\n\r]*", re.MULTILINE)


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


def find_delimiter(text: str) -> str | None:
    """The delimiter the first non-blank line uses: tab, semicolon, comma, else whitespace."""
    first = FIRST_LINE.search(text).group()
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


def from_table(text: str, name: str, column: str | None) -> np.ndarray:
    if find_delimiter(text) is None and _TWO_FIELDS.search(text) is None:
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
    return from_table_rows(text, name, column)


def from_table_rows(text: str, name: str, column: str | None) -> np.ndarray:
    delimiter = find_delimiter(text)
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
