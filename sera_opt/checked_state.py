"""State on disk that is whole and unaltered, or refused.

Two rules, for every file the library or its adapters write state to:

* **Atomic.** :func:`write_atomic` writes a temporary file in the destination's folder
  and renames it over the destination (``os.replace``), so an interrupted save (an
  exception, a killed process, a full disk) leaves the previous file as it was.
* **Checked.** :func:`seal` wraps a state with the SHA-256 of its canonical bytes
  (:func:`state_digest`: every array's dtype, shape and data, every number, string and
  key, independent of dict order); :func:`unseal` recomputes it on load and refuses a
  state that differs, so one flipped bit in a stored count is an error, not a silently
  moved estimate.

Nothing here imports torch: the caller passes the function that writes the bytes.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from sera_opt.exceptions import SeraOptError

__all__ = ["SEALED_FORMAT", "is_sealed", "seal", "state_digest", "unseal", "write_atomic"]

#: The ``"format"`` of a sealed payload: ``{"format", "sha256", "state"}``.
SEALED_FORMAT = "sera_opt.sealed_state/1"


def _feed(hasher: Any, obj: Any, where: str) -> None:
    """Feed ``obj``'s canonical bytes: a type tag, then a length or a fixed-width value, so
    that no two different states give the same stream."""
    if obj is None:
        hasher.update(b"N")
    elif isinstance(obj, (bool, np.bool_)):
        hasher.update(b"B1" if obj else b"B0")
    elif isinstance(obj, int):
        text = str(obj).encode()
        hasher.update(b"I%d:" % len(text) + text)
    elif isinstance(obj, float):
        hasher.update(b"F" + struct.pack("<d", obj))
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        hasher.update(b"S%d:" % len(data) + data)
    elif isinstance(obj, bytes):
        hasher.update(b"Y%d:" % len(obj) + obj)
    elif isinstance(obj, np.ndarray):
        _feed_array(hasher, obj, where)
    elif isinstance(obj, np.generic):
        hasher.update(b"G")
        _feed_array(hasher, np.asarray(obj), where)
    elif isinstance(obj, np.dtype):
        text = obj.str.encode()
        hasher.update(b"d%d:" % len(text) + text)
    elif isinstance(obj, Mapping):
        # Sorted by each key's own canonical bytes: dict order is not part of a state.
        items = []
        for key, value in obj.items():
            key_hasher = hashlib.sha256()
            _feed(key_hasher, key, where)
            items.append((key_hasher.digest(), key, value))
        hasher.update(b"D%d:" % len(items))
        for digest, key, value in sorted(items, key=lambda item: item[0]):
            hasher.update(digest)
            _feed(hasher, value, f"{where}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        hasher.update(b"L%d:" % len(obj))
        for i, value in enumerate(obj):
            _feed(hasher, value, f"{where}[{i}]")
    elif hasattr(obj, "detach") and hasattr(obj, "numpy"):  # a torch tensor, without torch
        hasher.update(b"t")
        _feed_array(hasher, obj.detach().cpu().numpy(), where)
    else:
        raise SeraOptError(
            f"cannot checksum {where}, a {type(obj).__name__}: a state on disk holds dicts, "
            "lists, arrays, numbers and strings only; convert it in state_dict().")


def _feed_array(hasher: Any, array: np.ndarray, where: str) -> None:
    shape = ",".join(str(n) for n in array.shape).encode()
    dtype = array.dtype.str.encode()
    hasher.update(b"A%d:" % len(dtype) + dtype + b"%d:" % len(shape) + shape)
    if array.dtype.hasobject:
        # The bytes of an object array are pointers: hash the items themselves.
        for i, value in enumerate(array.ravel().tolist()):
            _feed(hasher, value, f"{where}[{i}]")
    else:
        hasher.update(np.ascontiguousarray(array).tobytes())


def state_digest(state: Any) -> str:
    """The SHA-256 (hex) of ``state``'s canonical bytes.

    Equal for equal states whatever the order of their dicts; different when any array
    element, number, string or key differs (down to one bit), when a dtype or a shape
    differs, or when an entry is added or dropped.

    Raises
    ------
    SeraOptError
        When the state holds an object other than dicts, lists, tuples, numpy arrays and
        scalars, tensors, numbers, strings, bytes and None.
    """
    hasher = hashlib.sha256()
    _feed(hasher, state, "the state")
    return hasher.hexdigest()


def seal(state: Any) -> dict[str, Any]:
    """``{"format": SEALED_FORMAT, "sha256": state_digest(state), "state": state}``."""
    return {"format": SEALED_FORMAT, "sha256": state_digest(state), "state": state}


def is_sealed(payload: Any) -> bool:
    """True when ``payload`` has the form :func:`seal` returns (checked or not)."""
    return isinstance(payload, Mapping) and payload.get("format") == SEALED_FORMAT


def unseal(payload: Any, *, source: str) -> Any:
    """The state inside a :func:`seal` payload, after checking its checksum.

    Parameters
    ----------
    payload
        What was loaded from ``source``.
    source
        The file it came from, for the message.

    Raises
    ------
    SeraOptError
        When ``payload`` is not a sealed state, or its state's checksum is not the one it
        was saved with (the file was altered or damaged after it was written).
    """
    if not is_sealed(payload) or set(payload) != {"format", "sha256", "state"} \
            or not isinstance(payload["sha256"], str):
        raise SeraOptError(
            f"{source} is not a sealed sera_opt state (expected the keys format, sha256 and "
            "state); write it with the library's save function.")
    try:
        digest = state_digest(payload["state"])
    except SeraOptError as exc:
        raise SeraOptError(f"{source} holds a state that cannot be checked: {exc}") from None
    if digest != payload["sha256"]:
        raise SeraOptError(
            f"{source} is damaged: its state's checksum is {digest[:16]}..., not the "
            f"{payload['sha256'][:16]}... it was saved with, so at least one stored value "
            "changed after the save; restore the file from a copy, or delete it to start afresh.")
    return payload["state"]


def _mode_for(path: str) -> int:
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)  # read it: there is no other way
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> str:
    """Write a file whole or not at all: ``write(f)`` fills a temporary file in ``path``'s
    folder, which then replaces ``path`` in one rename.

    Parameters
    ----------
    path
        The destination; its folder must exist.
    write
        Called with the temporary file, opened for binary writing.

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    Whatever ``write`` raises, after the temporary file is removed; ``path`` is then
    exactly as it was before the call (absent, or the previous file).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    try:
        # mkstemp makes the file private (0600): give it the mode open() would have, or the
        # mode of the file it replaces, so that a save does not change who can read it.
        os.chmod(tmp, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            # On disk before the rename, so a crash cannot leave a renamed, empty file.
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
