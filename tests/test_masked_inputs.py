"""Masked arrays are refused wherever sera_opt reads rewards or prompt ids: converting one
drops the mask and reads whatever the masked entries hold."""

import numpy as np
import pytest

from sera_opt import SuccessTracker
from sera_opt.exceptions import SeraOptError


def test_the_tracker_refuses_masked_rewards_and_changes_nothing():
    tracker = SuccessTracker()
    rewards = np.ma.masked_array([1.0, 0.0, 1.0], mask=[False, True, False])
    with pytest.raises(SeraOptError, match=r"rewards is a numpy masked array.*compressed\(\)"):
        tracker.update([0, 0, 1], rewards)
    assert tracker.evidence([0, 1])[0].tolist() == [0.0, 0.0]


def test_the_tracker_refuses_masked_prompt_ids():
    tracker = SuccessTracker()
    ids = np.ma.masked_array([0, 1, 2], mask=[False, True, False])
    with pytest.raises(SeraOptError, match=r"prompt_ids is a numpy masked array"):
        tracker.update(ids, [1, 0, 1])
