"""SuccessTracker: posterior arithmetic, decay, the fitted prior, ids, checkpoints, errors."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_opt import SeraOptError, SuccessTracker


def test_posterior_arithmetic_by_hand():
    tracker = SuccessTracker(prior=(1.0, 2.0))
    tracker.update(["a", "a", "b", "a"], [1, 0, 1, 1])
    alpha, beta = tracker.posterior(["a", "b", "never"])
    assert alpha.tolist() == [3.0, 2.0, 1.0]
    assert beta.tolist() == [3.0, 2.0, 2.0]
    assert tracker.estimate(["a", "b", "never"]).tolist() == [0.5, 0.5, 1 / 3]
    s, f = tracker.evidence(["b", "a"])
    assert s.tolist() == [1.0, 2.0] and f.tolist() == [0.0, 1.0]


def test_decay_by_hand():
    tracker = SuccessTracker(prior=(1.0, 1.0), decay=0.5)
    tracker.update([7, 7], [1, 1])  # step 1: s = 2
    tracker.update([8], [0])  # step 2: prompt 7 untouched; its evidence halves lazily
    tracker.update([7], [0])  # step 3: s = 2 * 0.25, f = 1
    s, f = tracker.evidence([7, 8])
    assert s.tolist() == [0.5, 0.0]
    assert f.tolist() == [1.0, 0.5]
    assert tracker.posterior([7])[0].tolist() == [1.5]
    assert tracker.step == 3


def reference_evidence(batches, decay):
    """Eager decay over a dict: every update multiplies all evidence by decay first."""
    evidence = {}
    for ids, rewards in batches:
        for key in evidence:
            evidence[key] = [evidence[key][0] * decay, evidence[key][1] * decay]
        for key, r in zip(ids, rewards):
            e = evidence.setdefault(key, [0.0, 0.0])
            e[0] += r
            e[1] += 1 - r
    return evidence


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.integers(-3, 12), st.integers(0, 1)), max_size=12),
                min_size=1, max_size=6),
       st.sampled_from([1.0, 0.9, 0.5]), st.sampled_from(["int", "str", "dense"]))
def test_lazy_decay_equals_eager_reference(batches, decay, kind):
    def key(i):
        return f"p{i}" if kind == "str" else (i + 3 if kind == "dense" else i)

    tracker = SuccessTracker(decay=decay, num_prompts=16 if kind == "dense" else None)
    plain = []
    for batch in batches:
        ids = [key(i) for i, _ in batch]
        rewards = [r for _, r in batch]
        tracker.update(ids if ids or kind == "str" else np.array([], dtype=np.int64), rewards)
        plain.append((ids, rewards))
    ref = reference_evidence(plain, decay)
    keys = sorted(ref, key=str)
    if keys:
        s, f = tracker.evidence(keys)
        np.testing.assert_allclose(s, [ref[k][0] for k in keys], rtol=1e-12)
        np.testing.assert_allclose(f, [ref[k][1] for k in keys], rtol=1e-12)


def test_evidence_matches_bincount_at_scale():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50_000, 200_000)
    rewards = rng.integers(0, 2, ids.size)
    for tracker, keys in ((SuccessTracker(), ids), (SuccessTracker(num_prompts=50_000), ids),
                          (SuccessTracker(), ids * 7_919_000_003 - 2**40)):
        tracker.update(keys, rewards)
        tracker.update(keys[:1000], rewards[:1000])
        wins = np.bincount(ids, weights=rewards, minlength=50_000)
        wins += np.bincount(ids[:1000], weights=rewards[:1000], minlength=50_000)
        trials = np.bincount(ids, minlength=50_000) + np.bincount(ids[:1000], minlength=50_000)
        probe = np.arange(50_000)
        probe_keys = probe if keys is ids else probe * 7_919_000_003 - 2**40
        s, f = tracker.evidence(probe_keys)
        np.testing.assert_array_equal(s, wins)
        np.testing.assert_array_equal(s + f, trials)


def test_sparse_integer_ids_switch_from_table_to_hash_table():
    tracker = SuccessTracker(prior=(1.0, 1.0))
    tracker.update([0, 1, 2], [1, 0, 1])
    assert tracker._index.int_mode == "table"
    tracker.update([10**15, 1], [1, 1])  # far outside any direct table
    assert tracker._index.int_mode == "hash"
    alpha, beta = tracker.posterior([0, 1, 2, 10**15, -5])
    assert alpha.tolist() == [2.0, 2.0, 2.0, 2.0, 1.0]
    assert beta.tolist() == [1.0, 2.0, 1.0, 1.0, 1.0]


class LazyReference:
    """The tracker's evidence rule written out over a dict, with the same floating-point
    operations: stored (s, f) at the last touch, ``s * decay**k + wins`` at the next one."""

    def __init__(self, decay):
        self.decay, self.step, self.rows = decay, 0, {}

    def update(self, ids, rewards):
        self.step += 1
        batch = {}
        for key, r in zip(ids, rewards):
            trials, wins = batch.get(key, (0, 0.0))
            batch[key] = (trials + 1, wins + float(r))
        for key, (trials, wins) in batch.items():
            s, f, last = self.rows.get(key, (0.0, 0.0, 0))
            scale = self.factor(self.step - last)
            self.rows[key] = (s * scale + wins, f * scale + (trials - wins), self.step)

    def factor(self, k):
        # numpy's float ** ndarray, as the tracker's table of factors holds it.
        return 1.0 if self.decay == 1.0 else float(self.decay ** np.array([k], dtype=float)[0])

    def evidence(self, ids):
        out = [(s * self.factor(self.step - last), f * self.factor(self.step - last))
               if (s, f, last) != (0.0, 0.0, 0) else (0.0, 0.0)
               for s, f, last in (self.rows.get(k, (0.0, 0.0, 0)) for k in ids)]
        return np.array([o[0] for o in out]), np.array([o[1] for o in out])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 1)), max_size=20),
                min_size=1, max_size=12),
       st.sampled_from([1.0, 0.97, 0.9, 0.5]), st.sampled_from(["int", "str", "dense", "hash"]))
def test_evidence_is_bit_identical_to_the_lazy_rule(batches, decay, kind):
    def key(i):
        return {"str": f"p{i}", "hash": i * 7_919_000_003 - 2**50}.get(kind, i)

    tracker = SuccessTracker(prior=(0.7, 1.3), decay=decay,
                             num_prompts=16 if kind == "dense" else None)
    reference = LazyReference(decay)
    for batch in batches:
        ids = [key(i) for i, _ in batch]
        rewards = [r for _, r in batch]
        tracker.update(ids if ids else np.array([], dtype=np.int64), rewards)
        reference.update(ids, rewards)
    probe = [key(i) for i in range(16)]
    s, f = tracker.evidence(probe)
    rs, rf = reference.evidence(probe)
    np.testing.assert_array_equal(s, rs)
    np.testing.assert_array_equal(f, rf)
    alpha, beta = 0.7 + rs, 1.3 + rf
    np.testing.assert_array_equal(tracker.estimate(probe), alpha / (alpha + beta))


def test_estimates_never_reach_zero_or_one():
    tracker = SuccessTracker(prior=(1e-3, 1e-3))
    tracker.update(np.zeros(10**6, dtype=np.int64), np.ones(10**6))
    tracker.update(np.ones(10**6, dtype=np.int64), np.zeros(10**6))
    rows = tracker._evidence._rows
    for _ in range(3):  # overwhelming evidence against a tiny prior
        rows["successes"][0] *= 1e20
        rows["failures"][1] *= 1e20
    est = tracker.estimate([0, 1, 2])
    assert np.all((est > 0) & (est < 1))
    assert est[2] == 0.5
    fitted = SuccessTracker()
    fitted.update(np.repeat(np.arange(20), 4), np.ones(80))  # nothing but successes
    est = fitted.estimate(np.arange(25))
    assert np.all((est > 0) & (est < 1))


def test_fitted_prior_recovers_a_beta_population():
    rng = np.random.default_rng(1)
    a0, b0, prompts, rollouts = 2.0, 6.0, 4000, 8
    p = rng.beta(a0, b0, prompts)
    ids = np.repeat(np.arange(prompts), rollouts)
    rewards = (rng.random(ids.size) < p[ids]).astype(np.int64)
    tracker = SuccessTracker()
    tracker.update(ids, rewards)
    alpha0, beta0 = tracker.prior_params()
    assert alpha0 / (alpha0 + beta0) == pytest.approx(0.25, abs=0.01)
    assert alpha0 + beta0 == pytest.approx(8.0, rel=0.25)
    # Unseen prompts get the prior mean; seen ones the posterior mean.
    assert tracker.estimate([prompts + 1])[0] == pytest.approx(alpha0 / (alpha0 + beta0))
    k = rewards[:rollouts].sum()
    assert tracker.estimate([0])[0] == pytest.approx((alpha0 + k) / (alpha0 + beta0 + rollouts))


def test_prior_fallbacks_and_guards():
    tracker = SuccessTracker()
    assert tracker.prior_params() == (1.0, 1.0)  # nothing seen
    assert tracker.estimate([3, 4]).tolist() == [0.5, 0.5]
    tracker.update([0, 1, 2], [1, 1, 0])  # too few prompts with two rollouts: fallback strength
    a0, b0 = tracker.prior_params()
    assert a0 + b0 == pytest.approx(2.0)
    assert a0 / (a0 + b0) == pytest.approx((2 + 0.5) / (3 + 1))
    # Identical prompts: no spread beyond binomial noise -> the strength cap.
    homogeneous = SuccessTracker(max_prior_strength=40.0)
    rng = np.random.default_rng(2)
    ids = np.repeat(np.arange(500), 10)
    homogeneous.update(ids, (rng.random(ids.size) < 0.4).astype(int))
    assert sum(homogeneous.prior_params()) == pytest.approx(40.0)
    # All-or-nothing prompts: maximal spread -> the strength floor.
    polar = SuccessTracker(min_prior_strength=1.5)
    polar.update(ids, (ids % 2).astype(int))
    assert sum(polar.prior_params()) == pytest.approx(1.5)


def test_success_threshold_binarizes_rewards():
    tracker = SuccessTracker(prior=(1.0, 1.0), success_threshold=0.5)
    tracker.update([1, 1, 1], [0.2, 0.5, 3.0])
    assert tracker.posterior([1])[0].tolist() == [3.0]
    with pytest.raises(SeraOptError, match="binary"):
        SuccessTracker().update([1, 1], [0.2, 1.0])


@pytest.mark.parametrize("make_ids, dense", [
    (lambda n: np.arange(n) * 3, False),  # direct table
    (lambda n: np.arange(n) * 10**12 - 7, False),  # sorted keys
    (lambda n: [f"prompt-{i}" for i in range(n)], False),  # strings
    (lambda n: np.arange(n), True),  # dataset indices with num_prompts
], ids=["table", "sorted", "str", "dense"])
def test_state_dict_round_trips_exactly(make_ids, dense):
    rng = np.random.default_rng(3)
    ids = make_ids(300)
    tracker = SuccessTracker(decay=0.8, num_prompts=300 if dense else None,
                             max_prior_strength=30.0)
    for _ in range(3):
        pick = rng.integers(0, 300, 500)
        batch = [ids[i] for i in pick] if isinstance(ids, list) else ids[pick]
        tracker.update(batch, rng.integers(0, 2, 500))
    state = tracker.state_dict()
    restored = SuccessTracker().load_state_dict(pickle.loads(pickle.dumps(state)))
    probe = ids[:50]
    np.testing.assert_array_equal(restored.estimate(probe), tracker.estimate(probe))
    assert restored.prior_params() == tracker.prior_params()
    assert restored.decay == 0.8 and restored.step == tracker.step
    assert restored.max_prior_strength == 30.0
    # The copies are independent: both continue identically.
    snapshot = copy.deepcopy(state)
    batch = probe[:10]
    tracker.update(batch, np.ones(10))
    restored.update(batch, np.ones(10))
    np.testing.assert_array_equal(restored.estimate(probe), tracker.estimate(probe))
    np.testing.assert_array_equal(state["successes"], snapshot["successes"])


def test_load_rejects_foreign_state():
    with pytest.raises(SeraOptError, match="state"):
        SuccessTracker().load_state_dict({"successes": []})
    state = SuccessTracker().update([1, 2], [1, 0]).state_dict()
    state["failures"] = state["failures"][:1]
    with pytest.raises(SeraOptError, match="malformed"):
        SuccessTracker().load_state_dict(state)


@pytest.mark.parametrize("ids, rewards, match", [
    ([1, 2, 3], [1, 0], "one entry per rollout"),
    ([1.0, 2.0], [1, 0], "floats"),
    ([True, False], [1, 0], "booleans"),
    (["a", 2], [1, 0], "one kind"),
    ([[1, 2]], [[1, 0]], "1-D"),
    ([1, 2], [1, np.nan], "NaN"),
    ([1, 2], [1, 2], "binary"),
    ([1, 2], ["yes", "no"], "numbers"),
    ("abc", [1, 0, 1], "single string"),
])
def test_bad_updates_raise_and_change_nothing(ids, rewards, match):
    tracker = SuccessTracker()
    tracker.update([5], [1])
    before = tracker.state_dict()
    with pytest.raises(SeraOptError, match=match):
        tracker.update(ids, rewards)
    after = tracker.state_dict()
    assert after["step"] == before["step"]
    np.testing.assert_array_equal(after["successes"], before["successes"])


def test_id_kinds_are_not_mixed_and_dense_ids_are_checked():
    tracker = SuccessTracker()
    tracker.update([1, 2], [1, 0])
    with pytest.raises(SeraOptError, match="int prompt ids"):
        tracker.update(["a"], [1])
    dense = SuccessTracker(num_prompts=4)
    with pytest.raises(SeraOptError, match="outside 0..3"):
        dense.update([4], [1])
    with pytest.raises(SeraOptError, match="strings"):
        dense.estimate(["a"])
    # Numpy string and object arrays are strings too.
    named = SuccessTracker(prior=(1.0, 1.0))
    named.update(np.array(["x", "y"]), [1, 0])
    named.update(np.array(["x"], dtype=object), [1])
    assert named.posterior(["x"])[0].tolist() == [3.0]


@pytest.mark.parametrize("kwargs, match", [
    ({"prior": "flat"}, "prior"),
    ({"prior": (0.0, 1.0)}, "alpha > 0"),
    ({"decay": 0.0}, "decay"),
    ({"decay": 1.5}, "decay"),
    ({"num_prompts": 0}, "num_prompts"),
    ({"min_prior_strength": 5.0, "max_prior_strength": 2.0}, "max_prior_strength"),
    ({"min_fit_prompts": 1}, "min_fit_prompts"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(SeraOptError, match=match):
        SuccessTracker(**kwargs)


def test_tracking_benchmark_measures_against_its_baseline():
    from sera_opt.benchmarks import tracking as bench

    result = bench.time_tracker(3000, 1000, 1, np.random.default_rng(0), False)
    cases = {row["case"]: row for row in result["rows"]}
    assert cases[bench.BASELINE]["ratio_wall"] == 1.0
    for kind in bench.CASE_NAMES:
        for op in ("first update", "update", "estimate", "update + estimate"):
            row = cases[f"{kind} | {op}"]
            assert row["wall_s"] > 0 and row["rounds"] == 1
            assert row["ratio_cpu"] == row["cpu_s"] / max(cases[bench.BASELINE]["cpu_s"], 1e-9)


def test_tracking_benchmark_times_a_planner_step_and_its_parts():
    from sera_opt.benchmarks import tracking as bench

    rows = bench.time_planner_steps(5000, (16, 64), 2, np.random.default_rng(1), False)
    cases = {(r["policy"], r["prompts"], r["case"]): r for r in rows}
    assert {policy for policy, _, _ in cases} == set(bench.STEP_POLICIES)
    for policy in bench.STEP_POLICIES:
        for m, rounds in ((16, 2 * 64), (64, 2 * 16)):
            for case in ("plan", "observe", "plan + observe", "policy alone", "tracker alone"):
                row = cases[(policy, m, case)]
                assert row["rounds"] == rounds and row["cpu_s"] >= 0 and row["wall_s"] > 0
