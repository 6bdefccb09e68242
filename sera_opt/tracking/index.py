"""Prompt id -> slot, for the success tracker.

A :class:`PromptIndex` gives each prompt a slot ``0..size-1`` (the row of its
evidence) and has one job: map a batch of ids to slots, adding new ids when
asked. One kind of id per index:

* ``"dense"``: built with ``num_prompts=N``; the ids are ``0..N-1`` and are the
  slots themselves;
* ``"int"``: int64 ids. Non-negative ids of moderate range (dataset indices)
  go through a direct table (``table[id]``, a gather); once an id falls far
  outside it (hashes, negative ids) the index switches, once, to an
  open-addressing hash table (compiled; O(1) per id);
* ``"str"``: strings, matched exactly on their code points in a compiled hash
  table; a numpy string array (dtype ``str``) is read without creating a
  Python object per id, a list of ``str`` is converted to one first.

New ids get the next slots in order of first occurrence. numba is imported on
first use, not at ``import sera_opt``.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from .. import _jit
from .._arrays import one_d
from ..exceptions import SeraOptError

__all__ = ["ParsedIds", "PromptIndex", "parse_prompt_ids"]

_INT64_MAX = np.iinfo(np.int64).max
_TABLE_MIN = 1 << 20
_MIXED = ("prompt_ids mix strings with other types; use one kind of id (all int or all str).")


def _kernels():
    return _jit.kernels("sera_opt.tracking.index_kernels")


class ParsedIds(NamedTuple):
    """Validated ids: ``kind`` is "int" (``values`` int64, shape (R,)), "str"
    (``values`` uint32 code points, shape (R, width), NUL-padded) or "empty"."""

    kind: str
    values: np.ndarray

    @property
    def count(self) -> int:
        return int(self.values.shape[0])


def _string_rows(arr: np.ndarray) -> np.ndarray:
    """The code points of a 1-D numpy ``str`` array, one row per id (a view when possible)."""
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    arr = np.ascontiguousarray(arr)
    width = arr.dtype.itemsize // 4
    if width == 0:
        return np.zeros((arr.shape[0], 0), dtype=np.uint32)
    return arr.view(np.uint32).reshape(arr.shape[0], width)


def _strings_from_list(items) -> np.ndarray:
    # One pass in C checks every item: join refuses anything but str.
    try:
        joined = "".join(items)
    except TypeError:
        raise SeraOptError(_MIXED) from None
    # numpy's fixed-width strings cannot end in NUL: such an id would silently
    # merge with its stripped twin, so it is refused instead.
    if "\x00" in joined:
        bad = next((s for s in items if s.endswith("\x00")), None)
        if bad is not None:
            raise SeraOptError(
                f"prompt id {bad!r} ends in a NUL character ('\\x00'); string ids are compared "
                f"as numpy strings, which cannot end in NUL. Strip or replace it."
            )
    return np.array(items, dtype=str)


def parse_prompt_ids(prompt_ids) -> ParsedIds:
    """Read one batch of ids (array-like of int or str) without touching any index. Ids
    already read (a :class:`ParsedIds`) are returned as they are, so that a caller that
    hands one batch to several lookups reads it once."""
    if type(prompt_ids) is ParsedIds:
        return prompt_ids
    if isinstance(prompt_ids, (str, bytes)):
        raise SeraOptError(
            "prompt_ids must be a sequence of ids (one per rollout or prompt), got a single "
            "string; wrap it in a list."
        )
    if isinstance(prompt_ids, (list, tuple)) and prompt_ids and isinstance(prompt_ids[0], str):
        return ParsedIds("str", _string_rows(_strings_from_list(prompt_ids)))
    arr = one_d(prompt_ids, "prompt_ids")
    if arr.size == 0:
        return ParsedIds("empty", np.empty(0, dtype=np.int64))
    kind = arr.dtype.kind
    if kind in "iu":
        if kind == "u" and int(arr.max()) > _INT64_MAX:
            raise SeraOptError("integer prompt ids must fit in int64.")
        return ParsedIds("int", np.ascontiguousarray(arr, dtype=np.int64))
    if kind == "U":
        if isinstance(prompt_ids, (list, tuple)):
            # numpy turned numbers into strings: the list mixed kinds.
            raise SeraOptError(_MIXED)
        return ParsedIds("str", _string_rows(arr))
    if kind == "O":
        items = arr.tolist()
        if all(isinstance(x, str) for x in items):
            return ParsedIds("str", _string_rows(_strings_from_list(items)))
        if all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in items):
            try:
                return parse_prompt_ids(np.asarray(items, dtype=np.int64))
            except OverflowError:
                raise SeraOptError("integer prompt ids must fit in int64.") from None
        if any(isinstance(x, str) for x in items):
            raise SeraOptError(_MIXED)
    if kind == "b":
        raise SeraOptError("prompt_ids must be integers or strings, got booleans.")
    if kind == "f":
        raise SeraOptError(
            "prompt_ids must be integers or strings, got floats; if they are whole numbers, "
            "cast them with .astype(int)."
        )
    if kind == "S":
        raise SeraOptError(
            f"prompt_ids must be integers or strings, got bytes (dtype {arr.dtype}); decode "
            f"them first, e.g. with np.char.decode(ids, 'utf-8')."
        )
    raise SeraOptError(f"prompt_ids must be integers or strings, got dtype {arr.dtype}.")


def power_of_two_at_least(n: int, minimum_bits: int = 4) -> int:
    """The smallest power of two >= ``n`` and >= ``2 ** minimum_bits`` (a table size)."""
    return 1 << max(minimum_bits, int(n - 1).bit_length())


def grown(arr: np.ndarray, capacity: int, fill=0) -> np.ndarray:
    """A copy of ``arr`` with ``capacity`` entries, the new ones set to ``fill``."""
    out = np.full(capacity, fill, dtype=arr.dtype)
    out[:arr.size] = arr
    return out


class PromptIndex:
    """Prompt id -> slot (see the module docstring for the id kinds).

    Parameters
    ----------
    num_prompts : int, optional
        Dataset size for dense ids ``0..num_prompts-1``.
    """

    def __init__(self, num_prompts: int | None = None):
        self.num_prompts = num_prompts
        self.kind: str | None = "dense" if num_prompts is not None else None
        self.size = num_prompts if num_prompts is not None else 0
        # int ids: keys in slot order, and a direct table or a hash table.
        self._keys = np.empty(0, dtype=np.int64)
        self._direct: np.ndarray | None = np.empty(0, dtype=np.int64)
        self._hash: np.ndarray | None = None  # interleaved (key, slot); slot -1 = empty
        # str ids: code points of every key back to back, and (hash, slot) pairs.
        self._buf = np.empty(0, dtype=np.uint32)
        self._offsets = np.zeros(1, dtype=np.int64)
        self._str_table = np.full(32, -1, dtype=np.int64)

    @property
    def int_mode(self) -> str | None:
        """``"table"`` or ``"hash"`` for int ids (which map serves them), else None."""
        if self.kind != "int":
            return None
        return "table" if self._direct is not None else "hash"

    # ------------------------------------------------------------------ lookups
    def lookup(self, parsed: ParsedIds) -> tuple[np.ndarray, int]:
        """Slots of the ids (-1 where unknown) and how many are unknown. Changes nothing."""
        n = parsed.count
        if parsed.kind == "empty":
            return np.empty(0, dtype=np.int64), 0
        if self.kind == "dense":
            if parsed.kind != "int":
                raise SeraOptError(
                    "this tracker was built with num_prompts, so prompt ids are the integers "
                    "0..num_prompts-1; got strings."
                )
            bad = _kernels().first_outside(parsed.values, self.num_prompts)
            if bad >= 0:
                raise SeraOptError(
                    f"prompt id {int(parsed.values[bad])} is outside 0..{self.num_prompts - 1} "
                    f"(num_prompts={self.num_prompts})."
                )
            return parsed.values, 0
        if self.kind is None:
            return np.full(n, -1, dtype=np.int64), n
        if parsed.kind != self.kind:
            raise SeraOptError(
                f"this tracker holds {self.kind} prompt ids; got {parsed.kind} ids. Use one kind "
                f"of id per tracker."
            )
        k = _kernels()
        out = np.empty(n, dtype=np.int64)
        if parsed.kind == "int":
            if self._direct is not None:
                missing, _, _ = k.direct_lookup(self._direct, parsed.values, out)
            else:
                missing, _ = k.int_hash_lookup(self._hash, parsed.values, out)
        else:
            lengths = np.empty(n, dtype=np.int64)
            missing, _ = k.str_lookup(self._str_table, self._offsets, self._buf, parsed.values,
                                      out, lengths)
        return out, int(missing)

    def insert(self, parsed: ParsedIds, slots: np.ndarray, missing: int) -> None:
        """Give every id whose slot is -1 a new slot, in place (``slots`` from :meth:`lookup`)."""
        if missing == 0:
            return
        if self.kind is None:
            self.kind = parsed.kind
        if self.kind == "int":
            self._insert_int(parsed.values, slots, missing)
        else:
            self._insert_str(parsed.values, slots, missing)

    def _reserve_keys(self, need: int):
        if need > self._keys.size:
            self._keys = grown(self._keys, max(need, 2 * self._keys.size, 1024))

    def _insert_int(self, ids: np.ndarray, slots: np.ndarray, missing: int):
        k = _kernels()
        if self._direct is not None:
            lo, hi = int(ids.min()), int(ids.max())
            limit = max(_TABLE_MIN, 4 * (self.size + missing))
            if lo >= 0 and hi < limit:
                if hi >= self._direct.size:
                    self._direct = grown(self._direct, max(hi + 1, 2 * self._direct.size), -1)
                self._reserve_keys(self.size + missing)
                self.size = int(k.direct_insert(self._direct, self._keys, self.size, ids, slots))
                return
            # Sparse ids (hashes, negative ids): one switch to the hash table.
            self._direct = None
            self._hash = self._built_hash(self.size + missing)
        elif 2 * (self.size + missing) > self._hash.size // 2:
            self._hash = self._built_hash(self.size + missing)
        self._reserve_keys(self.size + missing)
        self.size = int(k.int_hash_insert(self._hash, self._keys, self.size, ids, slots))

    def _built_hash(self, keys_to_hold: int) -> np.ndarray:
        table = np.full(2 * power_of_two_at_least(2 * keys_to_hold), -1, dtype=np.int64)
        _kernels().int_hash_build(table, self._keys, self.size)
        return table

    def _insert_str(self, rows: np.ndarray, slots: np.ndarray, missing: int):
        k = _kernels()
        need = self.size + missing
        if 2 * need > self._str_table.size // 2:
            table = np.full(2 * power_of_two_at_least(2 * need), -1, dtype=np.int64)
            k.str_rehash(self._str_table, table)
            self._str_table = table
        if need + 1 > self._offsets.size:
            self._offsets = grown(self._offsets, max(need, 2 * self._offsets.size, 1024) + 1)
        lengths = np.empty(rows.shape[0], dtype=np.int64)
        k.row_lengths(rows, lengths)
        chars = int(self._offsets[self.size]) + int(lengths[slots < 0].sum())
        if chars > self._buf.size:
            self._buf = grown(self._buf, max(chars, 2 * self._buf.size, 1 << 16))
        self.size = int(k.str_insert(self._str_table, self._offsets, self._buf, self.size, rows,
                                     lengths, slots))

    # ------------------------------------------------------------------ state
    def keys(self) -> Any:
        """The ids in slot order (None for dense or empty indices; copies)."""
        if self.kind == "int":
            return self._keys[:self.size].copy()
        if self.kind == "str":
            if self.size == 0:
                return []
            lengths = np.diff(self._offsets[:self.size + 1])
            width = int(lengths.max())
            if width == 0:
                return [""] * self.size
            rows = np.zeros((self.size, width), dtype=np.uint32)
            _kernels().str_unpack(self._offsets, self._buf, self.size, width, rows)
            return rows.view(np.dtype(f"U{width}")).reshape(self.size).tolist()
        return None

    @classmethod
    def from_state(cls, kind, keys, size: int, num_prompts: int | None) -> PromptIndex:
        """A validated index for ``size`` slots; raises :class:`SeraOptError` naming the problem."""
        bad = "malformed SuccessTracker state"
        if not (kind is None or (isinstance(kind, str) and kind in ("dense", "int", "str"))):
            raise SeraOptError(f"{bad}: id_kind must be None, 'dense', 'int' or 'str', got "
                               f"{kind!r}.")
        if (kind == "dense") != (num_prompts is not None):
            raise SeraOptError(
                f"{bad}: id_kind {kind!r} does not match num_prompts={num_prompts!r} in the "
                f"config (dense ids go with num_prompts, and only they do)."
            )
        index = cls(num_prompts)
        if kind in (None, "dense"):
            if keys is not None:
                raise SeraOptError(f"{bad}: id_kind {kind!r} stores no keys, got {type(keys)}.")
            expected = num_prompts if kind == "dense" else 0
            if size != expected:
                raise SeraOptError(
                    f"{bad}: {size} evidence rows for id_kind {kind!r}"
                    + (f" with num_prompts={num_prompts}." if kind == "dense" else
                       " (a tracker that has seen no ids holds no evidence).")
                )
            return index
        if kind == "int":
            index._load_int_keys(keys, size)
        else:
            index._load_str_keys(keys, size)
        index.kind = kind
        return index

    def _load_int_keys(self, keys, size: int):
        bad = "malformed SuccessTracker state"
        if isinstance(keys, (str, bytes)) or keys is None:
            raise SeraOptError(f"{bad}: int ids need an array of keys, got {type(keys).__name__}.")
        try:
            arr = np.asarray(keys)
        except Exception as exc:
            raise SeraOptError(f"{bad}: keys could not be read as an array: {exc}") from exc
        if arr.ndim != 1 or arr.shape[0] != size:
            raise SeraOptError(f"{bad}: one key per prompt needed ({size}), got keys of shape "
                               f"{arr.shape}.")
        if size and arr.dtype.kind not in "iu":
            raise SeraOptError(f"{bad}: int ids need integer keys, got dtype {arr.dtype}.")
        if size and arr.dtype.kind == "u" and int(arr.max()) > _INT64_MAX:
            raise SeraOptError(f"{bad}: integer keys must fit in int64.")
        arr = np.array(arr, dtype=np.int64)
        sorted_keys = np.sort(arr)
        dup = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
        if dup.size:
            raise SeraOptError(f"{bad}: duplicate prompt id {int(sorted_keys[dup[0]])} in keys.")
        self._keys = arr
        self.size = size
        if size == 0 or (sorted_keys[0] >= 0 and sorted_keys[-1] < max(_TABLE_MIN, 4 * size)):
            table = np.full(int(sorted_keys[-1]) + 1 if size else 0, -1, dtype=np.int64)
            table[arr] = np.arange(size, dtype=np.int64)
            self._direct = table
        else:
            self._direct = None
            self._hash = self._built_hash(size)

    def _load_str_keys(self, keys, size: int):
        bad = "malformed SuccessTracker state"
        if isinstance(keys, np.ndarray):
            keys = keys.tolist()
        if not isinstance(keys, (list, tuple)):
            raise SeraOptError(f"{bad}: str ids need a list of keys, got {type(keys).__name__}.")
        if len(keys) != size:
            raise SeraOptError(f"{bad}: one key per prompt needed ({size}), got {len(keys)}.")
        if not all(isinstance(x, str) for x in keys):
            raise SeraOptError(f"{bad}: str ids need str keys.")
        if len(set(keys)) != size:
            seen: set = set()
            dup = next(x for x in keys if x in seen or seen.add(x))
            raise SeraOptError(f"{bad}: duplicate prompt id {dup!r} in keys.")
        if size == 0:
            return
        try:
            rows = _string_rows(_strings_from_list(keys))
        except SeraOptError as exc:
            raise SeraOptError(f"{bad}: {exc}") from None
        k = _kernels()
        lengths = np.empty(size, dtype=np.int64)
        k.row_lengths(rows, lengths)
        capacity = max(size, 1024)
        self._offsets = np.zeros(capacity + 1, dtype=np.int64)
        self._buf = np.zeros(max(int(lengths.sum()), 1 << 16), dtype=np.uint32)
        k.str_pack(rows, lengths, self._offsets, self._buf)
        self._str_table = np.full(2 * power_of_two_at_least(2 * size), -1, dtype=np.int64)
        k.str_build(self._str_table, self._offsets, self._buf, size)
        self.size = size
