"""A result owns its inputs: changing the caller's buffers after an allocation changes
nothing in it, neither its counts nor any field derived from them later."""

from __future__ import annotations

import numpy as np
import pytest

import sera_opt
from sera_opt import AllocationProblem, available_policies, get_policy

torch = pytest.importorskip("torch")

BUDGET = 24


def _probs(kind: str):
    p = np.array([0.9, 0.5, 0.05, 0.3])
    if kind == "float32":
        return p.astype(np.float32)
    if kind == "torch":
        return torch.tensor(p)
    return p


def _clobber(buffer) -> None:
    if isinstance(buffer, np.ndarray):
        buffer[...] = 0
    else:
        buffer.zero_()


def _derived(alloc) -> dict:
    """Every field of a result, read now (the lazy ones computed here)."""
    out = {"counts": alloc.counts.copy(), "factors": np.array(alloc.factors),
           "min_factor": alloc.min_factor, "probs": np.array(alloc.problem.success_probs),
           "min_rollouts": alloc.problem.min_rollouts.copy(),
           "max_rollouts": alloc.problem.max_rollouts.copy()}
    if alloc.terms is not None:
        out["terms"] = np.array(alloc.terms)
    if alloc.objective_value is not None:
        out["objective_value"] = alloc.objective_value
    return out


def _assert_same(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=f"{key} changed")


def _fresh(policy_name: str, kind: str):
    """An allocation of a policy, with the buffers the caller could reuse afterwards."""
    policy = get_policy(policy_name, max_rollouts=12)
    p = _probs(kind)
    lo = np.full(4, policy.min_rollouts, dtype=np.int64)
    hi = np.array([12, 11, 12, 12], dtype=np.int64)
    buffers = [p, lo, hi]
    inputs = {}
    if "posterior" in policy.extra_inputs:
        alpha = np.array([9.0, 5.0, 0.5, 3.0])
        beta = np.array([1.0, 5.0, 9.5, 7.0])
        inputs["posterior"] = (alpha, beta)
        buffers += [alpha, beta]
        p = None
    if "gradient_norms" in policy.extra_inputs:
        norms = np.array([1.0, 2.0, 0.5, 1.5])
        inputs["gradient_norms"] = norms
        buffers.append(norms)
    alloc = policy.allocate(p, BUDGET, min_rollouts=lo, max_rollouts=hi, **inputs)
    return alloc, buffers


# The posterior policies are given a float64 posterior (and no probabilities), so
# the probabilities' dtype is no case for them.
CASES = [(name, kind) for name in available_policies()
         for kind in (("float64",) if "posterior" in get_policy(name).extra_inputs
                      else ("float64", "float32", "torch"))]


@pytest.mark.parametrize(("policy_name", "kind"), CASES)
def test_result_unchanged_when_caller_reuses_buffers(policy_name, kind):
    reference = _derived(_fresh(policy_name, kind)[0])
    alloc, buffers = _fresh(policy_name, kind)
    for buffer in buffers:
        _clobber(buffer)
    _assert_same(reference, _derived(alloc))
    # replace() re-checks counts against the problem: the original bounds still hold.
    assert alloc.replace(counts=alloc.counts).counts.tolist() == reference["counts"].tolist()


@pytest.mark.parametrize("kind", ["float64", "float32", "torch"])
def test_allocate_issue_example(kind):
    p = _probs(kind)[:3] if kind != "torch" else torch.tensor([0.9, 0.5, 0.05])
    if kind == "float32":
        p = np.array([0.9, 0.5, 0.05], dtype=np.float32)
    elif kind == "float64":
        p = np.array([0.9, 0.5, 0.05])
    alloc = sera_opt.allocate(p, 24, max_rollouts=16)
    _clobber(p)
    assert alloc.counts.tolist() == [2, 6, 16]
    assert alloc.min_factor > 0.5
    assert np.all(np.asarray(alloc.factors) > 0.5)


def test_problem_holds_a_read_only_copy():
    p = np.array([0.2, 0.7])
    lo = np.array([1, 2])
    problem = AllocationProblem(p, 6, min_rollouts=lo, max_rollouts=np.array([4, 5]))
    p[:] = 1.0
    lo[:] = 3
    assert problem.success_probs.tolist() == [0.2, 0.7]
    assert problem.min_rollouts.tolist() == [1, 2]
    assert not problem.success_probs.flags.writeable
    # The caller's array keeps its own flags.
    assert p.flags.writeable


def test_gvm_leaves_the_callers_norms_writable():
    norms = np.array([1.0, 2.0])
    policy = get_policy("gvm", gradient_norms=norms)
    assert norms.flags.writeable
    norms[:] = 0
    assert policy.gradient_norms.tolist() == [1.0, 2.0]
