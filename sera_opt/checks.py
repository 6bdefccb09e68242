"""The checks of the library's inputs at its boundary: offsets, counts, real options,
success probabilities and masked arrays, each refused with a :class:`~sera_opt.SeraOptError`
that says what is wrong and how to fix it.

:mod:`sera_opt.problem` builds its :class:`~sera_opt.AllocationProblem` from them and
re-exports the public ones, where they were first documented.
"""

from __future__ import annotations

import numbers
import operator

import numpy as np

from ._arrays import host_values
from .exceptions import SeraOptError

__all__ = [
    "MAX_BUDGET",
    "OFFSETS",
    "checked_probs",
    "float_dtype",
    "owned_read_only",
    "refuse_masked",
    "validate_count",
    "validate_offset",
    "validate_real",
    "validate_success_probs",
]

OFFSETS = (0, 1)

#: The largest budget (and per-prompt bound) sera_opt accepts: ``2**53``, the last
#: point up to which float64 holds every whole number.
MAX_BUDGET = 2**53


def validate_offset(offset) -> int:
    """Return ``offset`` as an int, or raise if it is not 0 or 1."""
    if isinstance(offset, (bool, np.bool_)) or offset not in OFFSETS:
        raise SeraOptError(
            f"offset must be 0 (success-average estimator) or 1 (mean-centred "
            f"estimator), got {offset!r}."
        )
    return int(offset)


def validate_count(value, name: str, *, minimum: int = 0) -> int:
    """A whole number of rollouts as a Python ``int`` in ``[minimum, MAX_BUDGET]``.

    Integral floats (``8.0``) are accepted; ``True``/``False``, fractions, strings,
    NaN and values outside the supported range are refused with the fix.
    """
    if isinstance(value, (bool, np.bool_)):
        raise SeraOptError(f"{name} must be a whole number of rollouts, got {value!r}.")
    try:
        number = operator.index(value)
    except TypeError:
        if isinstance(value, (float, np.floating)) and np.isfinite(value) \
                and float(value).is_integer():
            number = int(value)
        else:
            raise SeraOptError(
                f"{name} must be a whole number of rollouts, got {value!r}."
            ) from None
    if number < minimum:
        raise SeraOptError(f"{name} must be at least {minimum}, got {number}.")
    if number > MAX_BUDGET:
        raise SeraOptError(
            f"{name}={number} is above the supported maximum 2**53 = {MAX_BUDGET}: the "
            f"solvers compare counts with float64 levels, which hold whole numbers exactly "
            f"only up to there."
        )
    return int(number)


def validate_real(value, name: str, *, minimum: float | None = None, strict: bool = False,
                  allow_inf: bool = False, meaning: str = "") -> float:
    """A real-valued option as a float: a number (not a bool or a string), not NaN, finite
    unless ``allow_inf``, and ``>= minimum`` (``> minimum`` when ``strict``). The error says
    what the option must be, what it means (``meaning``) and what was given."""
    must = ("a number" if allow_inf else "a finite number")
    if minimum is not None:
        must += f" {'>' if strict else '>='} {minimum:g}"
    if allow_inf:
        must += " (inf allowed)"
    if meaning:
        must += f": {meaning}"
    message = f"{name} must be {must}; got {value!r}."
    if isinstance(value, (bool, np.bool_, str, bytes)) or not isinstance(value, (numbers.Real,
                                                                                 np.number)):
        raise SeraOptError(message)
    out = float(value)
    if out != out or (not allow_inf and not np.isfinite(out)) or (
            minimum is not None and (out <= minimum if strict else out < minimum)):
        raise SeraOptError(message)
    return out


def float_dtype(dtype: np.dtype) -> np.dtype:
    # float32 inputs keep float32 outputs; anything else (ints, bools, float16)
    # is promoted to at least float32, and float64 stays float64.
    return np.result_type(dtype, np.float32)


def validate_success_probs(success_probs, *, name: str = "success_probs") -> np.ndarray:
    """Check that ``success_probs`` is a finite 1-D array of values in [0, 1].

    Returns a float array (float32 stays float32, everything else becomes
    float64); it may share memory with the input. Raises :class:`SeraOptError`
    with the fix otherwise: booleans, masked arrays, strings and objects are
    refused, not read as numbers.
    """
    return checked_probs(success_probs, name)[0]


def refuse_masked(value, name: str) -> None:
    """Raise if ``value`` is a numpy masked array: converting one drops the mask and
    reads whatever the masked entries hold (uninitialised memory for ``masked_all``)."""
    if isinstance(value, np.ma.MaskedArray):
        raise SeraOptError(
            f"{name} is a numpy masked array; sera_opt does not read masks, and unmasking "
            f"would use whatever the masked entries hold. Pass {name}.compressed() to drop "
            f"the masked prompts (and the same entries of the other inputs), or "
            f"{name}.filled(value) to give them a value."
        )


def checked_probs(success_probs, name: str) -> tuple[np.ndarray, bool]:
    """:func:`validate_success_probs`, and whether the array returned is one that this
    call made (so that nobody else holds a reference to its memory)."""
    refuse_masked(success_probs, name)
    fresh = isinstance(success_probs, (list, tuple))
    try:
        p = np.asarray(host_values(success_probs))
    except Exception as exc:  # ragged lists and the like
        raise SeraOptError(
            f"{name} must be a 1-D array of probabilities, one per prompt; could not convert "
            f"it ({type(exc).__name__}: {exc}). Pass a flat list or array of numbers."
        ) from exc
    kind = p.dtype.kind
    if kind == "c":
        raise SeraOptError(f"{name} must be real, got a complex array.")
    if kind == "b":
        raise SeraOptError(
            f"{name} holds booleans, not probabilities: True and False are not read as 1 and "
            f"0. Pass the probabilities (for example {name}.astype(float) if 1 and 0 are "
            f"what you mean)."
        )
    if kind not in "fiu":
        raise SeraOptError(
            f"{name} must be numeric probabilities in [0, 1], got dtype {p.dtype}."
        )
    if p.ndim != 1:
        raise SeraOptError(
            f"{name} must be 1-D (one success probability per prompt), got shape "
            f"{p.shape}; flatten it or pass one batch at a time."
        )
    if p.size == 0:
        raise SeraOptError(f"{name} is empty: a batch needs at least one prompt.")
    if p.dtype != np.float64 and p.dtype != np.float32:
        p = p.astype(float_dtype(p.dtype))
        fresh = True
    # Two reductions decide validity (NaN propagates through both); the slow
    # diagnosis below runs only on bad input.
    low, high = p.min(), p.max()
    if low >= 0 and high <= 1:
        return p, fresh
    bad = ~np.isfinite(p)
    if bad.any():
        raise SeraOptError(
            f"{name} contains {int(bad.sum())} non-finite value(s) (NaN or inf), first "
            f"at index {int(np.flatnonzero(bad)[0])}; estimate them (for example with "
            f"sera_opt.SuccessTracker) before allocating."
        )
    out = (p < 0) | (p > 1)
    i = int(np.flatnonzero(out)[0])
    raise SeraOptError(
        f"{name} must lie in [0, 1]; {int(out.sum())} value(s) do not, first "
        f"{p[i]!r} at index {i}. sera_opt does not clip them: pass probabilities, "
        f"not logits or counts."
    )


def owned_read_only(array: np.ndarray, fresh: bool = False) -> np.ndarray:
    """``array`` as a read-only array that nothing outside sera_opt can change: a copy,
    unless ``fresh`` says that the caller made ``array`` itself and keeps no other
    reference to it. A read-only flag on a user's array proves nothing (a writable
    view of the same memory may exist), so it never saves the copy."""
    if not fresh:
        array = np.array(array, copy=True)
    array.setflags(write=False)
    return array
