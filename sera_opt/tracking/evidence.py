"""The Beta evidence table of the success tracker, and the fitted prior's moments.

:class:`BetaEvidence` holds, per slot, the successes and failures seen so far
(decayed lazily), the step of each slot's last touch, and the decay clock. With
``fit=True`` it also keeps, incrementally, every quantity the method-of-moments
prior needs (:func:`fit_beta_prior`), so reading the prior costs O(1) and an
update O(its batch) amortized, whatever the number of prompts:

* ``S``, ``N``: decayed successes and rollouts over all prompts, multiplied by
  ``decay`` at each update and increased by the batch's counts (the eager
  rule, O(1));
* over the prompts with ``n_i >= 1`` decayed rollouts now (the "seen" set):
  their number, ``sum (r_i - c)``, ``sum (r_i - c)^2`` (``r_i = s_i / n_i``,
  which decay leaves unchanged, ``c`` a fixed centre) and ``sum 1 / n_i``;
* the number of prompts with ``n_i >= 2``.

A prompt leaves or re-enters these sets only when it is touched, or when its
decayed evidence falls below 1 or 2 rollouts while untouched. The latter moment
is known when the prompt is touched (``s d^k + f d^k < 1`` first holds at a
computable ``k``), so each touch schedules up to two expiry events in a
calendar of buckets (one per step, doubly linked nodes, two per slot) and each
update processes the events due now. Membership is decided by exactly the
expression the from-scratch fit evaluates, with the same factors ``d^k``
(numpy's ``decay ** k``, tabulated), so the two sets agree exactly, not up to
rounding.

Every term that is added to a sum is later removed bit for bit (the rates from
the stored ``(s, f)``, ``1 / n_i`` as ``d^(last_i - T) / (s_i + f_i)`` in the
frame of a base step ``T``), and the sums are compensated (Neumaier), so they
do not drift. What remains: ``S`` and ``N`` are multiplied by ``decay`` once
per update (a relative error of about one ulp per update), and the frame
factors span ``d^(t - T)``, which a rebase to the current step bounds by
``2^32``. A rebase every ``22 / -ln(decay)`` updates (728 at ``decay = 0.97``)
recomputes ``sum 1 / n_i`` over the seen prompts, found through their calendar
entries: O(seen prompts), and a prompt stays seen for at most ``ln(n_i) /
-ln(decay)`` updates after its last touch, so this is O(batch * ln(n) / 22)
amortized. A full recomputation every :data:`REFRESH_STEPS` updates (one pass
over all prompts: O(size / 65536) amortized) resets the drift of ``S`` and
``N``; the rate sums are re-centred (one pass) only when the pooled mean has
moved so far from their centre that rounding could matter.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from .. import _jit
from .._arrays import one_d
from ..exceptions import SeraOptError
from .index import grown, power_of_two_at_least

__all__ = ["BetaEvidence", "PriorMoments", "fit_beta_prior"]

_U = np.finfo(np.float64).eps / 2  # unit roundoff
#: Updates between full recomputations of the fit's sums (drift of S and N).
REFRESH_STEPS = 1 << 16
#: Largest ratio of frame factors between two rebases: 2^32.
_FRAME_RANGE_LOG = 32 * math.log(2.0)
#: Expiry events are scheduled at most this many steps ahead (farther ones
#: are re-checked then); bounds the decay-factor table and the calendar.
_LOOKAHEAD_CAP = 1 << 20
#: Re-centre the rate sums when their rounding could exceed this relative
#: error of the fitted strength (and re-centring would shrink it).
_RECENTRE_BOUND = 1e-12
#: A stored sum is accepted if it is this close (relative to the sum of the
#: magnitudes of its terms) to a recomputation: rounding leaves ~1e-13.
_STATE_TOLERANCE = 1e-8
_BAD = "malformed SuccessTracker state"
#: One 32-byte record per slot: its evidence as of its last touch, that step,
#: and a scratch accumulator for the batch being added. An update's random
#: accesses then hit one cache line per rollout, not one per array.
ROW = np.dtype([("successes", "<f8"), ("failures", "<f8"), ("last_step", "<i8"),
                ("scratch", "<i8")], align=True)
#: Rollouts per update call: the scratch holds trials in 32 bits.
MAX_BATCH = (1 << 31) - 1


def _kernels():
    return _jit.kernels("sera_opt.tracking.evidence_kernels")


class PriorMoments(NamedTuple):
    """What the method-of-moments prior reads (see :func:`fit_beta_prior`)."""

    size: int  # slots
    successes: float  # sum of decayed successes, all prompts
    rollouts: float  # sum of decayed rollouts n_i, all prompts
    seen: int  # prompts with n_i >= 1
    two: int  # prompts with n_i >= 2
    rate_sum: float  # sum over seen prompts of (r_i - shift)
    rate_sq_sum: float  # sum over seen prompts of (r_i - shift)^2
    inverse_sum: float  # sum over seen prompts of 1 / n_i
    shift: float


def _fit_terms(m: PriorMoments):
    """(mu, spread, h) of the fit, or None where the spread is not used."""
    mu = (m.successes + 0.5) / (m.rollouts + 1.0)
    if m.seen == 0:
        return mu, None, None
    delta = mu - m.shift
    spread = (m.rate_sq_sum / m.seen - 2.0 * delta * (m.rate_sum / m.seen) + delta * delta)
    return mu, spread, m.inverse_sum / m.seen


def fit_beta_prior(m: PriorMoments, *, fallback_prior, min_prior_strength, max_prior_strength,
                   min_fit_prompts) -> tuple[float, float]:
    """The method-of-moments Beta prior of :class:`sera_opt.SuccessTracker` from its moments."""
    if m.size == 0 or m.rollouts <= 0:
        return fallback_prior
    mu, spread, h = _fit_terms(m)
    strength = sum(fallback_prior)
    if m.two >= min_fit_prompts:
        if 1.0 - h >= 0.05:
            variance = (spread - mu * (1.0 - mu) * h) / (1.0 - h)
            if variance <= 0:
                strength = max_prior_strength
            else:
                strength = mu * (1.0 - mu) / variance - 1.0
            strength = min(max(strength, min_prior_strength), max_prior_strength)
    return mu * strength, (1.0 - mu) * strength


class BetaEvidence:
    """Per-slot decayed successes and failures, the decay clock and the prior's moments.

    Parameters
    ----------
    decay : float in (0, 1]
        Weight kept by old evidence at each update.
    fit : bool
        Keep the moments of the fitted prior.
    size : int
        Initial number of slots (dense trackers hold all of theirs from the start).
    """

    def __init__(self, decay: float, *, fit: bool, size: int = 0):
        self.decay = float(decay)
        self.fit = bool(fit)
        self.size = int(size)
        self.step = 0
        self._decay_one = self.decay == 1.0
        self._events = self.fit and not self._decay_one
        self._inv_log = 0.0 if self._decay_one else 1.0 / -math.log(self.decay)
        self._rebase_every = (1 << 62) if self._decay_one else min(
            REFRESH_STEPS, max(1, int(_FRAME_RANGE_LOG * self._inv_log)))
        capacity = self.size
        self._rows = np.zeros(capacity, dtype=ROW)
        self._touched = np.empty(0, dtype=np.int64)  # scratch of the updates
        # decay ** k for k = 0, 1, ... as numpy computes it; "complete" once it reached 0.
        self._powers = np.ones(1, dtype=np.float64)
        self._complete = False
        # Moments (layout in evidence_kernels: five Neumaier pairs SUM_*), frame base step, centre of the rates.
        self._sums = np.zeros(10, dtype=np.float64)
        self._counts = np.zeros(2, dtype=np.int64)
        self._base = 0
        self._shift = 0.5
        self._last_refresh = 0
        # Expiry calendar (decay < 1 with the fit): per node (two per slot: n >= 1,
        # n >= 2) its due step or -1; entries (node, step, next) chained per bucket.
        self._due = np.full(2 * capacity if self._events else 0, -1, dtype=np.int64)
        self._heads = np.full(64 if self._events else 1, -1, dtype=np.int64)
        self._calendar = np.zeros((0, 3), dtype=np.int64)
        self._pool = np.array([-1, 0], dtype=np.int64)  # free-list head, entries in use
        if not self._decay_one:
            self._ensure_powers(2)

    # ------------------------------------------------------------------ capacity
    @property
    def capacity(self) -> int:
        return int(self._rows.size)

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more slots (amortized doubling); changes no value."""
        need = self.size + extra
        if need <= self.capacity:
            return
        capacity = max(need, 2 * self.capacity, 1024)
        rows = np.zeros(capacity, dtype=ROW)
        rows[:self.size] = self._rows[:self.size]
        if self._events:
            self._due = grown(self._due, 2 * capacity, -1)
        self._rows = rows

    def _ensure_powers(self, length: int) -> None:
        have = self._powers.size
        if self._complete or length <= have:
            return
        length = max(length, 2 * have)
        extra = self.decay ** np.arange(have, length, dtype=np.float64)
        zero = np.flatnonzero(extra == 0.0)
        if zero.size:
            extra = extra[:zero[0]]
            self._complete = True
        self._powers = np.concatenate([self._powers, extra])

    def _ensure_horizon(self, t: int, rollouts: float) -> None:
        """Factor table and calendar large enough for the expiries scheduled at step ``t``."""
        if self._decay_one:
            return
        # No prompt holds more decayed rollouts than all prompts together.
        total = max(self._sums[2] + self._sums[3], 0.0) * self.decay + rollouts
        horizon = int(math.ceil(math.log(total * (1.0 + 1e-6) + 2.0) * self._inv_log)) + 2
        lookahead = min(horizon, _LOOKAHEAD_CAP)
        self._ensure_powers(max(t + 2, lookahead + 1))
        if self._events and self._heads.size < lookahead + 2:
            self._heads = np.full(power_of_two_at_least(lookahead + 2, minimum_bits=6), -1, dtype=np.int64)
            _kernels().refile_events(self._due, self._calendar, self._heads, self._pool)

    def _reserve_events(self, pushes: int) -> None:
        """Free calendar entries for ``pushes`` more events (stale ones dropped first)."""
        entries = self._calendar.shape[0]
        if entries - self._pool[1] >= pushes:
            return
        k = _kernels()
        if entries:
            k.refile_events(self._due, self._calendar, self._heads, self._pool)
        live = int(self._pool[1])
        if entries - live < pushes + live:
            # Keep as many free entries as live ones: the next refile is then at least
            # live / pushes updates away, so refiling costs O(1) amortized per push.
            self._calendar = np.zeros((max(2 * entries, 2 * (live + pushes), 1024), 3),
                                      dtype=np.int64)
            k.refile_events(self._due, self._calendar, self._heads, self._pool)

    # ------------------------------------------------------------------ updates
    def update(self, slots: np.ndarray, wins: np.ndarray, size: int) -> None:
        """One step of the clock and one batch of rollouts.

        ``slots`` (int64) are valid slots below ``size`` (the new number of
        slots; capacity reserved), ``wins`` the successes (bool), one per rollout.
        """
        rollouts = slots.size
        if rollouts > MAX_BATCH:
            raise SeraOptError(f"one update takes at most {MAX_BATCH} rollouts, got {rollouts}; "
                               f"split the batch.")
        t = self.step + 1
        self._ensure_horizon(t, rollouts)
        if self._touched.size < rollouts:
            self._touched = np.empty(max(rollouts, 2 * self._touched.size), dtype=np.int64)
        if self._events:
            # Two events per distinct prompt (re-checks reuse the entries they free).
            self._reserve_events(2 * min(rollouts, size) + 2)
        self.size = size
        self.step = t
        # One kernel per case: without decay, the expiry calendar is never compiled.
        kernels = _kernels()
        update = kernels.update_evidence if self._decay_one else kernels.update_evidence_decayed
        update(slots, wins.view(np.uint8), t, size, self._rows, self._touched, self.decay,
               self._powers, self._complete, self._inv_log, self.fit, self._sums, self._counts,
               self._base, self._shift, self._due, self._calendar, self._heads, self._pool)
        if self.fit:
            self._maintain()

    def _maintain(self) -> None:
        # Deterministic functions of the state only (not of reads), so a
        # restored tracker takes the same steps as the one it was saved from.
        t = self.step
        if t - self._last_refresh >= REFRESH_STEPS and not self._decay_one:
            self._refresh()
        elif t - self._base >= self._rebase_every:
            self._base = t
            _kernels().rebase_inverse_sum(self._rows, t, self._powers, self._due,
                                          self._calendar, self._sums)
        elif self._needs_recentring():
            self._refresh()

    def _needs_recentring(self) -> bool:
        m = self.moments()
        mu, spread, h = _fit_terms(m)
        if spread is None:
            return False
        q = max(m.rate_sq_sum / m.seen, 0.0)
        delta = abs(mu - m.shift)
        core = abs(spread) + mu * (1.0 - mu) * h
        excess = 2.0 * delta * math.sqrt(q) + delta * delta
        numerator = abs(spread - mu * (1.0 - mu) * h)
        return excess > core and 16 * _U * (core + excess) > _RECENTRE_BOUND * numerator

    def _refresh(self) -> None:
        """Recompute every moment from scratch at the current step, centred on the pooled mean."""
        self._clear_events()
        t = self.step
        self._ensure_powers(t + 2)
        magnitudes = np.zeros(5, dtype=np.float64)
        self._shift = float(_kernels().rebuild_fit(
            self._rows, self.size, t, t, math.nan, self._decay_one, self._powers,
            self._complete, self._inv_log, self._sums, magnitudes, self._counts, self._events,
            self._due, self._calendar, self._heads, self._pool))
        self._base = t
        self._last_refresh = t

    def _clear_events(self) -> None:
        """An empty calendar with room for two events per slot."""
        if not self._events:
            return
        self._due.fill(-1)
        if self._calendar.shape[0] < 2 * self.size + 2:
            self._calendar = np.zeros((2 * self.size + 2, 3), dtype=np.int64)
        _kernels().refile_events(self._due, self._calendar, self._heads, self._pool)

    # ------------------------------------------------------------------ reads
    def read(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decayed ``(successes, failures)`` of ``slots`` (0 where the slot is -1)."""
        s = np.empty(slots.size, dtype=np.float64)
        f = np.empty(slots.size, dtype=np.float64)
        _kernels().read_evidence(slots, self.step, self._rows, self._decay_one, self._powers,
                                 self._complete, s, f)
        return s, f

    def means(self, slots: np.ndarray, alpha0: float, beta0: float, lowest: float,
              highest: float) -> np.ndarray:
        """Posterior means under the prior ``Beta(alpha0, beta0)``, held in [lowest, highest]."""
        out = np.empty(slots.size, dtype=np.float64)
        _kernels().posterior_means(slots, self.step, self._rows, self._decay_one, self._powers,
                                   self._complete, float(alpha0), float(beta0), lowest, highest,
                                   out)
        return out

    def moments(self) -> PriorMoments:
        """The fit's inputs now (requires ``fit=True``)."""
        sums = self._sums
        frame = 1.0 if self._decay_one else self._powers[self.step - self._base]
        return PriorMoments(
            size=self.size, successes=float(sums[0] + sums[1]),
            rollouts=float(sums[2] + sums[3]), seen=int(self._counts[0]),
            two=int(self._counts[1]), rate_sum=float(sums[4] + sums[5]),
            rate_sq_sum=float(sums[6] + sums[7]), inverse_sum=float((sums[8] + sums[9]) / frame),
            shift=float(self._shift))

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """Evidence, clock and (with ``fit``) the moments' accumulators, as copies."""
        size = self.size
        rows = self._rows[:size]
        out: dict[str, Any] = {
            "successes": rows["successes"].copy(),
            "failures": rows["failures"].copy(),
            "last_step": rows["last_step"].copy(),
            "step": int(self.step),
        }
        if self.fit:
            out["prior_moments"] = {"base_step": int(self._base),
                                    "refresh_step": int(self._last_refresh),
                                    "shift": float(self._shift), "sums": self._sums.copy()}
        return out

    @classmethod
    def from_state(cls, *, decay: float, fit: bool, successes, failures, last_step, step,
                   prior_moments, all_touched: bool, size: int | None = None) -> BetaEvidence:
        """A validated table; raises :class:`SeraOptError` naming the first broken invariant.

        ``prior_moments`` None (with ``fit``) rebuilds the moments from the
        evidence; otherwise the stored accumulators are checked against a
        recomputation and kept as they are (so the restored table continues
        bit for bit). ``all_touched``: every slot must hold evidence (ids
        that were seen), as for non-dense trackers.
        """
        step = _step_number(step)
        s = _state_array(successes, "successes")
        f = _state_array(failures, "failures")
        last = _state_array(last_step, "last_step", integer=True)
        n = s.shape[0]
        if f.shape != (n,) or last.shape != (n,):
            raise SeraOptError(
                f"{_BAD}: successes, failures and last_step must have one entry per prompt "
                f"each; got lengths {n}, {f.shape[0]} and {last.shape[0]}."
            )
        if size is not None and n != size:
            raise SeraOptError(f"{_BAD}: {n} evidence rows for {size} prompts.")
        for name, arr in (("successes", s), ("failures", f)):
            if not np.isfinite(arr).all():
                raise SeraOptError(f"{_BAD}: {name} contain NaN or inf.")
            if (arr < 0).any():
                raise SeraOptError(f"{_BAD}: {name} contain negative values.")
        if n and (last.min() < 0 or last.max() > step):
            raise SeraOptError(
                f"{_BAD}: last_step must lie in [0, step={step}]; got values in "
                f"[{int(last.min())}, {int(last.max())}]."
            )
        untouched = last == 0
        if (s[untouched] != 0).any() or (f[untouched] != 0).any():
            raise SeraOptError(f"{_BAD}: evidence on a prompt with last_step 0 (never updated).")
        if all_touched and untouched.any():
            raise SeraOptError(f"{_BAD}: a prompt id without evidence (last_step 0).")
        touched = ~untouched
        if (s[touched] + f[touched] < 1).any():
            raise SeraOptError(
                f"{_BAD}: a prompt holds fewer than one rollout at its last update (each update "
                f"adds at least one)."
            )
        table = cls(decay, fit=fit, size=0)
        table.size = n
        table.step = step
        table._rows = np.zeros(n, dtype=ROW)
        table._rows["successes"] = s
        table._rows["failures"] = f
        table._rows["last_step"] = last
        if table._events:
            table._due = np.full(2 * n, -1, dtype=np.int64)
        # Before any moment exists, bound the horizon by all rollouts ever stored.
        table._ensure_horizon(step, float(s.sum() + f.sum()))
        if not fit:
            if prior_moments is not None:
                raise SeraOptError(f"{_BAD}: prior_moments given for a fixed prior.")
            return table
        if prior_moments is None:
            table._refresh()
        else:
            table._adopt_moments(prior_moments)
        return table

    def _adopt_moments(self, stored) -> None:
        if not isinstance(stored, dict) or set(stored) != {"base_step", "refresh_step", "shift",
                                                           "sums"}:
            raise SeraOptError(
                f"{_BAD}: prior_moments must be a dict with keys base_step, refresh_step, shift "
                f"and sums; got {sorted(stored) if isinstance(stored, dict) else type(stored)}."
            )
        t = self.step
        base = _step_number(stored["base_step"], "prior_moments.base_step")
        refresh = _step_number(stored["refresh_step"], "prior_moments.refresh_step")
        if not (refresh <= base <= t) or t - base >= self._rebase_every or (
                not self._decay_one and t - refresh >= REFRESH_STEPS):
            raise SeraOptError(
                f"{_BAD}: prior_moments steps (base {base}, refresh {refresh}) do not fit the "
                f"clock (step {t}) and decay {self.decay}."
            )
        shift = stored["shift"]
        if isinstance(shift, bool) or not isinstance(shift, numbers.Real) or not (
                0.0 <= float(shift) <= 1.0):
            raise SeraOptError(f"{_BAD}: prior_moments.shift must be a number in [0, 1], got "
                               f"{shift!r}.")
        sums = _state_array(stored["sums"], "prior_moments.sums")
        if sums.shape != (10,) or not np.isfinite(sums).all():
            raise SeraOptError(f"{_BAD}: prior_moments.sums must be 10 finite numbers.")
        reference = np.zeros(10, dtype=np.float64)
        magnitudes = np.zeros(5, dtype=np.float64)
        self._ensure_powers(t + 2)
        self._clear_events()
        _kernels().rebuild_fit(
            self._rows, self.size, t, base, float(shift), self._decay_one, self._powers,
            self._complete, self._inv_log, reference, magnitudes, self._counts, self._events,
            self._due, self._calendar, self._heads, self._pool)
        names = ("successes", "rollouts", "rates", "squared rates", "inverse rollouts")
        seen = int(self._counts[0])
        for i, name in enumerate(names):
            stored_value = sums[2 * i] + sums[2 * i + 1]
            value = reference[2 * i] + reference[2 * i + 1]
            # Rates centred on the shift can cancel to a magnitude of 0.
            floor = 1e-12 * seen if i in (2, 3) else 1e-290
            if abs(stored_value - value) > _STATE_TOLERANCE * magnitudes[i] + floor:
                raise SeraOptError(
                    f"{_BAD}: prior_moments.sums ({name}: {stored_value!r}) do not match the "
                    f"evidence ({value!r})."
                )
        self._sums = sums
        self._base = base
        self._last_refresh = refresh
        self._shift = float(shift)

    # ------------------------------------------------------------------ checks
    def check_moments(self) -> dict[str, Any]:
        """Recompute the moments from scratch and compare (for tests): counts must be equal.

        Returns the largest deviation of each sum relative to its terms' magnitudes.
        """
        reference = np.zeros(10, dtype=np.float64)
        magnitudes = np.zeros(5, dtype=np.float64)
        counts = np.zeros(2, dtype=np.int64)
        _kernels().rebuild_fit(
            self._rows, self.size, self.step, self._base, self._shift, self._decay_one,
            self._powers, self._complete, self._inv_log, reference, magnitudes, counts, False,
            np.empty(0, dtype=np.int64), np.zeros((0, 3), dtype=np.int64),
            np.full(1, -1, dtype=np.int64), np.array([-1, 0], dtype=np.int64))
        deviations = {}
        for i in range(5):
            stored = self._sums[2 * i] + self._sums[2 * i + 1]
            value = reference[2 * i] + reference[2 * i + 1]
            deviations[i] = abs(stored - value) / max(magnitudes[i], 1e-300)
        return {"counts": (int(self._counts[0]), int(self._counts[1])),
                "reference_counts": (int(counts[0]), int(counts[1])),
                "deviations": deviations}


def _step_number(value, name: str = "step") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0 \
            or value > np.iinfo(np.int64).max // 4:
        raise SeraOptError(f"{_BAD}: {name} must be a non-negative integer, got {value!r}.")
    return int(value)


def _state_array(values, name: str, *, integer: bool = False) -> np.ndarray:
    """A stored 1-D array as float64 (or int64 with ``integer``), or an error naming it."""
    what = "integers" if integer else "numbers"
    if values is None or isinstance(values, (str, bytes, dict)):
        raise SeraOptError(f"{_BAD}: {name} must be an array of {what}, got "
                           f"{type(values).__name__}.")
    arr = one_d(values, name, prefix=f"{_BAD}: ")
    if arr.size and arr.dtype.kind not in ("iu" if integer else "iuf"):
        raise SeraOptError(f"{_BAD}: {name} must hold {'integers' if integer else 'real numbers'}, "
                           f"got dtype {arr.dtype}.")
    if integer and arr.size and arr.dtype.kind == "u" and int(arr.max()) > np.iinfo(np.int64).max:
        raise SeraOptError(f"{_BAD}: {name} must fit in int64.")
    return np.array(arr, dtype=np.int64 if integer else np.float64)
