"""What a step's rounds drew, and the loop that draws them (docs/theory.md section 9).

:class:`RoundResult` is the frozen record a finished session returns;
:func:`run_rounds` is the one driver loop, for :class:`~sera_opt.rounds.RoundSession`
and :class:`~sera_opt.rounds.ReinforceAdaSession` alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import SeraOptError

__all__ = ["RoundResult", "run_rounds"]


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
    unsolved_fraction : ndarray of float64, shape (R,)
        The fraction of prompts still without a success after each round.
    active_fraction : ndarray of float64, shape (R,)
        The fraction of prompts still *active* after each round: without a success
        and below their cap (:meth:`RoundSession.active`), the prompts a later round
        allocates by the policy's rule. It differs from ``unsolved_fraction`` by the
        prompts without a success that reached their cap.
    factors : ndarray of float64, shape (M,)
        Each prompt's expected gradient scale ``kappa_i`` for the session's offset
        (see :meth:`RoundSession.factors`).
    offset : int
        The estimator offset the factors are for.
    prompt_ids : ndarray or None
        The planner's ids of the prompts (planner sessions only).
    stopped_early : bool
        Whether :meth:`RoundSession.stop` ended the session before its budget was spent.
    session_id : str or None
        The id of the session that drew it (:attr:`RoundSession.session_id`).
    """

    counts: np.ndarray
    prompt_index: np.ndarray
    round_index: np.ndarray
    rewards: np.ndarray
    round_counts: np.ndarray
    round_budgets: tuple[int, ...]
    unsolved_fraction: np.ndarray
    active_fraction: np.ndarray
    factors: np.ndarray
    offset: int
    prompt_ids: Any = None
    stopped_early: bool = False
    session_id: str | None = None
    wall_time: float = field(default=0.0, compare=False)

    @property
    def rounds(self) -> int:
        """The number of rounds drawn."""
        return int(self.round_counts.shape[0])

    @property
    def num_rollouts(self) -> int:
        return int(self.rewards.shape[0])


def run_rounds(session, sample: Callable[[np.ndarray], Any]) -> RoundResult:
    """Draw every round of ``session``: the one driver loop of the library.

    ``sample(counts)`` receives a round's counts (int64, one per prompt; every round
    it sees samples at least one rollout) and returns that round's rewards: one per
    rollout, grouped by prompt in order (``sum(counts)`` in all), binary; a sequence,
    numpy array or torch tensor of any dtype and device. Returns ``session.result()``.
    Works for :class:`RoundSession` and :class:`~sera_opt.rounds.ReinforceAdaSession`
    alike; a session already part-way through (restored from a checkpoint) continues
    where it stopped.
    """
    if not callable(sample):
        raise SeraOptError(
            f"sample must be a function sample(counts) -> rewards, got {type(sample).__name__}."
        )
    for counts in session:
        session.record(sample(counts))
    return session.result()
