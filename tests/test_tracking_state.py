"""SuccessTracker checkpoints: loading is all or nothing, and every field is checked."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_opt import SeraOptError, SuccessTracker
from tests.test_tracking_fit import assert_fit_matches

KINDS = ("dense", "int", "str", "hash")


def key_of(kind, i):
    return {"str": f"q{i}", "hash": i * 1_000_003 - 2**45}.get(kind, int(i))


def make_tracker(kind="int", decay=1.0, prior="fit", seed=0, steps=6, prompts=30):
    rng = np.random.default_rng(seed)
    tracker = SuccessTracker(decay=decay, prior=prior, min_fit_prompts=3,
                             num_prompts=prompts if kind == "dense" else None)
    for _ in range(steps):
        chosen = rng.choice(prompts, rng.integers(1, 12), replace=False)
        ids = np.repeat(chosen, rng.integers(1, 5, chosen.size))
        tracker.update([key_of(kind, i) for i in ids], (rng.random(ids.size) < 0.5).tolist())
    return tracker


def same(a, b) -> bool:
    """Deep equality of states: arrays by value and dtype, floats with NaN == NaN."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and \
            bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def probe_ids(tracker):
    state = tracker.state_dict()
    if state["id_kind"] == "dense":
        return list(range(min(tracker.num_prompts, 20)))
    keys = state["keys"]
    return list(keys[:20]) if keys is not None else []


def assert_works(tracker, where=""):
    """The tracker estimates, updates and keeps its invariants."""
    ids = probe_ids(tracker)
    if not ids:  # no prompt yet: any id of the tracker's kind
        kind = tracker.state_dict()["id_kind"]
        ids = [0] if kind == "dense" else (["fresh"] if kind == "str" else [10**12])
    est = tracker.estimate(ids)
    assert np.all((est > 0) & (est < 1)), where
    tracker.update(ids, [1] * len(ids))
    if tracker.prior == "fit":
        assert_fit_matches(tracker, where)
    assert_invariants(tracker.state_dict())


def assert_invariants(state):
    """An independent reading of what a valid state is."""
    config = state["config"]
    kind, keys = state["id_kind"], state["keys"]
    s, f, last = state["successes"], state["failures"], state["last_step"]
    n = s.shape[0]
    assert f.shape == (n,) and last.shape == (n,)
    assert s.dtype == f.dtype == np.float64 and last.dtype == np.int64
    assert np.isfinite(s).all() and np.isfinite(f).all() and (s >= 0).all() and (f >= 0).all()
    assert (last >= 0).all() and (last <= state["step"]).all()
    assert (s[last == 0] == 0).all() and (f[last == 0] == 0).all()
    assert (s[last > 0] + f[last > 0] >= 1).all()
    if kind == "dense":
        assert keys is None and config["num_prompts"] == n
    elif kind is None:
        assert keys is None and n == 0 and config["num_prompts"] is None
    else:
        assert config["num_prompts"] is None and len(keys) == n
        assert len(set(np.asarray(keys).tolist())) == n
        assert (last > 0).all()
        assert all(isinstance(k, str) for k in keys) if kind == "str" else \
            np.asarray(keys).dtype == np.int64
    assert ("prior_moments" in state) == (config["prior"] == "fit")


def assert_rejected_unchanged(tracker, bad, match=None):
    before = copy.deepcopy(tracker.state_dict())
    with pytest.raises(SeraOptError, match=match):
        tracker.load_state_dict(bad)
    with pytest.raises(SeraOptError, match=match):
        SuccessTracker.from_state_dict(bad)
    assert same(tracker.state_dict(), before), "a rejected state changed the tracker"
    assert_works(tracker, "after a rejected load")


# --------------------------------------------------------------------------- concrete cases

def _dup_keys(state):
    state["keys"][1] = state["keys"][0]


def _nan_successes(state):
    state["successes"][0] = np.nan


def _negative_failures(state):
    state["failures"][0] = -1.0


def _inf_failures(state):
    state["failures"][-1] = np.inf


def _last_after_step(state):
    state["last_step"][0] = state["step"] + 1


def _negative_last(state):
    state["last_step"][0] = -1


def _float_last(state):
    state["last_step"] = state["last_step"].astype(float)


def _evidence_never_updated(state):
    state["last_step"][0] = 0


def _too_few_rollouts(state):
    state["successes"][0], state["failures"][0] = 0.25, 0.25


def _keys_short(state):
    state["keys"] = state["keys"][:-1]


def _failures_short(state):
    state["failures"] = state["failures"][:-1]


def _moments_scaled(state):
    state["prior_moments"]["sums"][4] += 1.0 + abs(state["prior_moments"]["sums"][4])


def _moments_nan(state):
    state["prior_moments"]["sums"][8] = np.nan


def _shift_outside(state):
    state["prior_moments"]["shift"] = 1.5


def _base_after_step(state):
    state["prior_moments"]["base_step"] = state["step"] + 1


def _missing_field(state):
    del state["last_step"]


def _extra_field(state):
    state["note"] = "hello"


def _bad_decay(state):
    state["config"]["decay"] = 0.0


def _unknown_config(state):
    state["config"]["colour"] = "blue"


def _negative_step(state):
    state["step"] = -1


def _bool_step(state):
    state["step"] = True


@pytest.mark.parametrize("kind, mutate, match", [
    ("int", _dup_keys, "duplicate prompt id"),
    ("str", _dup_keys, "duplicate prompt id"),
    ("hash", _dup_keys, "duplicate prompt id"),
    ("int", _nan_successes, "NaN"),
    ("dense", _negative_failures, "negative"),
    ("str", _inf_failures, "NaN or inf"),
    ("int", _last_after_step, r"last_step must lie in \[0, step"),
    ("dense", _negative_last, "last_step must lie"),
    ("int", _float_last, "integers"),
    ("int", _evidence_never_updated, "evidence on a prompt with last_step 0|without evidence"),
    ("str", _too_few_rollouts, "fewer than one rollout"),
    ("int", _keys_short, "one key per prompt"),
    ("dense", _failures_short, "one entry per prompt"),
    ("int", _moments_scaled, "do not match the evidence"),
    ("dense", _moments_nan, "finite"),
    ("str", _shift_outside, "shift"),
    ("int", _base_after_step, "do not fit the clock"),
    ("int", _missing_field, "missing"),
    ("dense", _extra_field, "unknown"),
    ("int", _bad_decay, "decay"),
    ("str", _unknown_config, "config keys"),
    ("int", _negative_step, "step must be a non-negative integer"),
    ("dense", _bool_step, "step must be a non-negative integer"),
])
def test_corrupt_states_are_rejected_and_change_nothing(kind, mutate, match):
    bad = make_tracker(kind, decay=0.9, seed=1).state_dict()
    mutate(bad)
    target = make_tracker("int", seed=2)
    assert_rejected_unchanged(target, bad, match)


@pytest.mark.parametrize("change, match", [
    (lambda s: s.update(id_kind="str"), "str ids need str keys|list of keys"),
    (lambda s: s.update(id_kind="dense"), "num_prompts"),
    (lambda s: s.update(id_kind=None), "stores no keys"),
    (lambda s: s.update(keys=[str(k) for k in s["keys"]]), "integer keys"),
    (lambda s: s.update(id_kind="unicorn"), "id_kind must be"),
])
def test_key_kind_mismatches_are_rejected(change, match):
    bad = make_tracker("int").state_dict()
    change(bad)
    assert_rejected_unchanged(make_tracker("dense", seed=3), bad, match)


def test_dense_size_mismatch_is_rejected():
    bad = make_tracker("dense", prompts=30).state_dict()
    bad["config"]["num_prompts"] = 31
    assert_rejected_unchanged(make_tracker("str", seed=4), bad, "evidence rows|num_prompts")


def test_a_rejected_load_leaves_a_planner_usable():
    # The planner restores its tracker through load_state_dict: a corrupt tracker state must
    # leave its tracker as it was.
    from sera_opt import RolloutPlanner

    planner = RolloutPlanner("uniform", tracker=make_tracker("int", seed=5))
    ids = probe_ids(planner.tracker)
    before = copy.deepcopy(planner.tracker.state_dict())
    estimates = planner.tracker.estimate(ids)
    state = planner.state_dict()
    state["tracker"]["successes"][0] = np.nan
    with pytest.raises(SeraOptError):
        planner.load_state_dict(state)
    assert same(planner.tracker.state_dict(), before)
    np.testing.assert_array_equal(planner.tracker.estimate(ids), estimates)
    assert planner.plan(ids, 4 * len(ids)).counts.sum() == 4 * len(ids)
    planner.observe(ids, [1] * len(ids))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("decay", [1.0, 0.8])
def test_from_state_dict_restores_bit_for_bit(kind, decay):
    tracker = make_tracker(kind, decay=decay, seed=6, steps=9)
    state = pickle.loads(pickle.dumps(tracker.state_dict()))
    restored = SuccessTracker.from_state_dict(state)
    assert same(restored.state_dict(), tracker.state_dict())
    rng = np.random.default_rng(7)
    for _ in range(30):  # and both continue identically, expiries and rebases included
        ids = [key_of(kind, i) for i in rng.integers(0, 30, 15)]
        rewards = rng.integers(0, 2, 15)
        tracker.update(ids, rewards)
        restored.update(ids, rewards)
        assert restored.prior_params() == tracker.prior_params()
    assert same(restored.state_dict(), tracker.state_dict())


def test_states_of_format_1_load_with_rebuilt_moments():
    tracker = make_tracker("str", decay=0.9, seed=8)
    state = tracker.state_dict()
    del state["prior_moments"]
    state["format"] = "sera_opt.SuccessTracker/1"
    restored = SuccessTracker.from_state_dict(state)
    a, b = restored.prior_params()
    ra, rb = tracker.prior_params()
    assert a == pytest.approx(ra, rel=1e-12) and b == pytest.approx(rb, rel=1e-12)
    np.testing.assert_allclose(restored.estimate(probe_ids(tracker)),
                               tracker.estimate(probe_ids(tracker)), rtol=1e-12)
    assert_works(restored)


# --------------------------------------------------------------------------- property test

JUNK = [None, "x", 3.5, -1, True, [], {}, float("nan"), [1.5, "a"], np.zeros((2, 2))]
FIELDS = ["format", "config", "id_kind", "keys", "successes", "failures", "last_step", "step",
          "prior_moments"]


def mutate(state, choice, index, junk):
    """One corruption (or a harmless change) of a real state, chosen by ``choice``."""
    n = len(state["successes"])
    i = index % max(n, 1)
    arrays = [k for k in ("successes", "failures", "last_step") if n]
    if choice == 0:
        field = FIELDS[index % len(FIELDS)]
        if field in state:
            state[field] = junk
    elif choice == 1 and arrays:
        field = arrays[index % len(arrays)]
        values = [-1, 2**62, -(2**40)] if field == "last_step" else [np.nan, -1, np.inf, -0.5,
                                                                       1e300]
        state[field][i] = values[index % len(values)]
    elif choice == 2 and n:
        state["last_step"][i] = state["step"] + 1 + index % 3
    elif choice == 3 and state["keys"] is not None and n > 1:
        state["keys"][i] = state["keys"][(i + 1) % n]
    elif choice == 4:
        field = ["successes", "failures", "last_step", "keys"][index % 4]
        if state[field] is not None and len(state[field]):
            state[field] = state[field][:-1]
    elif choice == 5:
        state["id_kind"] = [None, "dense", "int", "str", "other"][index % 5]
    elif choice == 6:
        field = FIELDS[index % len(FIELDS)]
        state.pop(field, None) if index % 2 else state.update({f"extra{index}": junk})
    elif choice == 7:
        state["step"] = max(state["step"] + [-1, 5, -100][index % 3], -1)
    elif choice == 8:
        option, value = [("num_prompts", 7), ("decay", 1.5), ("prior", [1.0, 2.0]),
                         ("prior", "fit"), ("min_fit_prompts", 1), ("fallback_prior", [0, 1]),
                         ("success_threshold", "high"), ("max_prior_strength", 1e-9),
                         ("decay", 0.5)][index % 9]
        state["config"][option] = value
    elif choice == 9 and "prior_moments" in state:
        moments = state["prior_moments"]
        part = index % 5
        if part < 2:
            moments["sums"][(index // 5) % 10] *= [1 + 1e-6, -3.0][part]
        elif part == 2:
            moments["shift"] = [1.2, -0.1, np.nan][index % 3]
        else:
            moments["base_step" if part == 3 else "refresh_step"] = state["step"] + 1
    elif choice == 10 and n:
        state["successes"], state["failures"] = state["failures"], state["successes"]
    elif choice == 11 and state["keys"] is not None:
        state["keys"] = np.asarray(state["keys"]).astype(object if index % 2 else str)
    elif choice == 12 and "prior_moments" in state:
        del state["prior_moments"]
        state["format"] = "sera_opt.SuccessTracker/1"
    return state


tracker_spec = st.tuples(st.sampled_from(KINDS), st.sampled_from([1.0, 0.9, 0.5]),
                         st.sampled_from(["fit", (1.0, 2.0)]), st.integers(0, 2**16),
                         st.integers(0, 8))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tracker_spec, tracker_spec, st.integers(0, 12), st.integers(0, 10**6),
       st.sampled_from(JUNK))
def test_any_mutated_state_loads_valid_or_changes_nothing(source, target, choice, index, junk):
    kind, decay, prior, seed, steps = source
    state = mutate(copy.deepcopy(make_tracker(kind, decay, prior, seed, steps).state_dict()),
                   choice, index, junk)
    tracker = make_tracker(*target)
    before = copy.deepcopy(tracker.state_dict())
    try:
        tracker.load_state_dict(state)
    except SeraOptError:
        assert same(tracker.state_dict(), before), "a rejected state changed the tracker"
        assert_works(tracker, "after a rejected load")
    else:
        assert_invariants(tracker.state_dict())
        assert_works(tracker, "after an accepted load")
