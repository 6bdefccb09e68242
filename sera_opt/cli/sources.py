"""Reading ``sera-opt allocate``'s input: a file, a path or stdin, bounded in size, as
CSV or JSON text or a NumPy ``.npy`` array, into validated success probabilities."""

from __future__ import annotations

import io
import shlex
import sys
from pathlib import Path

import numpy as np

from ..exceptions import SeraOptError
from ..problem import validate_success_probs
from .tables import COMMENT, FIRST_LINE, find_delimiter, from_json, from_table

# The most ``allocate`` reads: a 10^8-prompt float64 .npy is 800 MB. It bounds what an
# endless source (/dev/zero, `yes 0.5 |`) can take before it is refused.
MAX_INPUT_BYTES = 1 << 30


_CHUNK = 1 << 20


_NPY_MAGIC = b"\x93NUMPY"


_FORMATS_HINT = "give the probabilities as CSV or JSON text (UTF-8) or as a NumPy .npy array"


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
        text = COMMENT.sub("", _decode(data, name))
        if not text.strip():
            raise SeraOptError(f"{name} holds only comment lines (starting with #); give one "
                               f"success probability per prompt.")
        if suffix == ".json" or FIRST_LINE.search(text).group()[0] in "[{":
            kind, values = "JSON", from_json(text, name)
        else:
            kind, values = "table", from_table(text, name, column)
    if column is not None and kind != "table":
        raise SeraOptError(
            f"--column selects a column of a CSV table, but {name} is {kind}; drop --column."
        )
    try:
        return validate_success_probs(values)
    except SeraOptError as exc:
        hint = ""
        first_line = FIRST_LINE.search(text).group().split() if kind == "table" else []
        if (len(first_line) == 1 and column is None and values.size > 1
                and find_delimiter(text) is None and not 0 <= values[0] <= 1):
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
