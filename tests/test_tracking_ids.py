"""SuccessTracker's prompt-id index: every id kind against a dict, and the string routes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_opt import SeraOptError, SuccessTracker
from sera_opt.tracking.index import PromptIndex, parse_prompt_ids


def counts_by_dict(batches):
    trials, wins = {}, {}
    for ids, rewards in batches:
        for key, r in zip(ids, rewards):
            trials[key] = trials.get(key, 0) + 1
            wins[key] = wins.get(key, 0) + r
    return trials, wins


def assert_counts(tracker, batches, probe):
    trials, wins = counts_by_dict(batches)
    s, f = tracker.evidence(probe)
    np.testing.assert_array_equal(s, [wins.get(k, 0) for k in probe])
    np.testing.assert_array_equal(s + f, [trials.get(k, 0) for k in probe])


INT64 = np.iinfo(np.int64)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from(
    [0, 1, 2, -1, 2**31, 2**40, -(2**40), INT64.max, INT64.min, 7 << 50, 8 << 50, 3 * 2**20]
    + list(range(5, 40, 3))), st.integers(0, 1)), max_size=25), min_size=1, max_size=8))
def test_integer_ids_match_a_dict(batches):
    tracker = SuccessTracker(prior=(1.0, 1.0))
    plain = []
    for batch in batches:
        ids = np.array([k for k, _ in batch], dtype=np.int64)
        rewards = [r for _, r in batch]
        tracker.update(ids, rewards)
        plain.append((ids.tolist(), rewards))
    probe = sorted({k for ids, _ in plain for k in ids} | {12345, -7})
    assert_counts(tracker, plain, probe)


def test_hash_table_grows_and_keeps_every_id():
    rng = np.random.default_rng(0)
    keys = rng.integers(INT64.min, INT64.max, 300_000, dtype=np.int64)
    tracker = SuccessTracker(prior=(1.0, 1.0))
    batches = []
    for part in np.array_split(keys, 7):  # several growths of the table
        rewards = (part % 3 == 0).astype(int)
        tracker.update(part, rewards)
        batches.append((part.tolist(), rewards.tolist()))
    assert tracker._index.int_mode == "hash" and len(tracker) == np.unique(keys).size
    assert_counts(tracker, batches, keys[::97].tolist() + [1, 2, 3])


STRINGS = ["", "a", "a ", "ab", "b", "a\x00b", "\x00a", "é", "日本語", "😀", "😀😀", "x" * 70,
           "prompt-1", "prompt-10", "PROMPT-1"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from(STRINGS), st.integers(0, 1)), min_size=1,
                         max_size=20), min_size=1, max_size=6),
       st.sampled_from(["list", "array", "object"]))
def test_string_ids_match_a_dict(batches, route):
    tracker = SuccessTracker(prior=(1.0, 1.0))
    plain = []
    for batch in batches:
        ids = [k for k, _ in batch]
        rewards = [r for _, r in batch]
        given_ids = {"list": ids, "array": np.array(ids, dtype=str),
                     "object": np.array(ids, dtype=object)}[route]
        tracker.update(given_ids, rewards)
        plain.append((ids, rewards))
    assert_counts(tracker, plain, STRINGS + ["never seen"])
    keys = tracker.state_dict()["keys"]
    assert len(keys) == len(set(keys)) == len({k for ids, _ in plain for k in ids})


def test_string_routes_agree_and_numpy_byte_orders_too():
    ids = ["α", "β", "α", "γγ", "β", "α"]
    rewards = [1, 0, 1, 1, 0, 0]
    results = []
    for given_ids in (ids, tuple(ids), np.array(ids), np.array(ids, dtype=">U2"),
                      np.array(ids, dtype=object), [np.str_(x) for x in ids]):
        tracker = SuccessTracker(prior=(1.0, 1.0))
        tracker.update(given_ids, rewards)
        results.append(tracker.posterior(["α", "β", "γγ", "δ"]))
    for alpha, beta in results:
        assert alpha.tolist() == [3.0, 1.0, 2.0, 1.0] and beta.tolist() == [2.0, 3.0, 1.0, 1.0]


def test_string_ids_are_compared_exactly_not_by_hash():
    # Corrupt a stored id's code points while its hash stays: a lookup that only compared
    # hashes would still find it.
    tracker = SuccessTracker(prior=(1.0, 1.0))
    tracker.update(["alpha", "beta"], [1, 0])
    index = tracker._index
    start = int(index._offsets[0])
    index._buf[start] = ord("A")
    s, f = tracker.evidence(["alpha", "Alpha", "beta"])
    assert s.tolist() == [0.0, 0.0, 0.0] and f.tolist() == [0.0, 0.0, 1.0]


def test_ids_ending_in_nul_are_refused_with_a_reason():
    tracker = SuccessTracker()
    with pytest.raises(SeraOptError, match="NUL"):
        tracker.update(["ok", "bad\x00"], [1, 0])
    assert len(tracker) == 0 and tracker.step == 0
    tracker.update(["in\x00side"], [1])  # NUL inside an id is kept
    assert tracker.evidence(["in\x00side", "inside"])[0].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("ids, match", [
    (["a", 1], "one kind"),
    ([1, "a"], "one kind"),
    (np.array([b"a", b"b"]), "bytes"),
    (np.array(["a", None], dtype=object), "one kind"),
])
def test_mixed_or_foreign_ids_are_refused(ids, match):
    tracker = SuccessTracker()
    with pytest.raises(SeraOptError, match=match):
        tracker.update(ids, [1] * len(ids))


def test_keys_round_trip_through_the_index_state():
    for kind, keys in (("int", np.array([5, -3, 2**60], dtype=np.int64)),
                       ("int", np.arange(10, dtype=np.int64) * 3),
                       ("str", ["", "a", "日本", "😀x", "a\x00b"])):
        index = PromptIndex.from_state(kind, keys, len(keys), None)
        slots, missing = index.lookup(parse_prompt_ids(keys if kind == "str" else keys[::-1]))
        assert missing == 0
        expected = np.arange(len(keys)) if kind == "str" else np.arange(len(keys))[::-1]
        np.testing.assert_array_equal(slots, expected)
        back = index.keys()
        assert (back == list(keys)) if kind == "str" else np.array_equal(back, keys)
