"""Allocation in rounds within a step (docs/theory.md section 9).

A :class:`RoundSession` spends one step's fixed budget over ``R`` rounds: a
first, non-adaptive round, then rounds that each allocate exactly, by the
policy's own rule, on what the step has shown so far. Built by
:meth:`sera_opt.AllocationPolicy.start_rounds` (probabilities taken as the truth)
or :meth:`sera_opt.RolloutPlanner.start_rounds` (the tracker's posteriors,
updated round by round)::

    session = planner.start_rounds(prompt_ids, budget, rounds=3)
    for counts in session:                     # int64, one entry per prompt
        session.record(sample_and_score(counts))
    out = session.result()                     # counts, round_index, rewards, factors

or, the same loop, ``out = run_rounds(session, sample_and_score)``. Only rounds
that sample are run: a round the budget leaves empty is dropped when the session
starts.

What a round does (for both estimator offsets, with the first-round baseline of
``maxrl_advantages(..., round_index=...)`` under offset 1):

* A prompt that has a success already has its final scale: more rollouts only
  lower its variance. A prompt without one is *active*: ``m`` more rollouts give
  it the expected scale ``E[1 - (1 - p)^m]`` under its updated posterior (or at
  its known ``p``).
* Policies whose :attr:`~sera_opt.AllocationPolicy.round_mode` is ``"scale"``
  (``sera``, ``sera-fair``, ``sera-bayes``) solve their own objective over the
  active prompts in the count ``m`` of this round (``m = 0`` allowed), on the
  updated estimates; the engine's exact solve does it. Those of round mode
  ``"totals"`` (uniform and the peers) apply their own rule to the active
  prompts' totals: counts at least what each has drawn, this round's budget on top.
* Budget an active prompt cannot take (every one at its cap) goes to the prompts
  with capacity left, lowest totals first, so a round spends exactly its share.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
import uuid
import warnings
from typing import Any

import numpy as np

from ..exceptions import SeraOptError, SeraOptWarning
from ..problem import AllocationProblem, exact_sum, validate_count
from ..separable.levels import expected_factors
from ..separable.objective import solve_validated
from ..separable.tiers import even_increments
from .outcomes import binary_rewards, read_only, rollout_layout
from .result import RoundResult, run_rounds

#: The rounds a step is sampled in when none are named: 1, the static plan in one
#: generation call. Rounds are opt-in (``rounds=4`` and the like): through TRL on CPU a
#: step in 4 rounds costs 2.04x to 2.24x a step in one, the extra being the generation
#: backend's cost per call, so the default returned to one round until a rule fixed
#: before a compute-matched experiment says otherwise (docs/benchmarks.md). See
#: :data:`sera_opt.planner.DEFAULT_ROUND_POLICY` for the policy of explicit later rounds.
DEFAULT_ROUNDS = 1

#: The ways a policy takes part in rounds (:attr:`sera_opt.AllocationPolicy.round_mode`):
#: ``"scale"``, its objective solved over the active prompts in the count of the round;
#: ``"totals"``, its rule applied to the active prompts' totals.
ROUND_MODES = ("scale", "totals")

__all__ = ["RoundSession", "RoundResult", "round_budgets", "run_rounds", "DEFAULT_ROUNDS",
           "ROUND_MODES"]


def round_budgets(budget: int, first_total: int, rounds: int, later_budgets=None) -> list[int]:
    """The budget of each round that samples: ``first_total`` for the first, the rest by
    ``later_budgets``.

    ``later_budgets=None`` divides what is left evenly over the ``rounds - 1`` later
    rounds (the earlier ones take the remainder); a sequence gives the later rounds'
    budgets itself and must have ``rounds - 1`` entries summing to what is left.
    Rounds that would get no budget are left out (they would draw nothing): with
    ``rounds`` beyond what the budget can fill, the list is shorter than ``rounds``.
    Its length is at most ``1 + budget - first_total`` whatever ``rounds`` is.

    Raises
    ------
    SeraOptError
        ``rounds < 1``; a first round larger than the budget; ``later_budgets`` of
        the wrong length or sum.
    """
    budget = validate_count(budget, "budget")
    first_total = validate_count(first_total, "first_total")
    rounds = validate_count(rounds, "rounds", minimum=1)
    rest = budget - first_total
    if rest < 0:
        raise SeraOptError(
            f"the first round needs {first_total} rollouts but the budget is {budget}; lower "
            f"first_round (or min_rollouts) or raise the budget."
        )
    if rounds == 1:
        return [budget]
    if later_budgets is None:
        # Built from the counts of each size, never one entry per requested round:
        # rounds=10**9 costs what the rounds that sample cost.
        base, extra = divmod(rest, rounds - 1)
        if base:
            return [first_total] + [base + 1] * extra + [base] * (rounds - 1 - extra)
        return [first_total] + [1] * extra
    try:
        later = [validate_count(b, "later_budgets") for b in later_budgets]
    except TypeError:
        raise SeraOptError(
            f"later_budgets must be a sequence of {rounds - 1} whole numbers (the later "
            f"rounds' budgets), got {later_budgets!r}."
        ) from None
    if len(later) != rounds - 1 or sum(later) != rest:
        raise SeraOptError(
            f"later_budgets must give the {rounds - 1} later rounds' budgets and sum to the "
            f"budget left after the first round ({rest}); got {later!r}."
        )
    return [first_total, *(b for b in later if b)]


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised by the caller of this function at
    the first frame outside sera_opt (the session is built through one or two layers)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("sera_opt"):
        frame = frame.f_back
        level += 1
    return level


class RoundSession:
    """One step's budget, spent round by round. Use
    :meth:`sera_opt.AllocationPolicy.start_rounds` or
    :meth:`sera_opt.RolloutPlanner.start_rounds` to build one.

    Iterating a session yields each round's counts until its budget is spent; record
    each round's rewards before taking the next (:func:`run_rounds` is that loop).

    A session is a value: it holds arrays, its policy and its id, and can be pickled
    and copied (``copy.copy`` and ``copy.deepcopy`` both give an independent session)
    to checkpoint a step part-way. A copy is *detached*:
    it does not report to the planner that started the original. The outcomes of a
    planner's session reach its tracker once per :attr:`session_id`: the original
    reports them when it ends, and a copy (or a session restored from a pickle) is
    delivered with :meth:`sera_opt.RolloutPlanner.observe_rounds`; the planner refuses
    a second delivery of the same id.

    Thread safety: the calls that change a session (:meth:`next_round`, :meth:`record`,
    :meth:`stop`) hold its lock, so threads sharing one session see each call whole; a
    call out of turn (a second ``next_round`` before the ``record``) is refused as in
    one thread.
    """

    def __init__(self, policy, budget: int, *, rounds: int, first_round: int,
                 later_budgets=None, lo: np.ndarray, hi: np.ndarray,
                 truth: np.ndarray | None, prior, inputs: dict[str, Any],
                 static_counts: np.ndarray | None = None, prompt_ids=None, observer=None,
                 rounds_named: bool = True):
        self.policy = policy
        self.offset = int(policy.offset)
        self.budget = budget
        self.session_id = uuid.uuid4().hex
        self._lo, self._hi = lo, hi
        self._truth = truth
        self._prior = prior
        self._inputs = inputs
        self._prompt_ids = prompt_ids
        self._observer = observer
        self._lock = threading.Lock()
        m = lo.shape[0]
        self.num_prompts = m
        if rounds == 1:
            self._first = np.array(static_counts, dtype=np.int64)
            self._budgets = [budget]
        else:
            # A switched-off prompt (max_rollouts 0) gets no round at all.
            first_counts = np.where(hi > 0, np.maximum(lo, first_round), 0)
            over = first_counts > hi
            if over.any():
                i = int(np.flatnonzero(over)[0])
                raise SeraOptError(
                    f"the first round gives prompt {i} {int(first_counts[i])} rollouts, above "
                    f"its max_rollouts={int(hi[i])}; lower first_round or raise max_rollouts."
                )
            self._first = first_counts
            self._budgets = round_budgets(budget, exact_sum(first_counts), rounds, later_budgets)
            if len(self._budgets) < rounds and rounds_named:
                warnings.warn(
                    f"rounds={rounds} asks for more rounds than the budget can fill: after the "
                    f"first round's {self._budgets[0]} rollouts, {budget - self._budgets[0]} are "
                    f"left for {rounds - 1} later rounds, so {rounds - len(self._budgets)} of "
                    f"them would draw nothing. The session runs only the rounds that sample "
                    f"({len(self._budgets)}); ask for at most {len(self._budgets)} (or raise the "
                    f"budget) to silence this.", SeraOptWarning, stacklevel=_user_stacklevel())
        #: The number of rounds the session runs: those that sample (a round the budget
        #: leaves empty is dropped when the session starts).
        self.rounds = len(self._budgets)
        self._spent = 0
        self._total = np.zeros(m, dtype=np.int64)
        self._successes = np.zeros(m, dtype=np.int64)
        self._first_successes = np.zeros(m, dtype=np.int64)
        self._round_counts: list[np.ndarray] = []
        self._round_wins: list[np.ndarray] = []
        self._rewards: list[np.ndarray] = []
        self._replay: list[tuple | None] = []  # per later round, what the factors replay needs
        self._unsolved_fraction: list[float] = []
        self._active_fraction: list[float] = []
        self._pending: np.ndarray | None = None
        # The active mask changes only when a round is recorded: kept from there, so that
        # planning a round does not derive it again.
        self._active = hi > 0
        self._stopped = False
        self._result: RoundResult | None = None
        self._wall = 0.0
        #: The static plan behind the first round (an :class:`~sera_opt.Allocation`, with
        #: its active set where the policy has one); None for a session in rounds whose
        #: first round is not a plan of the policy's, and in a copy (which carries the
        #: step's counts, not the plan's problem).
        self.static_allocation = None

    # ------------------------------------------------------------ a value
    def __getstate__(self) -> dict[str, Any]:
        # A copy carries the step, not the link to the planner that started the
        # original (it would report the same outcomes twice), nor the lock.
        state = self.__dict__.copy()
        del state["_lock"]
        state["_observer"] = None
        state["static_allocation"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __copy__(self) -> RoundSession:
        # A shallow copy would share the rounds' lists with the original, and recording
        # in one would change the other: every copy is a whole, independent session.
        return copy.deepcopy(self)

    # ------------------------------------------------------------ state
    @property
    def round(self) -> int:
        """The number of rounds recorded so far."""
        return len(self._rewards)

    @property
    def done(self) -> bool:
        """Whether the budget is spent (every round recorded), or :meth:`stop` was called."""
        return self._stopped or self._spent == self.budget

    @property
    def spent(self) -> int:
        """The rollouts recorded so far."""
        return self._spent

    @property
    def round_budgets(self) -> tuple[int, ...]:
        """The budget of each round that samples (the first is the first round's total)."""
        return tuple(self._budgets)

    @property
    def counts(self) -> np.ndarray:
        """The rollouts each prompt has drawn so far (a copy)."""
        return self._total.copy()

    @property
    def successes(self) -> np.ndarray:
        """The successes each prompt has had so far (a copy)."""
        return self._successes.copy()

    @property
    def prompt_index(self) -> np.ndarray:
        """The prompt (0..M-1) of each recorded rollout, in order (as in the result)."""
        return rollout_layout(self._round_counts, self.num_prompts)[1]

    @property
    def prompt_ids(self):
        """The planner's ids of the prompts (planner sessions only; else None)."""
        return self._prompt_ids

    def active(self) -> np.ndarray:
        """Mask of the prompts whose scale still depends on more rollouts: no success
        yet, and below their cap."""
        return self._active.copy()

    # ------------------------------------------------------------ rounds
    def __iter__(self):
        """Each round's counts (as :meth:`next_round`) until the session is done."""
        while not self.done:
            yield self.next_round()

    def next_round(self) -> np.ndarray:
        """The counts of the next round (int64, one per prompt; 0 for a prompt that
        gets nothing; at least one rollout in all). Record the round's rewards with
        :meth:`record` before asking for the next one."""
        with self._lock:
            if self.done:
                raise SeraOptError(
                    "the session is done; call result() (or start a new session)."
                )
            if self._pending is not None:
                raise SeraOptError(
                    "record() this round's rewards before asking for the next round."
                )
            start = time.perf_counter()
            r = len(self._rewards)
            if r == 0:
                counts = self._first.copy()
                self._replay.append(None)
            else:
                counts = self._allocate_round(self._budgets[r])
            self._pending = counts
            self._wall += time.perf_counter() - start
            return counts.copy()

    def record(self, rewards) -> RoundSession:
        """Take the rewards of the round that :meth:`next_round` gave: one per rollout,
        grouped by prompt in order (``sum(counts)`` in all: ``counts[0]`` rewards of
        prompt 0, then ``counts[1]`` of prompt 1, ...), binary (a sequence, numpy array
        or torch tensor, any dtype, bfloat16 and float16 included)."""
        with self._lock:
            if self._pending is None:
                raise SeraOptError(
                    "call next_round() first; record() takes that round's rewards."
                )
            counts = self._pending
            r = binary_rewards(rewards, exact_sum(counts))
            owner = np.repeat(np.arange(self.num_prompts), counts)
            wins = np.bincount(owner, weights=r, minlength=self.num_prompts).astype(np.int64)
            if not self._rewards:
                self._first_successes = wins.copy()
            self._total += counts
            self._successes += wins
            self._spent += r.shape[0]
            self._round_counts.append(counts)
            self._round_wins.append(wins)
            self._rewards.append(r)
            self._pending = None
            unsolved = self._successes == 0
            self._active = unsolved & (self._total < self._hi)
            m = self.num_prompts
            self._unsolved_fraction.append(float(unsolved.mean()) if m else 0.0)
            self._active_fraction.append(float(self._active.mean()) if m else 0.0)
            finished = self.done
        if finished:
            self._report()
        return self

    def stop(self) -> RoundSession:
        """End the session before its budget is spent: the budget not yet spent is not
        drawn (the realized counts then sum to less than the budget). A round handed
        out by :meth:`next_round` and not recorded is dropped."""
        with self._lock:
            if self.done:
                return self
            self._pending = None
            self._stopped = True
        self._report()
        return self

    def _report(self) -> None:
        """Hand the ended session to its observer (the planner that started it), once."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.observe_rounds(self)

    def result(self) -> RoundResult:
        """The realized counts, the rollouts' prompts and rounds, the rewards and the
        expected scales; only once the session is :attr:`done`."""
        if not self.done:
            raise SeraOptError(
                f"the session has {self.budget - self._spent} of its {self.budget} rollouts "
                f"left ({self.rounds - len(self._rewards)} round(s)); record them, or call "
                f"stop() to end it early."
            )
        if self._result is None:
            rc, prompt_index, rounds = rollout_layout(self._round_counts, self.num_prompts)
            rewards = (np.concatenate(self._rewards) if self._rewards
                       else np.zeros(0, dtype=np.float64))
            self._result = RoundResult(
                counts=read_only(self._total.copy()),
                prompt_index=read_only(prompt_index),
                round_index=read_only(rounds),
                rewards=read_only(rewards),
                round_counts=read_only(rc),
                round_budgets=tuple(self._budgets[:len(self._round_counts)]),
                unsolved_fraction=read_only(np.array(self._unsolved_fraction)),
                active_fraction=read_only(np.array(self._active_fraction)),
                factors=read_only(self.factors()),
                offset=self.offset,
                prompt_ids=self._prompt_ids,
                stopped_early=self._stopped and self._spent < self.budget,
                session_id=self.session_id,
                wall_time=self._wall,
            )
        return self._result

    def __repr__(self) -> str:
        state = "done" if self.done else f"round {self.round + 1} of {self.rounds}"
        return (f"RoundSession(policy={self.policy.name!r}, prompts={self.num_prompts}, "
                f"budget={self.budget}, rounds={self.rounds}, {state}, "
                f"session_id={self.session_id!r})")

    # ------------------------------------------------------------ one round
    def _estimates(self, rows: np.ndarray, total: np.ndarray) -> np.ndarray:
        """Success probabilities of ``rows`` with no success in ``total`` draws: the
        truth, or the posterior mean updated with the step's failures."""
        if self._truth is not None:
            return self._truth[rows]
        a, b = self._prior
        return a[rows] / (a[rows] + b[rows] + total)

    def _round_objective(self, rows: np.ndarray, total: np.ndarray):
        """The policy's objective over ``rows`` in the state "no success in ``total``
        draws", and the solve's lower bound per row (the count meaning "nothing more")."""
        policy = self.policy
        # Both branches of _estimates gather into a new array (fancy indexing copies):
        # nothing else holds it, so the problem may keep it without a second copy.
        p = np.asarray(self._estimates(rows, total), dtype=np.float64)
        p.setflags(write=False)
        shifted = policy.round_mode == "scale"
        lo = np.full(rows.shape[0], self.offset, dtype=np.int64) if shifted else total.copy()
        k = rows.shape[0]
        base = 1 + self.offset
        problem = AllocationProblem.from_validated(p, base * k, base, base, self.offset, False)
        inputs = {key: None if value is None else np.asarray(value)[rows]
                  for key, value in self._inputs.items()}
        if "posterior" in policy.extra_inputs:
            inputs["posterior"] = self._posterior(rows, total)
        return policy.round_objective(problem, **inputs), lo

    def _posterior(self, rows: np.ndarray, total: np.ndarray):
        """The Beta posterior of ``rows`` after ``total`` failures this step (None: the
        policy's point probabilities)."""
        if self._prior is not None:
            a, b = self._prior
            return a[rows], b[rows] + total
        pseudo = getattr(self.policy, "pseudo_posterior", None)
        post = None if pseudo is None else pseudo(self._truth[rows])
        if post is None:
            return None
        return post[0], post[1] + total

    def _allocate_round(self, budget: int) -> np.ndarray:
        m = self.num_prompts
        counts = np.zeros(m, dtype=np.int64)
        active = np.flatnonzero(self._active)
        room = self._hi - self._total
        spill = budget
        replay = None
        if active.size and budget:
            room_active = room[active]
            capacity = exact_sum(room_active)
            take = min(budget, capacity)
            if take == capacity:
                counts[active] = room_active
            else:
                objective, lo = self._round_objective(active, self._total[active])
                taken = solve_validated(objective, lo, lo + room_active, take,
                                        np.zeros(4, dtype=np.int64)) - lo
                counts[active] = taken
                replay = (objective, lo, taken)
            spill = budget - take
        if replay is None:
            replay = (None, None, counts[active].copy() if active.size else None)
        if spill:
            free = room - counts
            counts += even_increments(self._total + counts, free, spill)
        self._replay.append((active, spill) + replay)
        return counts

    # ------------------------------------------------------------ scales
    def factors(self) -> np.ndarray:
        """Each prompt's expected scale ``kappa_i`` (docs/theory.md section 9) for the
        session's offset, under the session's estimates: the known ``p`` for a policy's
        session, the end-of-step posterior for a planner's.

        ``kappa_i = P(K_i >= 1)`` for offset 0 and ``P(K_i >= 1) - p_i (1 - p_i)^(n0_i -
        1)`` for offset 1 with the first-round baseline. ``P(K_i >= 1)`` is
        ``1 - (1 - p_i)^F_i`` with ``F_i`` the rollouts prompt ``i`` draws on the path
        where it never succeeds: its realized count if it never did, and otherwise
        its counts up to its first success followed by those the later rounds would
        have given it (each such count is its share of the round when merged into the
        round's exact solution, the other prompts held at their realized state). With
        ``rounds=1`` these are the static allocation's factors ``w_c(p_i, n_i)``.
        """
        rc = self._round_counts
        m = self.num_prompts
        if not rc:
            return np.zeros(m)
        fail_total = rc[0].copy() if len(self._budgets) == 1 else self._fail_path_total()
        first = rc[0]
        offset = self.offset
        if self._truth is not None:
            p = self._truth
            with np.errstate(divide="ignore", invalid="ignore"):  # p = 1: log 0, 0 * -inf
                log_q = np.log1p(-p)
                hit = np.where(fail_total == 0, 0.0, -np.expm1(fail_total * log_q))
                if not offset:
                    return hit
                tail = np.where(first > 1, np.exp((first - 1) * log_q), 1.0)
            return hit - np.where(first >= 1, p * tail, 0.0)
        a, b = self._prior
        a_end = a + self._successes
        b_end = b + self._total - self._successes
        hit = expected_factors(a_end, b_end, fail_total, 0)
        if offset:
            # E[p (1-p)^(n0-1)] = E[(1-p)^(n0-1)] - E[(1-p)^n0]
            gate = (expected_factors(a_end, b_end, first, 0)
                    - expected_factors(a_end, b_end, np.maximum(first - 1, 0), 0))
            return hit - np.where(first >= 1, gate, 0.0)
        return hit

    def _fail_path_total(self) -> np.ndarray:
        """``F_i``: each prompt's rollouts on the path where it never succeeds."""
        rc = self._round_counts
        wins = self._round_wins
        fail = rc[0].copy()
        seen = wins[0] > 0  # a success before the round
        for r in range(1, len(rc)):
            active, spill, objective, lo, taken = self._replay[r]
            ghosts = np.flatnonzero(seen & (fail < self._hi))
            # Prompts active in round r drew their realized count on the fail path too.
            fail[active] += rc[r][active]
            if ghosts.size:
                fail[ghosts] += self._ghost_counts(ghosts, fail[ghosts], objective, lo, taken,
                                                   spill)
            seen = seen | (wins[r] > 0)
        return fail

    def _ghost_counts(self, ghosts, total, objective, lo, taken, spill) -> np.ndarray:
        """What each of ``ghosts`` (no success in ``total`` draws) would have drawn in a
        round, merged alone into that round's solution: its steps that beat, one by
        one, the weakest steps the round took (spill steps first, as the weakest)."""
        room = self._hi[ghosts] - total
        need = int(room.max()) if room.size else 0
        weakest = np.full(spill, -np.inf)
        if objective is not None and spill < need:
            # The weakest steps taken are rows' last ones (each row's gains fall with the
            # count): walk back from the end until no row's earlier step can be among the
            # ``need`` weakest.
            steps = [weakest]
            found = np.zeros(0)
            for j in range(1, int(taken.max()) + 1 if taken.size else 1):
                rows = np.flatnonzero(taken >= j)
                gains = objective.row_gains(rows, np.maximum(lo + taken - j, lo))
                found = np.sort(np.concatenate([found, gains]))[:need - spill]
                if found.size == need - spill and gains.min() >= found[-1]:
                    break
            steps.append(found)
            weakest = np.concatenate(steps)
        ghost_obj, ghost_lo = self._round_objective(ghosts, total)
        out = np.zeros(ghosts.shape[0], dtype=np.int64)
        steps = min(int(room.max()) if room.size else 0, weakest.shape[0])
        if not ghost_obj.gains_by_row:
            # Gains that cost less than gathering the rows: every ghost at every step.
            alive = room > 0
            for k in range(steps):
                if not alive.any():
                    break
                alive &= (ghost_obj.gains(ghost_lo + k) > weakest[k]) & (room > k)
                out += alive
            return out
        # A ghost stops at its first step that loses (or at its cap) and never resumes,
        # so only the ghosts still drawing are evaluated: most stop after a few steps.
        alive = np.flatnonzero(room > 0)
        for k in range(steps):
            if not alive.size:
                break
            gain = ghost_obj.row_gains(alive, ghost_lo + k)
            alive = alive[(gain > weakest[k]) & (room[alive] > k)]
            out[alive] += 1
        return out

