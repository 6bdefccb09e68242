"""The object a training loop holds: estimates before sampling, evidence after.

    planner = sera_opt.RolloutPlanner(max_rollouts=32)   # the default: uniform, offset 1, min 2
    # allocation by the estimates: RolloutPlanner("sera-fair", alpha=1.0, offset=1,
    #                                             min_rollouts=2, max_rollouts=32)
    for batch in loader:
        alloc = planner.plan(batch.prompt_ids, budget=8 * len(batch))
        rollouts = sample(batch, alloc.counts)              # the trainer's job
        planner.observe(rollouts.prompt_ids, rollouts.rewards)
    torch.save({"planner": planner.state_dict(), ...}, path)
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._locking import LockedState
from .exceptions import SeraOptError, SeraOptWarning
from .policies import AllocationPolicy, get_policy, policy_from_config
from .result import Allocation
from .rounds.session import DEFAULT_ROUNDS
from .tracking import SuccessTracker
from .tracking.index import parse_prompt_ids

__all__ = ["RolloutPlanner", "DEFAULT_POLICY", "DEFAULT_POLICY_OPTIONS", "DEFAULT_ROUNDS",
           "DEFAULT_ROUND_POLICY"]

_FORMAT = "sera_opt.RolloutPlanner/3"
# Written before the planner had a policy of its own for rounds (it is the policy).
_FORMAT_V2 = "sera_opt.RolloutPlanner/2"
# Written before policies had a public configuration: policy name and options apart.
_FORMAT_V1 = "sera_opt.RolloutPlanner/1"

#: The allocation policy a planner uses when none is named, and its options (which
#: options passed to the planner override). The integrations' default planners and the
#: examples use it too, so the default lives here alone. It is uniform allocation (the
#: MaxRL estimator alone), chosen by the cost rule written down before its runs
#: (docs/benchmarks.md, "A default chosen on cost"): through TRL the static
#: ``sera-fair`` plan (alpha = 1), the default before, was significantly below static
#: uniform allocation and below stock ``GRPOTrainer`` at pass@1, and no plan in rounds
#: won at equal CPU time. ``sera-fair`` (alpha = 1) and the other policies stay one
#: argument away: ``RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)``.
#: The offset and the minimum are those of the estimator's default
#: (``maxrl_advantages(estimator="mean_centred")``: offset c = 1, and a prompt needs at
#: least 2 rollouts to carry a signal), so the default planner and the default
#: estimator agree; pass ``offset=0, min_rollouts=1`` for ``"success_average"``.
DEFAULT_POLICY = "uniform"
DEFAULT_POLICY_OPTIONS: dict[str, Any] = {"offset": 1, "min_rollouts": 2}
#: The offset a policy named without one takes: that of ``maxrl_advantages``' default
#: estimator (``"mean_centred"``, c = 1), so that the factors a planner equalizes are the
#: estimator's; with ``offset=1`` every policy's minimum is at least 2. Pass
#: ``offset=0`` for ``"success_average"``.
ESTIMATOR_DEFAULT_OFFSET = 1

#: The policy that a planner built without one allocates the later rounds of a step
#: with, when rounds are asked for (``rounds >= 2``; the default, :data:`DEFAULT_ROUNDS`,
#: is one round, the static plan): each round's budget shared evenly among the prompts
#: still without a success. With 4 rounds it is the arm ``uniform:rounds=4`` of the
#: rounds decision (docs/benchmarks.md, "Rounds within a step"). Rounds are opt-in because
#: each is one more generation call (through TRL on CPU 4 rounds cost 2.04x to 2.24x a
#: static step) and no rounds arm won the cost rule at equal CPU time.
DEFAULT_ROUND_POLICY = "uniform"


def _id_array(prompt_ids) -> np.ndarray:
    """The ids as a numpy array that :meth:`SuccessTracker.update` reads back the same."""
    parsed = parse_prompt_ids(prompt_ids)
    if parsed.kind != "str":
        return parsed.values
    width = parsed.values.shape[1]
    if width == 0:
        return np.full(parsed.count, "", dtype="U1")
    return np.ascontiguousarray(parsed.values).view(f"U{width}").reshape(-1)


class RolloutPlanner(LockedState):
    """A success tracker and an allocation policy behind two calls.

    :meth:`plan` turns the next batch's prompt ids and a rollout budget into
    counts: the tracker's posterior-mean estimates go to the policy, and a
    policy that declares ``"posterior"`` among its
    :attr:`~sera_opt.AllocationPolicy.extra_inputs` (``"sera-bayes"``, ``"hora"``)
    also receives the Beta posteriors. :meth:`observe` feeds the rewards of the
    rollouts back into the tracker. :meth:`start_rounds` plans a step in rounds
    instead, each on what the rounds before it showed.

    Thread safety: a planner may be shared between threads (``observe`` from
    a callback while the loop calls ``plan``). Its lock covers the swap in
    :meth:`load_state_dict` and the reads of :meth:`plan` and
    :meth:`state_dict`; the tracker holds its own lock around its state. The
    solve in :meth:`plan` runs outside the lock, on the call's own estimates.

    Parameters
    ----------
    policy : str or AllocationPolicy, optional
        A registered policy name (see :func:`sera_opt.available_policies`) or
        an instance. None: :data:`DEFAULT_POLICY` with :data:`DEFAULT_POLICY_OPTIONS`
        (``uniform``, ``offset=1``, ``min_rollouts=2``: the pairing for the default
        ``maxrl_advantages`` estimator). A policy named without an ``offset`` takes the
        default estimator's too (:data:`ESTIMATOR_DEFAULT_OFFSET`, 1, so its minimum is at
        least 2): ``RolloutPlanner("sera-fair", alpha=1.0)`` pairs with
        ``maxrl_advantages()``. Pass ``offset=0`` for ``"success_average"``. A policy
        instance keeps its own offset.
    tracker : SuccessTracker or EpochTracker, optional
        Defaults to ``SuccessTracker()`` (fitted prior, no forgetting); for the
        ``"sera-paper"`` policy to the authors' estimates, ``EpochTracker()`` (frozen per
        epoch, discounted, with the whole batch uniform while any of its prompts is
        unseen: :meth:`paper_sera`).
    round_policy : str or AllocationPolicy, optional
        Allocates the rounds after the first in :meth:`start_rounds`. A name is built
        with the policy's offset and bounds. None: :data:`DEFAULT_ROUND_POLICY` for the
        default planner (no ``policy`` named), the policy itself for a named one. So
        ``RolloutPlanner()`` and ``RolloutPlanner("uniform", offset=1, min_rollouts=2)``
        are the same planner (the same :meth:`config`), and ``RolloutPlanner("sera-fair",
        alpha=1.0, offset=1, min_rollouts=2)`` allocates its rounds by ``sera-fair``
        unless ``round_policy="uniform"`` is given.
    **policy_options
        Passed to the policy's constructor (e.g. ``max_rollouts=32``,
        ``offset=1``).

    Attributes
    ----------
    policy : AllocationPolicy
        Allocates :meth:`plan` (and ``start_rounds(..., rounds=1)``).
    round_policy : AllocationPolicy
        Allocates the rounds after the first in :meth:`start_rounds` (shown by
        :meth:`config` and the repr). The planner's ``policy`` itself when one was
        named and no ``round_policy`` given; for the default planner
        :data:`DEFAULT_ROUND_POLICY` (``uniform``: each round's budget shared evenly
        among the prompts still without a success) with the default policy's offset
        and bounds, its cap of ``max_ratio`` times the average count included. Rounds
        are opt-in (the default is one round, the static plan), so it allocates only
        when ``rounds >= 2`` is asked for.
    """

    def __init__(self, policy=None, tracker: SuccessTracker | None = None, *,
                 round_policy=None, **policy_options: Any):
        default = policy is None
        if default:
            policy, policy_options = DEFAULT_POLICY, {**DEFAULT_POLICY_OPTIONS, **policy_options}
            _check_default_options(policy_options)
        elif isinstance(policy, str) and "offset" not in policy_options:
            # The offset of the estimator the counts will feed: maxrl_advantages' default,
            # the mean-centred one (offset 1; a prompt then needs 2 rollouts for a signal).
            policy_options = {**policy_options, "offset": ESTIMATOR_DEFAULT_OFFSET}
        self.policy: AllocationPolicy = get_policy(policy, **policy_options)
        if round_policy is None:
            round_policy = DEFAULT_ROUND_POLICY if default else self.policy
        self.round_policy: AllocationPolicy = (
            _round_policy_named(round_policy, self.policy) if isinstance(round_policy, str)
            else get_policy(round_policy))
        if self.round_policy.offset != self.policy.offset:
            raise SeraOptError(
                f"round_policy {self.round_policy.name!r} has offset={self.round_policy.offset} "
                f"but the planner's policy {self.policy.name!r} has offset={self.policy.offset}: "
                f"the rounds would report factors for another estimator than the one the "
                f"counts feed. Build the round policy with offset={self.policy.offset}, or "
                f"name it (round_policy={self.round_policy.name!r}) to take the policy's.")
        if tracker is None:
            tracker = _default_tracker(self.policy)
        elif not isinstance(tracker, _tracker_types()):
            raise SeraOptError(
                f"tracker must be a sera_opt.SuccessTracker or a sera_opt.EpochTracker, got "
                f"{type(tracker).__name__}."
            )
        self.tracker = tracker
        # Round sessions started with observe=True whose outcomes the tracker is still
        # owed, by id (an ordered set): each is observed once (observe_rounds).
        self._owed: dict[str, None] = {}
        self._lock = threading.RLock()


    @classmethod
    def paper_sera(cls, *, cold_start: str = "batch", **policy_options: Any) -> RolloutPlanner:
        """SERA as its authors run it (docs/theory.md, "SERA as its authors run it").

        The ``"sera-paper"`` policy (the mean-centred factor, positive counts in
        ``[2, 4 N0]`` with ``N0 = budget / M``, prompts without a useful chance of a mixed
        group switched off at threshold 0.05, the authors' rounding) with the authors'
        estimates: an :class:`~sera_opt.EpochTracker` (Beta(1/2, 1/2) prior, evidence
        discounted by 0.75 and frozen per epoch: call :meth:`end_epoch` at each pass over
        the data), and the whole batch uniform while any of its prompts is unseen
        (``cold_start="batch"``; ``"prior"`` estimates an unseen prompt by the prior
        instead). ``policy_options`` override the policy's settings, e.g.
        ``rounding="exact"`` for the lexicographic max-min on the same active set.
        """
        from .tracking import EpochTracker

        return cls("sera-paper", tracker=EpochTracker(cold_start=cold_start), **policy_options)

    def end_epoch(self) -> RolloutPlanner:
        """Mark the end of a pass over the data: an :class:`~sera_opt.EpochTracker` folds
        the epoch's outcomes into its frozen estimates; a :class:`SuccessTracker`, which
        updates after every :meth:`observe`, has nothing to do."""
        with self._lock:
            tracker = self.tracker
        end = getattr(tracker, "end_epoch", None)
        if end is not None:
            end()
        return self

    @property
    def uses_posterior(self) -> bool:
        """Whether the policy receives the tracker's Beta posteriors."""
        return "posterior" in self.policy.extra_inputs

    def plan(self, prompt_ids, budget, *, min_rollouts=None, max_rollouts=None,
             **allocate_options: Any) -> Allocation:
        """Counts for the prompts ``prompt_ids`` (one entry per prompt, in order).

        Parameters
        ----------
        prompt_ids : array_like of int or str, shape (M,)
            The batch's prompts. Unseen prompts are estimated from the prior.
        budget : int
            Total rollouts for the batch.
        min_rollouts, max_rollouts : int or array_like, optional
            Override the policy's bounds for this batch.
        **allocate_options
            The policy's other extra inputs (e.g. GVM's ``gradient_norms``).

        Returns
        -------
        Allocation
            ``counts[j]`` is the number of rollouts for ``prompt_ids[j]``.

        Warns
        -----
        SeraOptWarning
            When an id occurs more than once in ``prompt_ids``. Each row is
            then planned as a prompt of its own (same estimate, its own count,
            its own ``min_rollouts``), so the prompt receives the sum of its
            rows' counts; :meth:`observe` pools all their rollouts.
        """
        policy, (tracker, _, _), success_probs, allocate_options = self._inputs(
            prompt_ids, allocate_options, "plan")
        if _batch_is_cold(tracker, prompt_ids):
            if success_probs is None:  # a policy of posteriors: their means
                alpha, beta = allocate_options["posterior"]
                success_probs = np.asarray(alpha) / (np.asarray(alpha) + np.asarray(beta))
            return _cold_start(policy, success_probs, budget, min_rollouts, max_rollouts)
        # The estimates are this call's own arrays: the solve needs no lock.
        return policy.allocate(success_probs, budget, min_rollouts=min_rollouts,
                               max_rollouts=max_rollouts, **allocate_options)

    def _inputs(self, prompt_ids, allocate_options, caller: str, *, posterior: bool = False,
                rounds: bool = False):
        """The policy and tracker of one state, the estimates for ``prompt_ids`` and the
        policy's inputs (the tracker's posterior where it takes one); ``posterior``: also
        read the posterior for the caller's own use; ``rounds``: the round policy, with
        the planner's policy of the same state as the tracker's companion."""
        allocate_options = dict(allocate_options)
        # Read once: the tracker's lookups and the check for repeated ids share it (string
        # ids cost about 50 us a thousand to read).
        prompt_ids = parse_prompt_ids(prompt_ids)
        with self._lock:
            # The policies and the tracker of one state (load_state_dict swaps them all).
            static, tracker = self.policy, self.tracker
            policy = self.round_policy if rounds else static
            if "posterior" in policy.extra_inputs:
                if "posterior" in allocate_options:
                    raise SeraOptError(
                        "the planner passes the tracker's posterior itself; do not pass "
                        "posterior=."
                    )
                allocate_options["posterior"] = tracker.posterior(prompt_ids)
                prior = allocate_options["posterior"] if posterior else None
                success_probs = None
                repeats, examples = SuccessTracker.repeated_ids(prompt_ids)
            else:
                # The estimates, the check for repeats and (for a round session) the
                # posterior from one lookup of the ids.
                success_probs, repeats, examples, prior = tracker.estimate_and_repeats(
                    prompt_ids, posterior=posterior)
        if repeats:
            warnings.warn(
                f"prompt_ids repeats {repeats} prompt id(s) within one {caller}() call (for "
                f"example {', '.join(repr(e) for e in examples)}): each row is planned as a "
                f"prompt of its own, with the same estimate, and gets its own count, so the "
                f"prompt receives the sum of its rows' counts (at least min_rollouts per row). "
                f"Pass each prompt once to plan it once.", SeraOptWarning, stacklevel=3)
        # The options themselves are the policy's to check (allocate and start_rounds do).
        return policy, (tracker, prior, static), success_probs, allocate_options

    def start_rounds(self, prompt_ids, budget, *, rounds=None, first_round=None,
                     later_budgets=None, min_rollouts=None, max_rollouts=None, observe=True,
                     **allocate_options: Any):
        """Plan the step's ``budget`` in ``rounds`` rounds (docs/theory.md section 9);
        returns a :class:`~sera_opt.rounds.RoundSession`.

        ``rounds`` defaults to :data:`DEFAULT_ROUNDS`, 1: a session of one round whose
        counts are those of :meth:`plan` (the planner's :attr:`policy`), bit for bit,
        so that one loop serves both. Rounds are opt-in (``rounds=4``, say): the first
        round gives every prompt ``first_round`` rollouts; each round after it is
        allocated by :attr:`round_policy` on the tracker's posteriors updated with the
        step's outcomes so far, within the bounds of the planner's policy. Everything
        :meth:`plan` would check is checked here, before the first round.

        When the session ends (its last :meth:`~sera_opt.rounds.RoundSession.record`,
        or :meth:`~sera_opt.rounds.RoundSession.stop`) it hands itself to
        :meth:`observe_rounds`, and the tracker receives every round's outcomes in one
        update: do not also :meth:`observe` them. With ``observe=False`` it does not,
        and the caller observes the rollouts itself (a data-parallel trainer observes
        every process's rollouts, not only its own).

        ``first_round``, ``later_budgets``, ``min_rollouts`` and ``max_rollouts`` are
        those of :meth:`sera_opt.AllocationPolicy.start_rounds`; ``allocate_options``
        the policy's other extra inputs (as for :meth:`plan`).
        """
        from .problem import validate_count

        count = DEFAULT_ROUNDS if rounds is None else validate_count(rounds, "rounds",
                                                                     minimum=1)
        if not isinstance(observe, bool):
            raise SeraOptError(f"observe must be True or False; got {observe!r}.")
        policy, (tracker, prior, static_policy), success_probs, options = self._inputs(
            prompt_ids, allocate_options, "start_rounds", posterior=True, rounds=count > 1)
        ids = _id_array(prompt_ids)
        if _batch_is_cold(tracker, prompt_ids):
            # The authors' cold start: a batch with an unseen prompt is uniform, in every round.
            policy = static_policy = _cold_start_policy(static_policy, min_rollouts,
                                                        max_rollouts)
            if success_probs is None:
                success_probs = prior[0] / (prior[0] + prior[1])
            options.pop("posterior", None)
        if policy is not static_policy and max_rollouts is None and policy.max_rollouts is None:
            # The round policy keeps the planner's cap (max_ratio times the average
            # count), which the static policy computes per call.
            max_rollouts = static_policy.bounds(ids.shape[0], budget,
                                                min_rollouts=min_rollouts)[1]
        session = policy.start_rounds(
            success_probs, budget, rounds=rounds, first_round=first_round,
            later_budgets=later_budgets, min_rollouts=min_rollouts, max_rollouts=max_rollouts,
            prior=prior, prompt_ids=ids, observer=self if observe else None, **options)
        if observe:
            with self._lock:
                self._owed[session.session_id] = None
        return session

    def observe_rounds(self, session) -> RolloutPlanner:
        """Feed the outcomes of a finished round session into the tracker, once.

        A session that this planner started (with ``observe=True``) calls this itself
        when it ends. Call it for a copy of such a session: one restored from a
        checkpoint (a pickled or copied session does not report by itself), delivered
        to the planner whose state was saved with it. The outcomes of one
        :attr:`~sera_opt.rounds.RoundSession.session_id` reach the tracker once: a
        second delivery (the original and its copy both finished) is refused, and so
        is a session the planner does not owe (started with ``observe=False``, or by
        another planner whose state this one does not carry).
        """
        from .rounds import RoundSession

        if not isinstance(session, RoundSession):
            raise SeraOptError(
                f"observe_rounds takes the RoundSession that start_rounds returned, got "
                f"{type(session).__name__}."
            )
        if not session.done:
            raise SeraOptError(
                "the session has rounds left; record them (or stop() it) before its outcomes "
                "are observed."
            )
        result = session.result()
        with self._lock:
            if session.session_id not in self._owed:
                raise SeraOptError(
                    f"round session {session.session_id} is not owed to this planner's tracker: "
                    f"its outcomes were observed already (a copy of a session shares its id and "
                    f"counts once), or it was started with observe=False, or by a planner whose "
                    f"state this one does not carry. Observe each step's outcomes once."
                )
            del self._owed[session.session_id]
            tracker = self.tracker
        if result.num_rollouts:
            tracker.update(np.asarray(result.prompt_ids)[result.prompt_index], result.rewards)
        return self

    @property
    def open_rounds(self) -> tuple[str, ...]:
        """The ids of the round sessions whose outcomes the tracker is still owed (started
        with ``observe=True`` and not yet observed), oldest first."""
        with self._lock:
            return tuple(self._owed)

    def observe(self, prompt_ids, rewards) -> RolloutPlanner:
        """Record rollout outcomes (one entry per rollout); see :meth:`SuccessTracker.update`."""
        if isinstance(prompt_ids, Allocation):
            raise SeraOptError(
                "observe takes one prompt id per rollout, not the plan: pass "
                "np.repeat(prompt_ids, plan.counts) (the batch's ids, each repeated by its "
                "count) and the rewards in that order."
            )
        with self._lock:
            tracker = self.tracker
        tracker.update(prompt_ids, rewards)  # the tracker holds its own lock
        return self

    def config(self) -> dict[str, Any]:
        """The planner's configuration: its policy's and its round policy's
        (:meth:`AllocationPolicy.config`). Two planners with equal configurations plan
        alike, in one round and in rounds."""
        with self._lock:
            return {"policy": self.policy.config(), "round_policy": self.round_policy.config()}

    def state_dict(self) -> dict[str, Any]:
        """The policy's configuration, the tracker's state and the ids of the round
        sessions still owed to the tracker (:attr:`open_rounds`), for checkpoints.

        A session open when the state is saved is not in it, only its id: checkpoint
        the session beside the state (it pickles), and after :meth:`load_state_dict`
        finish it and hand it to :meth:`observe_rounds`; its outcomes then reach the
        tracker once, as in a step run through.
        """
        with self._lock:
            return {
                "format": _FORMAT,
                "policy": self.policy.config(),
                # None: the rounds use the policy itself.
                "round_policy": (None if self.round_policy is self.policy
                                 else self.round_policy.config()),
                "tracker": self.tracker.state_dict(),
                "open_rounds": list(self._owed),
            }

    def load_state_dict(self, state: Mapping[str, Any], *, replace_config: bool = False,
                        **objects: Any) -> RolloutPlanner:
        """Restore a :meth:`state_dict`, all or nothing: the tracker exactly, and the
        policy (and the round policy) rebuilt from their configurations. Returns
        ``self``. A state saved before planners had a round policy of their own
        (format ``/2`` or ``/1``) plans its rounds with its policy, as it did then.

        The round sessions the state still owed its tracker (``"open_rounds"``) are owed
        again: finish each (restored from its own checkpoint) and hand it to
        :meth:`observe_rounds`. Sessions opened before the load and not in the state are
        no longer owed (the state predates them).

        The state must be of this planner's configuration: its policy, round policy and
        tracker settings (:meth:`config`, the tracker's prior, decay or discount). One of
        another configuration is refused with both named, unless ``replace_config=True``
        asks for the state's configuration to replace the planner's. A rejected state
        raises :class:`SeraOptError` and leaves the planner as it was. Options the state can only name (a solver that is not registered) are
        taken from the planner's current policy when it holds one of that name, or
        from ``objects`` (``load_state_dict(state, solver=my_solver)``).
        """
        if not isinstance(state, Mapping) or state.get("format") not in (_FORMAT, _FORMAT_V2,
                                                                          _FORMAT_V1):
            raise SeraOptError(
                f"not a RolloutPlanner state (expected format {_FORMAT!r}); pass the dict that "
                f"RolloutPlanner.state_dict() returned."
            )
        try:
            if state["format"] == _FORMAT_V1:
                config = {"name": state["policy"], "options": dict(state["policy_options"])}
            else:
                config = state["policy"]
            round_config = state["round_policy"] if state["format"] == _FORMAT else None
            tracker_state = state["tracker"]
            tracker_type = _tracker_for_state(tracker_state)
            owed = state.get("open_rounds", [])
        except (KeyError, TypeError) as exc:
            raise SeraOptError(f"malformed RolloutPlanner state: missing {exc}.") from None
        if (not isinstance(owed, (list, tuple))
                or not all(isinstance(key, str) for key in owed)):
            raise SeraOptError(
                f"malformed RolloutPlanner state: 'open_rounds' must be a list of round "
                f"session ids (strings), got {owed!r}."
            )
        with self._lock:
            policy = policy_from_config(config, **self._current_objects(config, objects))
            round_policy = (policy if round_config is None else policy_from_config(
                round_config, **self._current_objects(round_config, objects))
            )
            tracker = tracker_type.from_state_dict(tracker_state)
            if not isinstance(replace_config, bool):
                raise SeraOptError(
                    f"replace_config must be True or False; got {replace_config!r}.")
            if not replace_config:
                self._check_same_configuration(policy, round_policy, tracker)
            # All built and checked: swap them in together.
            self.policy, self.round_policy, self.tracker = policy, round_policy, tracker
            self._owed = dict.fromkeys(owed)
        return self

    def _check_same_configuration(self, policy, round_policy, tracker) -> None:
        """Refuse a state whose configuration is not this planner's (load never changes
        what the caller asked for without being told to)."""
        ours = {"policy": self.policy.config(), "round_policy": self.round_policy.config(),
                "tracker": (type(self.tracker).__name__, _tracker_config(self.tracker))}
        theirs = {"policy": policy.config(), "round_policy": round_policy.config(),
                  "tracker": (type(tracker).__name__, _tracker_config(tracker))}
        differ = [key for key in ours if not _same(ours[key], theirs[key])]
        if differ:
            lines = "; ".join(f"{key}: the planner's {ours[key]!r}, the state's {theirs[key]!r}"
                              for key in differ)
            raise SeraOptError(
                f"the state is of another planner configuration ({lines}). Build the planner "
                f"with the state's configuration, or pass replace_config=True to load it with "
                f"its own.")

    def _current_objects(self, config, objects: dict[str, Any]) -> dict[str, Any]:
        """``objects``, completed from the current policy for options the configuration
        only names and that the current policy holds under the same name."""
        out = dict(objects)
        try:
            options = dict(config.get("options", {}))
        except (AttributeError, TypeError, ValueError):
            return out
        for key, value in options.items():
            if key in out or not (isinstance(value, Mapping) and set(value) == {"object", "name"}):
                continue
            current = getattr(self.policy, key, None)
            if getattr(current, "name", None) == value["name"]:
                out[key] = current
        return out

    def __repr__(self) -> str:
        return (f"RolloutPlanner(policy={self.policy!r}, round_policy={self.round_policy!r}, "
                f"tracker={self.tracker!r})")


def _tracker_config(tracker) -> dict[str, Any]:
    """A tracker's settings, as its state records them."""
    config = getattr(tracker, "config", None)
    if callable(config):
        return dict(config())
    return dict(tracker.state_dict()["config"])


def _same(a, b) -> bool:
    """Equal configurations (arrays of bounds compared by value)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


def _tracker_types() -> tuple[type, ...]:
    from .tracking import EpochTracker

    return (SuccessTracker, EpochTracker)


def _default_tracker(policy: AllocationPolicy):
    """The tracker of a planner built without one: the authors' estimates for their
    configuration, ``SuccessTracker()`` otherwise."""
    if policy.name == "sera-paper":
        from .tracking import EpochTracker

        return EpochTracker()
    return SuccessTracker()


def _tracker_for_state(state) -> type:
    """The tracker class that wrote ``state`` (by its format tag)."""
    from .tracking import EpochTracker

    fmt = state.get("format", "") if isinstance(state, Mapping) else ""
    return EpochTracker if str(fmt).startswith("sera_opt.EpochTracker") else SuccessTracker


def _batch_is_cold(tracker, prompt_ids) -> bool:
    """Whether the tracker asks for the whole batch to be allocated uniformly (the
    authors' cold start: a prompt of the batch has no estimate yet)."""
    cold = getattr(tracker, "batch_is_cold", None)
    return bool(cold(prompt_ids)) if cold is not None else False


def _cold_start(policy: AllocationPolicy, success_probs, budget, min_rollouts, max_rollouts
                ) -> Allocation:
    """Every prompt of the batch active with the same count (``N0`` each, weight 1), as
    the authors plan a batch with an unseen prompt: plain MaxRL."""
    alloc = _cold_start_policy(policy, min_rollouts, max_rollouts).allocate(success_probs, budget)
    return alloc.replace(solver=f"{policy.name} (cold start: uniform)", status="cold start")


def _cold_start_policy(policy: AllocationPolicy, min_rollouts, max_rollouts) -> AllocationPolicy:
    """Uniform allocation with ``policy``'s offset and bounds (the call's where given)."""
    from .policies import UniformPolicy

    lo = policy.min_rollouts if min_rollouts is None else min_rollouts
    hi = policy.max_rollouts if max_rollouts is None else max_rollouts
    return UniformPolicy(offset=policy.offset, min_rollouts=lo, max_rollouts=hi)


def _check_default_options(options: dict[str, Any]) -> None:
    """Refuse options the default policy does not take with the planner that takes them:
    ``RolloutPlanner(alpha=2.0)`` was ``sera-fair`` at alpha 2 while that was the default."""
    from .policies import POLICIES

    own = set(POLICIES.lookup(DEFAULT_POLICY).accepted_option_names(options))
    foreign = sorted(set(options) - own)
    if not foreign:
        return
    fair = set(POLICIES.lookup("sera-fair").accepted_option_names(options))
    if set(foreign) <= fair:
        given = ", ".join(f"{k}={options[k]!r}" for k in foreign)
        raise SeraOptError(
            f"RolloutPlanner() allocates with {DEFAULT_POLICY!r} (the default; "
            f"docs/benchmarks.md, 'A default chosen on cost'), which takes no "
            f"{', '.join(foreign)}. "
            f"For allocation by the tracker's estimates name the policy: "
            f"RolloutPlanner(\"sera-fair\", {given}, offset=1, min_rollouts=2)."
        )


def _round_policy_named(name: str, policy: AllocationPolicy) -> AllocationPolicy:
    """The policy registered as ``name`` with ``policy``'s offset and bounds (its ratio
    cap is applied per call, by :meth:`RolloutPlanner.start_rounds`)."""
    return get_policy(name, offset=policy.offset, min_rollouts=policy.min_rollouts,
                      max_rollouts=policy.max_rollouts)
