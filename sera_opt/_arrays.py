"""Reading a user's array-like into a 1-D numpy array, with one wording for the two
ways it can fail (it is not an array at all, or it has the wrong number of axes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .exceptions import SeraOptError

__all__ = ["host_values", "one_d"]


def host_values(values: Any) -> Any:
    """``values`` in a form numpy can read: a torch tensor is detached and moved to the
    host, and a bfloat16 one is widened to float32, which holds every bfloat16 value
    exactly (numpy has no bfloat16). Anything else is returned as it is."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch tensor, any device
        values = values.detach().cpu()
        if str(values.dtype) == "torch.bfloat16":
            values = values.float()
    return values


def one_d(values: Any, name: str, *, prefix: str = "", per: str = "") -> np.ndarray:
    """``np.asarray(values)``, refused with :class:`SeraOptError` unless it is 1-D.

    ``prefix`` opens both messages (what was being read, e.g. a checkpoint); ``per``
    says what one entry stands for (``" (one per rollout)"``). A torch bfloat16 tensor
    is read as float32 (exactly; numpy has no bfloat16). A numpy masked array is
    refused: converting it drops the mask and reads whatever the masked entries hold."""
    if isinstance(values, np.ma.MaskedArray):
        raise SeraOptError(
            f"{prefix}{name} is a numpy masked array; sera_opt does not read masks, and "
            f"unmasking would use whatever the masked entries hold. Pass {name}.compressed() "
            f"to drop the masked entries (and the same entries of the other inputs), or "
            f"{name}.filled(value) to give them a value.")
    try:
        arr = np.asarray(host_values(values))
    except Exception as exc:  # ragged lists and the like
        raise SeraOptError(f"{prefix}{name} could not be read as an array: {exc}") from exc
    if arr.ndim != 1:
        raise SeraOptError(f"{prefix}{name} must be 1-D{per}, got shape {arr.shape}.")
    return arr
