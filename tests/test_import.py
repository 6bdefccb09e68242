"""`import sera_opt` stays light: no torch, numba, cvxpy or trainer is loaded."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ["torch", "numba", "cvxpy", "trl", "transformers", "verl"]


def test_import_loads_no_heavy_dependency():
    code = (
        "import sys, sera_opt, sera_opt.cli; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"`import sera_opt` loaded: {out.stdout.strip()}"


def test_public_names_resolve():
    import sera_opt

    for name in ("allocate", "waterline", "attenuation", "Allocation", "AllocationProblem",
                 "AllocationPolicy", "SERAPolicy", "UniformPolicy", "get_policy", "get_solver",
                 "SeraOptError"):
        assert hasattr(sera_opt, name), name
    lazy = sera_opt._LAZY
    for name in lazy:
        assert name in dir(sera_opt)


def test_unknown_attribute_raises_attribute_error():
    import pytest

    import sera_opt

    with pytest.raises(AttributeError, match="no attribute"):
        sera_opt.does_not_exist  # noqa: B018
