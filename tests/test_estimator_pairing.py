"""maxrl_advantages(..., allocation=) refuses counts planned for the other estimator."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sera_opt  # noqa: E402
from sera_opt import SeraOptError  # noqa: E402


def batch(alloc):
    counts = torch.tensor(alloc.counts)
    index = torch.repeat_interleave(torch.arange(len(counts)), counts)
    rewards = (torch.arange(index.numel()) % 3 == 0).to(torch.float64)
    return rewards, index


@pytest.mark.parametrize("estimator", ["mean_centred", "success_average"])
def test_the_matching_allocation_gives_the_same_advantages(estimator):
    c = sera_opt.ESTIMATOR_OFFSETS[estimator]
    alloc = sera_opt.allocate(np.array([0.9, 0.5, 0.1]), 24, min_rollouts=2, max_rollouts=16,
                              offset=c)
    rewards, index = batch(alloc)
    got = sera_opt.maxrl_advantages(rewards, index, estimator=estimator, allocation=alloc)
    want = sera_opt.maxrl_advantages(rewards, index, estimator=estimator)
    assert torch.equal(got, want)


def test_an_allocation_for_the_other_offset_is_refused():
    alloc = sera_opt.allocate(np.array([0.9, 0.5, 0.1]), 24, min_rollouts=2, max_rollouts=16,
                              offset=1)
    rewards, index = batch(alloc)
    with pytest.raises(SeraOptError, match="offset=1 but the 'success_average' estimator has "
                                           "offset 0.*Plan with offset=0"):
        sera_opt.maxrl_advantages(rewards, index, estimator="success_average", allocation=alloc)


def test_something_that_is_not_an_allocation_is_refused():
    with pytest.raises(SeraOptError, match="allocation must be the Allocation"):
        sera_opt.maxrl_advantages(torch.ones(2), torch.zeros(2, dtype=torch.int64),
                                  allocation=[2])
