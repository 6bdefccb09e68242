"""One contract for every registered solver and policy, and one optimality suite for every
one flagged exact.

New solvers and policies join these tests by registering; nothing here names them. A policy
defined in this file (an objective class and a three-line policy, not registered globally)
runs through both suites too, which shows what a new policy takes.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import (
    Allocation,
    AllocationPolicy,
    AllocationProblem,
    SeparableObjective,
    SeparablePolicy,
    SeraOptError,
    SeraOptWarning,
    available_policies,
    available_solvers,
    get_policy,
    get_solver,
    policy_from_config,
)
from sera_opt.separable import expected_factors
from sera_opt.solvers import SOLVERS


# ----------------------------------------------------------------- a policy of this file
class LogShare(SeparableObjective):
    """maximize sum_i p_i log n_i: a concave objective the engine has no kernel for."""

    sense = "max-sum"

    def __init__(self, success_probs, offset=0):
        super().__init__(len(success_probs), offset)
        self.p = np.asarray(success_probs, dtype=float)

    def gains(self, counts):
        k = np.asarray(counts, dtype=float)
        return self.p * np.log((k + 1) / k)

    def terms(self, counts):
        return self.p * np.log(np.asarray(counts, dtype=float))


class LogSharePolicy(SeparablePolicy):
    name = "test-log-share"

    def objective(self, problem):
        return LogShare(problem.success_probs, problem.offset)


RNG = np.random.default_rng(11)
CASES = {
    "spread": (RNG.uniform(0.02, 0.98, 37), 37 * 6, 2, 16),
    "ties": (np.array([0.5, 0.2, 0.5, 0.2, 0.8, 0.8]), 6 * 5, 2, 10),
    "edges": (np.array([0.0, 1.0, 0.3, 0.0, 0.9]), 5 * 4, 2, 8),
    "tight": (np.array([0.1, 0.6, 0.3]), 3 * 4, 4, 4),
    "one": (np.array([0.4]), 7, 2, 7),
}


def allocators():
    """(id, flags, callable(p, budget, lo, hi, offset) -> Allocation) for every solver and
    policy, and the policy of this file."""
    out = []
    for name in available_solvers():
        cls = SOLVERS.lookup(name)
        out.append((f"solver:{name}", cls, lambda p, b, lo, hi, c=0, name=name: sera_opt.allocate(
            p, b, min_rollouts=lo, max_rollouts=hi, offset=c, solver=name)))
    for name in available_policies():
        cls = sera_opt.policies.POLICIES.lookup(name)
        out.append((f"policy:{name}", cls, lambda p, b, lo, hi, c=0, name=name: get_policy(
            name, offset=c).allocate(p, b, min_rollouts=lo, max_rollouts=hi)))
    out.append(("local:test-log-share", LogSharePolicy,
                lambda p, b, lo, hi, c=0: LogSharePolicy(offset=c).allocate(
                    p, b, min_rollouts=lo, max_rollouts=hi)))
    return out


ALLOCATORS = allocators()
IDS = [name for name, _, _ in ALLOCATORS]
EXACT = [entry for entry in ALLOCATORS if entry[1].exact]


@pytest.fixture(params=ALLOCATORS, ids=IDS)
def allocator(request):
    return request.param[2]


def reference_factors(alloc: Allocation) -> np.ndarray:
    p, c = alloc.problem.success_probs, alloc.offset
    if alloc.posterior is None:
        return sera_opt.attenuation(p, alloc.counts, c)
    return expected_factors(*alloc.posterior, alloc.counts, c)


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("case", sorted(CASES))
def test_contract(allocator, case, offset):
    p, budget, lo, hi = CASES[case]
    alloc = allocator(p, budget, lo, hi, offset)
    assert isinstance(alloc, Allocation)
    assert alloc.counts.dtype == np.int64
    assert alloc.counts.shape == p.shape
    assert int(alloc.counts.sum()) == budget, "counts must sum exactly to the budget"
    # A policy with an active set switches prompts off (0 rollouts); the others lie in
    # the bounds.
    on = alloc.counts > 0 if alloc.active_set is not None else np.ones(p.shape, bool)
    assert np.all(alloc.counts[on] >= lo) and np.all(alloc.counts <= hi), "bounds violated"
    assert alloc.offset == offset
    np.testing.assert_allclose(alloc.factors, reference_factors(alloc), rtol=1e-12, atol=1e-15,
                               err_msg="factors must follow from the counts")
    assert alloc.min_factor == float(alloc.factors[on].min())
    if alloc.objective is not None:
        np.testing.assert_array_equal(alloc.terms, alloc.objective.terms(alloc.counts))
        if alloc.objective.sense == "max-min":
            np.testing.assert_array_equal(alloc.levels, alloc.terms)
        else:
            assert alloc.levels is None, "only max-min objectives have levels"
    assert alloc.solver
    assert alloc.wall_time >= 0
    again = allocator(p.copy(), budget, lo, hi, offset)
    np.testing.assert_array_equal(alloc.counts, again.counts, err_msg="not deterministic")


def test_solvers_report_the_relaxation_as_flagged():
    p, budget, lo, hi = CASES["spread"]
    for name in available_solvers():
        alloc = sera_opt.allocate(p, budget, min_rollouts=lo, max_rollouts=hi, solver=name)
        if SOLVERS.lookup(name).relaxation:
            assert alloc.continuous is not None and alloc.waterline is not None, name
            assert alloc.continuous.sum() == pytest.approx(budget)
        else:
            assert alloc.continuous is None and alloc.waterline is None, name


def test_float32_inputs_keep_float32_factors(allocator):
    p = CASES["spread"][0].astype(np.float32)
    alloc = allocator(p, 37 * 6, 2, 16)
    assert alloc.factors.dtype == np.float32
    assert alloc.counts.dtype == np.int64


def test_results_are_read_only(allocator):
    alloc = allocator(*CASES["spread"])
    for field in (alloc.counts, alloc.factors):
        with pytest.raises(ValueError):
            field[0] = 0.5


@pytest.mark.parametrize(
    "p, budget, lo, hi",
    [
        (np.array([0.1, np.nan, 0.3]), 9, 2, 5),
        (np.array([0.1, 1.3, 0.3]), 9, 2, 5),
        (np.array([[0.1, 0.3]]), 9, 2, 5),
        (np.array([0.1, 0.2, 0.3]), 100, 2, 5),
        (np.array([0.1, 0.2, 0.3]), 3, 2, 5),
        (np.array([0.1, 0.2, 0.3]), 9, 5, 2),
        (np.array([0.1, 0.2, 0.3]), 2**60, 2, 2**60),
        (np.array([0.1, 0.2, 0.3]), True, 1, 5),
    ],
    ids=["nan", "above-one", "2-d", "budget-high", "budget-low", "min-above-max", "huge",
         "bool-budget"],
)
def test_bad_input_is_rejected_with_the_library_error(allocator, p, budget, lo, hi):
    with pytest.raises(SeraOptError):
        allocator(p, budget, lo, hi)


# ----------------------------------------------------------------- optimality suite
def _order_key(objective, counts):
    """The objective's order over allocations: lexicographic on sorted levels (with the limit
    order for levels that are 0 or infinite at every count) or the sum."""
    terms = objective.terms(np.asarray(counts))
    if objective.sense != "max-min":
        with np.errstate(invalid="ignore"):  # VIP's p = 0 and p = 1 give -inf + inf
            total = float(terms.sum())
        return (total if objective.sense == "max-sum" else -total,)
    edges = objective.edges()
    zero, infinite = edges if edges is not None else (np.zeros(len(terms), bool),) * 2
    m = np.asarray(counts) - objective.offset
    keys = [(0.0, int(mi)) if z else (math.inf, int(mi)) if f else (float(t), 0)
            for t, mi, z, f in zip(terms, m, zero, infinite)]
    return tuple(sorted(keys))


def _better(a, b, rtol=1e-9):
    """Whether key ``a`` is strictly better than key ``b`` beyond rounding."""
    for x, y in zip(a, b):
        x0, y0 = (x[0], y[0]) if isinstance(x, tuple) else (x, y)
        if x0 == y0 or (math.isfinite(x0) and math.isfinite(y0)
                        and abs(x0 - y0) <= rtol * max(abs(x0), abs(y0), 1e-300)):
            if isinstance(x, tuple) and x[1] != y[1]:
                return x[1] > y[1]
            continue
        return x0 > y0
    return False


@st.composite
def tiny_problems(draw):
    offset = draw(st.sampled_from([0, 1]))
    m = draw(st.integers(1, 4))
    lo = np.array(draw(st.lists(st.integers(1 + offset, 3 + offset), min_size=m, max_size=m)))
    hi = lo + np.array(draw(st.lists(st.integers(0, 4), min_size=m, max_size=m)))
    budget = draw(st.integers(int(lo.sum()), int(hi.sum())))
    p = np.array(draw(st.lists(st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.1, 0.9]),
                                         st.floats(1e-3, 1 - 1e-3)), min_size=m, max_size=m)))
    return p, lo, hi, budget, offset


@pytest.mark.parametrize("entry", EXACT, ids=[e[0] for e in EXACT])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tiny_problems())
def test_every_exact_allocator_is_optimal_for_its_own_objective(entry, case):
    name, _, allocate = entry
    p, lo, hi, budget, offset = case
    alloc = allocate(p, budget, lo, hi, offset)
    assert alloc.objective is not None, f"{name} is flagged exact but states no objective"
    mine = _order_key(alloc.objective, alloc.counts)
    for counts in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
        if sum(counts) == budget:
            theirs = _order_key(alloc.objective, counts)
            assert not _better(theirs, mine), f"{name}: {counts} beats {alloc.counts.tolist()}"


def test_the_exact_flags_are_the_expected_ones():
    # A flag lost by mistake would silently drop an allocator from the optimality suite.
    names = {e[0] for e in EXACT}
    assert {"solver:waterline", "solver:greedy", "policy:sera", "policy:uniform",
            "policy:sera-fair", "policy:hora", "local:test-log-share"} <= names
    assert sera_opt.get_policy("sera", solver=lambda pr: pr.min_rollouts + 0).exact is False


# ----------------------------------------------------------------- registries and protocol
def test_every_solver_is_registered_with_capabilities():
    assert available_solvers()[0] == "waterline"
    assert {"waterline", "milp", "greedy"} <= set(SOLVERS.names())
    for name in SOLVERS.names():
        cls = SOLVERS.lookup(name)
        assert cls.is_available() == (name in available_solvers())
        unknown = [m for m in cls.requires if not importlib.util.find_spec(m)]
        assert not unknown or name not in available_solvers()


def test_a_solver_that_needs_a_missing_module_is_unavailable_and_says_so():
    class NeedsNothingThere(sera_opt.Solver):
        """maximize nothing subject to a module that is not installed"""

        name = "test-needs-missing"
        requires = ("a_module_that_is_not_installed",)

        def _solve(self, problem):
            raise AssertionError("must not run")

    assert not NeedsNothingThere.is_available()
    with pytest.raises(sera_opt.MissingDependencyError, match="pip install"):
        sera_opt.allocate([0.5], 2, solver=NeedsNothingThere())


def test_every_policy_declares_its_protocol():
    assert {"sera", "uniform", "sera-fair"} <= set(available_policies())
    for name in available_policies():
        policy = get_policy(name)
        assert isinstance(policy, AllocationPolicy)
        assert isinstance(policy.extra_inputs, frozenset)
        assert isinstance(policy.offset_sensitive, bool)
        with pytest.raises(SeraOptError, match="does not take"):
            policy.allocate([0.5, 0.5], 4, not_an_input=1)


def test_the_built_in_policies_are_listed_by_preference_not_by_import_order():
    """Each built-in policy states its place: the listing (what the CLI, the benchmarks
    and error messages show) cannot change when modules are imported in another order."""
    import subprocess
    import sys

    built_in = [name for name in available_policies()
                if get_policy(name).__module__.startswith("sera_opt.")]
    places = [type(get_policy(name)).preference for name in built_in]
    assert len(set(places)) == len(places) and places == sorted(places), dict(zip(built_in, places))
    code = ("import sera_opt.policies.peers, sera_opt.policies.fair, sera_opt.policies.bayes, "
            "sera_opt; print(','.join(sera_opt.available_policies()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().split(",") == built_in


@pytest.mark.parametrize("entry", [e for e in ALLOCATORS if e[0].startswith("policy:")],
                         ids=lambda e: e[0])
def test_configuration_round_trips(entry):
    name = entry[0].split(":", 1)[1]
    policy = get_policy(name, offset=1, max_rollouts=9)
    config = policy.config()
    rebuilt = policy_from_config(config)
    assert type(rebuilt) is type(policy)
    assert rebuilt.config()["name"] == config["name"]
    for key, value in config["options"].items():
        np.testing.assert_equal(rebuilt.config()["options"][key], value, err_msg=key)
    p, budget = np.array([0.05, 0.5, 0.9, 0.3]), 20
    np.testing.assert_array_equal(rebuilt.allocate(p, budget).counts,
                                  policy.allocate(p, budget).counts)


def test_a_users_solver_round_trips_when_passed_again():
    def first_takes_all(problem):
        counts = problem.min_rollouts.copy()
        counts[0] += problem.spare_budget
        return counts

    policy = get_policy("sera", solver=first_takes_all, max_rollouts=20)
    config = policy.config()
    assert config["options"]["solver"] == {"object": "solver", "name": "first_takes_all"}
    with pytest.raises(SeraOptError, match="pass it again"):
        policy_from_config(config)
    rebuilt = policy_from_config(config, solver=policy.solver)
    assert rebuilt.allocate([0.5, 0.5], 6).counts.tolist() == [5, 1]
    with pytest.raises(SeraOptError, match="named"):
        policy_from_config(config, solver=get_solver("greedy"))


def test_options_are_checked_when_the_policy_is_built():
    with pytest.raises(SeraOptError, match="has no option 'gamma'"):
        get_policy("sera-fair", gamma=1)
    with pytest.raises(SeraOptError, match="alpha"):
        get_policy("sera-fair", alpha=-1)
    with pytest.raises(SeraOptError, match="min_rollouts"):
        get_policy("uniform", min_rollouts=1.5)
    with pytest.warns(SeraOptWarning, match="ignores the option 'continuous'"):
        get_policy("sera", solver="greedy", continuous=False)


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


def test_a_users_result_is_rebuilt_from_its_counts():
    # A user's solver cannot hand back factors that disagree with its counts: only the
    # counts are taken, on the problem that was solved.
    other = AllocationProblem([0.9, 0.9], 6)

    def foreign(problem):
        return Allocation(other, [3, 3], solver="mine")

    alloc = sera_opt.allocate([0.2, 0.4], 6, solver=foreign)
    assert alloc.problem.success_probs.tolist() == [0.2, 0.4]
    np.testing.assert_allclose(alloc.factors, sera_opt.attenuation([0.2, 0.4], [3, 3]))
    with pytest.raises(SeraOptError, match="outside"):
        Allocation(AllocationProblem([0.5, 0.5], 6, max_rollouts=4), [5, 1])


def test_a_new_policy_plugs_in_by_registering():
    from sera_opt.policies.registry import POLICIES

    sera_opt.register_policy(LogSharePolicy)
    try:
        alloc = get_policy("test-log-share").allocate([0.1, 0.9], 12)
        assert alloc.counts.sum() == 12 and alloc.counts[1] > alloc.counts[0]
        with pytest.raises(SeraOptError, match="already registered"):
            sera_opt.register_policy(type("Other", (LogSharePolicy,), {}))
    finally:
        POLICIES._entries.pop("test-log-share")


def test_uniform_spreads_the_remainder_by_index():
    alloc = get_policy("uniform").allocate(np.full(5, 0.5), 17)
    assert alloc.counts.tolist() == [4, 4, 3, 3, 3]
    alloc = get_policy("uniform").allocate(np.full(3, 0.5), 12, min_rollouts=[1, 1, 6],
                                           max_rollouts=[3, 10, 8])
    assert alloc.counts.tolist() == [3, 3, 6]


def test_uniform_raises_the_lowest_counts_first():
    # Minimums [5, 1, 1], budget 8: the spare rollout goes to a prompt at the lowest count.
    alloc = get_policy("uniform").allocate([0.1, 0.2, 0.3], 8, min_rollouts=[5, 1, 1],
                                           max_rollouts=10)
    assert alloc.counts.tolist() == [5, 2, 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=5),
       st.data())
def test_uniform_is_the_brute_force_water_filling(bounds, data):
    lo = np.array([b[0] for b in bounds])
    hi = lo + np.array([b[1] for b in bounds])
    budget = data.draw(st.integers(int(lo.sum()), int(hi.sum())))
    counts = get_policy("uniform").allocate(np.full(len(lo), 0.5), budget, min_rollouts=lo,
                                            max_rollouts=hi).counts
    # Water-filling is the lexicographic max-min of the counts; the tie goes to the lower
    # index, so among optimal allocations it is the lexicographically largest.
    best = max((tuple(sorted(c)), c) for c in itertools.product(
        *[range(a, b + 1) for a, b in zip(lo, hi)]) if sum(c) == budget)
    best_sorted = best[0]
    assert tuple(sorted(counts.tolist())) == best_sorted
    optimal = [c for c in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)])
               if sum(c) == budget and tuple(sorted(c)) == best_sorted]
    assert tuple(counts.tolist()) == max(optimal)


def test_sera_policy_passes_its_solver_options():
    policy = get_policy("sera", solver="waterline", continuous=False, max_rollouts=8)
    alloc = policy.allocate([0.05, 0.5, 0.9], 12)
    assert alloc.continuous is None
    assert alloc.counts.max() <= 8
    assert "continuous=False" in repr(policy)


def test_allocate_and_the_sera_policy_agree_by_default():
    rng = np.random.default_rng(4)
    for offset in (0, 1):
        p = np.concatenate([[1e-4], rng.uniform(0, 1, 30)])
        budget = 31 * 6
        np.testing.assert_array_equal(sera_opt.allocate(p, budget, offset=offset).counts,
                                      get_policy("sera", offset=offset).allocate(p, budget).counts)


def test_sera_caps_by_max_ratio_when_no_max_is_given():
    p = np.array([1e-4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99])
    budget = 8 * 4
    capped = get_policy("sera").allocate(p, budget)
    assert capped.counts.max() == 16  # ceil(4.0 * 32 / 8)
    assert sera_opt.allocate(p, budget).counts.max() == 16
    uncapped = get_policy("sera", max_ratio=None).allocate(p, budget)
    assert uncapped.counts[0] == budget - 7  # the hopeless prompt takes everything spare
    assert get_policy("sera", max_ratio=2).allocate(p, budget).counts.max() == 8
    # An explicit maximum wins over the ratio.
    assert get_policy("sera", max_rollouts=5).allocate(p, budget).counts.max() == 5
    assert get_policy("sera").allocate(p, budget, max_rollouts=6).counts.max() == 6
    # Posterior-mean SERA and the alpha-fair family take the same option.
    assert get_policy("sera-bayes").allocate(p, budget).counts.max() <= 16
    assert get_policy("sera-fair", alpha=8).allocate(p, budget).counts.max() <= 16


@pytest.mark.parametrize("bad", [0.5, "4", True, math.inf, math.nan])
def test_max_ratio_is_validated(bad):
    with pytest.raises(SeraOptError, match="max_ratio"):
        get_policy("sera", max_ratio=bad)


def test_policies_without_a_ratio_refuse_it():
    with pytest.raises(SeraOptError, match="no option 'max_ratio'"):
        get_policy("uniform", max_ratio=4)


# ---------------------------------------------------------------- construction-time checks
POLICY_NAMES = available_policies()


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_misspelt_option_is_refused_when_built_with_the_fix(name):
    with pytest.raises(SeraOptError, match=r"'min_rollout' \(did you mean 'min_rollouts'\?\)"):
        get_policy(name, min_rollout=2)


def test_a_misspelt_solver_option_is_refused():
    with pytest.raises(SeraOptError, match="did you mean 'continuous'"):
        sera_opt.SERAPolicy(continous=False)
    with pytest.raises(SeraOptError, match="did you mean 'min_rollouts'"):
        sera_opt.allocate([0.2, 0.4], 6, min_rollout=2)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_bounds_that_no_batch_can_meet_are_refused_when_built(name):
    with pytest.raises(SeraOptError, match="below min_rollouts=5"):
        get_policy(name, min_rollouts=5, max_rollouts=3)
    with pytest.raises(SeraOptError, match="at least 2"):
        get_policy(name, offset=1, min_rollouts=1)
    with pytest.raises(SeraOptError, match="at least 2"):
        get_policy(name, offset=1, min_rollouts=[2, 1])
    with pytest.raises(SeraOptError, match="different lengths"):
        get_policy(name, min_rollouts=[2, 2], max_rollouts=[4, 4, 4])
    with pytest.raises(SeraOptError, match="index 1"):
        get_policy(name, min_rollouts=[2, 5], max_rollouts=[4, 4])


def test_a_minimum_above_the_default_cap_is_refused_when_built():
    with pytest.raises(SeraOptError, match="default max_rollouts"):
        get_policy("knapsack", min_rollouts=200)


def test_solver_option_values_are_checked_when_built():
    with pytest.raises(SeraOptError, match="continuous is True or False"):
        get_policy("sera", continuous="no")
    with pytest.raises(SeraOptError, match="milp_solver"):
        get_policy("sera", solver="milp", milp_solver=3)


@pytest.mark.parametrize("options", [[("offset", 1)], "offset=1", 3, {1: 2}])
def test_malformed_config_options_give_the_library_error(options):
    with pytest.raises(SeraOptError, match="'options' is a mapping"):
        policy_from_config({"name": "sera", "options": options})


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_wrongly_typed_config_values_give_the_library_error(name):
    for options in ({"offset": "1"}, {"min_rollouts": "2"}, {"max_rollouts": [[4]]},
                    {"min_rollouts": None, "max_rollouts": 2.5}):
        with pytest.raises(SeraOptError):
            policy_from_config({"name": name, "options": options})
    with pytest.raises(SeraOptError, match="registered policy name"):
        policy_from_config({"name": ["sera"], "options": {}})

