"""The attenuation factor and input validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt import AllocationProblem, InfeasibleBudgetError, SeraOptError, attenuation


class TestAttenuation:
    def test_definition(self):
        p = np.array([0.1, 0.5, 0.9])
        n = np.array([3, 2, 5])
        np.testing.assert_allclose(attenuation(p, n), 1 - (1 - p) ** n, rtol=1e-14)
        np.testing.assert_allclose(attenuation(p, n, offset=1), 1 - (1 - p) ** (n - 1), rtol=1e-14)

    def test_zero_where_no_effective_rollouts(self):
        assert attenuation(0.7, 1, offset=1) == 0.0
        assert attenuation(0.7, 0) == 0.0
        assert attenuation(1.0, 1, offset=1) == 0.0  # 0 * log(0) would be NaN

    def test_edges(self):
        assert attenuation(1.0, 3) == 1.0
        assert attenuation(0.0, 100) == 0.0

    def test_stable_for_tiny_probabilities(self):
        # 1 - (1 - p) ** n cancels catastrophically; the factor must stay ~ n p.
        w = attenuation(1e-18, 4)
        assert w == pytest.approx(4e-18, rel=1e-12)

    def test_stable_near_one(self):
        w = attenuation(1 - 1e-12, 2)
        assert w == pytest.approx(1 - 1e-24, abs=1e-15)

    def test_broadcasting_and_dtype(self):
        p32 = np.array([0.2, 0.4], dtype=np.float32)
        w = attenuation(p32, np.array([[1], [2]]))
        assert w.shape == (2, 2) and w.dtype == np.float32
        assert attenuation(np.array([0.2]), 2).dtype == np.float64
        assert isinstance(attenuation(0.5, 2), float)

    def test_real_counts(self):
        assert attenuation(0.5, 2.5) == pytest.approx(1 - 0.5**2.5)

    @settings(max_examples=200, deadline=None)
    @given(st.floats(0, 1), st.integers(0, 200), st.sampled_from([0, 1]))
    def test_matches_power_form_and_is_monotone(self, p, n, c):
        w = attenuation(p, n, offset=c)
        assert 0.0 <= w <= 1.0
        if n - c > 0:
            assert w == pytest.approx(1 - (1 - p) ** (n - c), abs=1e-12)
        assert attenuation(p, n + 1, offset=c) >= w

    @pytest.mark.parametrize("bad", [[-0.1], [1.5], [np.nan]])
    def test_rejects_bad_probabilities(self, bad):
        with pytest.raises(SeraOptError, match="clip"):
            attenuation(bad, 2)

    def test_rejects_bad_offset(self):
        with pytest.raises(SeraOptError, match="offset"):
            attenuation(0.5, 2, offset=2)


class TestProblemValidation:
    def test_normalizes(self):
        prob = AllocationProblem([0.1, 0.2], 10, min_rollouts=2, max_rollouts=[6, 8], offset=1)
        assert prob.min_rollouts.dtype == np.int64
        assert prob.min_rollouts.tolist() == [2, 2]
        assert prob.max_rollouts.tolist() == [6, 8]
        assert prob.spare_budget == 6
        assert prob.num_prompts == 2
        with pytest.raises(ValueError):
            prob.success_probs[0] = 0.5  # read-only

    def test_no_cap_means_the_rest_of_the_budget(self):
        prob = AllocationProblem([0.1, 0.2, 0.3], 10, min_rollouts=[1, 2, 3])
        assert prob.max_rollouts.tolist() == [5, 6, 7]

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            (dict(success_probs=[[0.1, 0.2]], budget=4), "1-D"),
            (dict(success_probs=[], budget=4), "empty"),
            (dict(success_probs=[0.1, np.nan], budget=4), "non-finite"),
            (dict(success_probs=[0.1, np.inf], budget=4), "non-finite"),
            (dict(success_probs=[0.1, 1.2], budget=4), r"\[0, 1\]"),
            (dict(success_probs=[-0.1, 0.2], budget=4), r"\[0, 1\]"),
            (dict(success_probs=["a", "b"], budget=4), "numeric"),
            (dict(success_probs=[0.1, 0.2], budget=4.5), "whole number"),
            (dict(success_probs=[0.1, 0.2], budget="4"), "whole number"),
            (dict(success_probs=[0.1, 0.2], budget=4, min_rollouts=0), "at least 1"),
            (dict(success_probs=[0.1, 0.2], budget=4, min_rollouts=1, offset=1), "at least 2"),
            (dict(success_probs=[0.1, 0.2], budget=4, min_rollouts=3, max_rollouts=2), ">= min"),
            (dict(success_probs=[0.1, 0.2], budget=4, min_rollouts=[1, 2, 3]), "shape"),
            (dict(success_probs=[0.1, 0.2], budget=4, max_rollouts=2.5), "whole number"),
            (dict(success_probs=[0.1, 0.2], budget=4, offset=3), "offset"),
            (dict(success_probs=[0.1, 0.2], budget=4, offset=True), "offset"),
        ],
    )
    def test_rejects(self, kwargs, match):
        with pytest.raises(SeraOptError, match=match):
            AllocationProblem(**kwargs)

    @pytest.mark.parametrize("budget", [3, 21])
    def test_infeasible_budget_names_the_range(self, budget):
        with pytest.raises(InfeasibleBudgetError, match=r"\[4, 20\]"):
            AllocationProblem([0.1, 0.2], budget, min_rollouts=2, max_rollouts=10)

    def test_float_budget_that_is_whole_is_accepted(self):
        assert AllocationProblem([0.5], 4.0).budget == 4

    def test_check_counts(self):
        prob = AllocationProblem([0.1, 0.2], 6, max_rollouts=4)
        assert prob.check_counts([2, 4]).tolist() == [2, 4]
        with pytest.raises(SeraOptError, match="sum"):
            prob.check_counts([2, 3])
        with pytest.raises(SeraOptError, match="outside"):
            prob.check_counts([1, 5])

    def test_levels_and_factors(self):
        from sera_opt.separable import PointLevels

        prob = AllocationProblem([0.0, 0.5, 1.0], 9, min_rollouts=2, offset=1)
        levels = PointLevels.from_problem(prob).terms([3, 3, 3])
        assert levels[0] == 0.0 and levels[2] == np.inf
        assert levels[1] == pytest.approx(2 * np.log(2))
        np.testing.assert_allclose(prob.factors([3, 3, 3]), [0.0, 0.75, 1.0])

    def test_allocate_validates_too(self):
        with pytest.raises(InfeasibleBudgetError):
            sera_opt.allocate([0.5, 0.5], 100, max_rollouts=8)
        with pytest.raises(SeraOptError, match="unknown solver"):
            sera_opt.allocate([0.5, 0.5], 4, solver="simplex")


class TestSupportedRange:
    """Budgets and bounds are whole numbers up to 2**53, checked in Python integers."""

    @pytest.mark.parametrize("budget", [2**53 + 1, 2**62, 2**63 + 5, 10**30, 1e20])
    def test_budgets_beyond_the_range_are_refused_with_the_reason(self, budget):
        with pytest.raises(SeraOptError, match=r"2\*\*53"):
            AllocationProblem([0.5, 0.5, 0.5], budget)
        with pytest.raises(SeraOptError, match=r"2\*\*53"):
            sera_opt.allocate([0.5, 0.5, 0.5], budget)

    def test_the_largest_budget_is_exact(self):
        prob = AllocationProblem([0.5, 0.5], 2**53, max_rollouts=2**53)
        assert prob.budget == 2**53 and isinstance(prob.budget, int)
        alloc = sera_opt.allocate([0.5, 0.5], 2**53 - 1, max_rollouts=2**53)
        assert sum(int(n) for n in alloc.counts) == 2**53 - 1

    @pytest.mark.parametrize("budget", [True, False, np.bool_(True)])
    def test_booleans_are_not_budgets(self, budget):
        with pytest.raises(SeraOptError, match="whole number"):
            AllocationProblem([0.5], budget)

    def test_bounds_in_the_message_are_python_integers(self):
        # 3 prompts with a cap near 2**53 each: the sum is beyond int64's reach in a
        # naive product but is reported exactly.
        with pytest.raises(InfeasibleBudgetError, match=str(3 * 2**53)):
            AllocationProblem([0.5] * 3, 2, min_rollouts=1, max_rollouts=2**53)
        big = np.full(2048, 2**53, dtype=np.int64)  # sum 2**64: int64 would wrap around
        with pytest.raises(InfeasibleBudgetError, match=str(2048 * 2**53)):
            AllocationProblem(np.full(2048, 0.5), 1, max_rollouts=big)

    def test_no_cap_states_the_range_it_has(self):
        with pytest.raises(InfeasibleBudgetError) as info:
            AllocationProblem([0.1, 0.2, 0.3], 2)
        assert "at least sum(min_rollouts) = 3" in str(info.value)
        assert "[3, 3]" not in str(info.value)

    @pytest.mark.parametrize("bound", [2**53 + 1, 10**30, -1])
    def test_bounds_beyond_the_range_are_refused(self, bound):
        with pytest.raises(SeraOptError):
            AllocationProblem([0.5, 0.5], 4, min_rollouts=1, max_rollouts=bound)
        with pytest.raises(SeraOptError):
            AllocationProblem([0.5, 0.5], 4, min_rollouts=1, max_rollouts=[2, bound])

    @pytest.mark.parametrize("name", ["sera-bayes", "hora", "sera-fair"])
    def test_huge_budgets_in_the_expectation_policies_stay_in_range(self, name):
        # Large counts used to lose the Beta moments to cancellation between two
        # log-gammas of order n log n (factors like -839, or a MemoryError).
        p = np.array([0.3, 0.01, 0.9])
        budget = 10**15
        options = {} if name == "hora" else {"max_ratio": None}  # hora has no cap by default
        alloc = sera_opt.get_policy(name, **options).allocate(p, budget)
        assert sum(int(n) for n in alloc.counts) == budget
        assert np.all((alloc.factors >= 0) & (alloc.factors <= 1)), alloc.factors


class TestInputsTakenForWhatTheyAre:
    """Inputs that numpy would convert silently are refused with the fix."""

    @pytest.mark.parametrize("policy_name", sera_opt.available_policies())
    def test_masked_arrays_are_refused(self, policy_name):
        p = np.ma.masked_array([0.2, 0.5, 0.7], mask=[False, True, False])
        policy = sera_opt.get_policy(policy_name)
        with pytest.raises(SeraOptError, match=r"masked array.*compressed\(\).*filled"):
            policy.allocate(p, 12)
        fully = np.ma.masked_all(3)
        with pytest.raises(SeraOptError, match="masked array"):
            sera_opt.allocate(fully, 12)

    @pytest.mark.parametrize("p", [[True, False, True], np.array([True, False]),
                                   np.array([1, 0], dtype=bool)])
    def test_booleans_are_not_probabilities(self, p):
        with pytest.raises(SeraOptError, match="booleans, not probabilities"):
            sera_opt.allocate(p, 12)
        with pytest.raises(SeraOptError, match="booleans, not probabilities"):
            AllocationProblem(p, 12)

    def test_torch_bool_tensors_are_refused(self):
        torch = pytest.importorskip("torch")
        with pytest.raises(SeraOptError, match="booleans"):
            sera_opt.allocate(torch.tensor([True, False]), 8)

    @pytest.mark.parametrize("p", [[0.5, [0.2, 0.3]], [[0.1, 0.2], [0.3]]])
    def test_ragged_lists_say_what_to_pass(self, p):
        with pytest.raises(SeraOptError, match="one per prompt.*flat list"):
            sera_opt.allocate(p, 12)

    @pytest.mark.parametrize("p", [np.array([0.5, None]), np.array([0.5, 0.2], dtype=object),
                                   ["0.5", "0.2"], np.array([b"0.5"])])
    def test_objects_and_strings_are_refused(self, p):
        with pytest.raises(SeraOptError, match="numeric probabilities"):
            sera_opt.allocate(p, 12)

    @pytest.mark.parametrize("policy_name", ["sera", "sera-fair", "sera-bayes"])
    def test_the_default_cap_is_clamped_near_max_budget(self, policy_name):
        # ceil(4 B / M) exceeds 2**53 here; the cap is clamped to the budget instead of
        # being refused as a max_rollouts the caller never passed.
        policy = sera_opt.get_policy(policy_name)
        assert policy.allocate([0.5], sera_opt.MAX_BUDGET).counts.tolist() == [sera_opt.MAX_BUDGET]
        counts = policy.allocate([0.5, 0.2], sera_opt.MAX_BUDGET).counts
        assert int(counts.sum()) == sera_opt.MAX_BUDGET
        with pytest.raises(SeraOptError, match="budget="):
            policy.allocate([0.5], sera_opt.MAX_BUDGET + 1)

    def test_masked_bounds_posteriors_and_norms_are_refused(self):
        p = np.array([0.2, 0.5, 0.7])
        masked = np.ma.masked_array([2, 2, 2], mask=[True, False, False])
        with pytest.raises(SeraOptError, match="min_rollouts is a numpy masked array"):
            sera_opt.allocate(p, 12, min_rollouts=masked)
        with pytest.raises(SeraOptError, match="max_rollouts is a numpy masked array"):
            sera_opt.allocate(p, 12, max_rollouts=masked * 3)
        with pytest.raises(SeraOptError, match="masked array"):
            sera_opt.get_policy("uniform", min_rollouts=masked)
        alpha = np.ma.masked_array([1.0, 2.0, 3.0], mask=[True, False, False])
        with pytest.raises(SeraOptError, match="masked array"):
            sera_opt.get_policy("sera-bayes").allocate(None, 12, posterior=(alpha, np.ones(3)))
        with pytest.raises(SeraOptError, match="masked array"):
            sera_opt.get_policy("gvm").allocate(p, 12, gradient_norms=alpha)
        with pytest.raises(SeraOptError, match="masked array"):
            attenuation(np.ma.masked_array([0.2, 0.5], mask=[True, False]), [2, 3])

    def test_booleans_are_no_posteriors_norms_or_probabilities_anywhere(self):
        p = np.array([0.2, 0.5, 0.7])
        with pytest.raises(SeraOptError, match="booleans"):
            sera_opt.get_policy("hora").allocate(
                None, 12, posterior=(np.array([True, True, True]), np.ones(3)))
        with pytest.raises(SeraOptError, match="True is not read as 1"):
            sera_opt.get_policy("gvm").allocate(p, 12, gradient_norms=[True, False, True])
        with pytest.raises(SeraOptError, match="numeric"):
            attenuation([True, False], [2, 3])
        with pytest.raises(SeraOptError, match="numeric"):
            attenuation([0.2, 0.5], [True, False])
