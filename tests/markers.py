"""Markers and skips shared by the test suite (one place, so CI and developers agree)."""

from __future__ import annotations

import importlib.util
import os

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


# CI sets SERA_OPT_REQUIRE_TRAINERS=1: there a missing trainer fails its tests instead of
# skipping them, so an install step that silently broke cannot pass as green.
_REQUIRE_TRAINERS = os.environ.get("SERA_OPT_REQUIRE_TRAINERS") == "1"


def _requires(module: str, reason: str):
    return pytest.mark.skipif(not _REQUIRE_TRAINERS and not has_module(module), reason=reason)


requires_gpu = pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
gpu = [pytest.mark.gpu, requires_gpu]
requires_trl = _requires("trl", "needs trl (pip install '.[trl]')")
requires_verl = _requires("verl", "needs verl (see docs/integrations/verl.md)")
requires_sklearn = pytest.mark.skipif(not has_module("sklearn"), reason="needs scikit-learn")
