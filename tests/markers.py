"""Markers and skips shared by the test suite (one place, so CI and developers agree)."""

from __future__ import annotations

import importlib.util

import pytest


def has_module(name: str) -> bool:
    """True when ``name`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _cuda_available() -> bool:
    if not has_module("torch"):
        return False
    import torch

    return torch.cuda.is_available()


requires_gpu = pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
gpu = [pytest.mark.gpu, requires_gpu]
requires_trl = pytest.mark.skipif(not has_module("trl"), reason="needs trl (pip install '.[trl]')")
requires_verl = pytest.mark.skipif(not has_module("verl"), reason="needs verl (see docs/integrations/verl.md)")
requires_sklearn = pytest.mark.skipif(not has_module("sklearn"), reason="needs scikit-learn")
