"""The authors' estimates: discounted Beta evidence, frozen per epoch.

SERA as its authors run it (docs/theory.md, the authors' configuration) estimates
each prompt's success probability from a Beta(1/2, 1/2) prior and its outcomes in
earlier epochs only, each epoch's evidence weighed ``discount`` times less per epoch
that has passed since. :class:`EpochTracker` keeps that estimator: the outcomes of
the running epoch wait in pending counts, :meth:`EpochTracker.end_epoch` folds them
in, and every read in between sees the estimates of the last boundary.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import numpy as np

from .._locking import LockedState
from ..exceptions import SeraOptError
from .evidence import _state_array, _step_number
from .index import PromptIndex, grown, parse_prompt_ids
from .tracker import _HIGHEST, _LOWEST, MAX_PRIOR_STRENGTH, SuccessTracker, _real

__all__ = ["EpochTracker", "COLD_STARTS"]

_FORMAT = "sera_opt.EpochTracker/1"
_CONFIG_KEYS = ("prior", "discount", "cold_start", "success_threshold")
# The options a state must share with a tracker it is loaded into (all of them).
_SHARED_KEYS = _CONFIG_KEYS
_STATE_KEYS = ("format", "config", "id_kind", "keys", "successes", "failures",
               "pending_successes", "pending_failures", "known", "epoch", "step")
_BAD = "malformed EpochTracker state"
_MIN_CAPACITY = 16

#: The cold starts an :class:`EpochTracker` offers: ``"batch"`` (the authors': a batch
#: with a prompt that has no estimate yet is allocated uniformly) and ``"prior"``
#: (such a prompt is estimated by the prior mean, the rest of the batch as usual).
COLD_STARTS = ("batch", "prior")


@contextlib.contextmanager
def _as_epoch_state():
    """Errors of the shared state readers, which speak of a SuccessTracker state,
    re-worded for this tracker's state."""
    try:
        yield
    except SeraOptError as exc:
        raise SeraOptError(str(exc).replace("SuccessTracker state", "EpochTracker state")
                           ) from None


def _validated_config(*, prior, discount, cold_start, success_threshold) -> dict[str, Any]:
    """The constructor's options, checked and normalized (also used for checkpoints)."""
    try:
        pair = tuple(prior)
    except TypeError:
        pair = ()
    if isinstance(prior, (str, bytes)) or len(pair) != 2:
        raise SeraOptError(
            f"prior must be a pair (alpha0, beta0) of positive finite numbers, e.g. (0.5, 0.5) "
            f"(the authors' Beta(1/2, 1/2)); got {prior!r}.")
    a0, b0 = (_real(x, "prior's alpha0 and beta0", "numbers") for x in pair)
    if not (math.isfinite(a0) and math.isfinite(b0) and a0 > 0 and b0 > 0):
        raise SeraOptError(
            f"prior must have finite alpha0 > 0 and beta0 > 0 (an estimate of exactly 0 or 1 "
            f"would pin a prompt), got ({a0!r}, {b0!r}).")
    if a0 + b0 > MAX_PRIOR_STRENGTH:
        raise SeraOptError(
            f"prior has alpha0 + beta0 = {a0 + b0!r}, above the limit {MAX_PRIOR_STRENGTH:g} "
            f"(sera_opt.tracking.MAX_PRIOR_STRENGTH): the estimate would overflow. Scale both "
            f"down; the prior mean depends only on their ratio.")
    d = _real(discount, "discount", "a number in (0, 1]")
    if not (math.isfinite(d) and 0 < d <= 1):
        raise SeraOptError(
            f"discount must lie in (0, 1]: the weight an epoch's evidence keeps at each later "
            f"boundary (1 forgets nothing; the authors use 0.75), got {discount!r}.")
    if not isinstance(cold_start, str) or cold_start not in COLD_STARTS:
        raise SeraOptError(
            f"cold_start must be 'batch' (a batch with a prompt not yet estimated is "
            f"allocated uniformly, as the authors do) or 'prior' (such a prompt takes the "
            f"prior mean), got {cold_start!r}.")
    if success_threshold is not None:
        success_threshold = _real(success_threshold, "success_threshold",
                                  "a real number or None")
        if not math.isfinite(success_threshold):
            raise SeraOptError(f"success_threshold must be finite, got {success_threshold!r}.")
    return {"prior": (a0, b0), "discount": d, "cold_start": cold_start,
            "success_threshold": success_threshold}


class EpochTracker(LockedState):
    """Per-prompt Beta estimates frozen per epoch, with discounted evidence (the
    authors' estimator; docs/theory.md, the authors' configuration).

    Each prompt (keyed by a stable id) has decayed evidence ``S`` (successes) and
    ``F`` (failures) and the running epoch's pending counts ``s`` and ``f``.

    * :meth:`update` adds each rollout's outcome to ``s`` or ``f`` only.
    * :meth:`end_epoch` marks a boundary: ``S <- d S + s`` and ``F <- d F + f``
      for every prompt (one not visited in the epoch decays too), with
      ``d = discount``; the pending counts are cleared.
    * Every read (:meth:`estimate`, :meth:`posterior`, :meth:`evidence`) uses
      ``S`` and ``F`` alone, so estimates are frozen between boundaries and never
      use the running epoch: ``p_hat = (alpha0 + S) / (alpha0 + beta0 + S + F)``,
      the mean of ``Beta(alpha0 + S, beta0 + F)``.

    A prompt that draws at most ``n`` rollouts per epoch carries less than
    ``n / (1 - d)`` of evidence (``4 n`` at ``d = 0.75``), so its estimate stays
    above ``alpha0 / (alpha0 + beta0 + n / (1 - d))`` and below one minus
    ``beta0 / (alpha0 + beta0 + n / (1 - d))``: ``1 / (2 + 8 n)`` from either end
    for the authors' prior and discount.

    Cold start: a prompt is *known* (:meth:`known`) once it had outcomes before
    some boundary. With ``cold_start="batch"`` (the authors') a batch in which a
    prompt is not known is allocated uniformly (``N0`` rollouts each, weight 1):
    :meth:`batch_is_cold` says so to the planner. With ``cold_start="prior"`` no
    batch is cold: a prompt not known is estimated by the prior mean
    ``alpha0 / (alpha0 + beta0)``, as it is under either mode when read.

    Prompt ids are integers or strings (one kind per tracker), read as
    :class:`~sera_opt.SuccessTracker` reads them; rewards are checked as it
    checks them (binary, or compared with ``success_threshold``).

    Thread safety: a re-entrant lock is held around every change of the state
    (:meth:`update`, :meth:`end_epoch`, :meth:`load_state_dict`) and every read
    of it, so concurrent calls are serialized and each sees one consistent
    state; a copy (``pickle``, ``copy.deepcopy``) gets a lock of its own.

    Parameters
    ----------
    prior : (float, float), default (0.5, 0.5)
        The Beta prior ``(alpha0, beta0)``: two positive finite numbers.
    discount : float in (0, 1], default 0.75
        Weight that the evidence kept so far retains at each boundary; 1
        forgets nothing.
    cold_start : {"batch", "prior"}, default "batch"
        What a batch with a prompt not yet known gets (see above).
    success_threshold : float, optional
        Rewards ``>= success_threshold`` count as successes; without it the
        rewards must be binary (as for :class:`~sera_opt.SuccessTracker`).

    Attributes
    ----------
    prior : (float, float)
    discount : float
    cold_start : str
    success_threshold : float or None
        The configuration, as validated (see :meth:`config`).
    """

    # Everything a state swap replaces (see load_state_dict); the configuration is not
    # among them: a state of another configuration is refused.
    _STATE_ATTRIBUTES = ("_index", "_successes", "_failures", "_pending_successes",
                         "_pending_failures", "_known", "_epoch", "_step")

    def __init__(self, *, prior=(0.5, 0.5), discount: float = 0.75, cold_start: str = "batch",
                 success_threshold: float | None = None):
        self._apply_config(_validated_config(prior=prior, discount=discount,
                                             cold_start=cold_start,
                                             success_threshold=success_threshold))
        self._index = PromptIndex()
        self._successes = np.zeros(_MIN_CAPACITY)
        self._failures = np.zeros(_MIN_CAPACITY)
        self._pending_successes = np.zeros(_MIN_CAPACITY)
        self._pending_failures = np.zeros(_MIN_CAPACITY)
        # Slots are handed out in order of first outcome and every slot that exists at
        # a boundary has had one, so the known prompts are exactly the slots below this.
        self._known = 0
        self._epoch = 0
        self._step = 0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ config
    def _apply_config(self, config: dict[str, Any]) -> None:
        self.prior = config["prior"]
        self.discount = config["discount"]
        self.cold_start = config["cold_start"]
        self.success_threshold = config["success_threshold"]

    def config(self) -> dict[str, Any]:
        """The configuration (plain values): ``EpochTracker(**config)`` builds a tracker
        that estimates alike (``prior`` is a list here, which the constructor accepts)."""
        return {"prior": list(self.prior), "discount": self.discount,
                "cold_start": self.cold_start, "success_threshold": self.success_threshold}

    # ------------------------------------------------------------------ evidence
    def _reserve(self, size: int) -> None:
        capacity = self._successes.size
        if size <= capacity:
            return
        capacity = max(size, 2 * capacity)
        for name in ("_successes", "_failures", "_pending_successes", "_pending_failures"):
            setattr(self, name, grown(getattr(self, name), capacity))

    def update(self, prompt_ids, rewards) -> EpochTracker:
        """Record the outcomes of rollouts of the running epoch (pending until
        :meth:`end_epoch`; no estimate changes).

        Parameters
        ----------
        prompt_ids : array_like of int or str, shape (R,)
            The prompt of each rollout (an id repeated once per rollout).
        rewards : array_like, shape (R,)
            Each rollout's outcome: binary, or compared with ``success_threshold``.

        Returns
        -------
        EpochTracker
            ``self``. A rejected batch changes nothing.
        """
        parsed = parse_prompt_ids(prompt_ids)
        with self._lock:
            # SuccessTracker's check of the rewards (it reads only success_threshold),
            # so both trackers accept and refuse the same batches.
            try:
                wins = SuccessTracker.checked_rewards(self, rewards, parsed.count)
            except SeraOptError as exc:
                raise SeraOptError(str(exc).replace("to SuccessTracker", "to EpochTracker")
                                   ) from None
            slots, missing = self._index.lookup(parsed)
            if missing:
                self._reserve(self._index.size + missing)
                self._index.insert(parsed, slots, missing)
            np.add.at(self._pending_successes, slots, wins.astype(np.float64))
            np.add.at(self._pending_failures, slots, (~wins).astype(np.float64))
            self._step += 1
        return self

    def end_epoch(self) -> EpochTracker:
        """Mark an epoch boundary: ``S <- d S + s``, ``F <- d F + f`` for every prompt,
        pending counts cleared, :attr:`epoch` + 1. Returns ``self``.

        Every prompt with outcomes so far is :meth:`known` afterwards. Costs O(number
        of prompts).
        """
        with self._lock:
            n = self._index.size
            for total, pending in ((self._successes, self._pending_successes),
                                   (self._failures, self._pending_failures)):
                view = total[:n]
                view *= self.discount
                view += pending[:n]
                pending[:n] = 0.0
            self._known = n
            self._epoch += 1
        return self

    def _gather(self, slots: np.ndarray, missing: int, arrays) -> list[np.ndarray]:
        """The entries of ``arrays`` at ``slots`` (copies), 0 where an id has no slot."""
        if missing == 0:
            return [a[slots] for a in arrays]
        seen = slots >= 0
        out = []
        for a in arrays:
            values = np.zeros(slots.shape[0])
            values[seen] = a[slots[seen]]
            out.append(values)
        return out

    def evidence(self, prompt_ids) -> tuple[np.ndarray, np.ndarray]:
        """The decayed ``(S, F)`` of each prompt as of the last boundary (0 for prompts
        not known), float64."""
        parsed = parse_prompt_ids(prompt_ids)
        with self._lock:
            slots, missing = self._index.lookup(parsed)
            s, f = self._gather(slots, missing, (self._successes, self._failures))
        return s, f

    def pending(self, prompt_ids) -> tuple[np.ndarray, np.ndarray]:
        """The running epoch's ``(s, f)`` of each prompt (successes and failures since the
        last boundary; 0 for unseen prompts), float64 holding whole numbers."""
        parsed = parse_prompt_ids(prompt_ids)
        with self._lock:
            slots, missing = self._index.lookup(parsed)
            s, f = self._gather(slots, missing,
                                (self._pending_successes, self._pending_failures))
        return s, f

    repeated_ids = staticmethod(SuccessTracker.repeated_ids)

    # ------------------------------------------------------------------ reads
    def prior_params(self) -> tuple[float, float]:
        """The Beta prior ``(alpha0, beta0)`` (fixed)."""
        return self.prior

    def known(self, prompt_ids) -> np.ndarray:
        """Whether each prompt has an estimate of its own: it had outcomes before some
        boundary (bool ndarray, one entry per id)."""
        parsed = parse_prompt_ids(prompt_ids)
        with self._lock:
            slots, _ = self._index.lookup(parsed)
            return (slots >= 0) & (slots < self._known)

    def batch_is_cold(self, prompt_ids) -> bool:
        """Whether the batch ``prompt_ids`` is to be allocated uniformly: True when
        :attr:`cold_start` is ``"batch"`` and some prompt of it is not :meth:`known`."""
        known = self.known(prompt_ids)
        return self.cold_start == "batch" and not bool(known.all())

    def _read(self, parsed, *, posterior: bool):
        """One lookup of ``parsed`` ids under the lock: ``(slots, missing, estimates,
        posterior)``, the last None unless asked for."""
        a0, b0 = self.prior
        with self._lock:
            slots, missing = self._index.lookup(parsed)
            s, f = self._gather(slots, missing, (self._successes, self._failures))
        means = (a0 + s) / (a0 + b0 + s + f)
        # Overwhelming evidence against a small prior can round to 0 or 1; the
        # estimates stay strictly inside, as SuccessTracker's do.
        np.clip(means, _LOWEST, _HIGHEST, out=means)
        post = (a0 + s, b0 + f) if posterior else None
        return slots, missing, means, post

    def estimate(self, prompt_ids) -> np.ndarray:
        """The frozen estimates ``(alpha0 + S) / (alpha0 + beta0 + S + F)`` of the last
        boundary, strictly inside (0, 1) (float64); the prior mean for a prompt not
        :meth:`known`."""
        return self._read(parse_prompt_ids(prompt_ids), posterior=False)[2]

    def posterior(self, prompt_ids) -> tuple[np.ndarray, np.ndarray]:
        """The frozen Beta posterior ``(alpha0 + S, beta0 + F)`` of each prompt (float64)."""
        return self._read(parse_prompt_ids(prompt_ids), posterior=True)[3]

    def estimate_and_repeats(self, prompt_ids, *, posterior: bool = False):
        """:meth:`estimate` and :meth:`repeated_ids` of ``prompt_ids`` and, with
        ``posterior``, :meth:`posterior` (else None) from one lookup; returns
        ``(estimates, repeats, examples, posterior)`` as
        :meth:`SuccessTracker.estimate_and_repeats` does. When every id has a slot the
        ids repeat exactly where their slots do, so the slots are checked."""
        parsed = parse_prompt_ids(prompt_ids)
        slots, missing, means, post = self._read(parsed, posterior=posterior)
        if missing == 0 and parsed.count >= 2:
            ordered = np.sort(slots)
            if not (ordered[1:] == ordered[:-1]).any():
                return means, 0, [], post
        repeats, examples = self.repeated_ids(parsed)
        return means, repeats, examples, post

    def __len__(self) -> int:
        """Number of prompts with outcomes so far (known or pending)."""
        with self._lock:
            return int(self._index.size)

    @property
    def epoch(self) -> int:
        """Number of :meth:`end_epoch` calls so far (the discount's clock)."""
        with self._lock:
            return self._epoch

    @property
    def step(self) -> int:
        """Number of :meth:`update` calls so far."""
        with self._lock:
            return self._step

    def __repr__(self) -> str:
        with self._lock:
            return (f"EpochTracker(prompts={len(self)}, epoch={self._epoch}, "
                    f"prior={self.prior!r}, discount={self.discount!r}, "
                    f"cold_start={self.cold_start!r})")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, the running epoch's pending counts included
        (copies; plain numpy arrays, lists and numbers)."""
        with self._lock:
            n = self._index.size
            return {
                "format": _FORMAT,
                "config": self.config(),
                "id_kind": self._index.kind,
                "keys": self._index.keys(),
                "successes": self._successes[:n].copy(),
                "failures": self._failures[:n].copy(),
                "pending_successes": self._pending_successes[:n].copy(),
                "pending_failures": self._pending_failures[:n].copy(),
                "known": self._known,
                "epoch": self._epoch,
                "step": self._step,
            }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> EpochTracker:
        """A new tracker restored from :meth:`state_dict`, every field checked.

        Raises :class:`SeraOptError` naming the first field that breaks an
        invariant: the format; the configuration (checked as the constructor
        checks it); the id kind and the keys (one per prompt, unique); one row of
        each of the four evidence arrays per prompt, finite and >= 0, the pending
        counts whole numbers; ``known`` in ``[0, prompts]``, with the evidence of
        at least one outcome discounted over ``epoch`` boundaries on every prompt
        before it, and no folded evidence and at least one pending outcome on
        every prompt past it (a prompt gets its slot with its first outcome);
        ``epoch`` and ``step``
        non-negative integers, at least 1 where a boundary or an update must
        have happened.
        """
        fmt = state.get("format") if isinstance(state, dict) else None
        if fmt != _FORMAT:
            raise SeraOptError(
                f"not an EpochTracker state (expected format {_FORMAT!r}); pass the dict that "
                f"EpochTracker.state_dict() returned.")
        if set(state) != set(_STATE_KEYS):
            missing = sorted(set(_STATE_KEYS) - set(state))
            extra = sorted(set(state) - set(_STATE_KEYS), key=str)
            raise SeraOptError(f"{_BAD}: keys differ (missing {missing}, unknown {extra}).")
        raw = state["config"]
        if not isinstance(raw, dict):
            raise SeraOptError(f"{_BAD}: config must be a dict, got {type(raw).__name__}.")
        if set(raw) != set(_CONFIG_KEYS):
            missing = sorted(set(_CONFIG_KEYS) - set(raw))
            extra = sorted(set(raw) - set(_CONFIG_KEYS), key=str)
            raise SeraOptError(f"{_BAD}: config keys differ (missing {missing}, unknown {extra}).")
        try:
            config = _validated_config(**raw)
        except SeraOptError as exc:
            raise SeraOptError(f"{_BAD}: config: {exc}") from None
        kind = state["id_kind"]
        if not (kind is None or (isinstance(kind, str) and kind in ("int", "str"))):
            raise SeraOptError(f"{_BAD}: id_kind must be None, 'int' or 'str', got {kind!r}.")
        with _as_epoch_state():
            arrays = {name: _state_array(state[name], name)
                      for name in ("successes", "failures", "pending_successes",
                                   "pending_failures")}
            known = _step_number(state["known"], "known")
            epoch = _step_number(state["epoch"], "epoch")
            step = _step_number(state["step"], "step")
        sizes = {name: a.shape[0] for name, a in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise SeraOptError(f"{_BAD}: one row per prompt in every evidence array needed, got "
                               f"lengths {sizes}.")
        n = sizes["successes"]
        for name, a in arrays.items():
            if not np.isfinite(a).all():
                raise SeraOptError(f"{_BAD}: {name} contains NaN or inf.")
            if (a < 0).any():
                raise SeraOptError(f"{_BAD}: {name} must be >= 0, got {float(a.min())!r}.")
        for name in ("pending_successes", "pending_failures"):
            if (np.floor(arrays[name]) != arrays[name]).any():
                raise SeraOptError(f"{_BAD}: {name} counts outcomes and must hold whole "
                                   f"numbers.")
        if known > n:
            raise SeraOptError(f"{_BAD}: known must lie in [0, {n}] (the prompts held), got "
                               f"{known}.")
        later = slice(known, n)
        if (arrays["successes"][later] + arrays["failures"][later] > 0).any():
            raise SeraOptError(f"{_BAD}: prompts past the first {known} (the known ones) have "
                               f"folded evidence; only a boundary folds it, and it makes them "
                               f"known.")
        if (arrays["pending_successes"][later] + arrays["pending_failures"][later] < 1).any():
            raise SeraOptError(f"{_BAD}: a prompt past the first {known} (the known ones) has "
                               f"no pending outcome; a prompt is held only once it has one.")
        # A known prompt had an outcome folded in at most `epoch` boundaries ago, so its
        # evidence is at least discount ** epoch (half of it: rounding; nothing checked
        # where that underflows).
        floor = config["discount"] ** epoch
        floor = 0.5 * floor if floor > 1e-290 else 0.0
        first = slice(0, known)
        if known and (arrays["successes"][first] + arrays["failures"][first] < floor).any():
            raise SeraOptError(f"{_BAD}: a known prompt (one of the first {known}) has less "
                               f"evidence than one outcome discounted over {epoch} epochs.")
        if known > 0 and epoch == 0:
            raise SeraOptError(f"{_BAD}: {known} prompts are known at epoch 0; a prompt becomes "
                               f"known at a boundary.")
        if n > 0 and step == 0:
            raise SeraOptError(f"{_BAD}: {n} prompts at step 0; evidence comes from updates.")
        with _as_epoch_state():
            index = PromptIndex.from_state(kind, state["keys"], n, None)
        tracker = cls.__new__(cls)
        tracker._apply_config(config)
        tracker._index = index
        capacity = max(n, _MIN_CAPACITY)
        for name, a in arrays.items():
            setattr(tracker, f"_{name}", grown(a, capacity))
        tracker._known, tracker._epoch, tracker._step = known, epoch, step
        tracker._lock = threading.RLock()
        return tracker

    def load_state_dict(self, state: dict[str, Any]) -> EpochTracker:
        """Restore a :meth:`state_dict` of a tracker configured as this one. Returns
        ``self``.

        All or nothing: the state is validated in full by :meth:`from_state_dict` and
        then swapped in. A state whose ``prior``, ``discount``, ``cold_start`` or
        ``success_threshold`` differ from this tracker's is refused (its evidence
        would be read under other estimates); a rejected state raises
        :class:`SeraOptError` and leaves this tracker exactly as it was.
        """
        restored = type(self).from_state_dict(state)
        with self._lock:
            mine, theirs = self.config(), restored.config()
            differ = [key for key in _SHARED_KEYS if mine[key] != theirs[key]]
            if differ:
                what = "; ".join(f"{key}={theirs[key]!r} in the state, {key}={mine[key]!r} "
                                 f"here" for key in differ)
                given = {**theirs, "prior": tuple(theirs["prior"])}
                options = ", ".join(f"{key}={given[key]!r}" for key in _CONFIG_KEYS)
                raise SeraOptError(
                    f"the state was saved by an EpochTracker of another configuration ({what}); "
                    f"its evidence means other estimates here. Build the tracker with the "
                    f"state's configuration, EpochTracker({options}), or restore it with "
                    f"EpochTracker.from_state_dict(state).")
            for name in self._STATE_ATTRIBUTES:
                setattr(self, name, getattr(restored, name))
        return self
