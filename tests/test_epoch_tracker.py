"""EpochTracker: the authors' estimates (docs/theory.md, the authors' configuration).

The class is checked against a reference written plainly from the description (a dict
per prompt: decayed evidence S, F and the running epoch's pending counts s, f; at a
boundary S <- d S + s, F <- d F + f for every prompt), bit for bit, on generated
sequences of updates and boundaries.
"""

from __future__ import annotations

import copy
import math
import pickle
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_opt import EpochTracker, SeraOptError, SuccessTracker

# ----------------------------------------------------------------------------- reference


class Reference:
    """The estimator as the description states it, one prompt at a time."""

    def __init__(self, prior=(0.5, 0.5), discount=0.75, cold_start="batch"):
        self.a0, self.b0 = prior
        self.discount = discount
        self.cold_start = cold_start
        self.rows: dict = {}  # id -> [S, F, s, f, known]
        self.epoch = 0
        self.step = 0

    def update(self, ids, rewards):
        for key, reward in zip(ids, rewards, strict=True):
            row = self.rows.setdefault(key, [0.0, 0.0, 0, 0, False])
            if reward:
                row[2] += 1
            else:
                row[3] += 1
        self.step += 1

    def end_epoch(self):
        for row in self.rows.values():
            row[0] = self.discount * row[0] + row[2]
            row[1] = self.discount * row[1] + row[3]
            row[2] = row[3] = 0
            row[4] = True  # it had outcomes before this boundary
        self.epoch += 1

    def row(self, key):
        return self.rows.get(key, [0.0, 0.0, 0, 0, False])

    def estimate(self, key):
        S, F = self.row(key)[:2]
        return (self.a0 + S) / (self.a0 + self.b0 + S + F)

    def posterior(self, key):
        S, F = self.row(key)[:2]
        return self.a0 + S, self.b0 + F

    def known(self, key):
        return self.row(key)[4]

    def batch_is_cold(self, ids):
        return self.cold_start == "batch" and not all(self.known(k) for k in ids)


def assert_agrees(tracker: EpochTracker, reference: Reference, probe, where=""):
    """Every read of the tracker equals the reference's, exactly."""
    probe = list(probe)
    expected = np.array([reference.estimate(k) for k in probe], dtype=np.float64)
    np.testing.assert_array_equal(tracker.estimate(probe), expected,
                                  err_msg=f"estimates differ {where}")
    alpha, beta = tracker.posterior(probe)
    np.testing.assert_array_equal(alpha, [reference.posterior(k)[0] for k in probe],
                                  err_msg=f"posterior alpha differs {where}")
    np.testing.assert_array_equal(beta, [reference.posterior(k)[1] for k in probe],
                                  err_msg=f"posterior beta differs {where}")
    S, F = tracker.evidence(probe)
    np.testing.assert_array_equal(S, [reference.row(k)[0] for k in probe],
                                  err_msg=f"S differs {where}")
    np.testing.assert_array_equal(F, [reference.row(k)[1] for k in probe],
                                  err_msg=f"F differs {where}")
    s, f = tracker.pending(probe)
    np.testing.assert_array_equal(s, [reference.row(k)[2] for k in probe],
                                  err_msg=f"pending successes differ {where}")
    np.testing.assert_array_equal(f, [reference.row(k)[3] for k in probe],
                                  err_msg=f"pending failures differ {where}")
    np.testing.assert_array_equal(tracker.known(probe), [reference.known(k) for k in probe],
                                  err_msg=f"known differs {where}")
    for k in probe:
        assert tracker.batch_is_cold([k]) == reference.batch_is_cold([k]), (
            f"batch_is_cold([{k!r}]) differs {where}")
    assert tracker.batch_is_cold(probe) == reference.batch_is_cold(probe), where
    assert len(tracker) == len(reference.rows), f"prompt count differs {where}"
    assert tracker.epoch == reference.epoch and tracker.step == reference.step, where


# ----------------------------------------------------------------------------- histories

POOLS = {
    "int": list(range(7)),
    "sparse": [-3, 5, 2**40, -(2**50), 17, 10**15, 0],  # the index's hash table
    "str": ["a", "b", "prompt 3", "", "é", "b ", "long-prompt-id-6"],
}
UNSEEN = {"int": [99, 1000], "sparse": [2**41, -1], "str": ["never", "z"]}


def key(kind: str, i: int):
    return POOLS[kind][i]


# One operation: an update (rollouts as pool positions and rewards) or a boundary (None).
OPERATION = st.one_of(
    st.none(),
    st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=0, max_size=12),
)


def run(ops, kind, tracker, reference, check=False):
    for step, op in enumerate(ops):
        if op is None:
            tracker.end_epoch()
            reference.end_epoch()
        else:
            ids = [key(kind, i) for i, _ in op]
            rewards = [int(r) for _, r in op]
            # String ids both as a list and as a numpy str array.
            given_ids = np.asarray(ids, dtype=str) if kind == "str" and step % 2 else ids
            tracker.update(given_ids, rewards)
            reference.update(ids, rewards)
        if check:
            assert_agrees(tracker, reference, POOLS[kind] + UNSEEN[kind], f"after op {step}")


@pytest.mark.parametrize("kind", sorted(POOLS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPERATION, max_size=14),
       discount=st.sampled_from([0.75, 1.0, 0.5, 0.3, 0.999]),
       prior=st.sampled_from([(0.5, 0.5), (1.0, 1.0), (2.0, 0.25)]),
       cold_start=st.sampled_from(["batch", "prior"]))
def test_agrees_with_the_reference(kind, ops, discount, prior, cold_start):
    tracker = EpochTracker(prior=prior, discount=discount, cold_start=cold_start)
    reference = Reference(prior, discount, cold_start)
    run(ops, kind, tracker, reference, check=True)


@pytest.mark.parametrize("kind", sorted(POOLS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(OPERATION, max_size=10),
       updates=st.lists(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1,
                                 max_size=12), min_size=1, max_size=6))
def test_updates_within_an_epoch_change_no_estimate(kind, history, updates):
    tracker = EpochTracker()
    run(history, kind, tracker, Reference())
    probe = POOLS[kind] + UNSEEN[kind]
    before = (tracker.estimate(probe), *tracker.posterior(probe), *tracker.evidence(probe),
              tracker.known(probe))
    reads_before = tracker.estimate_and_repeats(probe, posterior=True)
    for op in updates:
        tracker.update([key(kind, i) for i, _ in op], [int(r) for _, r in op])
        after = (tracker.estimate(probe), *tracker.posterior(probe), *tracker.evidence(probe),
                 tracker.known(probe))
        for old, new in zip(before, after, strict=True):
            np.testing.assert_array_equal(new, old, err_msg="an update changed a frozen read")
    reads_after = tracker.estimate_and_repeats(probe, posterior=True)
    np.testing.assert_array_equal(reads_after[0], reads_before[0])
    np.testing.assert_array_equal(reads_after[3][0], reads_before[3][0])
    # The boundary is what moves them: every prompt updated above now has its outcomes.
    tracker.end_epoch()
    visited = sorted({i for op in updates for i, _ in op})
    assert tracker.known([key(kind, i) for i in visited]).all()
    pending = tracker.pending([key(kind, i) for i in visited])
    assert not pending[0].any() and not pending[1].any(), "a boundary left pending counts"


# ----------------------------------------------------------------------------- the bound


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 16), epochs=st.integers(1, 80),
       discount=st.floats(0.05, 0.99), alpha0=st.floats(0.05, 4.0), beta0=st.floats(0.05, 4.0),
       seed=st.integers(0, 2**31 - 1), rate=st.sampled_from([0.0, 1.0, 0.5, 0.9]))
def test_estimates_stay_within_the_bound_for_n_rollouts_per_epoch(n, epochs, discount, alpha0,
                                                                  beta0, seed, rate):
    """At most n rollouts per epoch carry less than n / (1 - d) of evidence, so
    p_hat lies in [a0 / (a0 + b0 + n / (1 - d)), 1 - b0 / (a0 + b0 + n / (1 - d))]."""
    rng = np.random.default_rng(seed)
    tracker = EpochTracker(prior=(alpha0, beta0), discount=discount)
    ids = np.arange(4)
    limit = n / (1 - discount)
    # A relative slack of 1e-12: the decayed sums converge to n / (1 - d) from below in
    # exact arithmetic, and may land one rounding step above it in floating point.
    low = alpha0 / (alpha0 + beta0 + limit) * (1 - 1e-12)
    high = 1 - beta0 / (alpha0 + beta0 + limit) * (1 - 1e-12)
    for _ in range(epochs):
        draws = rng.integers(0, n + 1, ids.size)  # at most n each, some skipped
        draws[0] = n  # one prompt at exactly n, every epoch
        rows = np.repeat(ids, draws)
        tracker.update(rows, rng.random(rows.size) < rate)
        tracker.end_epoch()
        p = tracker.estimate(ids)
        assert (p >= low).all() and (p <= high).all(), (p, low, high)
        S, F = tracker.evidence(ids)
        assert (S + F <= limit * (1 + 1e-12)).all(), "more evidence than n / (1 - d)"


@pytest.mark.parametrize("n", [1, 4, 16])
def test_the_authors_bound_is_one_over_two_plus_eight_n_and_is_approached(n):
    tracker = EpochTracker()  # Beta(1/2, 1/2), d = 0.75
    for _ in range(200):
        tracker.update([0] * n + [1] * n, [0] * n + [1] * n)
        tracker.end_epoch()
    low, high = tracker.estimate([0, 1])
    bound = 1 / (2 + 8 * n)
    assert bound * (1 - 1e-12) <= low <= bound * (1 + 1e-9), (low, bound)
    assert 1 - bound * (1 + 1e-9) <= high <= 1 - bound * (1 - 1e-12), (high, bound)


# ----------------------------------------------------------------------------- cold start


def test_batch_is_cold_in_both_modes():
    batch = EpochTracker(cold_start="batch")
    prior = EpochTracker(cold_start="prior")
    for tracker in (batch, prior):
        assert tracker.known([]).shape == (0,)
        tracker.update([1, 2, 2], [1, 0, 1])
    # Outcomes of the running epoch give no estimate yet.
    assert batch.batch_is_cold([1, 2]) and not prior.batch_is_cold([1, 2])
    assert not batch.known([1, 2]).any()
    for tracker in (batch, prior):
        tracker.end_epoch()
        tracker.update([3], [1])
    assert not batch.batch_is_cold([1, 2]) and not batch.batch_is_cold([2, 1, 2])
    assert batch.batch_is_cold([1, 3]), "a prompt seen only in this epoch has no estimate"
    assert batch.batch_is_cold([1, 77]), "an unseen prompt"
    assert not batch.batch_is_cold([]), "an empty batch holds no unknown prompt"
    for ids in ([1, 2], [1, 3], [1, 77], []):
        assert not prior.batch_is_cold(ids)
    assert batch.known([1, 2, 3, 77]).tolist() == [True, True, False, False]
    assert prior.known([1, 2, 3, 77]).tolist() == [True, True, False, False]
    # Either way, a prompt not known reads the prior mean.
    for tracker in (batch, prior):
        assert tracker.estimate([3, 77]).tolist() == [0.5, 0.5]
    skewed = EpochTracker(prior=(1.0, 3.0), cold_start="prior")
    assert skewed.estimate(["new"]).tolist() == [0.25]
    assert batch.cold_start == "batch" and prior.cold_start == "prior"


def test_a_prompt_skipped_for_epochs_stays_known_and_decays():
    tracker = EpochTracker(discount=0.5)
    tracker.update(["a", "a", "b"], [1, 1, 0]).end_epoch()
    for _ in range(3):
        tracker.update(["b"], [0]).end_epoch()
    S, F = tracker.evidence(["a", "b"])
    assert S.tolist() == [2 * 0.5**3, 0.0] and F.tolist() == [0.0, 1 + 0.5 + 0.25 + 0.125]
    assert tracker.known(["a", "b"]).all() and not tracker.batch_is_cold(["a", "b"])


# ----------------------------------------------------------------------------- the planner's reads


@pytest.mark.parametrize("ids", [
    [3, 1, 2], [3, 1, 3, 2, 1, 1], [5, 9], [1], [], [1, 1], ["a", "b", "a"], ["a", "q", "q"],
    [2**40, -7, 2**40],
])
@pytest.mark.parametrize("posterior", [False, True])
def test_estimate_and_repeats_keeps_the_success_trackers_contract(ids, posterior):
    strings = bool(ids) and isinstance(ids[0], str)
    seen = ["a", "b", "c"] if strings else [1, 2, 3, 2**40, -7]
    epoch, success = EpochTracker(prior=(1.0, 1.0), discount=1.0), SuccessTracker(prior=(1, 1))
    for tracker in (epoch, success):
        tracker.update(seen, [1, 0, 1, 0, 1][:len(seen)])
    epoch.end_epoch()
    mine = epoch.estimate_and_repeats(ids, posterior=posterior)
    theirs = success.estimate_and_repeats(ids, posterior=posterior)
    assert len(mine) == 4
    np.testing.assert_allclose(mine[0], theirs[0], rtol=1e-15)
    assert mine[0].dtype == np.float64 and mine[0].shape == (len(ids),)
    assert mine[1] == theirs[1] and mine[2] == theirs[2], (mine[1:3], theirs[1:3])
    if posterior:
        for a, b in zip(mine[3], theirs[3], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-15)
    else:
        assert mine[3] is None
    assert EpochTracker.repeated_ids(ids) == SuccessTracker.repeated_ids(ids)
    assert epoch.prior_params() == (1.0, 1.0)


@pytest.mark.parametrize("rewards", [
    [0.5, 1.0], [float("nan"), 1.0], [1], [[1], [0]], ["1", "0"], [1 + 0j, 0j],
])
def test_rewards_are_checked_as_the_success_tracker_checks_them(rewards):
    tracker = EpochTracker().update([0, 1], [1, 0])
    before = tracker.state_dict()
    for t in (tracker, SuccessTracker()):
        with pytest.raises(SeraOptError):
            t.update([0, 1], rewards)
    assert_same_state(tracker.state_dict(), before)


def test_rewards_message_names_this_tracker_and_thresholds_count_alike():
    with pytest.raises(SeraOptError, match="to EpochTracker"):
        EpochTracker().update([0], [0.5])
    rewards = [0.2, 0.7, 1.0, 0.0, 0.5]
    for threshold in (0.5, None):
        values = rewards if threshold is not None else [True, False, True, True, False]
        mine = EpochTracker(success_threshold=threshold).update([1, 1, 2, 2, 3], values)
        theirs = SuccessTracker(success_threshold=threshold).update([1, 1, 2, 2, 3], values)
        s, f = mine.pending([1, 2, 3])
        S, F = theirs.evidence([1, 2, 3])
        assert s.tolist() == S.tolist() and f.tolist() == F.tolist()


def test_ids_are_read_as_the_success_tracker_reads_them():
    tracker = EpochTracker().update([1, 2], [1, 0])
    with pytest.raises(SeraOptError, match="one kind of id"):
        tracker.update(["a"], [1])
    for bad, match in (("abc", "single string"), ([1.5, 2.0], "got floats"),
                       ([True, False], "got booleans"), (np.zeros((2, 1), dtype=int), "1-D")):
        with pytest.raises(SeraOptError, match=match):
            tracker.update(bad, [1, 0])
    with pytest.raises(SeraOptError, match="one entry per rollout"):
        tracker.update([1, 2, 3], [1, 0])
    assert tracker.step == 1 and len(tracker) == 2


# ----------------------------------------------------------------------------- checkpoints


def assert_same_state(a, b):
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            assert type(x) is type(y) and x == y, (name, x, y)


@pytest.mark.parametrize("kind", sorted(POOLS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(OPERATION, max_size=10), more=st.lists(OPERATION, max_size=6),
       cold_start=st.sampled_from(["batch", "prior"]))
def test_state_round_trips_with_pending_evidence(kind, history, more, cold_start):
    tracker = EpochTracker(discount=0.6, cold_start=cold_start)
    reference = Reference(discount=0.6, cold_start=cold_start)
    run(history, kind, tracker, reference)
    state = tracker.state_dict()
    restored = EpochTracker.from_state_dict(state)
    loaded = EpochTracker(discount=0.6, cold_start=cold_start).load_state_dict(state)
    copied = pickle.loads(pickle.dumps(tracker))
    deep = copy.deepcopy(tracker)
    for other in (restored, loaded, copied, deep):
        assert_same_state(other.state_dict(), state)
        # It resumes where the original was, the running epoch's outcomes included.
        twin = copy.deepcopy(reference)
        run(more, kind, other, twin)
        assert_agrees(other, twin, POOLS[kind] + UNSEEN[kind], "after resuming")
    assert_same_state(tracker.state_dict(), state)  # reading the state changed nothing


def good_state():
    tracker = EpochTracker(discount=0.5)
    tracker.update(["a", "b", "b"], [1, 0, 1]).end_epoch()
    tracker.update(["a", "c"], [0, 1])  # "c" pending only
    return tracker.state_dict()


def _set(name, value):
    def change(state):
        state[name] = value
    return change


def _config(name, value):
    def change(state):
        state["config"] = {**state["config"], name: value}
    return change


def _row(name, index, value):
    def change(state):
        state[name] = state[name].copy()
        state[name][index] = value
    return change


CORRUPTIONS = [
    (_set("format", "sera_opt.SuccessTracker/2"), "not an EpochTracker state"),
    (lambda s: s.pop("known"), "keys differ"),
    (_set("extra", 1), "keys differ"),
    (_set("config", [0.5, 0.5]), "config must be a dict"),
    (lambda s: s["config"].pop("discount"), "config keys differ"),
    (_config("discount", 1.5), "discount must lie in"),
    (_config("prior", [0.5, -1.0]), "alpha0 > 0"),
    (_config("cold_start", "fit"), "cold_start must be"),
    (_set("id_kind", "dense"), "id_kind must be"),
    (_set("id_kind", "int"), "int"),
    (_set("keys", ["a", "a", "c"]), "duplicate prompt id"),
    (_set("keys", ["a", "b"]), "one key per prompt"),
    (_set("successes", np.array([1.0, 1.0])), "one row per prompt"),
    (_set("failures", "oops"), "failures must be an array"),
    (_row("successes", 0, float("nan")), "NaN or inf"),
    (_row("failures", 1, -0.5), "must be >= 0"),
    (_row("pending_successes", 2, 0.5), "whole numbers"),
    (_row("pending_failures", 0, float("inf")), "NaN or inf"),
    (_set("known", 4), "known must lie in"),
    (_set("known", -1), "known must be a non-negative integer"),
    (_set("known", 3), "less evidence than one outcome"),  # "c" known with S = F = 0
    (_set("known", 1), "folded evidence"),  # "b" has folded evidence past known
    (_set("epoch", 0), "known at epoch 0"),
    (_set("step", 1.0), "step must be a non-negative integer"),
    (_row("pending_successes", 2, 0.0), "no pending outcome"),
]


@pytest.mark.parametrize(("change", "match"), CORRUPTIONS)
def test_corrupt_states_are_refused_and_change_nothing(change, match):
    tracker = EpochTracker(discount=0.5).update(["z"], [1])
    before = tracker.state_dict()
    state = good_state()
    EpochTracker.from_state_dict(copy.deepcopy(state))  # the uncorrupted state loads
    change(state)
    with pytest.raises(SeraOptError, match=match):
        EpochTracker.from_state_dict(state)
    with pytest.raises(SeraOptError, match=match):
        tracker.load_state_dict(state)
    assert_same_state(tracker.state_dict(), before)
    assert "SuccessTracker state" not in str(pytest.raises(
        SeraOptError, EpochTracker.from_state_dict, state).value)


@pytest.mark.parametrize(("option", "mine", "theirs"), [
    ("prior", (1.0, 1.0), (0.5, 0.5)),
    ("discount", 1.0, 0.75),
    ("cold_start", "prior", "batch"),
    ("success_threshold", 0.5, None),
])
def test_load_refuses_another_configuration_and_names_the_fix(option, mine, theirs):
    saved = EpochTracker(**{option: theirs}).update([1, 2], [1, 0]).end_epoch().state_dict()
    tracker = EpochTracker(**{option: mine}).update([3], [1])
    before = tracker.state_dict()
    with pytest.raises(SeraOptError) as info:
        tracker.load_state_dict(saved)
    message = str(info.value)

    def shown(value):
        return repr(list(value)) if option == "prior" else repr(value)

    assert f"{option}={shown(theirs)} in the state" in message, message
    assert f"{option}={shown(mine)} here" in message, message
    assert "Build the tracker with the state's configuration" in message, message
    assert "EpochTracker.from_state_dict(state)" in message, message
    assert_same_state(tracker.state_dict(), before)
    # The fix the message names works.
    assert EpochTracker.from_state_dict(saved).config()[option] == saved["config"][option]
    EpochTracker(**{**saved["config"], "prior": tuple(saved["config"]["prior"])}
                 ).load_state_dict(saved)


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(("options", "match"), [
    ({"discount": 0.0}, r"discount must lie in \(0, 1\]"),
    ({"discount": 1.0001}, r"discount must lie in \(0, 1\]"),
    ({"discount": -0.5}, r"discount must lie in \(0, 1\]"),
    ({"discount": float("nan")}, r"discount must lie in \(0, 1\]"),
    ({"discount": "0.75"}, "discount must be a number"),
    ({"discount": True}, "discount must be a number"),
    ({"prior": (0.5,)}, "prior must be a pair"),
    ({"prior": "fit"}, "prior must be a pair"),
    ({"prior": 0.5}, "prior must be a pair"),
    ({"prior": (0.5, 0.0)}, "alpha0 > 0 and beta0 > 0"),
    ({"prior": (-1.0, 1.0)}, "alpha0 > 0 and beta0 > 0"),
    ({"prior": (float("inf"), 1.0)}, "alpha0 > 0 and beta0 > 0"),
    ({"prior": (1e300, 1e300)}, "above the limit"),
    ({"prior": ("a", 1.0)}, "must be numbers"),
    ({"cold_start": "uniform"}, "cold_start must be 'batch'"),
    ({"cold_start": None}, "cold_start must be 'batch'"),
    ({"success_threshold": float("nan")}, "success_threshold must be finite"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(SeraOptError, match=match):
        EpochTracker(**options)


def test_config_round_trips_and_defaults_are_the_authors():
    tracker = EpochTracker()
    assert tracker.config() == {"prior": [0.5, 0.5], "discount": 0.75, "cold_start": "batch",
                                "success_threshold": None}
    assert tracker.prior_params() == (0.5, 0.5)
    again = EpochTracker(**tracker.config())
    assert again.config() == tracker.config()
    other = EpochTracker(prior=(1, 3), discount=1, cold_start="prior", success_threshold=0.5)
    assert EpochTracker(**other.config()).config() == other.config()
    assert "discount=1.0" in repr(other) and "cold_start='prior'" in repr(other)


# ----------------------------------------------------------------------------- threads

THREADS = 4
ROUNDS = 30


def test_shared_between_threads():
    """Updates with overlapping new ids, boundaries and reads from several threads: no
    update is lost, every id has one slot, and every read is of one consistent state."""
    tracker = EpochTracker(discount=1.0)  # with no forgetting the totals are exact
    fed: list[list] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS + 1)

    def work(k):
        rng = np.random.default_rng(k)
        try:
            for round_ in range(ROUNDS):
                ids = [f"p{i}" for i in rng.integers(0, 16, 24) + 16 * round_]
                rewards = rng.integers(0, 2, len(ids))
                if round_ % 5 == 0:
                    barrier.wait()
                tracker.update(ids, rewards)
                fed[k].append((ids, rewards))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
            barrier.abort()

    def boundaries():
        try:
            for round_ in range(ROUNDS):
                if round_ % 5 == 0:
                    barrier.wait()
                tracker.end_epoch()
                probe = [f"p{i}" for i in range(0, 16 * ROUNDS, 7)]
                p = tracker.estimate(probe)
                alpha, beta = tracker.posterior(probe)
                assert ((p > 0) & (p < 1)).all()
                assert ((alpha >= 0.5) & (beta >= 0.5)).all()
                # Known prompts and their evidence come from one state.
                S, F = tracker.evidence(probe)
                known = tracker.known(probe)
                assert not (S + F)[~known].any(), "evidence on a prompt not known"
                assert ((S + F)[known] >= 1).all(), "a known prompt without evidence"
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
            barrier.abort()

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
        threads.append(threading.Thread(target=boundaries))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    assert not errors, f"a thread failed: {errors[0]!r}"
    tracker.end_epoch()
    totals: dict = {}
    for batches in fed:
        for ids, rewards in batches:
            for k, r in zip(ids, rewards.tolist(), strict=True):
                s, f = totals.get(k, (0, 0))
                totals[k] = (s + r, f + 1 - r)
    assert tracker.step == THREADS * ROUNDS, "an update was lost or counted twice"
    assert tracker.epoch == ROUNDS + 1
    assert len(tracker) == len(totals), "an id got two slots"
    keys = sorted(totals)
    S, F = tracker.evidence(keys)
    assert S.tolist() == [totals[k][0] for k in keys]
    assert F.tolist() == [totals[k][1] for k in keys]
    assert tracker.known(keys).all()
    restored = EpochTracker.from_state_dict(tracker.state_dict())
    assert restored.estimate(keys).tolist() == tracker.estimate(keys).tolist()
    assert math.isclose(float(tracker.estimate(keys).min()), float(
        min((0.5 + s) / (1 + s + f) for s, f in totals.values())), rel_tol=1e-15)
