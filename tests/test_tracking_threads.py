"""SuccessTracker and RolloutPlanner shared between threads.

Several threads update one tracker (or observe through one planner) with
overlapping ids that none of them has seen before; afterwards every id has one
slot, the evidence adds up to what was fed, and the state round-trips. Python
switches threads every few microseconds here (``sys.setswitchinterval``), so
without the lock a check-then-insert of a new id is interleaved in most runs.
"""

from __future__ import annotations

import copy
import pickle
import sys
import threading

import numpy as np
import pytest

from sera_opt import RolloutPlanner, SuccessTracker

THREADS = 4
ROUNDS = 30
BATCH = 48


def _ids(kind: str, rng: np.random.Generator, round_: int) -> np.ndarray:
    # Each round brings new ids, drawn so that the threads' batches overlap.
    base = rng.integers(0, 24, BATCH) + 24 * round_
    if kind == "str":
        return np.asarray([f"prompt-{i}" for i in base], dtype=str)
    if kind == "sparse":
        return base.astype(np.int64) * 1_000_003_337 - 2**40
    return base.astype(np.int64)


def _hammer(kind: str, feed) -> tuple[dict, int]:
    """Run THREADS threads through ``feed(ids, rewards)``; return what each fed, per id."""
    barrier = threading.Barrier(THREADS)
    fed: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        try:
            for round_ in range(ROUNDS):
                ids = _ids(kind, rng, round_)
                rewards = rng.integers(0, 2, ids.size)
                if round_ % 3 == 0:
                    barrier.wait()  # line the threads up on a round of new ids
                feed(ids, rewards)
                fed[k].append((ids, rewards))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
            barrier.abort()

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    assert not errors, f"a thread failed: {errors[0]!r}"
    totals: dict = {}
    for batches in fed:
        for ids, rewards in batches:
            for key, r in zip(ids.tolist(), rewards.tolist()):
                s, f = totals.get(key, (0, 0))
                totals[key] = (s + r, f + 1 - r)
    return totals, THREADS * ROUNDS


def _check(tracker: SuccessTracker, totals: dict, updates: int, kind: str) -> None:
    assert tracker.step == updates, "an update was lost or counted twice"
    assert len(tracker) == len(totals), (
        f"{len(tracker)} slots for {len(totals)} distinct ids: an id got two slots")
    state = tracker.state_dict()
    keys = list(state["keys"])
    assert len(set(keys)) == len(keys), "an id holds two slots"
    keys_in = np.asarray(list(totals), dtype=str if kind == "str" else np.int64)
    s, f = tracker.evidence(keys_in)
    want_s = np.array([totals[k][0] for k in totals], dtype=np.float64)
    want_f = np.array([totals[k][1] for k in totals], dtype=np.float64)
    np.testing.assert_array_equal(s, want_s, err_msg="successes lost or double-counted")
    np.testing.assert_array_equal(f, want_f, err_msg="failures lost or double-counted")
    assert state["successes"].sum() == want_s.sum()
    assert state["failures"].sum() == want_f.sum()
    restored = SuccessTracker().load_state_dict(state)
    np.testing.assert_array_equal(restored.estimate(keys_in), tracker.estimate(keys_in))


@pytest.mark.parametrize("kind", ["str", "sparse", "int"])
def test_concurrent_updates_with_new_ids(kind):
    tracker = SuccessTracker()
    tracker.update(_ids(kind, np.random.default_rng(99), 0)[:1], [1])  # compile first
    tracker = SuccessTracker()
    totals, updates = _hammer(kind, tracker.update)
    _check(tracker, totals, updates, kind)


@pytest.mark.parametrize("kind", ["str", "sparse"])
def test_concurrent_observe_and_plan_through_one_planner(kind):
    planner = RolloutPlanner(max_rollouts=16)
    reads: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        rng = np.random.default_rng(7)
        try:
            while not done.is_set():
                ids = np.unique(_ids(kind, rng, int(rng.integers(0, ROUNDS))))[:8]
                counts = planner.plan(ids, budget=8 * 4).counts
                assert counts.sum() == 32
                planner.tracker.state_dict()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            reads.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        totals, updates = _hammer(kind, planner.observe)
    finally:
        done.set()
        reader.join()
    assert not reads, f"a reader failed: {reads[0]!r}"
    _check(planner.tracker, totals, updates, kind)


def test_a_tracker_and_a_planner_still_pickle_and_copy():
    planner = RolloutPlanner(max_rollouts=16)
    planner.observe(["a", "a", "b"], [1, 0, 1])
    for clone in (pickle.loads(pickle.dumps(planner)), copy.deepcopy(planner),
                  copy.copy(planner)):
        np.testing.assert_array_equal(clone.tracker.estimate(["a", "b", "c"]),
                                      planner.tracker.estimate(["a", "b", "c"]))
        clone.observe(["c"], [1])  # the copy has a working lock of its own
    tracker = pickle.loads(pickle.dumps(planner.tracker))
    tracker.update(["a"], [1])
    assert tracker.evidence(["a"])[0].tolist() == [2.0]
    assert planner.tracker.evidence(["a"])[0].tolist() == [1.0]
