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


def test_public_names_resolve_to_the_objects_they_name():
    import sera_opt
    from sera_opt import api, policies, problem, result, separable, solvers

    expected = {
        "allocate": api.allocate, "waterline": api.waterline,
        "attenuation": problem.attenuation, "AllocationProblem": problem.AllocationProblem,
        "MAX_BUDGET": problem.MAX_BUDGET, "Allocation": result.Allocation,
        "AllocationPolicy": policies.AllocationPolicy, "SeparablePolicy": policies.SeparablePolicy,
        "SERAPolicy": policies.SERAPolicy, "SERAFairPolicy": policies.SERAFairPolicy,
        "UniformPolicy": policies.UniformPolicy, "get_policy": policies.get_policy,
        "policy_from_config": policies.policy_from_config,
        "DEFAULT_MAX_RATIO": policies.DEFAULT_MAX_RATIO, "get_solver": solvers.get_solver,
        "SeparableObjective": separable.SeparableObjective,
        "solve_separable": separable.solve_separable,
    }
    for name, obj in expected.items():
        assert getattr(sera_opt, name) is obj, name
    # Every name the package lists in dir() resolves (the lazy ones on first access).
    missing = [n for n in dir(sera_opt) if not n.startswith("_") and not hasattr(sera_opt, n)]
    assert not missing, missing


def test_unknown_attribute_raises_attribute_error():
    import pytest

    import sera_opt

    with pytest.raises(AttributeError, match="no attribute"):
        sera_opt.does_not_exist  # noqa: B018
