"""Allocation in rounds within a step (docs/theory.md section 9).

A :class:`RoundSession` spends one step's fixed budget over ``R`` rounds: a
first, non-adaptive round, then rounds that each allocate exactly, by the
policy's own rule, on what the step has shown so far. Built by
:meth:`sera_opt.AllocationPolicy.start_rounds` (probabilities taken as the truth)
or :meth:`sera_opt.RolloutPlanner.start_rounds` (the tracker's posteriors,
updated round by round)::

    session = planner.start_rounds(prompt_ids, budget, rounds=3)
    while not session.done:
        counts = session.next_round()          # int64, one entry per prompt
        session.record(sample_and_score(counts))
    out = session.result()                     # counts, round_index, rewards, factors

What a round does (for both estimator offsets, with the first-round baseline of
``maxrl_advantages(..., round_index=...)`` under offset 1):

* A prompt that has a success already has its final scale: more rollouts only
  lower its variance. A prompt without one is *active*: ``m`` more rollouts give
  it the expected scale ``E[1 - (1 - p)^m]`` under its updated posterior (or at
  its known ``p``).
* Policies whose counts follow the scale (``offset_sensitive``: ``sera``,
  ``sera-fair``, ``sera-bayes``) solve their own objective over the active
  prompts in the count ``m`` of this round (``m = 0`` allowed), on the updated
  estimates; the engine's exact solve does it. The other policies (uniform and the
  peers) apply their own rule to the active prompts' totals: counts at least what
  each has drawn, this round's budget on top.
* Budget an active prompt cannot take (every one at its cap) goes to the prompts
  with capacity left, lowest totals first, so a round spends exactly its share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _jit
from ..exceptions import SeraOptError
from ..problem import AllocationProblem, exact_sum, validate_count
from ..separable.levels import expected_factors
from ..separable.objective import KernelObjective, SeparableObjective, solve_validated
from ..separable.tiers import even_increments

#: The rounds a step is sampled in when none are named: the arm that won the rounds
#: decision written down before its runs (docs/benchmarks.md, "Rounds within a step")
#: samples in 4 rounds, the number Reinforce-Ada uses. See
#: :data:`sera_opt.planner.DEFAULT_ROUND_POLICY` for the policy of its later rounds.
DEFAULT_ROUNDS = 4

__all__ = ["RoundSession", "RoundResult", "round_budgets", "DEFAULT_ROUNDS"]


def round_budgets(budget: int, first_total: int, rounds: int, split=None) -> list[int]:
    """The budget of each round: ``first_total`` for the first, the rest by ``split``.

    ``split=None`` divides what is left evenly over the later rounds (the earlier
    ones take the remainder); a sequence gives the later rounds' budgets itself
    and must sum to what is left.
    """
    rest = budget - first_total
    if rest < 0:
        raise SeraOptError(
            f"the first round needs {first_total} rollouts but the budget is {budget}; lower "
            f"first (or min_rollouts) or raise the budget."
        )
    if rounds == 1:
        return [budget]
    if split is None:
        base, extra = divmod(rest, rounds - 1)
        return [first_total] + [base + (1 if r < extra else 0) for r in range(rounds - 1)]
    try:
        later = [validate_count(b, "round_budgets") for b in split]
    except TypeError:
        raise SeraOptError(
            f"round_budgets must be a sequence of {rounds - 1} whole numbers (the later "
            f"rounds' budgets), got {split!r}."
        ) from None
    if len(later) != rounds - 1 or sum(later) != rest:
        raise SeraOptError(
            f"round_budgets must give the {rounds - 1} later rounds' budgets and sum to the "
            f"budget left after the first round ({rest}); got {later!r}."
        )
    return [first_total, *later]


@dataclass(frozen=True)
class RoundResult:
    """What a finished :class:`RoundSession` drew.

    Attributes
    ----------
    counts : ndarray of int64, shape (M,)
        Each prompt's realized number of rollouts over all rounds.
    prompt_index : ndarray of int64, shape (N,)
        The prompt (0..M-1) of each rollout, in the order recorded: round by round,
        grouped by prompt within a round.
    round_index : ndarray of int64, shape (N,)
        The round (0-based) of each rollout; pass it to
        ``maxrl_advantages(..., round_index=...)``.
    rewards : ndarray of float64, shape (N,)
        The recorded rewards, in the same order.
    round_counts : ndarray of int64, shape (R, M)
        The counts of each round.
    round_budgets : tuple of int
        The budget each round spent.
    active_fraction : ndarray of float64, shape (R,)
        The fraction of prompts still active (no success yet, below their cap)
        after each round.
    factors : ndarray of float64, shape (M,)
        Each prompt's expected gradient scale ``kappa_i`` for the session's offset
        (see :attr:`RoundSession.factors`).
    prompt_ids : ndarray or None
        The planner's ids of the prompts (planner sessions only).
    stopped_early : bool
        Whether :meth:`RoundSession.stop` ended the session before its last round.
    """

    counts: np.ndarray
    prompt_index: np.ndarray
    round_index: np.ndarray
    rewards: np.ndarray
    round_counts: np.ndarray
    round_budgets: tuple[int, ...]
    active_fraction: np.ndarray
    factors: np.ndarray
    offset: int
    prompt_ids: Any = None
    stopped_early: bool = False
    wall_time: float = field(default=0.0, compare=False)

    @property
    def rounds(self) -> int:
        """The number of rounds drawn."""
        return int(self.round_counts.shape[0])

    @property
    def num_rollouts(self) -> int:
        return int(self.rewards.shape[0])


def rollout_layout(round_counts: list[np.ndarray], m: int):
    """``(round_counts (R, M), prompt_index, round_index)`` of rollouts recorded round by
    round, grouped by prompt within a round."""
    if not round_counts:
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros((0, m), dtype=np.int64), empty, empty.copy()
    ids = np.arange(m, dtype=np.int64)
    prompt_index = np.concatenate([np.repeat(ids, c) for c in round_counts])
    round_index = np.repeat(np.arange(len(round_counts), dtype=np.int64),
                            [int(c.sum()) for c in round_counts])
    return np.stack(round_counts), prompt_index, round_index


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _binary(rewards, n: int) -> np.ndarray:
    """The round's rewards as float64 0/1, or a clear error."""
    if hasattr(rewards, "detach"):  # a torch tensor, on any device
        rewards = rewards.detach().cpu().numpy()
    if isinstance(rewards, np.ma.MaskedArray):
        raise SeraOptError("rewards must not be a masked array; drop the masked rollouts.")
    try:
        r = np.asarray(rewards)
    except (TypeError, ValueError):
        raise SeraOptError(
            "rewards must be a flat sequence of 0/1 outcomes, one per rollout of this round."
        ) from None
    if r.ndim != 1 or r.shape[0] != n:
        raise SeraOptError(
            f"record() takes this round's rewards, one per rollout grouped by prompt in "
            f"order ({n} in all), got shape {r.shape}."
        )
    if r.dtype != np.bool_ and not np.issubdtype(r.dtype, np.number):
        raise SeraOptError(f"rewards must be numbers 0/1 or booleans, got dtype {r.dtype}.")
    r = r.astype(np.float64)
    if not np.all((r == 0.0) | (r == 1.0)):
        bad = int(np.flatnonzero(~((r == 0.0) | (r == 1.0)))[0])
        raise SeraOptError(
            f"rewards must be binary (0/1); got {r[bad]!r} at position {bad}. Threshold graded "
            f"rewards yourself (rewards >= t) before recording them."
        )
    return r


class RoundSession:
    """One step's budget, spent round by round. Use
    :meth:`sera_opt.AllocationPolicy.start_rounds` or
    :meth:`sera_opt.RolloutPlanner.start_rounds` to build one.

    A session belongs to one loop: it is not meant to be shared between threads.
    """

    def __init__(self, policy, budget: int, *, rounds: int, first, round_split, lo: np.ndarray,
                 hi: np.ndarray, truth: np.ndarray | None, prior, inputs: dict[str, Any],
                 static, prompt_ids=None, on_finish=None):
        self.policy = policy
        self.offset = int(policy.offset)
        self.rounds = rounds
        self.budget = budget
        self._lo, self._hi = lo, hi
        self._truth = truth
        self._prior = prior
        self._inputs = inputs
        self._static = static
        self._prompt_ids = prompt_ids
        self._on_finish = on_finish
        m = lo.shape[0]
        self.num_prompts = m
        if rounds == 1:
            self._first = None
            self._budgets = [budget]
        else:
            first_counts = np.maximum(lo, first)
            over = first_counts > hi
            if over.any():
                i = int(np.flatnonzero(over)[0])
                raise SeraOptError(
                    f"the first round gives prompt {i} {int(first_counts[i])} rollouts, above "
                    f"its max_rollouts={int(hi[i])}; lower first or raise max_rollouts."
                )
            self._first = first_counts
            self._budgets = round_budgets(budget, exact_sum(first_counts), rounds, round_split)
        self._total = np.zeros(m, dtype=np.int64)
        self._successes = np.zeros(m, dtype=np.int64)
        self._first_successes = np.zeros(m, dtype=np.int64)
        self._round_counts: list[np.ndarray] = []
        self._round_wins: list[np.ndarray] = []
        self._rewards: list[np.ndarray] = []
        self._replay: list[tuple | None] = []  # per later round, what the factors replay needs
        self._active_fraction: list[float] = []
        self._pending: np.ndarray | None = None
        # The active mask changes only when a round is recorded: kept from there, so that
        # planning a round does not derive it again.
        self._active = hi > 0
        self._stopped = False
        self._result: RoundResult | None = None
        self._wall = 0.0

    # ------------------------------------------------------------ state
    @property
    def round(self) -> int:
        """The number of rounds recorded so far."""
        return len(self._rewards)

    @property
    def done(self) -> bool:
        """Whether every round is recorded (or :meth:`stop` was called)."""
        return self._stopped or len(self._rewards) == self.rounds

    @property
    def round_budgets(self) -> tuple[int, ...]:
        """The budget of each round (the first is the first round's total)."""
        return tuple(self._budgets)

    @property
    def counts(self) -> np.ndarray:
        """The rollouts each prompt has drawn so far (a copy)."""
        return self._total.copy()

    @property
    def successes(self) -> np.ndarray:
        """The successes each prompt has had so far (a copy)."""
        return self._successes.copy()

    def active(self) -> np.ndarray:
        """Mask of the prompts whose scale still depends on more rollouts: no success
        yet, and below their cap."""
        return self._active.copy()

    # ------------------------------------------------------------ rounds
    def next_round(self) -> np.ndarray:
        """The counts of the next round (int64, one per prompt; 0 for a prompt that
        gets nothing). Record the round's rewards with :meth:`record` before asking
        for the next one."""
        if self.done:
            raise SeraOptError("the session is done; call result() (or start a new session).")
        if self._pending is not None:
            raise SeraOptError("record() this round's rewards before asking for the next round.")
        start = time.perf_counter()
        r = len(self._rewards)
        if r == 0 and self.rounds == 1:
            counts = np.array(self._static().counts, dtype=np.int64)
            self._replay.append(None)
        elif r == 0:
            counts = self._first.copy()
            self._replay.append(None)
        else:
            counts = self._allocate_round(self._budgets[r])
        self._pending = counts
        self._wall += time.perf_counter() - start
        return counts.copy()

    def record(self, rewards) -> RoundSession:
        """Take the rewards of the round that :meth:`next_round` gave: one per rollout,
        grouped by prompt in order (``sum(counts)`` in all), binary."""
        if self._pending is None:
            raise SeraOptError("call next_round() first; record() takes that round's rewards.")
        counts = self._pending
        r = _binary(rewards, exact_sum(counts))
        owner = np.repeat(np.arange(self.num_prompts), counts)
        wins = np.bincount(owner, weights=r, minlength=self.num_prompts).astype(np.int64)
        if not self._rewards:
            self._first_successes = wins.copy()
        self._total += counts
        self._successes += wins
        self._round_counts.append(counts)
        self._round_wins.append(wins)
        self._rewards.append(r)
        self._pending = None
        self._active = (self._successes == 0) & (self._total < self._hi)
        self._active_fraction.append(float(self._active.mean()) if self.num_prompts else 0.0)
        if self.done:
            self._finish()
        return self

    def stop(self) -> RoundSession:
        """End the session before its last round: the budget not yet spent is not
        drawn (the realized counts then sum to less than the budget). A round handed
        out by :meth:`next_round` and not recorded is dropped."""
        if self.done:
            return self
        self._pending = None
        self._stopped = True
        self._finish()
        return self

    def _finish(self) -> None:
        if self._on_finish is not None and self._rewards:
            owner = self.prompt_index()
            self._on_finish(owner, np.concatenate(self._rewards))

    def prompt_index(self) -> np.ndarray:
        """The prompt (0..M-1) of each recorded rollout, in order."""
        return rollout_layout(self._round_counts, self.num_prompts)[1]

    def result(self) -> RoundResult:
        """The realized counts, the rollouts' prompts and rounds, the rewards and the
        expected scales; only once the session is :attr:`done`."""
        if not self.done:
            raise SeraOptError(
                f"the session has {self.rounds - len(self._rewards)} round(s) left; record "
                f"them, or call stop() to end it early."
            )
        if self._result is None:
            rc, prompt_index, rounds = rollout_layout(self._round_counts, self.num_prompts)
            rewards = (np.concatenate(self._rewards) if self._rewards
                       else np.zeros(0, dtype=np.float64))
            self._result = RoundResult(
                counts=_read_only(self._total.copy()),
                prompt_index=_read_only(prompt_index),
                round_index=_read_only(rounds),
                rewards=_read_only(rewards),
                round_counts=_read_only(rc),
                round_budgets=tuple(self._budgets[:len(self._round_counts)]),
                active_fraction=_read_only(np.array(self._active_fraction)),
                factors=_read_only(self.factors()),
                offset=self.offset,
                prompt_ids=self._prompt_ids,
                stopped_early=self._stopped and len(self._rewards) < self.rounds,
                wall_time=self._wall,
            )
        return self._result

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
        shifted = bool(policy.offset_sensitive)
        lo = np.full(rows.shape[0], self.offset, dtype=np.int64) if shifted else total.copy()
        k = rows.shape[0]
        base = 1 + self.offset
        problem = AllocationProblem._validated(p, base * k, base, base, self.offset, False)
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
        fail_total = rc[0].copy() if self.rounds == 1 else self._fail_path_total()
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
                gains = row_gains(objective, rows, np.maximum(lo + taken - j, lo))
                found = np.sort(np.concatenate([found, gains]))[:need - spill]
                if found.size == need - spill and gains.min() >= found[-1]:
                    break
            steps.append(found)
            weakest = np.concatenate(steps)
        ghost_obj, ghost_lo = self._round_objective(ghosts, total)
        out = np.zeros(ghosts.shape[0], dtype=np.int64)
        steps = min(int(room.max()) if room.size else 0, weakest.shape[0])
        if not _by_rows(ghost_obj):
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
            gain = row_gains(ghost_obj, alive, ghost_lo + k)
            alive = alive[(gain > weakest[k]) & (room[alive] > k)]
            out[alive] += 1
        return out


def _by_rows(objective) -> bool:
    """Whether ``objective``'s gains come from its kernel, row by row (a built-in
    objective that keeps the engine's ``gains``)."""
    return (isinstance(objective, KernelObjective) and objective._kind is not None
            and type(objective).gains is SeparableObjective.gains)


def row_gains(objective, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``objective.gains(counts)[rows]``: ``counts`` has one entry per row of the
    objective, ``rows`` are ascending indices.

    Built-in objectives evaluate the rows asked for only, by their kernel on those rows'
    parameters (a term depends on its own row alone, so each gain is the same float):
    a replay asks for few of them, and their gains are the costly part. Others are
    evaluated on every row, where a gain is cheap.
    """
    if _by_rows(objective):
        p0, p1, p2 = objective._params()
        return _jit.kernels("sera_opt.kernels.gains").gains_at(
            objective._kind, p0[rows], p1[rows], p2[rows], objective.offset, counts[rows])
    return objective.gains(counts)[rows]
