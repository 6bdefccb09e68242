"""Reinforce-Ada (Xiong et al., arXiv 2510.04996) as a peer in the round-session API.

Implemented from the paper and its described defaults: rounds of ``per_round`` (8)
rollouts for every prompt still active, at most ``max_rounds`` (4); a prompt exits
once it has ``keep // 2`` successes and ``keep - keep // 2`` failures (``exit=
"balanced"``) or one success (``"positive"``, the paper's positive-focused rule);
then ``keep`` (4) of its rollouts are kept (the first successes and failures, half
and half where it can, the other kind filling in), and each kept rollout's
advantage is ``r - rbar`` with ``rbar`` the success rate of the prompt's whole pool
(its "global statistics"), not of the kept group.

What it ascends (docs/theory.md section 9): its budget is its own (8 to 32 rollouts per
prompt), and its estimator is not MaxRL's. By the lemma of section 9 its expected
per-prompt update is ``kappa(p) grad log p`` with the scale that
:func:`reinforce_ada_scale` enumerates; in units of ``grad p`` (``kappa / p``) the
balanced rule weighs prompts symmetrically in p, about ``(1/p + 1/(1 - p))/2 - 1``,
an ascent on roughly ``logit(p)/2 - p``, where MaxRL's ``log p`` up-weights only
the hard prompts.

Two budgets: ``budget=None`` is the paper's own, variable budget (reported as the
realized counts); a ``budget`` caps the step's total (the matched-budget variant):
a round that cannot give every active prompt ``per_round`` shares what is left
evenly, lowest totals first, and what the rule does not draw is left unspent.
"""

from __future__ import annotations

import numpy as np

from ..exceptions import SeraOptError
from ..problem import validate_count, validate_success_probs
from ..separable.tiers import even_increments
from .outcomes import binary_rewards, read_only, rollout_layout
from .result import RoundResult
from .scales import RuleScale, rule_scale

__all__ = ["ReinforceAda", "ReinforceAdaSession", "reinforce_ada_scale", "EXITS"]

EXITS = ("balanced", "positive")


class ReinforceAda:
    """Reinforce-Ada's multi-round sampling with early exits (a peer; not a MaxRL rule).

    Parameters
    ----------
    exit : {"balanced", "positive"}
        When a prompt stops: ``keep // 2`` successes and ``keep - keep // 2`` failures,
        or one success.
    per_round : int, default 8
        Rollouts per active prompt and round.
    max_rounds : int, default 4
    keep : int, default 4
        Rollouts kept per prompt for the update.
    """

    name = "reinforce-ada"

    def __init__(self, exit: str = "balanced", *, per_round: int = 8, max_rounds: int = 4,
                 keep: int = 4):
        if exit not in EXITS:
            raise SeraOptError(f"exit must be one of {EXITS}, got {exit!r}.")
        self.exit = exit
        self.per_round = validate_count(per_round, "per_round", minimum=1)
        self.max_rounds = validate_count(max_rounds, "max_rounds", minimum=1)
        self.keep = validate_count(keep, "keep", minimum=2)
        if self.keep > self.per_round * self.max_rounds:
            raise SeraOptError(
                f"keep={self.keep} rollouts per prompt cannot be reached: a prompt draws at most "
                f"per_round * max_rounds = {self.per_round} * {self.max_rounds} = "
                f"{self.per_round * self.max_rounds}. Lower keep, or raise per_round or "
                f"max_rounds.")

    def exited(self, successes, failures) -> np.ndarray:
        """Whether a prompt with these counts has stopped sampling."""
        successes, failures = np.asarray(successes), np.asarray(failures)
        if self.exit == "positive":
            return successes >= 1
        return (successes >= self.keep // 2) & (failures >= self.keep - self.keep // 2)

    def start_rounds(self, success_probs=None, budget=None, *, num_prompts=None):
        """A session over the step's prompts. ``success_probs`` is not used by the rule
        (it looks only at rewards) and may be None with ``num_prompts``; given, it sizes
        the step. ``budget=None``: the rule's own budget; an int: at most that many."""
        if success_probs is not None:
            m = validate_success_probs(success_probs).shape[0]
            if num_prompts is not None and validate_count(num_prompts, "num_prompts",
                                                          minimum=1) != m:
                raise SeraOptError(
                    f"num_prompts={num_prompts} but success_probs holds {m} prompts; pass one "
                    f"of them, or make them agree.")
        elif num_prompts is not None:
            m = validate_count(num_prompts, "num_prompts", minimum=1)
        else:
            raise SeraOptError("pass success_probs or num_prompts (the step's prompt count).")
        if budget is not None:
            budget = validate_count(budget, "budget", minimum=1)
        return ReinforceAdaSession(self, m, budget)

    def __repr__(self) -> str:
        return (f"ReinforceAda(exit={self.exit!r}, per_round={self.per_round}, "
                f"max_rounds={self.max_rounds}, keep={self.keep})")


class ReinforceAdaSession:
    """The rounds of one step under :class:`ReinforceAda`: the same ``next_round`` /
    ``record`` / ``done`` / ``result`` as :class:`~sera_opt.rounds.RoundSession`, plus
    :meth:`kept` and :meth:`advantages` for the rule's own update."""

    def __init__(self, rule: ReinforceAda, num_prompts: int, budget: int | None):
        self.rule = rule
        self.num_prompts = num_prompts
        self.budget = budget
        self._total = np.zeros(num_prompts, dtype=np.int64)
        self._successes = np.zeros(num_prompts, dtype=np.int64)
        self._round_counts: list[np.ndarray] = []
        self._rewards: list[np.ndarray] = []
        self._active_fraction: list[float] = []
        self._unsolved_fraction: list[float] = []
        self._pending: np.ndarray | None = None

    def active(self) -> np.ndarray:
        return ~self.rule.exited(self._successes, self._total - self._successes)

    @property
    def spent(self) -> int:
        return int(self._total.sum())

    @property
    def done(self) -> bool:
        if self._pending is not None:
            return False
        if len(self._rewards) >= self.rule.max_rounds or not self.active().any():
            return True
        return self.budget is not None and self.spent >= self.budget

    def __iter__(self):
        """Each round's counts (as :meth:`next_round`) until the session is done."""
        while not self.done:
            yield self.next_round()

    def next_round(self) -> np.ndarray:
        if self.done:
            raise SeraOptError("the session is done; call result().")
        if self._pending is not None:
            raise SeraOptError("record() this round's rewards before asking for the next round.")
        active = self.active()
        counts = np.where(active, self.rule.per_round, 0).astype(np.int64)
        if self.budget is not None and counts.sum() > self.budget - self.spent:
            idx = np.flatnonzero(active)
            counts[:] = 0
            counts[idx] = even_increments(self._total[idx], np.full(idx.size, self.rule.per_round),
                                          self.budget - self.spent)
        self._pending = counts
        return counts.copy()

    def record(self, rewards) -> ReinforceAdaSession:
        if self._pending is None:
            raise SeraOptError("call next_round() first; record() takes that round's rewards.")
        counts = self._pending
        r = binary_rewards(rewards, int(counts.sum()))
        owner = np.repeat(np.arange(self.num_prompts), counts)
        self._successes += np.bincount(owner, weights=r, minlength=self.num_prompts).astype(
            np.int64)
        self._total += counts
        self._round_counts.append(counts)
        self._rewards.append(r)
        self._pending = None
        self._active_fraction.append(float(self.active().mean()))
        self._unsolved_fraction.append(float((self._successes == 0).mean()))
        return self

    def result(self) -> RoundResult:
        """The realized rollouts (``factors``: the rule's scale is not MaxRL's; NaN)."""
        if not self.done:
            raise SeraOptError("the session has rounds left; record them first.")
        rc, index, rounds = rollout_layout(self._round_counts, self.num_prompts)
        rewards = np.concatenate(self._rewards) if self._rewards else np.zeros(0)
        return RoundResult(
            counts=read_only(self._total.copy()), prompt_index=read_only(index),
            round_index=read_only(rounds), rewards=read_only(rewards),
            round_counts=read_only(rc),
            round_budgets=tuple(int(c.sum()) for c in self._round_counts),
            unsolved_fraction=read_only(np.array(self._unsolved_fraction)),
            active_fraction=read_only(np.array(self._active_fraction)),
            factors=read_only(np.full(self.num_prompts, np.nan)), offset=1)

    def kept(self) -> np.ndarray:
        """Mask over the recorded rollouts (in :meth:`result` order) of the ``keep`` per
        prompt the update uses: up to half successes and half failures, first drawn
        first, the other kind filling in where one is short."""
        out = self.result()
        mask = np.zeros(out.rewards.shape[0], dtype=bool)
        half = self.rule.keep // 2
        for i in range(self.num_prompts):
            rows = np.flatnonzero(out.prompt_index == i)
            wins, losses = rows[out.rewards[rows] == 1], rows[out.rewards[rows] == 0]
            pos, neg = _kept_counts(wins.size, losses.size, self.rule.keep, half)
            mask[wins[:pos]] = True
            mask[losses[:neg]] = True
        return mask

    def advantages(self) -> tuple[np.ndarray, np.ndarray]:
        """``(kept, advantage)`` per recorded rollout: ``r - rbar`` over the prompt's whole
        pool for the kept ones, 0 for the others (no division by a standard deviation,
        the paper's setting)."""
        out = self.result()
        kept = self.kept()
        rate = np.bincount(out.prompt_index, weights=out.rewards, minlength=self.num_prompts)
        rate = rate / np.maximum(out.counts, 1)
        adv = np.where(kept, out.rewards - rate[out.prompt_index], 0.0)
        return kept, adv


def _kept_counts(successes: int, failures: int, keep: int, half: int) -> tuple[int, int]:
    """Successes and failures kept: ``half`` successes and ``keep - half`` failures where
    the pool has them, the other kind filling in (at exit and in the fallback of a prompt
    that never exits alike: a positive-focused prompt without a success keeps failures
    only, whose advantages are 0)."""
    take = min(keep, successes + failures)
    pos = min(half, successes)
    neg = min(take - pos, failures)
    return min(successes, take - neg), neg


def reinforce_ada_scale(p: float, rule: ReinforceAda | None = None) -> RuleScale:
    """The exact scale of Reinforce-Ada's update for one prompt: ``E[g] = kappa grad log
    p`` with ``g = sum_kept (r_j - rbar) S_j`` (rbar the pool's rate), by enumeration of
    its rounds (docs/theory.md section 9). ``kappa / p`` is its weight on ``grad p``."""
    rule = ReinforceAda() if rule is None else rule
    if not isinstance(rule, ReinforceAda):
        raise SeraOptError(
            f"rule must be a sera_opt.rounds.ReinforceAda or None (its defaults); got "
            f"{type(rule).__name__} {rule!r}.")
    half = rule.keep // 2

    def per_prompt(r, total, successes, first):
        return 0 if rule.exited(successes, total - successes) else rule.per_round

    def coefficients(total, successes, n0, k1):
        if total == 0:
            return 0.0, 0.0
        pos, neg = _kept_counts(successes, total - successes, rule.keep, half)
        rate = successes / total
        return pos * (1.0 - rate), -neg * rate

    return rule_scale(p, per_prompt, rounds=rule.max_rounds, coefficients=coefficients)
