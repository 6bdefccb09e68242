"""Success-probability estimates before sampling (docs/theory.md section 5).

Rollout counts are fixed before the rollouts are drawn, so each prompt's
success probability must come from its history. :class:`SuccessTracker`
keeps, per prompt, the (optionally decayed) numbers of successes and failures
seen so far and turns them into a Beta posterior under a Beta prior fitted to
the whole dataset. It is two parts with one job each: a prompt-id index
(:mod:`.index`: id -> slot) and a Beta evidence table (:mod:`.evidence`:
per-slot evidence, the decay clock and the fitted prior's moments, kept
incrementally).
"""

from __future__ import annotations

import math
import numbers
import threading
from typing import Any

import numpy as np

from .._arrays import one_d
from .._locking import LockedState
from ..exceptions import SeraOptError
from .evidence import BetaEvidence, fit_beta_prior
from .index import PromptIndex, parse_prompt_ids

__all__ = ["SuccessTracker"]

_FORMAT = "sera_opt.SuccessTracker/2"
# States written before the fitted prior's moments were kept: they load, and
# the moments are rebuilt from the evidence.
_FORMAT_V1 = "sera_opt.SuccessTracker/1"
_CONFIG_KEYS = ("prior", "decay", "num_prompts", "success_threshold", "fallback_prior",
                "min_prior_strength", "max_prior_strength", "min_fit_prompts")
_STATE_KEYS = ("format", "config", "id_kind", "keys", "successes", "failures", "last_step",
               "step")
_LOWEST = float(np.finfo(np.float64).tiny)
_HIGHEST = float(np.nextafter(1.0, 0.0))


#: The largest prior strength ``alpha0 + beta0`` (fixed, fallback or the fit's upper
#: bound). Far beyond any useful prior; it keeps ``alpha0 + beta0`` plus the evidence
#: finite, so a posterior mean never becomes ``alpha / inf``.
MAX_PRIOR_STRENGTH = 1e300


def _real(value, name: str, what: str) -> float:
    """``value`` as a float; booleans and strings are not numbers here."""
    bad = SeraOptError(f"{name} must be {what}, got {value!r} ({type(value).__name__}).")
    if isinstance(value, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
        raise bad
    try:
        return float(value)  # also numpy and torch scalars
    except (TypeError, ValueError):
        raise bad from None


def _prior_pair(prior, name: str) -> tuple[float, float]:
    what = "'fit' or a pair (alpha, beta) of positive numbers" if name == "prior" else \
        "a pair (alpha, beta) of positive numbers"
    try:
        pair = tuple(prior)
    except TypeError:
        pair = ()
    if isinstance(prior, (str, bytes)) or len(pair) != 2:
        raise SeraOptError(f"{name} must be {what}, got {prior!r}.")
    a, b = (_real(x, f"{name}'s alpha and beta", "numbers") for x in pair)
    if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
        raise SeraOptError(
            f"{name} must have finite alpha > 0 and beta > 0 (a posterior mean of exactly 0 or "
            f"1 would pin a prompt), got ({a!r}, {b!r})."
        )
    if a + b > MAX_PRIOR_STRENGTH:
        raise SeraOptError(
            f"{name} has alpha + beta = {a + b!r}, above the limit {MAX_PRIOR_STRENGTH:g} "
            f"(sera_opt.tracking.MAX_PRIOR_STRENGTH): the posterior mean alpha / (alpha + "
            f"beta) would overflow. Scale both down; the mean depends only on their ratio."
        )
    return a, b


def _positive(value, name: str, *, allow_zero: bool = False) -> float:
    v = _real(value, name, "a number")
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise SeraOptError(f"{name} must be finite and {'>=' if allow_zero else '>'} 0, "
                           f"got {value!r}.")
    return v


def _validated_config(*, prior, decay, num_prompts, success_threshold, fallback_prior,
                      min_prior_strength, max_prior_strength, min_fit_prompts) -> dict[str, Any]:
    """The constructor's options, checked and normalized (also used for checkpoints)."""
    if isinstance(prior, str):
        if prior != "fit":
            raise SeraOptError(f"prior must be 'fit' or (alpha, beta), got {prior!r}.")
    else:
        prior = _prior_pair(prior, "prior")
    decay = _positive(decay, "decay")
    if decay > 1:
        raise SeraOptError(f"decay must lie in (0, 1] (1 forgets nothing), got {decay!r}.")
    if num_prompts is not None:
        if isinstance(num_prompts, (bool, np.bool_)) or not isinstance(num_prompts, numbers.Integral) \
                or num_prompts < 1:
            raise SeraOptError(f"num_prompts must be a positive integer, got {num_prompts!r}.")
        num_prompts = int(num_prompts)
    if success_threshold is not None:
        success_threshold = _real(success_threshold, "success_threshold", "a real number or None")
        if not math.isfinite(success_threshold):
            raise SeraOptError("success_threshold must be finite.")
    fallback_prior = _prior_pair(fallback_prior, "fallback_prior")
    min_prior_strength = _positive(min_prior_strength, "min_prior_strength")
    max_prior_strength = _positive(max_prior_strength, "max_prior_strength")
    if max_prior_strength < min_prior_strength:
        raise SeraOptError("max_prior_strength must be >= min_prior_strength.")
    if max_prior_strength > MAX_PRIOR_STRENGTH:
        raise SeraOptError(
            f"max_prior_strength must be at most {MAX_PRIOR_STRENGTH:g} "
            f"(sera_opt.tracking.MAX_PRIOR_STRENGTH), got {max_prior_strength!r}: a fitted "
            f"alpha0 + beta0 beyond it would overflow the posterior mean.")
    if isinstance(min_fit_prompts, bool) or not isinstance(min_fit_prompts, numbers.Integral) \
            or min_fit_prompts < 2:
        raise SeraOptError(f"min_fit_prompts must be an integer >= 2, got {min_fit_prompts!r}.")
    return {"prior": prior, "decay": decay, "num_prompts": num_prompts,
            "success_threshold": success_threshold, "fallback_prior": fallback_prior,
            "min_prior_strength": min_prior_strength, "max_prior_strength": max_prior_strength,
            "min_fit_prompts": int(min_fit_prompts)}


class SuccessTracker(LockedState):
    """Per-prompt success evidence and Beta posteriors, for datasets of millions of prompts.

    Each prompt's success probability ``p_i`` gets the posterior
    ``Beta(alpha0 + s_i, beta0 + f_i)``, where ``s_i`` and ``f_i`` are the
    successes and failures seen in its rollouts (decayed, see ``decay``) and
    ``Beta(alpha0, beta0)`` is the prior. :meth:`estimate` returns the
    posterior means, which lie strictly inside (0, 1); prompts never seen get
    the prior mean.

    The prior, with ``prior="fit"`` (the default), is fitted to the evidence of
    all prompts by the method of moments:

    * mean ``mu = (sum_i s_i + 1/2) / (sum_i n_i + 1)`` pooled over rollouts
      (``n_i = s_i + f_i``; the half-counts keep it inside (0, 1));
    * between-prompt variance from the prompts with ``n_i >= 1``: the spread
      of their rates ``r_i = s_i / n_i`` is ``E[(r_i - mu)^2] = V + (mu (1 -
      mu) - V) / n_i`` for binomial draws, so ``V = (S - mu (1 - mu) h) / (1 -
      h)`` with ``S`` the mean squared deviation and ``h`` the mean of
      ``1 / n_i``;
    * strength ``alpha0 + beta0 = mu (1 - mu) / V - 1``, clipped to
      ``[min_prior_strength, max_prior_strength]`` (a shrinkage guard: no
      measurable spread, or a noisy one, cannot make the prior overrule the
      data without bound, nor vanish), and ``alpha0 = mu * strength``.

    With fewer than ``min_fit_prompts`` prompts that have two or more
    rollouts, or when ``h`` is too close to 1 for the variance to be
    identified (mostly single rollouts), the strength of ``fallback_prior``
    is used with the fitted mean; with no evidence at all, ``fallback_prior``
    itself. A fixed ``prior=(alpha0, beta0)`` skips the fit.

    The sums the fit reads are kept up to date by each :meth:`update` (O(its
    batch) amortized), so :meth:`prior_params` costs O(1) however many prompts
    the tracker holds. They equal a recomputation over all prompts up to
    floating-point rounding; which prompts count as ``n_i >= 1`` and ``n_i >=
    2`` under decay is decided exactly as a recomputation would.

    Forgetting: with ``decay < 1`` every call to :meth:`update` first
    multiplies all earlier evidence by ``decay``, so a rollout observed ``t``
    updates ago weighs ``decay ** t`` (applied lazily, per prompt, when the
    prompt is next touched or read).

    Prompt ids are integers or strings (one kind per tracker). With
    ``num_prompts=N`` the ids must be ``0..N-1`` and are the slots themselves.
    Otherwise non-negative integers of moderate range (dataset indices) are
    mapped by a direct table (a gather), sparse integers (hashes, negative
    ids) by a compiled hash table, and strings by a compiled hash table that
    compares their code points exactly. Pass strings as a numpy array of
    dtype ``str`` (``np.asarray(ids, dtype=str)``, e.g. a dataset column kept
    as one) for the fast route: no Python object per id is created; a list of
    ``str`` is converted to such an array on each call. Strings that end in
    ``"\\x00"`` are rejected (numpy strings cannot hold them).

    Thread safety: a tracker may be shared between threads. A re-entrant
    lock is held around every change of the state (:meth:`update`,
    :meth:`load_state_dict`) and every read of it (:meth:`estimate`,
    :meth:`posterior`, :meth:`evidence`, :meth:`prior_params`, ``len``,
    :attr:`step`, :meth:`state_dict`), so concurrent calls are serialized and
    each sees one consistent state; a copy (``pickle``, ``copy.deepcopy``)
    gets a lock of its own.

    Parameters
    ----------
    prior : "fit" or (float, float), default "fit"
        The Beta prior, fitted as above or fixed.
    decay : float in (0, 1], default 1
        Weight kept by old evidence at each update; 1 forgets nothing.
    num_prompts : int, optional
        Dataset size when the ids are dataset indices ``0..N-1``.
    success_threshold : float, optional
        Rewards ``>= success_threshold`` count as successes. Without it the
        rewards must be binary (0/1 or False/True). Boolean rewards are taken
        as the outcomes they are, which agrees with comparing 1 and 0 only for
        a threshold in (0, 1]; with any other threshold they are refused (so
        True and 1.0 can never count differently).
    fallback_prior : (float, float), default (1, 1)
        Prior used while the fit is not identified (uniform by default, so an
        unseen prompt starts at 1/2 and one with ``k`` successes in ``n``
        rollouts at ``(k + 1) / (n + 2)``).
    min_prior_strength, max_prior_strength : float, default 1 and 50
        Bounds on the fitted ``alpha0 + beta0``.
    min_fit_prompts : int, default 10
        Prompts with at least two rollouts needed before the strength is fitted.
    """

    # Everything a state swap replaces (see load_state_dict).
    _STATE_ATTRIBUTES = _CONFIG_KEYS + ("_index", "_evidence", "_fitted")

    def __init__(self, *, prior="fit", decay: float = 1.0, num_prompts: int | None = None,
                 success_threshold: float | None = None, fallback_prior=(1.0, 1.0),
                 min_prior_strength: float = 1.0, max_prior_strength: float = 50.0,
                 min_fit_prompts: int = 10):
        self._apply_config(_validated_config(
            prior=prior, decay=decay, num_prompts=num_prompts,
            success_threshold=success_threshold, fallback_prior=fallback_prior,
            min_prior_strength=min_prior_strength, max_prior_strength=max_prior_strength,
            min_fit_prompts=min_fit_prompts))
        self._index = PromptIndex(self.num_prompts)
        self._evidence = BetaEvidence(self.decay, fit=self.prior == "fit",
                                      size=self._index.size)
        self._fitted: tuple[float, float] | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ config
    def _apply_config(self, config: dict[str, Any]) -> None:
        self.prior = config["prior"]
        self.decay = config["decay"]
        self.num_prompts = config["num_prompts"]
        self.success_threshold = config["success_threshold"]
        self.fallback_prior = config["fallback_prior"]
        self.min_prior_strength = config["min_prior_strength"]
        self.max_prior_strength = config["max_prior_strength"]
        self.min_fit_prompts = config["min_fit_prompts"]

    def _config(self) -> dict[str, Any]:
        return {
            "prior": self.prior if self.prior == "fit" else list(self.prior),
            "decay": self.decay,
            "num_prompts": self.num_prompts,
            "success_threshold": self.success_threshold,
            "fallback_prior": list(self.fallback_prior),
            "min_prior_strength": self.min_prior_strength,
            "max_prior_strength": self.max_prior_strength,
            "min_fit_prompts": self.min_fit_prompts,
        }

    # ------------------------------------------------------------------ evidence
    def checked_rewards(self, rewards, n: int) -> np.ndarray:
        """Successes (bool, contiguous) from the rewards of ``n`` rollouts; changes nothing."""
        r = one_d(rewards, "rewards", per=" (one per rollout)")
        if r.shape[0] != n:
            raise SeraOptError(
                f"prompt_ids and rewards must have one entry per rollout each; got {n} ids and "
                f"{r.shape[0]} rewards."
            )
        if r.dtype == np.bool_:
            # A bool reward is the number 0 or 1, compared with the threshold like any
            # other reward (as in the estimator): True succeeds iff 1 >= t, False iff 0 >= t.
            t = self.success_threshold
            if t is not None and t > 1:
                return np.zeros(n, dtype=np.bool_)
            if t is not None and t <= 0:
                return np.ones(n, dtype=np.bool_)
            return np.ascontiguousarray(r)
        if not np.issubdtype(r.dtype, np.number) or np.iscomplexobj(r):
            raise SeraOptError(f"rewards must be numbers or booleans, got dtype {r.dtype}.")
        if np.issubdtype(r.dtype, np.floating) and not np.isfinite(r).all():
            raise SeraOptError("rewards contain NaN or inf.")
        if self.success_threshold is not None:
            return r >= self.success_threshold
        binary = (r == 0) | (r == 1)
        if not binary.all():
            i = int(np.flatnonzero(~binary)[0])
            raise SeraOptError(
                f"rewards must be binary (0 or 1) to count successes; got {r[i]!r} at index {i}. "
                f"Pass success_threshold=... to SuccessTracker to binarize other rewards."
            )
        return r == 1

    def update(self, prompt_ids, rewards) -> SuccessTracker:
        """Record the outcomes of one batch of rollouts.

        Parameters
        ----------
        prompt_ids : array_like of int or str, shape (R,)
            The prompt of each rollout (repeat an id once per rollout).
        rewards : array_like, shape (R,)
            Each rollout's outcome: binary, or compared with ``success_threshold``.

        Each call is one step of the decay clock: earlier evidence is first
        multiplied by ``decay``. Costs O(R) amortized, whatever the number of
        prompts. A rejected batch changes nothing. Returns ``self``.
        """
        # Everything that can reject the batch runs before anything is mutated.
        parsed = parse_prompt_ids(prompt_ids)
        with self._lock:
            # The lookup and the insert of new ids are one step: another thread
            # must not insert the same new id in between.
            successes = self.checked_rewards(rewards, parsed.count)
            slots, missing = self._index.lookup(parsed)
            if missing:
                self._evidence.reserve(missing)
                self._index.insert(parsed, slots, missing)
            self._fitted = None
            self._evidence.update(slots, successes, self._index.size)
        return self

    def evidence(self, prompt_ids) -> tuple[np.ndarray, np.ndarray]:
        """The decayed ``(successes, failures)`` of each prompt (0 for unseen ones)."""
        parsed = parse_prompt_ids(prompt_ids)
        with self._lock:
            return self._evidence.read(self._index.lookup(parsed)[0])

    @staticmethod
    def repeated_ids(prompt_ids) -> tuple[int, list]:
        """How many distinct ids occur more than once in ``prompt_ids``, and up to three of them.

        Reads no tracker state. Integers are sorted (several times faster than hashing
        them); strings go into a scratch index (one hash pass).
        """
        parsed = parse_prompt_ids(prompt_ids)
        if parsed.count < 2:
            return 0, []
        if parsed.kind == "int":
            ordered = np.sort(parsed.values)
            same = ordered[1:] == ordered[:-1]
            if not same.any():
                return 0, []
            repeated = np.unique(ordered[1:][same])
            return int(repeated.size), repeated[:3].tolist()
        scratch = PromptIndex()
        slots, missing = scratch.lookup(parsed)
        scratch.insert(parsed, slots, missing)
        if scratch.size == parsed.count:
            return 0, []
        repeated = np.flatnonzero(np.bincount(slots, minlength=scratch.size) > 1)
        keys = scratch.keys()
        return int(repeated.size), [np.asarray(keys[int(i)]).item() for i in repeated[:3]]

    # ------------------------------------------------------------------ prior
    def prior_params(self) -> tuple[float, float]:
        """The Beta prior ``(alpha0, beta0)`` in use (O(1); cached until the next update)."""
        with self._lock:
            if self.prior != "fit":
                return self.prior
            if self._fitted is None:
                self._fitted = fit_beta_prior(
                    self._evidence.moments(), fallback_prior=self.fallback_prior,
                    min_prior_strength=self.min_prior_strength,
                    max_prior_strength=self.max_prior_strength,
                    min_fit_prompts=self.min_fit_prompts)
            return self._fitted

    # ------------------------------------------------------------------ reads
    def posterior(self, prompt_ids) -> tuple[np.ndarray, np.ndarray]:
        """Beta posterior ``(alpha, beta)`` of each prompt's success probability (float64)."""
        return self._read(parse_prompt_ids(prompt_ids), means=False, posterior=True)[3]

    def estimate(self, prompt_ids) -> np.ndarray:
        """Posterior-mean success probabilities, strictly inside (0, 1) (float64).

        Unseen prompts get the prior mean. The mean is exact up to rounding;
        where rounding alone would reach 0 or 1 (overwhelming evidence against
        a tiny prior), it is held one floating-point step inside.
        """
        return self._read(parse_prompt_ids(prompt_ids), means=True, posterior=False)[2]

    def _read(self, parsed, *, means: bool, posterior: bool):
        """One lookup of ``parsed`` ids and what is read at their slots, all of one state
        (the prior and the evidence under the lock): ``(slots, missing, estimates,
        posterior)``, the last two None unless asked for."""
        with self._lock:
            a0, b0 = self.prior_params()
            slots, missing = self._index.lookup(parsed)
            estimates = (self._evidence.means(slots, a0, b0, _LOWEST, _HIGHEST) if means
                         else None)
            post = None
            if posterior:
                s, f = self._evidence.read(slots)
                post = (a0 + s, b0 + f)
        return slots, missing, estimates, post

    def estimate_and_repeats(self, prompt_ids, *, posterior: bool = False):
        """:meth:`estimate` and :meth:`repeated_ids` of ``prompt_ids``, and with
        ``posterior`` also :meth:`posterior` (else None), from one lookup: when every id
        has a slot, the ids repeat exactly where their slots do, so the check sorts the
        slots (integers) instead of hashing the ids again (for string ids, a scratch
        index cost about a fifth of a planner's step at 1,024 prompts). A batch with
        unseen or repeated ids takes :meth:`repeated_ids` (the same answer, and its
        examples). Returns ``(estimates, repeats, examples, posterior)``."""
        parsed = parse_prompt_ids(prompt_ids)
        slots, missing, means, post = self._read(parsed, means=True, posterior=posterior)
        if missing == 0 and parsed.count >= 2:
            ordered = np.sort(slots)
            if not (ordered[1:] == ordered[:-1]).any():
                return means, 0, [], post
        repeats, examples = self.repeated_ids(parsed)
        return means, repeats, examples, post

    def __len__(self) -> int:
        """Number of prompts with a slot (seen at least once, or ``num_prompts``)."""
        with self._lock:
            return int(self._index.size)

    @property
    def step(self) -> int:
        """Number of :meth:`update` calls so far (the decay clock)."""
        with self._lock:
            return self._evidence.step

    def __repr__(self) -> str:
        with self._lock:
            return (f"SuccessTracker(prompts={len(self)}, step={self.step}, "
                    f"prior={self.prior!r}, decay={self.decay!r})")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: configuration, ids, evidence, clock (copies).

        Plain numpy arrays, lists and numbers. With the fitted prior it also
        holds the prior's running sums (``prior_moments``), so a restored
        tracker continues bit for bit.
        """
        with self._lock:  # one consistent snapshot
            evidence = self._evidence.state()
            config = self._config()
            kind = self._index.kind
            keys = self._index.keys()
        state = {
            "format": _FORMAT,
            "config": config,
            "id_kind": kind,
            "keys": keys,
            "successes": evidence["successes"],
            "failures": evidence["failures"],
            "last_step": evidence["last_step"],
            "step": evidence["step"],
        }
        if "prior_moments" in evidence:
            state["prior_moments"] = evidence["prior_moments"]
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SuccessTracker:
        """A new tracker restored from :meth:`state_dict`, every field checked.

        Raises :class:`SeraOptError` naming the first field that breaks an
        invariant: the format; the configuration (checked as the constructor
        checks it); the id kind against the keys and ``num_prompts``;
        duplicate keys; one key and one evidence row per prompt; dtypes;
        successes and failures finite and >= 0; ``last_step`` integers in
        ``[0, step]``, 0 exactly on prompts without evidence, and at least one
        rollout where positive; the fitted prior's sums against a
        recomputation from the evidence. States of format
        ``sera_opt.SuccessTracker/1`` load too (their prior's sums are
        rebuilt).
        """
        fmt = state.get("format") if isinstance(state, dict) else None
        if not isinstance(fmt, str) or fmt not in (_FORMAT, _FORMAT_V1):
            raise SeraOptError(
                f"not a SuccessTracker state (expected format {_FORMAT!r}); pass the dict that "
                f"SuccessTracker.state_dict() returned."
            )
        bad = "malformed SuccessTracker state"
        raw = state.get("config")
        if not isinstance(raw, dict):
            raise SeraOptError(f"{bad}: config must be a dict, got {type(raw).__name__}.")
        if set(raw) != set(_CONFIG_KEYS):
            missing = sorted(set(_CONFIG_KEYS) - set(raw))
            extra = sorted(set(raw) - set(_CONFIG_KEYS), key=str)
            raise SeraOptError(f"{bad}: config keys differ (missing {missing}, unknown {extra}).")
        raw = dict(raw)
        if isinstance(raw["prior"], (list, tuple)):
            raw["prior"] = tuple(raw["prior"])
        try:
            config = _validated_config(**raw)
        except SeraOptError as exc:
            raise SeraOptError(f"{bad}: config: {exc}") from None
        fit = config["prior"] == "fit"
        expected = set(_STATE_KEYS)
        if state["format"] == _FORMAT and fit:
            expected.add("prior_moments")
        if set(state) != expected:
            missing = sorted(expected - set(state))
            extra = sorted(set(state) - expected, key=str)
            raise SeraOptError(f"{bad}: keys differ (missing {missing}, unknown {extra}).")
        kind = state["id_kind"]
        if not (kind is None or (isinstance(kind, str) and kind in ("dense", "int", "str"))):
            raise SeraOptError(f"{bad}: id_kind must be None, 'dense', 'int' or 'str', got "
                               f"{kind!r}.")
        evidence = BetaEvidence.from_state(
            decay=config["decay"], fit=fit, successes=state["successes"],
            failures=state["failures"], last_step=state["last_step"], step=state["step"],
            prior_moments=state.get("prior_moments"), all_touched=kind in ("int", "str"))
        index = PromptIndex.from_state(kind, state["keys"], evidence.size,
                                       config["num_prompts"])
        tracker = cls.__new__(cls)
        tracker._apply_config(config)
        tracker._index = index
        tracker._evidence = evidence
        tracker._fitted = None
        tracker._lock = threading.RLock()
        return tracker

    def load_state_dict(self, state: dict[str, Any]) -> SuccessTracker:
        """Restore a :meth:`state_dict` exactly (configuration included). Returns ``self``.

        All or nothing: the state is validated in full by
        :meth:`from_state_dict` into a new tracker, which is then swapped in;
        a rejected state raises :class:`SeraOptError` and leaves this tracker
        exactly as it was.
        """
        restored = type(self).from_state_dict(state)
        with self._lock:
            for name in self._STATE_ATTRIBUTES:
                setattr(self, name, getattr(restored, name))
        return self
