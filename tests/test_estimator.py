"""Tests of the multiplicity-corrected MaxRL estimator (sera_opt.estimator).

The expectations of docs/theory.md sections 2 and 4 are checked twice: exactly, by
enumerating every outcome of a softmax policy (small groups), and by Monte
Carlo with a tolerance derived from the number of draws. The vectorised code
is compared with a loop over prompts in exact rational arithmetic.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import sera_opt
from sera_opt import estimator as est
from sera_opt.estimator import groups as groups_module
from sera_opt.estimator import hashing
from sera_opt.exceptions import SeraOptError, SeraOptWarning
from tests.markers import gpu

COMBINATIONS = [(e, c) for e in est.ESTIMATORS for c in (True, False)]


def on_gpu(func):
    """Mark a test `gpu` and skip it without a CUDA device (tests.markers.gpu)."""
    for mark in gpu:
        func = mark(func)
    return func


# ----------------------------------------------------------------------------
# The obviously-correct reference: a loop over prompts in exact arithmetic.
# ----------------------------------------------------------------------------

def reference_advantages(rewards, prompt_index, estimator, multiplicity_correction):
    """The formulas of docs/theory.md sections 2 and 4, one prompt at a time, as Fractions."""
    rewards = [int(r) for r in rewards]
    prompt_index = [int(i) for i in prompt_index]
    groups: dict[int, list[int]] = {}
    for j, i in enumerate(prompt_index):
        groups.setdefault(i, []).append(j)
    num_rollouts, num_prompts = len(rewards), len(groups)
    out = [Fraction(0)] * num_rollouts
    for members in groups.values():
        n = len(members)
        k = sum(rewards[j] for j in members)
        if k == 0:
            continue
        rbar = Fraction(k, n)
        scale = Fraction(num_rollouts, num_prompts) / n if multiplicity_correction else 1
        for j in members:
            if estimator == "mean_centred":
                a = (rewards[j] - rbar) / rbar
            else:
                a = rewards[j] / rbar
            out[j] = a * scale
    return out


def assert_matches_reference(actual, rewards, prompt_index, estimator, correction, rtol):
    expected = reference_advantages(rewards, prompt_index, estimator, correction)
    got = actual.double().cpu().tolist()
    assert len(got) == len(expected)
    for j, (g, e) in enumerate(zip(got, expected, strict=True)):
        e = float(e)
        assert math.isfinite(g), f"advantage {j} is {g}"
        assert abs(g - e) <= rtol * max(1.0, abs(e)), (
            f"advantage {j}: got {g}, expected {e} ({estimator}, correction={correction})")


# ----------------------------------------------------------------------------
# Vectorised path against the reference
# ----------------------------------------------------------------------------

@st.composite
def batches(draw):
    ids_pool = draw(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=8, unique=True))
    n = draw(st.integers(0, 40))
    picks = draw(st.lists(st.integers(0, len(ids_pool) - 1), min_size=n, max_size=n))
    rewards = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    return [ids_pool[p] for p in picks], rewards


@settings(max_examples=150, deadline=None)
@given(batch=batches(), combination=st.sampled_from(COMBINATIONS))
def test_matches_loop_reference_arbitrary_ids(batch, combination):
    ids, rewards = batch
    estimator, correction = combination
    adv = sera_opt.maxrl_advantages(
        torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids, dtype=torch.int64),
        estimator=estimator, multiplicity_correction=correction)
    assert adv.dtype == torch.float64 and adv.shape == (len(ids),)
    assert_matches_reference(adv, rewards, ids, estimator, correction, rtol=1e-13)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), combination=st.sampled_from(COMBINATIONS))
def test_all_slot_paths_agree_bitwise(data, combination):
    """Dense ids with num_prompts, a dense range, and wide ids (unique) give the same bits."""
    estimator, correction = combination
    m = data.draw(st.integers(1, 12))
    n = data.draw(st.integers(1, 50))
    dense = torch.tensor(data.draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n)))
    rewards = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    kwargs = dict(estimator=estimator, multiplicity_correction=correction, dtype=torch.float32)
    a = sera_opt.maxrl_advantages(rewards, dense, num_prompts=m, **kwargs)
    b = sera_opt.maxrl_advantages(rewards, dense + 1000, **kwargs)  # dense range, offset
    c = sera_opt.maxrl_advantages(rewards, dense * 10**12 - 7, **kwargs)  # unique path
    d = sera_opt.maxrl_advantages(rewards, dense, num_prompts=m + 5, validate=False, **kwargs)
    for other in (b, c, d):
        assert torch.equal(a, other), (a, other)


@pytest.mark.parametrize("hash_from", [0, 1 << 62])
def test_wide_ids_get_compact_slots_and_sorted_statistics(hash_from):
    ids = torch.tensor([0, 10**15, 0, 10**15, 5])
    with _Setting(groups_module, _HASH_MIN_ROLLOUTS=hash_from):
        groups = groups_module.group(torch.tensor([1, 0, 0, 1, 1]), ids)
        stats = sera_opt.group_statistics(torch.tensor([1, 0, 0, 1, 1]), ids)
    assert isinstance(groups.slot_ids, hashing.HashedSlots) == (hash_from == 0)
    assert groups.num_slots == 3
    assert stats.prompt_ids.tolist() == [0, 5, 10**15]
    assert stats.counts.tolist() == [2, 1, 2] and stats.successes.tolist() == [1, 1, 1]
    assert torch.equal(stats.prompt_ids[stats.slot_index], ids)


# ----------------------------------------------------------------------------
# Sparse ids: hashed slots against the sort-based reference
# ----------------------------------------------------------------------------

class _Setting:
    """Set a module attribute for the duration of a block (usable inside hypothesis tests)."""

    def __init__(self, module, **values):
        self.module, self.values, self.saved = module, values, {}

    def __enter__(self):
        for name, value in self.values.items():
            self.saved[name] = getattr(self.module, name)
            setattr(self.module, name, value)

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            setattr(self.module, name, value)


def _wrap64(value: int) -> int:
    value %= 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value


def colliding_ids(count: int, seed: int, round_index: int = 0) -> list[int]:
    """Distinct ids whose hash in round ``round_index`` shares its top 34 bits.

    Every table of at most 2**30 buckets puts them all in one bucket, so that
    round resolves exactly one of them and the others must go further.
    """
    rng = np.random.default_rng(seed)
    top = int(rng.integers(0, 1 << 30)) << 34
    lows = rng.choice(1 << 34, size=count, replace=False)
    inverse = hashing._INVERSES[round_index]
    return [_wrap64((top | int(low)) * inverse) for low in lows]


def _sparse_pools():
    """Id pools that take the sparse path: hashes, extremes, colliding ids, progressions."""
    full = st.integers(-(2**63), 2**63 - 1)
    return st.one_of(
        st.lists(full, min_size=1, max_size=40, unique=True),
        st.lists(st.sampled_from([-(2**63), 2**63 - 1, -1, 0, 1, 2**62, -(2**62)]) | full,
                 min_size=2, max_size=12, unique=True),
        st.builds(colliding_ids, st.integers(2, 60), st.integers(0, 2**32),
                  st.integers(0, hashing._MAX_ROUNDS - 1)),
        st.builds(lambda m, step, start: [start + step * k for k in range(m)],
                  st.integers(2, 60), st.integers(2**20, 2**40), st.integers(-(2**60), 2**60)),
    )


def _advantages_and_stats(rewards, ids):
    stats = sera_opt.group_statistics(rewards, ids)
    advantages = [sera_opt.maxrl_advantages(rewards, ids, estimator=e, multiplicity_correction=c,
                                            dtype=torch.float64) for e, c in COMBINATIONS]
    return advantages, stats


def _diagnostics(rewards, ids):
    probs = ((ids % 7).abs().double() + 1) / 9  # some per-prompt estimate, as a function of the id
    return [sera_opt.advantage_diagnostics(rewards, ids, success_probs=probs),
            sera_opt.advantage_diagnostics(rewards, ids, estimator="success_average",
                                           multiplicity_correction=False)]


@settings(max_examples=200, deadline=None)
@given(pool=_sparse_pools(), data=st.data(), fused=st.booleans())
def test_hashed_slots_match_the_sort_reference_bitwise(pool, data, fused):
    """Hashing (torch ops, or the numba kernels) gives the sort path's results, bit for bit."""
    n = data.draw(st.integers(1, 120))
    picks = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n))
    outcomes = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    ids = torch.tensor([pool[p] for p in picks], dtype=torch.int64)
    rewards = torch.tensor(outcomes, dtype=torch.float64)
    with _Setting(groups_module, _SPARSE_SLOTS="sort"):
        reference, ref_stats = _advantages_and_stats(rewards, ids)
        ref_diagnostics = _diagnostics(rewards, ids)
    with _Setting(hashing, _CPU_BACKEND="numba" if fused else "torch"), \
            _Setting(groups_module, _HASH_MIN_ROLLOUTS=0):
        got, stats = _advantages_and_stats(rewards, ids)
        diagnostics = _diagnostics(rewards, ids)
    for d, ref in zip(diagnostics, ref_diagnostics, strict=True):
        for key, value in ref.items():  # sums over slots in another order: last bits may differ
            assert d[key] == pytest.approx(value, rel=1e-12, abs=1e-15, nan_ok=True), key
    span = int(ids.max()) - int(ids.min()) + 1
    sparse = span > groups_module._DENSE_RANGE_FACTOR * n + groups_module._DENSE_RANGE_SLACK
    for a, b in zip(got, reference, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(a.view(torch.int64), b.view(torch.int64))  # same bits, signs of 0 too
    for field in ("prompt_ids", "counts", "successes", "slot_index", "num_prompts",
                  "num_rollouts"):
        assert torch.equal(getattr(stats, field), getattr(ref_stats, field)), field
    if sparse:
        with _Setting(groups_module, _HASH_MIN_ROLLOUTS=0):
            groups = groups_module.group(rewards, ids)
        assert isinstance(groups.slot_ids, hashing.HashedSlots)
        assert groups.num_slots == torch.unique(ids).numel()  # compact: one slot per prompt


@pytest.mark.parametrize("kind", ["random", "colliding", "progression", "extremes"])
def test_hashing_backends_write_the_same_codes(kind):
    """The numba kernels compute the torch ops' rounds: on one thread, identical codes."""
    g = torch.Generator().manual_seed(3)
    if kind == "random":
        pool = torch.randint(-(2**63), 2**63 - 1, (5000,), generator=g)
    elif kind == "colliding":
        pool = torch.tensor(colliding_ids(700, seed=4) + colliding_ids(300, seed=5, round_index=1))
    elif kind == "progression":
        pool = torch.arange(3000) * 1_000_003 - 2**40
    else:
        pool = torch.tensor([-(2**63), 2**63 - 1, -1, 0, 1, 2**32, -(2**32)])
    ids = pool[torch.randint(0, pool.numel(), (20_000,), generator=g)]
    success = torch.rand(ids.numel(), generator=g) < 0.4
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch's scatter then lets the last writer win, like the kernel
    try:
        codes = {}
        for backend in ("numba", "torch"):
            codes[backend] = torch.empty(ids.numel(), dtype=torch.int32)
            slots = hashing.hashed_codes(ids, success, codes[backend], backend=backend)
            names = slots.slot_ids()
            assert slots.num_slots == torch.unique(ids).numel() == names.numel()
            assert torch.equal(names[codes[backend].long() >> 1], ids)
            assert torch.equal((codes[backend] & 1).bool(), success)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(codes["numba"], codes["torch"])


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_a_full_table_names_its_slots(backend):
    """Every bucket of a table occupied, the last one's entry -1 (its id hashes to all
    ones, its rank is T - 1): the slots are still named right, in one round."""
    bits, mask = hashing._MIN_BITS, (1 << 64) - 1
    inverse = hashing._INVERSES[0] & mask
    top = [(b << (64 - bits)) | 12345 for b in range(2**bits - 1)] + [mask]
    pool = [hashing._signed(y * inverse & mask) for y in top]
    ids = torch.tensor(pool * 3)
    success = torch.arange(ids.numel()) % 2 == 0
    codes = torch.empty(ids.numel(), dtype=torch.int64)
    slots = hashing.hashed_codes(ids, success, codes, backend=backend)
    assert len(slots.rounds) == 1 and slots.rounds[0].bits == bits
    table = slots.rounds[0].table
    assert slots.num_slots == table.numel() and int(table[-1]) == -1
    names = slots.slot_ids()
    assert torch.equal(torch.sort(names).values, torch.sort(torch.tensor(pool)).values)
    assert torch.equal(names[codes >> 1], ids) and torch.equal((codes & 1).bool(), success)


@pytest.mark.parametrize("length", [2, 64, 65, 1000])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_the_kernel_histogram_is_bincount(length, dtype):
    """The numba histogram of the hashed codes gives torch.bincount's table (a power of
    two long inside, cut to length), with empty and full bins."""
    g = torch.Generator().manual_seed(length)
    codes = torch.randint(0, length // 2 + 1, (5000,), generator=g, dtype=dtype)
    codes[:3] = torch.tensor([0, length - 1, length - 1])
    got = hashing.kernel_histogram(codes, length)
    assert got.dtype == torch.int64 and got.shape == (length,)
    assert torch.equal(got, torch.bincount(codes, minlength=length))


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("max_rounds", [1, 2])
def test_ids_left_after_the_last_round_are_numbered_exactly(backend, max_rounds):
    """Ids that collide in every round allowed are numbered by torch.unique, still exactly."""
    pool = colliding_ids(200, seed=6) + colliding_ids(100, seed=7, round_index=1) + [5, -5]
    g = torch.Generator().manual_seed(8)
    ids = torch.tensor(pool)[torch.randint(0, len(pool), (3000,), generator=g)]
    success = torch.rand(ids.numel(), generator=g) < 0.5
    codes = torch.empty(ids.numel(), dtype=torch.int64)
    with _Setting(hashing, _MAX_ROUNDS=max_rounds):
        slots = hashing.hashed_codes(ids, success, codes, backend=backend)
    assert len(slots.rounds) == max_rounds and slots.rest is not None and slots.rest.numel() > 0
    names = slots.slot_ids()
    assert torch.equal(names[codes >> 1], ids) and torch.equal((codes & 1).bool(), success)
    assert names.numel() == slots.num_slots == torch.unique(ids).numel()


@pytest.mark.parametrize("fused", [False, True])
def test_sparse_ids_are_not_sorted(fused):
    """Hashing sorts nothing (the old path sorted all N rollouts with torch.unique)."""
    g = torch.Generator().manual_seed(9)
    pool = torch.randint(-(2**63), 2**63 - 1, (1000,), generator=g)
    ids = pool[torch.randint(0, 1000, (2 * groups_module._HASH_MIN_ROLLOUTS,), generator=g)]
    rewards = (torch.rand(ids.numel(), generator=g) < 0.5).float()
    expected = sera_opt.maxrl_advantages(rewards, torch.unique(ids, return_inverse=True)[1])

    class Recorder(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            if "sort" in name or "unique" in name:
                self.calls.append(name)
            return func(*args, **(kwargs or {}))

    with _Setting(hashing, _CPU_BACKEND="numba" if fused else "torch"), Recorder() as recorder:
        got = sera_opt.maxrl_advantages(rewards, ids)
    assert recorder.calls == []
    assert torch.equal(got, expected)
    # The recorder does see the reference path's sort.
    with _Setting(groups_module, _SPARSE_SLOTS="sort"), Recorder() as recorder:
        sera_opt.maxrl_advantages(rewards, ids)
    assert "unique" in recorder.calls or "_unique2" in recorder.calls, recorder.calls


def test_hand_computed_example():
    # Prompt 5: n=3, K=2; prompt 9: n=2, K=1; prompt 2: n=1, K=0; prompt 7: n=2, K=2.
    # N = 8, M = 4, nbar = 2.
    rewards = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1.0], dtype=torch.float64)
    ids = torch.tensor([5, 5, 5, 9, 9, 2, 7, 7])
    expected = {
        ("mean_centred", True): [1 / 3, -2 / 3, 1 / 3, 1, -1, 0, 0, 0],
        ("mean_centred", False): [0.5, -1, 0.5, 1, -1, 0, 0, 0],
        ("success_average", True): [1, 0, 1, 2, 0, 0, 1, 1],
        ("success_average", False): [1.5, 0, 1.5, 2, 0, 0, 1, 1],
    }
    for (estimator, correction), values in expected.items():
        adv = sera_opt.maxrl_advantages(rewards, ids, estimator=estimator,
                                        multiplicity_correction=correction)
        torch.testing.assert_close(adv, torch.tensor(values, dtype=torch.float64),
                                   rtol=1e-15, atol=1e-15)


# ----------------------------------------------------------------------------
# Degenerate groups: exact zeros, never NaN
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_zero_success_all_success_and_singletons(dtype, estimator, correction):
    # prompt 0: all fail (n=4); prompt 1: all succeed (n=3); prompts 2, 3: singletons
    # (one success, one failure); prompt 4: mixed, so the batch has some signal.
    rewards = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1], dtype=dtype)
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 3, 4, 4, 4])
    adv = sera_opt.maxrl_advantages(rewards, ids, estimator=estimator,
                                    multiplicity_correction=correction)
    assert adv.dtype == dtype
    assert torch.isfinite(adv).all()
    assert (adv[:4] == 0).all(), "zero-success prompts must contribute exactly zero"
    assert adv[8] == 0, "a failed singleton must contribute exactly zero"
    if estimator == "mean_centred":
        assert (adv[4:7] == 0).all(), "all-success prompts must give exactly zero when mean-centred"
        assert adv[7] == 0, "a mean-centred singleton carries no signal"
        assert (adv[9:] != 0).all()
    else:
        assert (adv[4:7] > 0).all() and adv[7] > 0
    assert_matches_reference(adv, rewards.tolist(), ids.tolist(), estimator, correction,
                             rtol=4 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_batch_without_any_signal_is_all_zero(estimator, correction):
    adv = sera_opt.maxrl_advantages(torch.zeros(6), torch.tensor([3, 3, 1, 1, 1, 8]),
                                    estimator=estimator, multiplicity_correction=correction)
    assert torch.equal(adv, torch.zeros(6))
    single = sera_opt.maxrl_advantages(torch.ones(1), torch.tensor([4]), estimator=estimator,
                                       multiplicity_correction=correction)
    assert single.tolist() == ([0.0] if estimator == "mean_centred" else [1.0])


@pytest.mark.parametrize("num_prompts", [None, 3])
def test_empty_batch(num_prompts):
    adv = sera_opt.maxrl_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.int64),
                                    num_prompts=num_prompts)
    assert adv.shape == (0,) and adv.dtype == torch.float32
    stats = sera_opt.group_statistics(torch.zeros(0), torch.zeros(0, dtype=torch.int64),
                                      num_prompts=num_prompts)
    assert int(stats.num_prompts) == 0 and int(stats.num_rollouts) == 0


# ----------------------------------------------------------------------------
# Structural properties
# ----------------------------------------------------------------------------

def _random_batch(seed, m=30, max_count=9, p=None):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, max_count + 1, (m,), generator=g)
    ids = torch.repeat_interleave(torch.arange(m), counts)
    probs = torch.rand(m, generator=g, dtype=torch.float64) if p is None else torch.full((m,), p, dtype=torch.float64)
    rewards = torch.bernoulli(probs[ids], generator=g)
    perm = torch.randperm(ids.numel(), generator=g)
    return rewards[perm], ids[perm], counts


@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_permutation_equivariance_and_relabelling(estimator, correction):
    rewards, ids, _ = _random_batch(1)
    kwargs = dict(estimator=estimator, multiplicity_correction=correction)
    adv = sera_opt.maxrl_advantages(rewards, ids, **kwargs)
    perm = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(2))
    assert torch.equal(sera_opt.maxrl_advantages(rewards[perm], ids[perm], **kwargs), adv[perm])
    relabelled = (ids * 7919 + 3) % 100003  # injective on 0..29
    assert torch.equal(sera_opt.maxrl_advantages(rewards, relabelled, **kwargs), adv)


@pytest.mark.parametrize("correction", [True, False])
def test_mean_centred_groups_sum_to_zero(correction):
    rewards, ids, counts = _random_batch(3)
    adv = sera_opt.maxrl_advantages(rewards, ids, multiplicity_correction=correction)
    sums = torch.zeros(counts.numel(), dtype=torch.float64).index_add_(0, ids, adv)
    torch.testing.assert_close(sums, torch.zeros_like(sums), atol=1e-12, rtol=0)


def test_correction_preserves_total_coefficient_mass():
    """THEORY section 4: when every prompt has a success, the batch's coefficient mass is unchanged."""
    rewards, ids, counts = _random_batch(4, p=0.4)
    for i in range(counts.numel()):  # at least one success per prompt
        rewards[(ids == i).nonzero()[0]] = 1
    stats = sera_opt.group_statistics(rewards, ids)
    assert (stats.successes > 0).all()
    corrected = sera_opt.maxrl_advantages(rewards, ids, estimator="success_average")
    plain = sera_opt.maxrl_advantages(rewards, ids, estimator="success_average",
                                      multiplicity_correction=False)
    n = float(ids.numel())
    assert corrected.sum().item() == pytest.approx(n, rel=1e-12)
    assert plain.sum().item() == pytest.approx(n, rel=1e-12)
    # ... and each prompt's mass becomes nbar instead of n_i.
    per_prompt = torch.zeros(counts.numel(), dtype=torch.float64).index_add_(0, ids, corrected)
    torch.testing.assert_close(per_prompt, torch.full_like(per_prompt, n / counts.numel()))


def test_group_statistics_matches_numpy():
    rewards, ids, counts = _random_batch(6)
    stats = sera_opt.group_statistics(rewards, ids, num_prompts=counts.numel())
    assert torch.equal(stats.counts, counts)
    np.testing.assert_array_equal(stats.successes.numpy(),
                                  np.bincount(ids.numpy(), weights=rewards.numpy()).astype(np.int64))
    assert int(stats.num_prompts) == counts.numel() and int(stats.num_rollouts) == ids.numel()
    assert float(stats.mean_count) == pytest.approx(ids.numel() / counts.numel())
    assert torch.equal(stats.slot_index, ids)


# ----------------------------------------------------------------------------
# Dtypes and reward encodings
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_dtypes_round_once(dtype, estimator, correction):
    rewards, ids, _ = _random_batch(7)
    exact = sera_opt.maxrl_advantages(rewards, ids, estimator=estimator,
                                      multiplicity_correction=correction)
    low = sera_opt.maxrl_advantages(rewards.to(dtype), ids, estimator=estimator,
                                    multiplicity_correction=correction)
    assert low.dtype == dtype
    # The per-prompt values are computed in float64 and rounded once.
    assert torch.equal(low, exact.to(dtype))
    torch.testing.assert_close(low.double(), exact, rtol=torch.finfo(dtype).eps / 2, atol=0)


def test_reward_encodings_agree():
    rewards, ids, _ = _random_batch(8)
    ref = sera_opt.maxrl_advantages(rewards, ids)
    as_bool = sera_opt.maxrl_advantages(rewards.bool(), ids, dtype=torch.float64)
    as_int = sera_opt.maxrl_advantages(rewards.to(torch.int32), ids, dtype=torch.float64)
    graded = sera_opt.maxrl_advantages(rewards * 0.7 + 0.1, ids, success_threshold=0.5)
    from_list = sera_opt.maxrl_advantages(rewards.tolist(), ids.tolist(), dtype=torch.float64)
    for other in (as_bool, as_int, graded, from_list):
        assert torch.equal(other, ref)
    assert sera_opt.maxrl_advantages(rewards.bool(), ids).dtype == torch.get_default_dtype()


# ----------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(rewards=torch.tensor([0, 0.5, 1]), prompt_index=torch.tensor([0, 0, 1])), "binary"),
    (dict(rewards=torch.tensor([0, 2, 1]), prompt_index=torch.tensor([0, 0, 1])), "binary"),
    (dict(rewards=torch.tensor([0, -1, 1]), prompt_index=torch.tensor([0, 0, 1])), "binary"),
    (dict(rewards=torch.tensor([0, float("nan"), 1]), prompt_index=torch.tensor([0, 0, 1])), "binary"),
    (dict(rewards=torch.tensor([0.2, float("nan")]), prompt_index=torch.tensor([0, 0]),
          success_threshold=0.5), "non-finite"),
    (dict(rewards=torch.ones(2, 2), prompt_index=torch.zeros(2, 2, dtype=torch.int64)), "1-D"),
    (dict(rewards=torch.ones(3), prompt_index=torch.zeros(2, dtype=torch.int64)), "one prompt id"),
    (dict(rewards=torch.ones(2), prompt_index=torch.zeros(2)), "integer"),
    (dict(rewards=torch.ones(2), prompt_index=torch.zeros(2, dtype=torch.bool)), "integer"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 3]), num_prompts=3), r"\[0, 3\)"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([-1, 0]), num_prompts=3), r"\[0, 3\)"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]), num_prompts=0), "at least 1"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]), num_prompts=2.0), "positive int"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]), estimator="grpo"), "unknown estimator"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]), multiplicity_correction=1), "True or False"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]), dtype=torch.int64), "floating"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]),
          process_group=object()), "not initialized"),
    (dict(rewards=[[0, 1], [1]], prompt_index=[0, 1]), "could not convert"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]), success_threshold="high"),
     "real number"),
    (dict(rewards=torch.ones(2), prompt_index=torch.tensor([0, 1]),
          success_threshold=float("nan")), "finite"),
])
def test_bad_inputs_raise_library_error(kwargs, match):
    with pytest.raises(SeraOptError, match=match):
        sera_opt.maxrl_advantages(**kwargs)


@pytest.mark.parametrize("index_dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_prompt_index_dtypes(index_dtype):
    rewards, ids, counts = _random_batch(13, m=20)
    ref = sera_opt.maxrl_advantages(rewards, ids)
    for num_prompts in (None, counts.numel()):
        got = sera_opt.maxrl_advantages(rewards, ids.to(index_dtype), num_prompts=num_prompts)
        assert torch.equal(got, ref)


def test_extreme_int64_ids():
    low, high = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0])
    for ids in ([low, low + 3, low, low + 3, low + 1, low + 1],  # dense range at the bottom
                [high, high - 3, high, high - 3, high - 1, high - 1],  # ... and at the top
                [low, high, low, high, 0, 0]):  # as wide as can be: torch.unique
        adv = sera_opt.maxrl_advantages(rewards, torch.tensor(ids), dtype=torch.float64)
        assert_matches_reference(adv, rewards.tolist(), ids, "mean_centred", True, rtol=1e-15)


def test_unvalidated_nonbinary_rewards_count_nonzero_as_success():
    ids = torch.tensor([0, 0, 0])
    fast = sera_opt.maxrl_advantages(torch.tensor([0.0, 0.5, 1.0]), ids, validate=False)
    assert torch.equal(fast, sera_opt.maxrl_advantages(torch.tensor([0.0, 1.0, 1.0]), ids))


def test_reward_error_names_the_fix():
    with pytest.raises(SeraOptError, match="success_threshold") as info:
        sera_opt.maxrl_advantages(torch.tensor([0, 1, 0.25]), torch.tensor([0, 0, 0]))
    assert "0.25" in str(info.value) and "index 2" in str(info.value)


@pytest.mark.parametrize("threshold", [-1.0, 0.0, 0.5, 1.0, 1.5, 2.0])
def test_bool_rewards_meet_a_threshold_as_the_numbers_0_and_1(threshold):
    ids = torch.tensor([0, 0, 1, 1])
    as_bool = sera_opt.maxrl_advantages(torch.tensor([True, False, True, False]), ids,
                                        success_threshold=threshold)
    as_float = sera_opt.maxrl_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), ids,
                                         success_threshold=threshold)
    assert as_bool.tolist() == as_float.tolist()


def test_unvalidated_out_of_range_ids_still_fail_loudly_on_cpu():
    with pytest.raises(SeraOptError, match="outside"):
        sera_opt.maxrl_advantages(torch.ones(2), torch.tensor([0, 5]), num_prompts=3,
                                  validate=False)


# ----------------------------------------------------------------------------
# No host synchronisation on the fast path
# ----------------------------------------------------------------------------

_SYNCING = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero",
            "unique", "unique_consecutive", "masked_select", "numpy", "cpu", "equal", "any",
            "all"}


class _SyncRecorder(TorchFunctionMode):
    """Records tensor calls that need the value on the host (or a data-dependent shape)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in _SYNCING:
            self.calls.append(name)
        if name == "__getitem__" and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in args[1:]):
            self.calls.append("boolean indexing")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_fast_path_reads_nothing_back(estimator, correction):
    rewards, ids, counts = _random_batch(9)
    with _SyncRecorder() as recorder:
        adv = sera_opt.maxrl_advantages(rewards, ids, estimator=estimator,
                                        multiplicity_correction=correction,
                                        num_prompts=counts.numel(), validate=False)
        logits = torch.zeros(ids.numel(), 4, requires_grad=True)
        old = torch.zeros(ids.numel(), 4)
        mask = torch.ones(ids.numel(), 4)
        sera_opt.policy_gradient_loss(logits, adv, mask, "seq-mean-token-mean", validate=False)
        sera_opt.policy_gradient_loss(logits, adv, mask.bool(), old_token_logprobs=old,
                                      validate=False)
        for mode in est.LOSS_MODES:
            sera_opt.aggregate_loss(logits, mask, mode, validate=False)
    assert recorder.calls == []
    # The recorder does see the validating paths' single read-back each.
    with _SyncRecorder() as recorder:
        sera_opt.maxrl_advantages(rewards, ids, num_prompts=counts.numel())
    assert recorder.calls == ["tolist"]
    with _SyncRecorder() as recorder:
        sera_opt.policy_gradient_loss(logits, adv, mask, "token-sum", old_token_logprobs=old)
    assert recorder.calls == ["tolist"]
    with _SyncRecorder() as recorder:
        sera_opt.aggregate_loss(logits, mask)
    assert recorder.calls == ["tolist"]


# ----------------------------------------------------------------------------
# Expectations: exact enumeration and Monte Carlo on a softmax policy
# ----------------------------------------------------------------------------
#
# Prompt i has its own logits theta_i over V actions; actions in SUCCESS are
# successes, so p_i = sum_{a in SUCCESS} pi_i(a). The score of action a is
# e_a - pi_i (in prompt i's block of parameters) and
# grad log p_i = sum_{a in SUCCESS} pi_i(a) (e_a - pi_i) / p_i, both exact.

V = 3
SUCCESS = torch.tensor([True, False, False])
LOGITS = torch.tensor([[0.4, 0.0, -0.3], [-1.2, 0.3, 0.1], [0.9, -0.5, 0.0],
                       [-0.2, 0.8, -0.4], [-2.0, 0.5, 0.5]], dtype=torch.float64)
COUNTS = torch.tensor([1, 2, 3, 4, 5])  # heterogeneous, a singleton included


def softmax_policy():
    probs = torch.softmax(LOGITS, dim=1)
    p = probs[:, SUCCESS].sum(1)
    onehot = torch.eye(V, dtype=torch.float64)
    scores = onehot[None, :, :] - probs[:, None, :]  # (M, V actions, V params)
    grad_log_p = (probs[:, :, None] * scores * SUCCESS[None, :, None]).sum(1) / p[:, None]
    return probs, p, scores, grad_log_p


def contract(estimator, correction, counts=COUNTS):
    """The right-hand side of the contract, prompt block by prompt block, shape (M, V)."""
    _, p, _, grad_log_p = softmax_policy()
    offset = est.ESTIMATOR_OFFSETS[estimator]
    w = torch.as_tensor(sera_opt.attenuation(p.numpy(), counts.numpy(), offset))
    m, n_total = counts.numel(), counts.sum().double()
    weight = w / m if correction else counts.double() * w / n_total
    return weight[:, None] * grad_log_p


def batch_gradient(actions, batch_of, prompt_of, num_batches, estimator, correction):
    """(1/N) sum_j A_j S_j per batch, as (batches, M, V), for rollouts given by their action."""
    probs, _, scores, _ = softmax_policy()
    m, n = COUNTS.numel(), int(COUNTS.sum())
    rewards = SUCCESS[actions]
    adv = sera_opt.maxrl_advantages(rewards, batch_of * m + prompt_of, estimator=estimator,
                                    multiplicity_correction=correction,
                                    num_prompts=num_batches * m, dtype=torch.float64)
    contributions = adv[:, None] * scores[prompt_of, actions] / n
    out = torch.zeros(num_batches * m, V, dtype=torch.float64)
    out.index_add_(0, batch_of * m + prompt_of, contributions)
    return out.view(num_batches, m, V)


@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_exact_expectation_by_enumeration(estimator, correction):
    """Sum over every outcome of every prompt's group: E matches the contract to 1e-12.

    All batches of one call share the counts, so nbar = N / M is that of one batch.
    """
    probs, _, _, _ = softmax_policy()
    m = COUNTS.numel()
    expected = contract(estimator, correction)
    for i, n_i in enumerate(COUNTS.tolist()):
        outcomes = torch.tensor(list(itertools.product(range(V), repeat=n_i)))  # (V^n_i, n_i)
        num_batches = outcomes.shape[0]
        prompt_of = torch.repeat_interleave(torch.arange(m), COUNTS).repeat(num_batches)
        batch_of = torch.arange(num_batches).repeat_interleave(int(COUNTS.sum()))
        actions = torch.zeros(num_batches, int(COUNTS.sum()), dtype=torch.int64)
        start = int(COUNTS[:i].sum())
        actions[:, start:start + n_i] = outcomes
        grads = batch_gradient(actions.view(-1), batch_of, prompt_of, num_batches,
                               estimator, correction)[:, i]
        weights = probs[i][outcomes].prod(1)
        assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
        mean = (weights[:, None] * grads).sum(0)
        torch.testing.assert_close(mean, expected[i], rtol=0, atol=1e-12,
                                   msg=f"prompt {i} (n={n_i}), {estimator}, correction={correction}")


def sample_batches(num_batches, seed):
    probs, _, _, _ = softmax_policy()
    g = torch.Generator().manual_seed(seed)
    m, n = COUNTS.numel(), int(COUNTS.sum())
    prompt_of = torch.repeat_interleave(torch.arange(m), COUNTS).repeat(num_batches)
    batch_of = torch.arange(num_batches).repeat_interleave(n)
    actions = torch.multinomial(probs[prompt_of], 1, generator=g).squeeze(1)
    return actions, batch_of, prompt_of


MC_BATCHES = 40_000
MC_SIGMAS = 5.0  # per component; 4 combinations x 15 components: P(false alarm) < 4e-5


@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_monte_carlo_expectation_matches_contract(estimator, correction):
    actions, batch_of, prompt_of = sample_batches(MC_BATCHES, seed=11)
    grads = batch_gradient(actions, batch_of, prompt_of, MC_BATCHES, estimator, correction)
    mean = grads.mean(0)
    standard_error = grads.std(0) / math.sqrt(MC_BATCHES)
    expected = contract(estimator, correction)
    tolerance = MC_SIGMAS * standard_error + 1e-12
    excess = (mean - expected).abs() - tolerance
    assert (excess <= 0).all(), (
        f"{estimator}, correction={correction}: mean\n{mean}\nexpected\n{expected}\n"
        f"tolerance\n{tolerance}")
    # The test has power: the other variant of the correction is rejected.
    wrong = contract(estimator, not correction)
    assert ((mean - wrong).abs() > tolerance).any()


@pytest.mark.parametrize("estimator", est.ESTIMATORS)
def test_monte_carlo_per_prompt_attenuation(estimator):
    """THEORY section 2: E[g_i] = w_c(p_i, n_i) grad log p_i with sera_opt.attenuation."""
    actions, batch_of, prompt_of = sample_batches(MC_BATCHES, seed=12)
    n = int(COUNTS.sum())
    # Uncorrected, sum_j A_ij S_ij = n_i g_i, and batch_gradient divides by N.
    grads = batch_gradient(actions, batch_of, prompt_of, MC_BATCHES, estimator, False)
    g = grads * n / COUNTS[None, :, None].double()
    _, p, _, grad_log_p = softmax_policy()
    w = torch.as_tensor(sera_opt.attenuation(p.numpy(), COUNTS.numpy(),
                                             est.ESTIMATOR_OFFSETS[estimator]))
    mean = g.mean(0)
    tolerance = MC_SIGMAS * g.std(0) / math.sqrt(MC_BATCHES) + 1e-12
    assert ((mean - w[:, None] * grad_log_p).abs() <= tolerance).all()
    if estimator == "mean_centred":
        assert float(w[0]) == 0.0 and torch.equal(g[:, 0], torch.zeros_like(g[:, 0]))
    # Attenuation is visible: the unattenuated likelihood gradient is rejected.
    assert ((mean - grad_log_p).abs() > tolerance).any()


# ----------------------------------------------------------------------------
# Gradients through a torch model, and the loss modes
# ----------------------------------------------------------------------------

class TinyPolicy(torch.nn.Module):
    """Next-token logits from the prompt's embedding and the previous token."""

    def __init__(self, num_prompts=4, vocab=5, width=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.prompt = torch.nn.Embedding(num_prompts, width)
        self.token = torch.nn.Embedding(vocab + 1, width)  # id `vocab` is the start token
        self.out = torch.nn.Linear(width, vocab)
        self.vocab = vocab
        self.double()

    def token_logprobs(self, prompt_ids, tokens):
        start = torch.full_like(tokens[:, :1], self.vocab)
        previous = torch.cat([start, tokens[:, :-1]], dim=1)
        hidden = torch.tanh(self.prompt(prompt_ids)[:, None, :] + self.token(previous))
        logp = torch.log_softmax(self.out(hidden), dim=-1)
        return logp.gather(-1, tokens[..., None]).squeeze(-1)


def _sequence_batch(seed=0, num_prompts=4, length=6):
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([1, 2, 4, 3])
    prompt_ids = torch.repeat_interleave(torch.arange(num_prompts), counts)
    n = prompt_ids.numel()
    tokens = torch.randint(0, 5, (n, length), generator=g)
    lengths = torch.randint(1, length + 1, (n,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    rewards = (tokens[:, 0] < 2).double()
    return prompt_ids, tokens, mask, rewards


def _flat_grad(model, loss):
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([gr.reshape(-1) for gr in grads])


def _per_sequence_scores(model, prompt_ids, tokens, mask):
    """S_k = grad log pi(y_k) for every sequence, by a loop (the slow reference)."""
    scores = []
    for k in range(tokens.shape[0]):
        logp = model.token_logprobs(prompt_ids[k:k + 1], tokens[k:k + 1])
        scores.append(_flat_grad(model, (logp * mask[k:k + 1]).sum()))
    return torch.stack(scores)


@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
def test_autograd_gradient_matches_contract_form(estimator, correction):
    model = TinyPolicy()
    prompt_ids, tokens, mask, rewards = _sequence_batch()
    adv = sera_opt.maxrl_advantages(rewards, prompt_ids, estimator=estimator,
                                    multiplicity_correction=correction)
    logp = model.token_logprobs(prompt_ids, tokens)
    seq_logprob = (logp * mask).sum(1)
    grad = _flat_grad(model, (adv * seq_logprob).mean())
    scores = _per_sequence_scores(model, prompt_ids, tokens, mask)
    reference = (adv[:, None] * scores).sum(0) / tokens.shape[0]
    torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-12)
    assert grad.abs().max() > 0


@pytest.mark.parametrize("mode", est.LOSS_MODES)
def test_loss_modes_weight_sequences_as_documented(mode):
    model = TinyPolicy(seed=1)
    prompt_ids, tokens, mask, rewards = _sequence_batch(seed=2)
    mask[3] = False  # an empty sequence (padding row) counts for nothing
    adv = sera_opt.maxrl_advantages(rewards, prompt_ids)
    logp = model.token_logprobs(prompt_ids, tokens)
    loss = sera_opt.policy_gradient_loss(logp, adv, mask, mode)
    same = sera_opt.aggregate_loss(-adv[:, None] * logp, mask, mode)
    torch.testing.assert_close(loss, same)
    grad = _flat_grad(model, loss)

    scores = _per_sequence_scores(model, prompt_ids, tokens, mask)
    lengths = mask.sum(1).double()
    nonempty = float((lengths > 0).sum())
    weight = {
        "token-mean": torch.full_like(lengths, 1 / float(lengths.sum())),
        "seq-mean-token-sum": torch.full_like(lengths, 1 / nonempty),
        "seq-mean-token-mean": 1 / (nonempty * lengths.clamp_min(1)),
        "token-sum": torch.ones_like(lengths),
    }[mode]
    reference = -((weight * adv)[:, None] * scores).sum(0)
    torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-12)
    if mode == "seq-mean-token-sum":
        # Exactly the contract's (advantages * seq_logprob).mean() over non-empty rows, negated.
        keep = lengths > 0
        contract_loss = -(adv[keep] * (logp * mask).sum(1)[keep]).mean()
        torch.testing.assert_close(loss, contract_loss)


def test_loss_without_mask_and_with_empty_mask():
    loss = torch.arange(6.0).view(2, 3).requires_grad_()
    assert sera_opt.aggregate_loss(loss).item() == pytest.approx(2.5)
    assert sera_opt.aggregate_loss(loss, None, "token-sum").item() == 15
    assert sera_opt.aggregate_loss(loss, None, "seq-mean-token-sum").item() == 7.5
    empty = torch.zeros(2, 3, dtype=torch.bool)
    for mode in est.LOSS_MODES:
        value = sera_opt.aggregate_loss(loss, empty, mode)
        assert value.item() == 0.0 and math.isfinite(value.item())
        value.backward()
        assert torch.equal(loss.grad, torch.zeros_like(loss))
        loss.grad = None


def test_fractional_mask_weights_and_low_precision_losses():
    loss = torch.ones(2, 4)
    weights = torch.tensor([[0.25, 0.25, 0, 0], [0, 0, 0, 0]])
    # Token weights act as fractional tokens: T = 0.5, one non-empty sequence.
    assert sera_opt.aggregate_loss(loss, weights, "token-mean").item() == 1.0
    assert sera_opt.aggregate_loss(loss, weights, "seq-mean-token-sum").item() == 0.5
    assert sera_opt.aggregate_loss(loss, weights, "seq-mean-token-mean").item() == 1.0
    for dtype in (torch.float16, torch.bfloat16):
        for mode in est.LOSS_MODES:
            value = sera_opt.aggregate_loss(loss.to(dtype), weights, mode)
            assert value.dtype == dtype


def test_ppo_clip_surrogate():
    logp = torch.log(torch.tensor([[0.5, 0.2], [0.3, 0.3]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    plain = sera_opt.policy_gradient_loss(logp, adv, mode="token-sum")
    (g_plain,) = torch.autograd.grad(plain, logp)
    # At ratio 1 the clipped surrogate has the REINFORCE gradient.
    same = sera_opt.policy_gradient_loss(logp, adv, mode="token-sum",
                                         old_token_logprobs=logp.detach())
    (g_same,) = torch.autograd.grad(same, logp)
    torch.testing.assert_close(g_same, g_plain)
    # Token (0, 0): ratio 2 with A > 0 is clipped (no gradient); token (1, 1):
    # ratio 0.5 with A < 0 is clipped too; the others are inside the range.
    old = logp.detach() - torch.log(torch.tensor([[2.0, 1.1], [0.95, 0.5]], dtype=torch.float64))
    clipped = sera_opt.policy_gradient_loss(logp, adv, mode="token-sum",
                                            old_token_logprobs=old, clip_range=(0.2, 0.28))
    (g_clip,) = torch.autograd.grad(clipped, logp)
    assert g_clip[0, 0] == 0 and g_clip[1, 1] == 0
    torch.testing.assert_close(g_clip[0, 1], -1.1 * adv[0])
    torch.testing.assert_close(g_clip[1, 0], 0.95 * -adv[1])
    with pytest.warns(SeraOptWarning, match="clip_range"):
        sera_opt.policy_gradient_loss(logp, adv, clip_range=0.2)


@pytest.mark.parametrize("call,match", [
    (lambda: sera_opt.aggregate_loss(torch.zeros(2, 3), None, "mean"), "unknown loss mode"),
    (lambda: sera_opt.aggregate_loss(torch.zeros(6), None), "shape"),
    (lambda: sera_opt.aggregate_loss(torch.zeros(2, 3, dtype=torch.int64)), "floating"),
    (lambda: sera_opt.aggregate_loss(torch.zeros(2, 3), torch.ones(2, 2)), "mask must have"),
    (lambda: sera_opt.aggregate_loss([[0.0]]), "torch.Tensor"),
    (lambda: sera_opt.policy_gradient_loss(torch.zeros(2, 3), torch.zeros(3)), "one entry"),
    (lambda: sera_opt.policy_gradient_loss(torch.zeros(3), torch.zeros(3)), "shape"),
    (lambda: sera_opt.policy_gradient_loss(torch.zeros(2, 3), torch.zeros(2),
                                           old_token_logprobs=torch.zeros(2, 2)), "old_token"),
    (lambda: sera_opt.policy_gradient_loss(torch.zeros(2, 3), torch.zeros(2),
                                           old_token_logprobs=torch.zeros(2, 3),
                                           clip_range=1.5), "clip_range"),
])
def test_loss_bad_inputs(call, match):
    with pytest.raises(SeraOptError, match=match):
        call()


NAN, INF = float("nan"), float("inf")


def _loss_batch(dtype=torch.float64):
    g = torch.Generator().manual_seed(21)
    logp = -torch.rand(4, 5, generator=g, dtype=dtype) * 3
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]],
                        dtype=torch.bool)
    adv = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=dtype)
    return logp, mask, adv


def _with(tensor, index, value):
    out = tensor.clone()
    out[index] = value
    return out


# One case per kind of bad value: (name, call, what the message must say).
_LOGP, _MASK, _ADV = _loss_batch()
BAD_LOSS_VALUES = [
    ("mask NaN", lambda **kw: sera_opt.aggregate_loss(_LOGP, _with(_MASK.double(), (1, 2), NAN),
                                                      **kw), r"mask contains 1 .*\[1, 2\]"),
    ("mask inf", lambda **kw: sera_opt.aggregate_loss(_LOGP, _with(_MASK.double(), (0, 0), INF),
                                                      **kw), r"mask contains 1 .*\[0, 0\]"),
    ("mask negative", lambda **kw: sera_opt.aggregate_loss(
        _LOGP, _with(_MASK.double(), (2, 1), -1.0), **kw), r"mask contains 1 .*\(-1.0\)"),
    ("integer mask negative", lambda **kw: sera_opt.aggregate_loss(
        _LOGP, _with(_MASK.long(), (3, 4), -1), **kw), r"mask contains 1 .*\[3, 4\]"),
    ("policy mask negative", lambda **kw: sera_opt.policy_gradient_loss(
        _LOGP, _ADV, _with(_MASK.float(), (0, 1), -0.5), **kw), "mask contains 1"),
    ("loss NaN", lambda **kw: sera_opt.aggregate_loss(_with(_LOGP, (1, 4), NAN), _MASK, **kw),
     r"per_token_loss contains 1 non-finite .* at unmasked tokens, the first at \[1, 4\]"),
    ("loss inf, no mask", lambda **kw: sera_opt.aggregate_loss(_with(_LOGP, (3, 0), -INF), **kw),
     r"per_token_loss contains 1 non-finite value\(s\) \(NaN or inf\), the first at \[3, 0\]"),
    ("advantage NaN", lambda **kw: sera_opt.policy_gradient_loss(_LOGP, _with(_ADV, 2, NAN),
                                                                _MASK, **kw),
     r"advantages contains 1 .*\[2\] \(nan\)"),
    ("advantage inf", lambda **kw: sera_opt.policy_gradient_loss(_LOGP, _with(_ADV, 1, INF),
                                                                _MASK, **kw), r"advantages .*\[1\]"),
    ("advantage overflows the dtype", lambda **kw: sera_opt.policy_gradient_loss(
        _LOGP.float(), _with(_ADV, 0, 1e300), _MASK, **kw), r"advantages .*as torch.float32"),
    ("logprob NaN", lambda **kw: sera_opt.policy_gradient_loss(_with(_LOGP, (0, 2), NAN), _ADV,
                                                              _MASK, **kw),
     r"token_logprobs contains 1 .*unmasked.*\[0, 2\]"),
    ("logprob -inf", lambda **kw: sera_opt.policy_gradient_loss(_with(_LOGP, (1, 0), -INF), _ADV,
                                                               **kw), r"token_logprobs .*-inf"),
    ("old logprob NaN", lambda **kw: sera_opt.policy_gradient_loss(
        _LOGP, _ADV, _MASK, old_token_logprobs=_with(_LOGP, (2, 0), NAN), **kw),
     r"old_token_logprobs contains 1 .*\[2, 0\]"),
    ("ratio overflows", lambda **kw: sera_opt.policy_gradient_loss(
        _LOGP.float(), -_ADV.float(), _MASK, old_token_logprobs=_with(_LOGP.float(), (0, 1), -200.0),
        **kw), r"the per-token loss contains 1 .*overflowed"),
]


@pytest.mark.parametrize("name,call,match", BAD_LOSS_VALUES, ids=[c[0] for c in BAD_LOSS_VALUES])
def test_losses_reject_bad_values(name, call, match):
    with pytest.raises(SeraOptError, match=match):
        call()
    # validate=False trusts the input: no error, and the bad value shows in the result.
    value = call(validate=False)
    assert not math.isfinite(value.item()) or "mask" in name, (name, value)


def test_loss_validate_flag_must_be_bool():
    logp, mask, adv = _loss_batch()
    with pytest.raises(SeraOptError, match="validate must be True or False"):
        sera_opt.aggregate_loss(logp, mask, validate=1)
    with pytest.raises(SeraOptError, match="validate must be True or False"):
        sera_opt.policy_gradient_loss(logp, adv, mask, validate="no")


def test_non_binary_mask_weights_are_accepted_and_documented_as_weights():
    loss = torch.ones(2, 3, dtype=torch.float64)
    weights = torch.tensor([[0.5, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert sera_opt.aggregate_loss(loss, weights, "token-sum").item() == 2.5
    assert sera_opt.aggregate_loss(loss * 3, weights, "token-mean").item() == 3.0


@settings(max_examples=60, deadline=None)
@given(data=st.data(), mode=st.sampled_from(est.LOSS_MODES), ppo=st.booleans(),
       weighted=st.booleans())
def test_masked_tokens_never_reach_loss_or_gradient(data, mode, ppo, weighted):
    """Garbage (NaN, +-inf) at masked tokens changes neither the loss nor its gradient."""
    rows, cols = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))
    seed = data.draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, cols, generator=g, dtype=torch.float64) * 4
    old = logp - 0.1 * torch.randn(rows, cols, generator=g, dtype=torch.float64)
    keep = torch.rand(rows, cols, generator=g) < 0.6
    mask = keep * (torch.rand(rows, cols, generator=g, dtype=torch.float64) + 0.5) if weighted else keep
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    garbage = torch.tensor([NAN, INF, -INF], dtype=torch.float64)[
        torch.randint(0, 3, (rows, cols), generator=g)]

    def run(fill):
        x = torch.where(keep, logp, fill).requires_grad_()
        o = torch.where(keep, old, fill) if ppo else None
        loss = sera_opt.policy_gradient_loss(x, adv, mask, mode, old_token_logprobs=o)
        (grad,) = torch.autograd.grad(loss, x)
        return loss.detach(), grad

    clean_loss, clean_grad = run(torch.zeros(()))
    dirty_loss, dirty_grad = run(garbage)
    assert math.isfinite(clean_loss.item())
    assert torch.equal(dirty_loss, clean_loss)
    assert torch.equal(dirty_grad, clean_grad) and torch.isfinite(dirty_grad).all()
    assert (dirty_grad[~keep] == 0).all()


# ----------------------------------------------------------------------------
# Diagnostics
# ----------------------------------------------------------------------------

def test_diagnostics_hand_computed():
    rewards = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1.0])
    ids = torch.tensor([5, 5, 5, 9, 9, 2, 7, 7])
    d = sera_opt.advantage_diagnostics(rewards, ids)
    assert all(isinstance(v, float) for v in d.values())
    assert d["num_prompts"] == 4 and d["num_rollouts"] == 8 and d["mean_count"] == 2
    assert d["min_count"] == 1 and d["max_count"] == 3
    assert d["success_rate"] == 5 / 8
    assert d["zero_success_fraction"] == 0.25 and d["all_success_fraction"] == 0.25
    assert d["signal_fraction"] == 0.5  # prompts 5 and 9
    # Posterior means (K+1)/(n+2): 3/5, 2/4, 1/3, 3/4 for n = 3, 2, 1, 2; c = 1.
    factors = [1 - (2 / 5) ** 2, 1 - 0.5, 0.0, 1 - 0.25]
    assert d["min_factor"] == 0.0
    assert d["max_factor"] == pytest.approx(max(factors))
    assert d["mean_factor"] == pytest.approx(np.mean(factors))
    assert d["min_correction"] == pytest.approx(2 / 3) and d["max_correction"] == 2
    e = np.array(factors)
    assert d["weight_spread"] == pytest.approx(e.std() / e.mean())
    assert d["alignment_proxy"] == pytest.approx(e.mean() / np.sqrt((e**2).mean()))


def test_diagnostics_with_success_probs_and_without_correction():
    g = torch.Generator().manual_seed(3)
    counts = torch.tensor([2, 4, 8, 8])
    ids = torch.repeat_interleave(torch.arange(4), counts)
    p = torch.tensor([0.5, 0.3, 0.1, 0.6], dtype=torch.float64)
    rewards = torch.bernoulli(p[ids], generator=g)
    for estimator in est.ESTIMATORS:
        c = est.ESTIMATOR_OFFSETS[estimator]
        w = sera_opt.attenuation(p.numpy(), counts.numpy(), c)
        for correction in (True, False):
            d = sera_opt.advantage_diagnostics(rewards, ids, estimator=estimator,
                                               multiplicity_correction=correction,
                                               success_probs=p[ids])
            e = w if correction else w * counts.numpy() / counts.double().mean().item()
            assert d["min_factor"] == pytest.approx(w.min())
            assert d["max_factor"] == pytest.approx(w.max())
            assert d["weight_spread"] == pytest.approx(e.std() / e.mean())
            assert d["alignment_proxy"] == pytest.approx(e.mean() / np.sqrt((e**2).mean()))
            if not correction:
                assert d["min_correction"] == d["max_correction"] == 1.0


def test_diagnostics_equal_weights_give_perfect_alignment():
    ids = torch.repeat_interleave(torch.arange(5), 4)
    rewards = torch.tensor([1.0, 0, 0, 0] * 5)
    d = sera_opt.advantage_diagnostics(rewards, ids, success_probs=torch.full((20,), 0.3))
    assert d["alignment_proxy"] == pytest.approx(1.0) and d["weight_spread"] == pytest.approx(0.0)
    # All mean-centred singletons: no weight anywhere, alignment 0 by convention, spread NaN.
    d = sera_opt.advantage_diagnostics(torch.ones(3), torch.arange(3))
    assert d["alignment_proxy"] == 0.0 and math.isnan(d["weight_spread"])


def test_diagnostics_rejects_bad_success_probs():
    with pytest.raises(SeraOptError, match=r"\[0, 1\]"):
        sera_opt.advantage_diagnostics(torch.ones(2), torch.tensor([0, 0]),
                                       success_probs=torch.tensor([0.5, 1.5]))
    with pytest.raises(SeraOptError, match="one entry per rollout"):
        sera_opt.advantage_diagnostics(torch.ones(2), torch.tensor([0, 0]),
                                       success_probs=torch.tensor([0.5]))


def test_lazy_exports_resolve_to_the_estimator_and_load_torch_only_on_access():
    """Each exported name is the object in sera_opt.estimator, and torch loads on first use.

    In a fresh interpreter: importing sera_opt (and listing it) must not load
    torch or the estimator; the first access of an estimator name must load both
    and return sera_opt.estimator's own object, for every name in its __all__.
    """
    code = textwrap.dedent("""
        import json, sys
        import sera_opt
        dir(sera_opt)
        before = [m for m in ("torch", "sera_opt.estimator") if m in sys.modules]
        first = sera_opt.maxrl_advantages
        after = [m for m in ("torch", "sera_opt.estimator") if m in sys.modules]
        import sera_opt.estimator as est
        same = {name: getattr(sera_opt, name) is getattr(est, name) for name in est.__all__}
        exported = sorted(n for n, m in sera_opt._LAZY.items() if m == ".estimator")
        print(json.dumps(dict(before=before, after=after, same=same, exported=exported,
                              all=sorted(est.__all__), first=first is est.maxrl_advantages)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    report = json.loads(out.stdout)
    assert report["before"] == [], f"import sera_opt loaded {report['before']}"
    assert report["after"] == ["torch", "sera_opt.estimator"]
    assert report["first"]
    assert report["same"] and all(report["same"].values()), report["same"]
    # Every public estimator name is exported lazily, and nothing else points there.
    assert report["exported"] == report["all"]
    assert est.ESTIMATOR_OFFSETS == {"mean_centred": 1, "success_average": 0}


# ----------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("estimator,correction", COMBINATIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@on_gpu
def test_cuda_matches_cpu(estimator, correction, dtype):
    rewards, ids, counts = _random_batch(10, m=200)
    kwargs = dict(estimator=estimator, multiplicity_correction=correction)
    cpu = sera_opt.maxrl_advantages(rewards.to(dtype), ids, **kwargs)
    for num_prompts in (None, counts.numel()):
        cuda = sera_opt.maxrl_advantages(rewards.to(dtype).cuda(), ids.cuda(),
                                         num_prompts=num_prompts, **kwargs)
        assert cuda.device.type == "cuda" and cuda.dtype == dtype
        assert torch.equal(cuda.cpu(), cpu)
    wide = sera_opt.maxrl_advantages(rewards.to(dtype).cuda(), (ids * 10**12).cuda(), **kwargs)
    assert torch.equal(wide.cpu(), cpu)


@on_gpu
def test_cuda_hashed_slots_match_the_cpu_sort_reference():
    g = torch.Generator().manual_seed(14)
    pools = {
        "random": torch.randint(-(2**63), 2**63 - 1, (20_000,), generator=g),
        "colliding": torch.tensor(colliding_ids(500, seed=15) + colliding_ids(300, seed=16, round_index=1)),
        "extremes": torch.tensor([-(2**63), 2**63 - 1, -1, 0, 1]),
    }
    for name, pool in pools.items():
        ids = pool[torch.randint(0, pool.numel(), (200_000,), generator=g)]
        rewards = (torch.rand(ids.numel(), generator=g) < 0.3).float()
        with _Setting(groups_module, _SPARSE_SLOTS="sort"):
            reference, ref_stats = _advantages_and_stats(rewards, ids)
        got, stats = _advantages_and_stats(rewards.cuda(), ids.cuda())
        for a, b in zip(got, reference, strict=True):
            assert a.device.type == "cuda" and torch.equal(a.cpu(), b), name
        for field in ("prompt_ids", "counts", "successes", "slot_index"):
            assert torch.equal(getattr(stats, field).cpu(), getattr(ref_stats, field)), (name, field)
        codes = torch.empty(ids.numel(), dtype=torch.int32, device="cuda")
        slots = hashing.hashed_codes(ids.cuda(), rewards.cuda().bool(), codes)
        assert torch.equal(slots.slot_ids()[codes.long() >> 1].cpu(), ids), name


@on_gpu
def test_cuda_fast_path_does_not_synchronise():
    rewards, ids, counts = _random_batch(11, m=200)
    rewards, ids = rewards.float().cuda(), ids.cuda()
    logp = torch.randn(ids.numel(), 7, device="cuda", requires_grad=True)
    mask = torch.rand(ids.numel(), 7, device="cuda") < 0.8
    sera_opt.maxrl_advantages(rewards, ids, num_prompts=counts.numel(), validate=False)  # warm up
    torch.cuda.synchronize()
    old = logp.detach() + 0.01
    torch.cuda.set_sync_debug_mode("error")
    try:
        for estimator, correction in COMBINATIONS:
            adv = sera_opt.maxrl_advantages(rewards, ids, estimator=estimator,
                                            multiplicity_correction=correction,
                                            num_prompts=counts.numel(), validate=False)
            for mode in est.LOSS_MODES:
                sera_opt.policy_gradient_loss(logp, adv, mask, mode, validate=False)
                sera_opt.policy_gradient_loss(logp, adv, mask.float(), mode,
                                              old_token_logprobs=old, validate=False)
                sera_opt.aggregate_loss(logp, mask, mode, validate=False)
        # The check has power: the validating calls do read back.
        for call in (lambda: sera_opt.maxrl_advantages(rewards, ids, num_prompts=counts.numel()),
                     lambda: sera_opt.policy_gradient_loss(logp, adv, mask),
                     lambda: sera_opt.aggregate_loss(logp, mask)):
            with pytest.raises(RuntimeError, match="synchroniz"):
                call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@on_gpu
def test_cuda_diagnostics_and_loss_match_cpu():
    rewards, ids, _ = _random_batch(12, m=50)
    d_cpu = sera_opt.advantage_diagnostics(rewards, ids)
    d_cuda = sera_opt.advantage_diagnostics(rewards.cuda(), ids.cuda())
    assert d_cpu.keys() == d_cuda.keys()
    for key in d_cpu:
        assert d_cuda[key] == pytest.approx(d_cpu[key], rel=1e-12, nan_ok=True), key
    loss = torch.randn(ids.numel(), 5, dtype=torch.float64)
    mask = torch.rand(ids.numel(), 5) < 0.7
    for mode in est.LOSS_MODES:
        a = sera_opt.aggregate_loss(loss, mask, mode)
        b = sera_opt.aggregate_loss(loss.cuda(), mask.cuda(), mode)
        assert b.item() == pytest.approx(a.item(), rel=1e-12)


# ---------------------------------------------------------------- inputs taken for what they are
def test_masked_rewards_are_refused_with_the_fix():
    rewards = np.ma.masked_array([1.0, 0.0, 1.0], mask=[False, True, False])
    with pytest.raises(SeraOptError, match=r"masked array.*compressed\(\).*filled"):
        sera_opt.maxrl_advantages(rewards, [0, 0, 1])
    with pytest.raises(SeraOptError, match="masked array"):
        sera_opt.maxrl_advantages([1, 0], np.ma.masked_all(2, dtype=np.int64))


def test_ragged_rewards_say_what_to_pass():
    with pytest.raises(SeraOptError, match="flat list"):
        sera_opt.maxrl_advantages([[1, 0], [1]], [0, 0])


def test_meta_tensors_are_refused():
    meta = torch.ones(4, device="meta")
    with pytest.raises(SeraOptError, match="meta tensor"):
        sera_opt.maxrl_advantages(meta, torch.zeros(4, dtype=torch.long, device="meta"))
    with pytest.raises(SeraOptError, match="meta tensor"):
        sera_opt.group_statistics(meta, torch.zeros(4, dtype=torch.long, device="meta"))
    with pytest.raises(SeraOptError, match="meta tensor"):
        sera_opt.policy_gradient_loss(torch.zeros(2, 3, device="meta"),
                                      torch.ones(2, device="meta"))


@pytest.mark.parametrize("clip_range", ["0.2", ("0.2", 0.3), (0.2, True), b"0.2"])
def test_clip_range_must_be_numbers(clip_range):
    logprobs = torch.zeros(2, 3)
    with pytest.raises(SeraOptError, match="clip_range"):
        sera_opt.policy_gradient_loss(logprobs, torch.ones(2), old_token_logprobs=logprobs,
                                      clip_range=clip_range)


def test_a_table_too_large_to_allocate_is_a_clear_error():
    rewards, ids = torch.tensor([1.0, 0.0]), torch.tensor([0, 1])
    with pytest.raises(SeraOptError, match="num_prompts=10000000000000 sizes it"):
        sera_opt.maxrl_advantages(rewards, ids, num_prompts=10**13)


def test_half_precision_advantages_never_overflow_silently():
    n = 70_000  # one success: the advantage n / K = 69 999 exceeds float16's 65 504
    rewards = (torch.arange(n) == 0).to(torch.float16)
    ids = torch.zeros(n, dtype=torch.long)
    with pytest.raises(SeraOptError, match="dtype=torch.float32"):
        sera_opt.maxrl_advantages(rewards, ids)
    wide = sera_opt.maxrl_advantages(rewards, ids, dtype=torch.float32)
    assert wide.dtype == torch.float32 and wide[0].item() == n - 1
    for dtype in (torch.float16, torch.bfloat16):
        small = sera_opt.maxrl_advantages(rewards[:1000].to(dtype), ids[:1000])
        assert small.dtype == dtype and bool(torch.isfinite(small).all())
        assert small[0].item() == pytest.approx(999, rel=1e-2)
    brain = sera_opt.maxrl_advantages(rewards.to(torch.bfloat16), ids)
    assert brain.dtype == torch.bfloat16 and bool(torch.isfinite(brain).all())
