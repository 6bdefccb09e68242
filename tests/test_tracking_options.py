"""SuccessTracker and RolloutPlanner options and inputs that are not what they look like.

Booleans and strings are not numbers; a prior whose strength overflows is refused; boolean
rewards count as 1.0 and 0.0 would, or are refused; a prompt repeated within one plan()
is planned row by row, with a warning.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sera_opt import RolloutPlanner, SeraOptError, SeraOptWarning, SuccessTracker
from sera_opt.tracking import MAX_PRIOR_STRENGTH


@pytest.mark.parametrize("options, words", [
    ({"decay": True}, "decay must be a number"),
    ({"decay": np.bool_(True)}, "decay must be a number"),
    ({"decay": "0.9"}, "decay must be a number"),
    ({"prior": ("1", "2")}, "must be numbers"),
    ({"prior": (True, 1.0)}, "must be numbers"),
    ({"prior": (1.0, 2.0, 3.0)}, "pair"),
    ({"prior": "uniform"}, "'fit' or (alpha, beta)"),
    ({"fallback_prior": (1.0, False)}, "must be numbers"),
    ({"fallback_prior": "ab"}, "pair"),
    ({"min_prior_strength": True}, "min_prior_strength must be a number"),
    ({"max_prior_strength": True}, "max_prior_strength must be a number"),
    ({"success_threshold": True}, "success_threshold must be a real number"),
    ({"success_threshold": "0.5"}, "success_threshold must be a real number"),
    ({"num_prompts": np.bool_(True)}, "num_prompts must be a positive integer"),
])
def test_booleans_and_strings_are_not_numbers(options, words):
    with pytest.raises(SeraOptError, match="got") as info:
        SuccessTracker(**options)
    assert words in str(info.value)
    with pytest.raises(SeraOptError):
        RolloutPlanner(tracker=SuccessTracker(**options))


def test_numpy_scalars_still_count_as_numbers():
    tracker = SuccessTracker(prior=np.array([1.0, 3.0]), decay=np.float32(0.5),
                             min_prior_strength=np.int64(1))
    assert tracker.prior == (1.0, 3.0) and tracker.decay == 0.5
    assert tracker.estimate([0]).tolist() == [0.25]


@pytest.mark.parametrize("name", ["prior", "fallback_prior"])
def test_a_prior_whose_strength_overflows_is_refused(name):
    with pytest.raises(SeraOptError, match="MAX_PRIOR_STRENGTH") as info:
        SuccessTracker(**{name: (1e308, 1e308)})
    assert "Scale both down" in str(info.value)
    with pytest.raises(SeraOptError, match="MAX_PRIOR_STRENGTH"):
        SuccessTracker(max_prior_strength=1e308)


def test_a_prior_at_the_limit_gives_its_mean():
    half = MAX_PRIOR_STRENGTH / 2
    tracker = SuccessTracker(prior=(half, half))
    tracker.update([0, 0], [1, 1])
    assert tracker.estimate([0, 1]).tolist() == [0.5, 0.5]
    tracker = SuccessTracker(prior=(MAX_PRIOR_STRENGTH / 4, 3 * MAX_PRIOR_STRENGTH / 4))
    np.testing.assert_allclose(tracker.estimate([0]), [0.25], rtol=1e-15)


@pytest.mark.parametrize("threshold", [0.5, 1.0, 1e-9, 2.0, 0.0, -1.0, 1.0 + 1e-12])
def test_boolean_rewards_count_as_one_and_zero_would(threshold):
    as_bools = SuccessTracker(success_threshold=threshold)
    as_numbers = SuccessTracker(success_threshold=threshold)
    as_bools.update([1, 1, 2], np.array([True, False, True]))
    as_numbers.update([1, 1, 2], [1.0, 0.0, 1.0])
    for got, want in zip(as_bools.evidence([1, 2]), as_numbers.evidence([1, 2])):
        assert got.tolist() == want.tolist(), (threshold, got, want)
    if threshold > 1:  # the case: True must not succeed where 1.0 fails
        assert as_bools.evidence([2])[0].tolist() == [0.0]


@pytest.mark.parametrize("ids, repeated", [
    (["a", "b", "a"], "'a'"),
    (np.array([5, 7, 5, 7, 9]), "5, 7"),
    (np.array([2**40 + 3, -1, 2**40 + 3]), str(2**40 + 3)),
])
def test_a_prompt_repeated_within_one_plan_warns_and_its_rows_are_planned_apart(ids, repeated):
    planner = RolloutPlanner(max_rollouts=16)
    planner.observe(np.asarray(ids)[:1], [1])
    with pytest.warns(SeraOptWarning, match="repeats") as record:
        alloc = planner.plan(ids, budget=4 * len(ids))
    message = str(record[0].message)
    assert repeated in message and "sum of its rows' counts" in message
    assert record[0].filename == __file__  # points at the caller
    assert len(alloc.counts) == len(ids) and alloc.counts.sum() == 4 * len(ids)
    first = np.flatnonzero(np.asarray(ids) == np.asarray(ids)[0])
    # Rows of one prompt share its estimate, so the policy gives them equal counts.
    assert len(set(alloc.counts[first].tolist())) == 1


def test_distinct_prompts_plan_without_a_warning():
    planner = RolloutPlanner(max_rollouts=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        planner.plan(["a", "b", "c"], budget=12)
        planner.plan(np.arange(1000) * 7_919_000_003, budget=8000)
