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


def test_all_lists_the_top_level_surface():
    """``sera_opt.__all__`` is every public name the package binds (its submodules aside,
    but for ``cache``), once each; the kernel-cache names live under ``sera_opt.cache``."""
    import types

    import sera_opt

    listed = sera_opt.__all__
    assert len(listed) == len(set(listed)), "a name listed twice in sera_opt.__all__"
    public = {name for name in dir(sera_opt) if not name.startswith("_")
              and not isinstance(getattr(sera_opt, name), types.ModuleType)}
    assert set(listed) - {"__version__", "cache"} == public
    assert isinstance(sera_opt.cache, types.ModuleType)
    for name in ("wait_for_kernels", "kernel_cache_info", "clear_kernel_cache",
                 "set_kernel_cache_dir", "KernelCacheInfo"):
        assert name in sera_opt.cache.__all__ and not hasattr(sera_opt, name), name
