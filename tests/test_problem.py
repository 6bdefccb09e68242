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
            (dict(success_probs=[0.1, 0.2], budget=4, max_rollouts=2.5), "whole numbers"),
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
        prob = AllocationProblem([0.0, 0.5, 1.0], 9, min_rollouts=2, offset=1)
        levels = prob.levels([3, 3, 3])
        assert levels[0] == 0.0 and levels[2] == np.inf
        assert levels[1] == pytest.approx(2 * np.log(2))
        np.testing.assert_allclose(prob.factors([3, 3, 3]), [0.0, 0.75, 1.0])

    def test_allocate_validates_too(self):
        with pytest.raises(InfeasibleBudgetError):
            sera_opt.allocate([0.5, 0.5], 100, max_rollouts=8)
        with pytest.raises(SeraOptError, match="unknown solver"):
            sera_opt.allocate([0.5, 0.5], 4, solver="simplex")
