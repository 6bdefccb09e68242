"""One contract for every registered solver and policy.

New solvers and policies join these tests by registering; nothing here names them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import sera_opt
from sera_opt import (
    Allocation,
    AllocationPolicy,
    SeraOptError,
    SeraOptWarning,
    available_policies,
    available_solvers,
    get_policy,
    get_solver,
)
from sera_opt.solvers import SOLVERS

RNG = np.random.default_rng(11)
CASES = {
    "spread": (RNG.uniform(0.02, 0.98, 37), 37 * 6, 2, 16),
    "ties": (np.array([0.5, 0.2, 0.5, 0.2, 0.8, 0.8]), 6 * 5, 2, 10),
    "edges": (np.array([0.0, 1.0, 0.3, 0.0, 0.9]), 5 * 4, 2, 8),
    "tight": (np.array([0.1, 0.6, 0.3]), 3 * 4, 4, 4),
    "one": (np.array([0.4]), 7, 2, 7),
}


def allocators():
    """(id, callable(p, budget, lo, hi) -> Allocation) for every solver and policy."""
    out = []
    for name in available_solvers():
        out.append((f"solver:{name}", lambda p, b, lo, hi, name=name: sera_opt.allocate(
            p, b, min_rollouts=lo, max_rollouts=hi, solver=name)))
    for name in available_policies():
        out.append((f"policy:{name}", lambda p, b, lo, hi, name=name: get_policy(name).allocate(
            p, b, min_rollouts=lo, max_rollouts=hi)))
    return out


ALLOCATORS = allocators()
IDS = [name for name, _ in ALLOCATORS]


@pytest.fixture(params=ALLOCATORS, ids=IDS)
def allocator(request):
    return request.param[1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_contract(allocator, case):
    p, budget, lo, hi = CASES[case]
    alloc = allocator(p, budget, lo, hi)
    assert isinstance(alloc, Allocation)
    assert alloc.counts.dtype == np.int64
    assert alloc.counts.shape == p.shape
    assert int(alloc.counts.sum()) == budget, "counts must sum exactly to the budget"
    assert np.all(alloc.counts >= lo) and np.all(alloc.counts <= hi), "bounds violated"
    assert alloc.factors.shape == p.shape
    assert np.all((alloc.factors >= 0) & (alloc.factors <= 1))
    assert alloc.min_factor == pytest.approx(float(alloc.factors.min()))
    assert alloc.solver
    assert alloc.wall_time >= 0
    again = allocator(p.copy(), budget, lo, hi)
    np.testing.assert_array_equal(alloc.counts, again.counts, err_msg="not deterministic")


def test_float32_inputs_keep_float32_factors(allocator):
    p = CASES["spread"][0].astype(np.float32)
    alloc = allocator(p, 37 * 6, 2, 16)
    assert alloc.factors.dtype == np.float32
    assert alloc.counts.dtype == np.int64


def test_results_are_read_only(allocator):
    alloc = allocator(*CASES["spread"])
    with pytest.raises(ValueError):
        alloc.counts[0] = 99


@pytest.mark.parametrize(
    "p, budget, lo, hi",
    [
        (np.array([0.1, np.nan, 0.3]), 9, 2, 5),
        (np.array([0.1, 1.3, 0.3]), 9, 2, 5),
        (np.array([[0.1, 0.3]]), 9, 2, 5),
        (np.array([0.1, 0.2, 0.3]), 100, 2, 5),
        (np.array([0.1, 0.2, 0.3]), 3, 2, 5),
        (np.array([0.1, 0.2, 0.3]), 9, 5, 2),
    ],
    ids=["nan", "above-one", "2-d", "budget-high", "budget-low", "min-above-max"],
)
def test_bad_input_is_rejected_with_the_library_error(allocator, p, budget, lo, hi):
    with pytest.raises(SeraOptError):
        allocator(p, budget, lo, hi)


def test_every_solver_is_registered_with_capabilities():
    assert available_solvers()[0] == "waterline"
    assert {"waterline", "milp", "greedy"} <= set(SOLVERS.names())
    for name in SOLVERS.names():
        cls = SOLVERS.lookup(name)
        assert isinstance(cls.integer, bool) and isinstance(cls.exact, bool)
        assert cls.__doc__ and "subject to" in cls.__doc__, f"{name}: docstring states the problem"


def test_every_policy_is_an_allocation_policy():
    assert {"sera", "uniform"} <= set(available_policies())
    for name in available_policies():
        assert isinstance(get_policy(name), AllocationPolicy)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(SeraOptError, match="'waterline'"):
        get_solver("nope")
    with pytest.raises(SeraOptError, match="'sera'"):
        get_policy("nope")


def test_ignored_solver_option_warns():
    with pytest.warns(SeraOptWarning, match="ignores the option 'continuous'"):
        sera_opt.allocate([0.2, 0.4], 6, solver="greedy", continuous=False)


def test_known_solver_option_is_used_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alloc = sera_opt.allocate([0.2, 0.4], 6, solver="waterline", continuous=False)
    assert alloc.continuous is None


def test_callable_and_instance_solvers():
    def everything_to_first(problem):
        counts = problem.min_rollouts.copy()
        counts[0] += problem.spare_budget
        return counts

    alloc = sera_opt.allocate([0.2, 0.4], 6, solver=everything_to_first)
    assert alloc.counts.tolist() == [5, 1]
    assert alloc.solver == "everything_to_first"
    alloc = sera_opt.allocate([0.2, 0.4], 6, solver=get_solver("greedy"))
    assert alloc.solver == "greedy"


def test_callable_solver_output_is_checked():
    with pytest.raises(SeraOptError, match="sum"):
        sera_opt.allocate([0.2, 0.4], 6, solver=lambda problem: [1, 1])


def test_a_new_policy_plugs_in_by_registering():
    from sera_opt.policies.base import POLICIES

    @sera_opt.register_policy
    class FirstTakesAll(AllocationPolicy):
        name = "test-first-takes-all"

        def _allocate(self, problem):
            counts = problem.min_rollouts.copy()
            counts[0] = problem.budget - counts[1:].sum()
            return Allocation.from_counts(problem, counts, solver=self.name, wall_time=0.0)

    try:
        alloc = get_policy("test-first-takes-all").allocate([0.1, 0.9], 5)
        assert alloc.counts.tolist() == [4, 1]
        with pytest.raises(SeraOptError, match="already registered"):
            sera_opt.register_policy(type("Other", (FirstTakesAll,), {}))
    finally:
        POLICIES._entries.pop("test-first-takes-all")


def test_uniform_spreads_the_remainder_by_index():
    alloc = get_policy("uniform").allocate(np.full(5, 0.5), 17)
    assert alloc.counts.tolist() == [4, 4, 3, 3, 3]
    alloc = get_policy("uniform").allocate(np.full(3, 0.5), 12, min_rollouts=[1, 1, 6],
                                           max_rollouts=[3, 10, 8])
    assert alloc.counts.tolist() == [3, 3, 6]


def test_sera_policy_passes_its_solver_options():
    policy = get_policy("sera", solver="waterline", continuous=False, max_rollouts=8)
    alloc = policy.allocate([0.05, 0.5, 0.9], 12)
    assert alloc.continuous is None
    assert alloc.counts.max() <= 8
    assert "continuous=False" in repr(policy)


def test_sera_caps_by_max_ratio_when_no_max_is_given():
    p = np.array([1e-4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99])
    budget = 8 * 4
    capped = get_policy("sera").allocate(p, budget)
    assert capped.counts.max() == 16  # ceil(4.0 * 32 / 8)
    uncapped = get_policy("sera", max_ratio=None).allocate(p, budget)
    assert uncapped.counts[0] == budget - 7  # the hopeless prompt takes everything spare
    assert get_policy("sera", max_ratio=2).allocate(p, budget).counts.max() == 8
    # An explicit maximum wins over the ratio.
    assert get_policy("sera", max_rollouts=5).allocate(p, budget).counts.max() == 5
    assert get_policy("sera").allocate(p, budget, max_rollouts=6).counts.max() == 6
    # Posterior-mean SERA takes the same option.
    assert get_policy("sera-bayes").allocate(p, budget).counts.max() <= 16


@pytest.mark.parametrize("bad", [0.5, "4", True])
def test_max_ratio_is_validated(bad):
    with pytest.raises(SeraOptError, match="max_ratio"):
        get_policy("sera", max_ratio=bad)


def test_policies_without_a_ratio_refuse_it():
    with pytest.raises(SeraOptError, match="unexpected option"):
        get_policy("uniform", max_ratio=4)
