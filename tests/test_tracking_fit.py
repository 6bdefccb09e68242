"""The fitted prior, kept incrementally, against a from-scratch recomputation.

The reference below is the method of moments written directly over every
prompt's decayed evidence (what ``SuccessTracker`` computed on each read before
its sums were kept incrementally). The incremental fit must agree with it:

* exactly on which prompts have ``n_i >= 1`` and ``n_i >= 2`` decayed rollouts
  (the same predicate ``s * d^k + f * d^k >= threshold``, the same factors);
* up to rounding on ``(alpha0, beta0)``, to a relative 1e-9. Why that bound
  holds with room to spare: every term of the incremental sums is removed bit
  for bit as it was added and the sums are compensated, so each sum is within a
  few ulps (u = 1.1e-16) of the exact sum of its terms; ``S`` and ``N`` are
  multiplied by ``decay`` once per update (<= 300 updates here: <= 3e-14
  relative); each term differs from the reference's by <= 4u (rates from the
  stored evidence, ``1 / n_i`` through a frame factor). The fit amplifies an
  absolute error in the spread by ``A = (spread + mu (1 - mu) h) / ((1 - h) V)``;
  where the strength is not clipped, ``V >= mu (1 - mu) / (max_strength + 1)``
  and ``1 - h >= 0.05``, so ``A <= 20 (2 max_strength + 3) = 2060`` at the
  default cap of 50, and the error of the strength stays below ``2060 * 16 u
  ~ 4e-12``; ``beta0 = (1 - mu) * strength`` adds ``u / (1 - mu) <= 2e-12`` for
  the <= 10^4 rollouts here. So 1e-9 is about 250 times the worst case.

One branch of the fit is discontinuous: ``1 - h >= 0.05`` (below it the
strength falls back). Where the reference's ``1 - h`` lies within 1e-9 of 0.05,
either branch is a correct rounding of the exact value, and the test accepts
either.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sera_opt.tracking.evidence as beta_evidence
from sera_opt import SuccessTracker

RTOL = 1e-9


def reference_fit(tracker: SuccessTracker, strength_branch: str | None = None):
    """(alpha0, beta0), ``1 - h`` and the counts, from all prompts' decayed evidence."""
    state = tracker.state_dict()
    keys = np.arange(tracker.num_prompts) if state["id_kind"] == "dense" else state["keys"]
    fallback = tracker.fallback_prior
    if keys is None or len(keys) == 0:
        return fallback, None, (0, 0)
    s, f = tracker.evidence(keys)
    n = s + f
    seen, two = int((n >= 1).sum()), int((n >= 2).sum())
    total = float(n.sum())
    if total <= 0:
        return fallback, None, (seen, two)
    mu = (float(s.sum()) + 0.5) / (total + 1.0)
    strength = sum(fallback)
    one_minus_h = None
    if two >= tracker.min_fit_prompts:
        mask = n >= 1
        rates = s[mask] / n[mask]
        spread = float(np.mean((rates - mu) ** 2))
        h = float(np.mean(1.0 / n[mask]))
        one_minus_h = 1.0 - h
        fitted = one_minus_h >= 0.05 if strength_branch is None else strength_branch == "fit"
        if fitted:
            variance = (spread - mu * (1.0 - mu) * h) / (1.0 - h)
            strength = tracker.max_prior_strength if variance <= 0 else \
                mu * (1.0 - mu) / variance - 1.0
            strength = min(max(strength, tracker.min_prior_strength), tracker.max_prior_strength)
    return (mu * strength, (1.0 - mu) * strength), one_minus_h, (seen, two)


def assert_fit_matches(tracker: SuccessTracker, where: str = ""):
    (a_ref, b_ref), one_minus_h, counts = reference_fit(tracker)
    check = tracker._evidence.check_moments() if tracker.prior == "fit" else None
    if check is not None:
        assert check["counts"] == counts, f"{where}: counts {check['counts']} != {counts}"
    a, b = tracker.prior_params()
    candidates = [(a_ref, b_ref)]
    if one_minus_h is not None and abs(one_minus_h - 0.05) < 1e-9:
        candidates = [reference_fit(tracker, branch)[0] for branch in ("fit", "fallback")]
    ok = any(math.isclose(a, ra, rel_tol=RTOL, abs_tol=0) and
             math.isclose(b, rb, rel_tol=RTOL, abs_tol=0) for ra, rb in candidates)
    assert ok, f"{where}: prior {(a, b)} != reference {candidates}"


def batches():
    prompt = st.integers(0, 24)
    rollout = st.tuples(prompt, st.integers(1, 6), st.floats(0.0, 1.0))
    return st.lists(st.lists(rollout, max_size=10), min_size=1, max_size=40)


def run_sequence(tracker, sequence, seed, key):
    rng = np.random.default_rng(seed)
    for step, batch in enumerate(sequence):
        ids, rewards = [], []
        for prompt, count, p in batch:
            ids += [key(prompt)] * count
            rewards += (rng.random(count) < p).astype(int).tolist()
        tracker.update(ids if ids else np.array([], dtype=np.int64), rewards)
        assert_fit_matches(tracker, f"after update {step + 1}")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.sampled_from([1.0, 0.97, 0.9, 0.6, 0.3]),
       st.sampled_from(["dense", "int", "str", "hash"]), st.integers(2, 12),
       st.integers(0, 2**32 - 1))
def test_incremental_fit_equals_recomputation(sequence, decay, kind, min_fit, seed):
    def key(i):
        return {"str": f"prompt-{i}", "hash": (i + 1) * -(2**40) + 17}.get(kind, i)

    tracker = SuccessTracker(decay=decay, num_prompts=25 if kind == "dense" else None,
                             min_fit_prompts=min_fit)
    run_sequence(tracker, sequence, seed, key)


@pytest.mark.parametrize("decay", [1.0, 0.97, 0.5])
def test_long_sequences_cross_rebases_and_refreshes(monkeypatch, decay):
    # Small periods, so that many rebases and full refreshes happen within the run.
    monkeypatch.setattr(beta_evidence, "REFRESH_STEPS", 97)
    rng = np.random.default_rng(int(decay * 100))
    prompts = 400
    p = rng.beta(0.7, 0.9, prompts)
    tracker = SuccessTracker(decay=decay, num_prompts=prompts)
    for step in range(300):
        chosen = rng.choice(prompts, rng.integers(0, 40), replace=False)
        ids = np.repeat(chosen, rng.integers(1, 9, chosen.size))
        tracker.update(ids, rng.random(ids.size) < p[ids])
        if step % 5 == 0 or step > 280:
            assert_fit_matches(tracker, f"step {step}")
    deviations = tracker._evidence.check_moments()["deviations"]
    assert max(deviations.values()) < 1e-12, deviations


def test_expiry_events_follow_the_decayed_thresholds():
    # decay 0.5: 8 rollouts weigh 8, 4, 2, 1, 0.5 after 0..4 untouched updates.
    tracker = SuccessTracker(decay=0.5, min_fit_prompts=2)
    tracker.update([1] * 8 + [2] * 3, [1, 0] * 4 + [1, 1, 0])
    expected = [(2, 2), (2, 1), (1, 1), (1, 0), (0, 0), (0, 0)]
    for step, counts in enumerate(expected):
        check = tracker._evidence.check_moments()
        assert check["counts"] == counts == check["reference_counts"], (step, check)
        assert_fit_matches(tracker, f"empty update {step}")
        tracker.update([], [])


def test_expiries_beyond_the_factor_table_are_rechecked(monkeypatch):
    # With a tiny look-ahead, expiries are scheduled as re-check points first.
    monkeypatch.setattr(beta_evidence, "_LOOKAHEAD_CAP", 3)
    rng = np.random.default_rng(5)
    tracker = SuccessTracker(decay=0.9, num_prompts=50, min_fit_prompts=2)
    for step in range(120):
        chosen = rng.choice(50, 5, replace=False) if step < 20 else np.array([], dtype=int)
        ids = np.repeat(chosen, 30)
        tracker.update(ids, rng.random(ids.size) < 0.4)
        assert_fit_matches(tracker, f"step {step}")
    assert tracker._evidence.check_moments()["counts"] == (0, 0)


def test_recentring_keeps_the_spread_accurate_when_the_mean_drifts():
    # The population's mean moves from ~0.95 to ~0.02 (old evidence decays away): the rate
    # sums, centred where the tracker started, would lose digits without re-centring.
    rng = np.random.default_rng(8)
    tracker = SuccessTracker(decay=0.8, num_prompts=300)
    for phase, (a, b) in enumerate(((19.0, 1.0), (0.4, 19.6))):
        p = rng.beta(a, b, 300)
        for _ in range(40):
            ids = np.repeat(rng.choice(300, 100, replace=False), 20)
            tracker.update(ids, rng.random(ids.size) < p[ids])
            assert_fit_matches(tracker, f"phase {phase}")
    moments = tracker._evidence.moments()
    pooled = (moments.successes + 0.5) / (moments.rollouts + 1.0)
    # Centred near 0.95 during the first phase, re-centred in the second.
    assert pooled < 0.05 and tracker._evidence._shift < 0.2
