"""Reading and checking the separable engine's inputs: rows of numbers, probabilities,
Beta posteriors, the fairness ``alpha`` and per-prompt count bounds."""

from __future__ import annotations

import numpy as np

from ..exceptions import SeraOptError
from ..problem import MAX_BUDGET, refuse_masked, validate_real


def as_float_row(values, name: str, m: int | None = None) -> np.ndarray:
    refuse_masked(values, name)
    try:
        raw = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise SeraOptError(f"{name} must be a 1-D array of numbers: {exc}") from exc
    if raw.dtype.kind not in "fiu":
        what = "booleans (True is not read as 1)" if raw.dtype == np.bool_ else \
            f"dtype {raw.dtype}"
        raise SeraOptError(f"{name} must be a 1-D array of numbers, got {what}.")
    arr = raw.astype(np.float64, copy=False)
    if arr.ndim != 1:
        raise SeraOptError(f"{name} must be 1-D (one entry per prompt), got shape {arr.shape}.")
    if m is not None and arr.shape[0] != m:
        raise SeraOptError(f"{name} must have one entry per prompt ({m}), got {arr.shape[0]}.")
    # The minimum is NaN where any entry is (a reduction, no temporary the size of the row).
    if arr.size and np.isnan(arr.min()):
        raise SeraOptError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}.")
    return arr


def probabilities(success_probs) -> np.ndarray:
    p = as_float_row(success_probs, "success_probs")
    if p.size and not (p.min() >= 0 and p.max() <= 1):
        i = int(np.flatnonzero((p < 0) | (p > 1))[0])
        raise SeraOptError(
            f"success_probs must lie in [0, 1], got {p[i]!r} at index {i}; sera_opt does not "
            f"clip them."
        )
    return p


def validate_beta_posterior(alpha, beta, m: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check Beta posterior parameters: finite, ``>= 0``, ``alpha + beta > 0``.

    ``alpha = 0`` stands for a point mass at ``p = 0`` and ``beta = 0`` for one
    at ``p = 1`` (the limits of the Beta family).
    """
    a = as_float_row(alpha, "posterior alpha", m)
    b = as_float_row(beta, "posterior beta", a.shape[0])
    if not a.size:
        return a, b
    # Reductions first (no temporaries the size of the rows); the masks only to name
    # the first bad entry.
    for name, arr in (("alpha", a), ("beta", b)):
        if arr.min() >= 0 and arr.max() < np.inf:
            continue
        bad = ~np.isfinite(arr) | (arr < 0)
        i = int(np.flatnonzero(bad)[0])
        raise SeraOptError(
            f"posterior {name} must be finite and >= 0; got {arr[i]!r} at index {i}. "
            f"Pass Beta parameters, e.g. from sera_opt.SuccessTracker.posterior()."
        )
    if a.min() > 0 or b.min() > 0:
        return a, b
    both = (a == 0) & (b == 0)
    if both.any():
        i = int(np.flatnonzero(both)[0])
        raise SeraOptError(
            f"posterior alpha and beta are both 0 at index {i}: that is no distribution; "
            f"give at least one of them a positive value."
        )
    return a, b


def check_alpha(alpha) -> float:
    """The fairness ``alpha`` as a float in ``[0, inf]``, or a :class:`SeraOptError`."""
    return validate_real(alpha, "alpha", minimum=0.0, allow_inf=True,
                         meaning="0 sums the factors, 1 is proportional fairness, inf is SERA's "
                                 "max-min")



def count_bounds(value, name: str, m: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(
            arr == np.round(arr)
        ):
            arr = arr.astype(np.int64)
        else:
            raise SeraOptError(f"{name} must hold whole numbers of rollouts, got {value!r}.")
    arr = np.broadcast_to(arr.astype(np.int64), (m,)) if arr.ndim == 0 else arr
    if arr.shape != (m,):
        raise SeraOptError(f"{name} must be a scalar or have shape ({m},), got {arr.shape}.")
    if arr.size and (arr.max() > MAX_BUDGET or arr.min() < 0):
        raise SeraOptError(f"{name} must lie in [0, 2**53].")
    return np.array(arr, dtype=np.int64, order="C")  # writable copy (see KernelObjective)
