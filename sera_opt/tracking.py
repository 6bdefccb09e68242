"""Success-probability estimates before sampling (THEORY.md section 5).

Rollout counts are fixed before the rollouts are drawn, so each prompt's
success probability must come from its history. :class:`SuccessTracker`
keeps, per prompt, the (optionally decayed) numbers of successes and failures
seen so far, in flat numpy arrays indexed by a slot per prompt, and turns
them into a Beta posterior under a Beta prior fitted to the whole dataset.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .exceptions import SeraOptError

__all__ = ["SuccessTracker"]

_FORMAT = "sera_opt.SuccessTracker/1"
_INT64_MAX = np.iinfo(np.int64).max
_TABLE_MIN = 1 << 20


def _prior_pair(prior, name: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in prior)
    except (TypeError, ValueError):
        raise SeraOptError(
            f"{name} must be 'fit' or a pair (alpha, beta) of positive numbers, got {prior!r}."
        ) from None
    if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
        raise SeraOptError(
            f"{name} must have finite alpha > 0 and beta > 0 (a posterior mean of exactly 0 or "
            f"1 would pin a prompt), got ({a!r}, {b!r})."
        )
    return a, b


def _positive(value, name: str, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise SeraOptError(f"{name} must be a number, got {value!r}.") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise SeraOptError(f"{name} must be finite and {'>=' if allow_zero else '>'} 0, "
                           f"got {value!r}.")
    return v


class SuccessTracker:
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

    Forgetting: with ``decay < 1`` every call to :meth:`update` first
    multiplies all earlier evidence by ``decay``, so a rollout observed ``t``
    updates ago weighs ``decay ** t`` (applied lazily, per prompt, when the
    prompt is next touched or read: O(batch) per update).

    Prompt ids are integers or strings (one kind per tracker). Non-negative
    integers of moderate range (dataset indices) are mapped to slots by a
    direct table (a gather); sparse integers (hashes) by a sorted key array
    and ``np.searchsorted``; strings by one hash lookup each. With
    ``num_prompts=N`` the ids must be ``0..N-1`` and are the slots themselves.

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
        rewards must be binary (0/1 or False/True).
    fallback_prior : (float, float), default (1, 1)
        Prior used while the fit is not identified (uniform by default, so an
        unseen prompt starts at 1/2 and one with ``k`` successes in ``n``
        rollouts at ``(k + 1) / (n + 2)``).
    min_prior_strength, max_prior_strength : float, default 1 and 50
        Bounds on the fitted ``alpha0 + beta0``.
    min_fit_prompts : int, default 10
        Prompts with at least two rollouts needed before the strength is fitted.
    """

    def __init__(self, *, prior="fit", decay: float = 1.0, num_prompts: int | None = None,
                 success_threshold: float | None = None, fallback_prior=(1.0, 1.0),
                 min_prior_strength: float = 1.0, max_prior_strength: float = 50.0,
                 min_fit_prompts: int = 10):
        self._configure(prior=prior, decay=decay, num_prompts=num_prompts,
                        success_threshold=success_threshold, fallback_prior=fallback_prior,
                        min_prior_strength=min_prior_strength,
                        max_prior_strength=max_prior_strength, min_fit_prompts=min_fit_prompts)
        self._reset()

    # ------------------------------------------------------------------ config
    def _configure(self, *, prior, decay, num_prompts, success_threshold, fallback_prior,
                   min_prior_strength, max_prior_strength, min_fit_prompts):
        if isinstance(prior, str):
            if prior != "fit":
                raise SeraOptError(f"prior must be 'fit' or (alpha, beta), got {prior!r}.")
            self.prior = "fit"
        else:
            self.prior = _prior_pair(prior, "prior")
        decay = _positive(decay, "decay")
        if decay > 1:
            raise SeraOptError(f"decay must lie in (0, 1] (1 forgets nothing), got {decay!r}.")
        self.decay = decay
        if num_prompts is not None:
            if isinstance(num_prompts, bool) or not isinstance(num_prompts, numbers.Integral) \
                    or num_prompts < 1:
                raise SeraOptError(f"num_prompts must be a positive integer, got {num_prompts!r}.")
            num_prompts = int(num_prompts)
        self.num_prompts = num_prompts
        if success_threshold is not None:
            success_threshold = float(success_threshold)
            if not math.isfinite(success_threshold):
                raise SeraOptError("success_threshold must be finite.")
        self.success_threshold = success_threshold
        self.fallback_prior = _prior_pair(fallback_prior, "fallback_prior")
        self.min_prior_strength = _positive(min_prior_strength, "min_prior_strength")
        self.max_prior_strength = _positive(max_prior_strength, "max_prior_strength")
        if self.max_prior_strength < self.min_prior_strength:
            raise SeraOptError("max_prior_strength must be >= min_prior_strength.")
        if isinstance(min_fit_prompts, bool) or not isinstance(min_fit_prompts, numbers.Integral) \
                or min_fit_prompts < 2:
            raise SeraOptError(f"min_fit_prompts must be an integer >= 2, got {min_fit_prompts!r}.")
        self.min_fit_prompts = int(min_fit_prompts)

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

    def _reset(self):
        # Id -> slot maps. "dense": the id is the slot; "int": sorted keys with
        # their slots; "str": a dict. _keys lists the ids in slot order.
        if self.num_prompts is not None:
            self._id_kind = "dense"
            capacity = self.num_prompts
            self._size = self.num_prompts
        else:
            self._id_kind = None
            capacity = 0
            self._size = 0
        self._keys: np.ndarray | list | None = None
        self._table: np.ndarray | None = np.full(0, -1, dtype=np.int64)
        self._sorted_keys = np.empty(0, dtype=np.int64)
        self._sorted_slots = np.empty(0, dtype=np.int64)
        self._str_index: dict[str, int] = {}
        self._successes = np.zeros(capacity, dtype=np.float64)
        self._failures = np.zeros(capacity, dtype=np.float64)
        self._last_step = np.zeros(capacity, dtype=np.int64)
        self._step = 0
        self._fitted: tuple[float, float] | None = None

    # ------------------------------------------------------------------ ids
    def _parse_ids(self, prompt_ids) -> tuple[str, Any]:
        """Return ("int", int64 array) or ("str", list of str)."""
        if isinstance(prompt_ids, (str, bytes)):
            raise SeraOptError(
                "prompt_ids must be a sequence of ids (one per rollout or prompt), got a single "
                "string; wrap it in a list."
            )
        if isinstance(prompt_ids, (list, tuple)) and prompt_ids and isinstance(prompt_ids[0], str):
            # A list of strings: keep it (numpy's fixed-width copy would cost more).
            if set(map(type, prompt_ids)) != {str}:
                raise SeraOptError(
                    "prompt_ids mix strings with other types; use one kind of id (all int or "
                    "all str)."
                )
            return "str", list(prompt_ids)
        try:
            arr = np.asarray(prompt_ids)
        except Exception as exc:
            raise SeraOptError(f"prompt_ids could not be read as an array: {exc}") from exc
        if arr.ndim != 1:
            raise SeraOptError(f"prompt_ids must be 1-D, got shape {arr.shape}.")
        if arr.size == 0:
            return "empty", np.empty(0, dtype=np.int64)
        kind = arr.dtype.kind
        if kind in "iu":
            if kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
                raise SeraOptError("integer prompt ids must fit in int64.")
            return "int", arr.astype(np.int64, copy=False)
        if kind == "U":
            if isinstance(prompt_ids, (list, tuple)) and not all(
                    type(x) is str for x in prompt_ids):
                raise SeraOptError(
                    "prompt_ids mix strings with other types; use one kind of id (all int or "
                    "all str)."
                )
            return "str", arr.tolist()
        if kind == "O":
            items = arr.tolist()
            if all(type(x) is str for x in items):
                return "str", items
            if all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in items):
                return self._parse_ids(np.asarray(items, dtype=np.int64))
        if kind == "b":
            raise SeraOptError("prompt_ids must be integers or strings, got booleans.")
        if kind == "f":
            raise SeraOptError(
                "prompt_ids must be integers or strings, got floats; if they are whole numbers, "
                "cast them with .astype(int)."
            )
        raise SeraOptError(
            f"prompt_ids must be integers or strings, got dtype {arr.dtype}."
        )

    def _lookup(self, prompt_ids, *, insert: bool, parsed=None) -> np.ndarray:
        """Slots of ``prompt_ids`` (int64); -1 for unknown ids when not inserting."""
        kind, ids = self._parse_ids(prompt_ids) if parsed is None else parsed
        if kind == "empty":
            return np.empty(0, dtype=np.int64)
        if self._id_kind == "dense":
            if kind != "int":
                raise SeraOptError(
                    "this tracker was built with num_prompts, so prompt ids are the integers "
                    "0..num_prompts-1; got strings."
                )
            if ids.size and (ids.min() < 0 or ids.max() >= self.num_prompts):
                bad = ids[(ids < 0) | (ids >= self.num_prompts)][0]
                raise SeraOptError(
                    f"prompt id {int(bad)} is outside 0..{self.num_prompts - 1} (num_prompts="
                    f"{self.num_prompts})."
                )
            return ids
        if self._id_kind is None:
            if not insert:
                return np.full(len(ids), -1, dtype=np.int64)
            self._id_kind = kind
            self._keys = np.empty(0, dtype=np.int64) if kind == "int" else []
        if kind != self._id_kind:
            raise SeraOptError(
                f"this tracker holds {self._id_kind} prompt ids; got {kind} ids. Use one kind "
                f"of id per tracker."
            )
        if kind == "int":
            return self._lookup_int(ids, insert)
        return self._lookup_str(ids, insert)

    def _table_limit(self, incoming: int) -> int:
        # A direct id -> slot table is used while it stays within a few times
        # the number of prompts (dataset indices); sparse ids (hashes) switch
        # to a sorted key array.
        return max(_TABLE_MIN, 4 * (self._size + incoming))

    def _lookup_int(self, ids: np.ndarray, insert: bool) -> np.ndarray:
        if self._table is not None and ids.size:
            low, high = int(ids.min()), int(ids.max())
            table = self._table
            if low >= 0 and high < table.size:
                slots = table[ids]
            elif not insert:
                slots = np.full(ids.shape, -1, dtype=np.int64)
                inside = (ids >= 0) & (ids < table.size)
                slots[inside] = table[ids[inside]]
                return slots
            elif low >= 0 and high < self._table_limit(ids.size):
                grown = np.full(max(high + 1, 2 * table.size), -1, dtype=np.int64)
                grown[:table.size] = table
                self._table = table = grown
                slots = table[ids]
            else:
                self._to_sorted_keys()
                return self._lookup_sorted(ids, insert)
            if not insert:
                return slots
            missing = slots < 0
            if missing.any():
                new_ids = ids[missing]
                # Mark each missing id with a position; the positions that
                # survive are one representative per distinct id, no sort needed.
                marks = np.arange(new_ids.size, dtype=np.int64)
                table[new_ids] = marks
                distinct = new_ids[table[new_ids] == marks]
                distinct.sort()
                table[distinct] = self._grow(distinct.size)
                self._keys = np.concatenate([self._keys, distinct])
                slots[missing] = table[new_ids]
            return slots
        return self._lookup_sorted(ids, insert)

    def _to_sorted_keys(self):
        order = np.argsort(self._keys, kind="stable")
        self._sorted_keys = self._keys[order]
        self._sorted_slots = order.astype(np.int64)
        self._table = None

    def _lookup_sorted(self, ids: np.ndarray, insert: bool) -> np.ndarray:
        keys = self._sorted_keys
        if ids.size > 4096:
            # Sorted needles let searchsorted walk the keys in order (cache friendly).
            order = np.argsort(ids, kind="stable")
            pos_sorted = np.searchsorted(keys, ids[order])
            pos = np.empty_like(pos_sorted)
            pos[order] = pos_sorted
        else:
            pos = np.searchsorted(keys, ids)
        if keys.size:
            np.minimum(pos, keys.size - 1, out=pos)
            found = keys[pos] == ids
            slots = np.where(found, self._sorted_slots[pos], -1)
        else:
            found = np.zeros(ids.shape, dtype=bool)
            slots = np.full(ids.shape, -1, dtype=np.int64)
        if not insert or found.all():
            return slots
        missing = ~found
        new = np.sort(ids[missing])
        new = new[np.concatenate(([True], new[1:] != new[:-1]))]
        new_slots = self._grow(new.size)
        self._keys = np.concatenate([self._keys, new])
        at = np.searchsorted(keys, new)
        self._sorted_keys = np.insert(keys, at, new)
        self._sorted_slots = np.insert(self._sorted_slots, at, new_slots)
        slots[missing] = new_slots[np.searchsorted(new, ids[missing])]
        return slots

    def _lookup_str(self, ids: list, insert: bool) -> np.ndarray:
        index = self._str_index
        get = index.get
        # One dict lookup per rollout (None for unknown ids becomes -1 below).
        found = list(map(get, ids))
        slots = np.fromiter((-1 if v is None else v for v in found), dtype=np.int64,
                            count=len(ids)) if None in found else np.array(found, dtype=np.int64)
        if not insert:
            return slots
        missing = np.flatnonzero(slots < 0)
        if missing.size:
            for j in missing.tolist():
                key = ids[j]
                slot = get(key)
                if slot is None:
                    slot = self._grow(1)[0]
                    index[key] = slot
                    self._keys.append(key)
                slots[j] = slot
        return slots

    def _grow(self, n: int) -> np.ndarray:
        """Allocate ``n`` new slots (amortized doubling of the evidence arrays)."""
        start = self._size
        need = start + n
        if need > self._successes.size:
            capacity = max(need, 2 * self._successes.size, 1024)
            for name in ("_successes", "_failures", "_last_step"):
                old = getattr(self, name)
                grown = np.zeros(capacity, dtype=old.dtype)
                grown[:start] = old[:start]
                setattr(self, name, grown)
        self._size = need
        return np.arange(start, need, dtype=np.int64)

    # ------------------------------------------------------------------ evidence
    def _rewards(self, rewards, n: int) -> np.ndarray:
        try:
            r = np.asarray(rewards)
        except Exception as exc:
            raise SeraOptError(f"rewards could not be read as an array: {exc}") from exc
        if r.ndim != 1:
            raise SeraOptError(f"rewards must be 1-D (one per rollout), got shape {r.shape}.")
        if r.shape[0] != n:
            raise SeraOptError(
                f"prompt_ids and rewards must have one entry per rollout each; got {n} ids and "
                f"{r.shape[0]} rewards."
            )
        if r.dtype == np.bool_:
            return r
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

    def _scale(self, slots: np.ndarray) -> np.ndarray | float:
        """Decay factor that brings the stored evidence of ``slots`` to the current step."""
        if self.decay == 1.0:
            return 1.0
        return self.decay ** (self._step - self._last_step[slots]).astype(np.float64)

    def update(self, prompt_ids, rewards) -> SuccessTracker:
        """Record the outcomes of one batch of rollouts.

        Parameters
        ----------
        prompt_ids : array_like of int or str, shape (R,)
            The prompt of each rollout (repeat an id once per rollout).
        rewards : array_like, shape (R,)
            Each rollout's outcome: binary, or compared with ``success_threshold``.

        Each call is one step of the decay clock: earlier evidence is first
        multiplied by ``decay``. Returns ``self``.
        """
        # Validate both inputs before anything is mutated.
        parsed = self._parse_ids(prompt_ids)
        successes = self._rewards(rewards, len(parsed[1]))
        slots = self._lookup(prompt_ids, insert=True, parsed=parsed)
        self._step += 1
        self._fitted = None
        if slots.size == 0:
            return self
        if self._size <= 4 * slots.size:
            # Dense accumulation over all slots is cheapest here.
            trials = np.bincount(slots, minlength=self._size)
            wins = np.bincount(slots, weights=successes, minlength=self._size)
            touched = np.flatnonzero(trials)
            trials = trials[touched]
            wins = wins[touched]
        else:
            order = np.argsort(slots, kind="stable")
            grouped = slots[order]
            starts = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
            touched = grouped[starts]
            trials = np.diff(np.append(starts, grouped.size))
            wins = np.add.reduceat(successes[order].astype(np.float64), starts)
        scale = self._scale(touched)
        self._successes[touched] = self._successes[touched] * scale + wins
        self._failures[touched] = self._failures[touched] * scale + (trials - wins)
        self._last_step[touched] = self._step
        return self

    def _evidence_at(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        known = slots >= 0
        s = np.zeros(slots.shape, dtype=np.float64)
        f = np.zeros(slots.shape, dtype=np.float64)
        if known.all():
            scale = self._scale(slots)
            s = self._successes[slots] * scale
            f = self._failures[slots] * scale
        elif known.any():
            k = slots[known]
            scale = self._scale(k)
            s[known] = self._successes[k] * scale
            f[known] = self._failures[k] * scale
        return s, f

    def evidence(self, prompt_ids) -> tuple[np.ndarray, np.ndarray]:
        """The decayed ``(successes, failures)`` of each prompt (0 for unseen ones)."""
        return self._evidence_at(self._lookup(prompt_ids, insert=False))

    # ------------------------------------------------------------------ prior
    def prior_params(self) -> tuple[float, float]:
        """The Beta prior ``(alpha0, beta0)`` in use (fitted lazily, cached until the next update)."""
        if self.prior != "fit":
            return self.prior
        if self._fitted is None:
            self._fitted = self._fit()
        return self._fitted

    def _fit(self) -> tuple[float, float]:
        size = self._size
        if size == 0:
            return self.fallback_prior
        slots = np.arange(size)
        s, f = self._evidence_at(slots)
        n = s + f
        total = float(n.sum())
        if total <= 0:
            return self.fallback_prior
        mu = (float(s.sum()) + 0.5) / (total + 1.0)
        fallback_strength = sum(self.fallback_prior)
        seen = n >= 1
        strength = fallback_strength
        if int((n >= 2).sum()) >= self.min_fit_prompts:
            ns = n[seen]
            rates = s[seen] / ns
            spread = float(np.mean((rates - mu) ** 2))
            h = float(np.mean(1.0 / ns))
            if 1.0 - h >= 0.05:
                variance = (spread - mu * (1.0 - mu) * h) / (1.0 - h)
                if variance <= 0:
                    strength = self.max_prior_strength
                else:
                    strength = mu * (1.0 - mu) / variance - 1.0
                strength = min(max(strength, self.min_prior_strength), self.max_prior_strength)
        return mu * strength, (1.0 - mu) * strength

    # ------------------------------------------------------------------ reads
    def posterior(self, prompt_ids) -> tuple[np.ndarray, np.ndarray]:
        """Beta posterior ``(alpha, beta)`` of each prompt's success probability (float64)."""
        a0, b0 = self.prior_params()
        s, f = self.evidence(prompt_ids)
        return a0 + s, b0 + f

    def estimate(self, prompt_ids) -> np.ndarray:
        """Posterior-mean success probabilities, strictly inside (0, 1) (float64).

        Unseen prompts get the prior mean. The mean is exact up to rounding;
        where rounding alone would reach 0 or 1 (overwhelming evidence against
        a tiny prior), it is held one floating-point step inside.
        """
        alpha, beta = self.posterior(prompt_ids)
        mean = alpha / (alpha + beta)
        return np.clip(mean, np.finfo(np.float64).tiny, np.nextafter(1.0, 0.0))

    def __len__(self) -> int:
        """Number of prompts with a slot (seen at least once, or ``num_prompts``)."""
        return int(self._size)

    @property
    def step(self) -> int:
        """Number of :meth:`update` calls so far (the decay clock)."""
        return self._step

    def __repr__(self) -> str:
        return (f"SuccessTracker(prompts={len(self)}, step={self._step}, prior={self.prior!r}, "
                f"decay={self.decay!r})")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: configuration, ids, evidence, clock (copies)."""
        size = self._size
        if self._id_kind == "int":
            keys: Any = self._keys.copy()
        elif self._id_kind == "str":
            keys = list(self._keys)
        else:
            keys = None
        return {
            "format": _FORMAT,
            "config": self._config(),
            "id_kind": self._id_kind,
            "keys": keys,
            "successes": self._successes[:size].copy(),
            "failures": self._failures[:size].copy(),
            "last_step": self._last_step[:size].copy(),
            "step": int(self._step),
        }

    def load_state_dict(self, state: dict[str, Any]) -> SuccessTracker:
        """Restore a :meth:`state_dict` exactly (configuration included). Returns ``self``."""
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise SeraOptError(
                f"not a SuccessTracker state (expected format {_FORMAT!r}); pass the dict that "
                f"SuccessTracker.state_dict() returned."
            )
        try:
            config = dict(state["config"])
            prior = config["prior"]
            config["prior"] = prior if isinstance(prior, str) else tuple(prior)
            config["fallback_prior"] = tuple(config["fallback_prior"])
            id_kind = state["id_kind"]
            successes = np.array(state["successes"], dtype=np.float64)
            failures = np.array(state["failures"], dtype=np.float64)
            last_step = np.array(state["last_step"], dtype=np.int64)
            step = int(state["step"])
            keys = state["keys"]
        except (KeyError, TypeError, ValueError) as exc:
            raise SeraOptError(f"malformed SuccessTracker state: {exc}") from exc
        size = successes.shape[0]
        if successes.ndim != 1 or failures.shape != (size,) or last_step.shape != (size,):
            raise SeraOptError("malformed SuccessTracker state: evidence arrays differ in shape.")
        if id_kind not in (None, "dense", "int", "str"):
            raise SeraOptError(f"malformed SuccessTracker state: id_kind {id_kind!r}.")
        self._configure(**config)
        self._reset()
        if id_kind == "dense":
            if self.num_prompts != size:
                raise SeraOptError("malformed SuccessTracker state: num_prompts != evidence size.")
        elif id_kind in ("int", "str"):
            if keys is None or len(keys) != size:
                raise SeraOptError("malformed SuccessTracker state: one key per prompt needed.")
            self._id_kind = id_kind
            self._size = size
            if id_kind == "int":
                k = np.array(keys, dtype=np.int64)
                self._keys = k
                self._to_sorted_keys()
                if np.any(self._sorted_keys[1:] == self._sorted_keys[:-1]):
                    raise SeraOptError("malformed SuccessTracker state: duplicate prompt ids.")
                if size == 0 or (k.min() >= 0 and k.max() < self._table_limit(0)):
                    table = np.full(int(k.max()) + 1 if size else 0, -1, dtype=np.int64)
                    table[k] = np.arange(size, dtype=np.int64)
                    self._table = table
            else:
                self._keys = [str(x) for x in keys]
                self._str_index = {key: i for i, key in enumerate(self._keys)}
                if len(self._str_index) != size:
                    raise SeraOptError("malformed SuccessTracker state: duplicate prompt ids.")
        elif size:
            raise SeraOptError("malformed SuccessTracker state: evidence without ids.")
        self._successes = successes
        self._failures = failures
        self._last_step = last_step
        self._step = step
        return self
