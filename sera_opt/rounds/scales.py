"""The exact gradient scale of a per-prompt round rule, by enumeration (docs/theory.md section 9).

A *per-prompt rule* says how many rollouts a prompt draws in each round from what
its own earlier rounds showed. Whatever the rule, the MaxRL estimators keep the
direction of the prompt's likelihood gradient and change only its scale::

    E[g] = kappa * grad log p,   kappa = E[C1] - p / (1 - p) * E[C0],

with ``C1`` and ``C0`` the summed coefficients of the estimator on the successes
and on the failures. :func:`rule_scale` computes ``kappa`` exactly by
enumerating the rounds' success counts; it is the slow reference that the round
sessions (:mod:`sera_opt.rounds.session`) and the estimator's ``round_index`` path
are tested against. The rules below are the ones docs/theory.md section 9 names.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..exceptions import SeraOptError
from ..problem import validate_count, validate_offset

__all__ = ["RuleScale", "rule_scale", "fixed_rule", "first_success_rule", "balanced_rule",
           "BASELINES"]

#: The baselines of the mean-centred estimator (offset 1) that :func:`rule_scale`
#: knows: ``"first_round"`` (the first round's rollouts, gated on a first-round
#: success: a baseline fixed before the later rewards it multiplies are seen) and
#: ``"pooled"`` (every rollout's own mean, ``K / T``, as with fixed counts).
BASELINES = ("first_round", "pooled")

#: A rule: ``rule(round, total, successes, first_successes) -> rollouts this round``.
Rule = Callable[[int, int, int, int], int]


@dataclass(frozen=True)
class RuleScale:
    """What a per-prompt rule does to one prompt, exactly.

    Attributes
    ----------
    scale : float
        ``kappa``: the expected estimator is ``kappa * grad log p``.
    rollouts : float
        The expected number of rollouts the rule draws.
    success : float
        ``P(K >= 1)``, the probability that the prompt ends with a success.
    """

    scale: float
    rollouts: float
    success: float


def rule_scale(p: float, rule: Rule, *, rounds: int, offset: int = 0,
               baseline: str = "first_round", coefficients=None) -> RuleScale:
    """The exact scale ``kappa`` of the MaxRL estimator under a per-prompt round rule.

    Parameters
    ----------
    p : float
        The prompt's success probability, in [0, 1].
    rule : callable
        ``rule(round, total, successes, first_successes)``: the rollouts drawn in
        round ``round`` (0-based), given the prompt's ``total`` rollouts and
        ``successes`` so far and the successes of its first round (0 before it). It
        must return a whole number >= 0 and depend on nothing but these (a
        reward-only rule, as the lemma of docs/theory.md section 9 requires).
    rounds : int
        How many rounds the rule runs.
    offset : {0, 1}
        The estimator: 0 the success average ``(1/K) sum_j r_j S_j``; 1 the
        mean-centred estimator with the ``baseline`` below.
    baseline : {"first_round", "pooled"}
        Offset 1 only. ``"first_round"``: ``g = (1/K) sum_j r_j S_j - 1{K1 >= 1} (1/n0)
        sum_{j in round 0} S_j``; ``"pooled"``: ``g = (1/K) sum_j (r_j - K/T) S_j``.
    coefficients : callable, optional
        Another estimator: ``coefficients(total, successes, n0, k1) -> (C1, C0)``, its
        summed coefficients on the successes and on the failures at the end of the
        rounds (``offset`` and ``baseline`` are then ignored). Reinforce-Ada's update is
        one (:func:`sera_opt.rounds.reinforce_ada_scale`).

    Returns
    -------
    RuleScale
    """
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) \
            or not 0.0 <= float(p) <= 1.0:
        raise SeraOptError(f"p must be a probability in [0, 1] (a real number, not a bool), "
                           f"got {p!r}.")
    p = float(p)
    rounds = validate_count(rounds, "rounds", minimum=1)
    offset = validate_offset(offset)
    if baseline not in BASELINES:
        raise SeraOptError(f"unknown baseline {baseline!r}; use one of {BASELINES}.")
    # state (total, successes, first-round count, first-round successes) -> the number of
    # reward sequences that reach it; a state's probability is that times p^K (1-p)^(T-K).
    # Keeping the powers apart makes p / (1 - p) E[C0] exact at p = 1 as well. The numbers
    # are Python integers, exact at any count (comb(1030, 515) is beyond the float range).
    states: dict[tuple[int, int, int, int], int] = {(0, 0, 0, 0): 1}
    for r in range(rounds):
        nxt: dict[tuple[int, int, int, int], int] = {}
        for (t, k, n0, k1), ways in states.items():
            m = rule(r, t, k, k1)
            if isinstance(m, bool) or not isinstance(m, int) or m < 0:
                raise SeraOptError(f"the rule returned {m!r} rollouts; it must return an int >= 0.")
            for j in range(m + 1):
                key = (t + m, k + j, m if r == 0 else n0, j if r == 0 else k1)
                nxt[key] = nxt.get(key, 0) + ways * math.comb(m, j)
        states = nxt
    q = 1.0 - p
    c1 = c0 = cost = hit = 0.0
    for (t, k, n0, k1), ways in states.items():
        prob = _weight(ways, p, k, q, t - k)
        # p / (1 - p) times the probability; only states with a failure carry C0.
        tilted = _weight(ways, p, k + 1, q, t - k - 1) if t > k else 0.0
        cost += prob * t
        if k:
            hit += prob
        if coefficients is not None:
            one, zero = coefficients(t, k, n0, k1)
            c1 += prob * one
            if t > k:
                c0 += tilted * zero
        elif offset == 0:
            c1 += prob * (1.0 if k else 0.0)
        elif baseline == "pooled":
            if k:
                c1 += prob * (1.0 - k / t)
                c0 -= tilted * (t - k) / t
        else:
            c1 += prob * ((1.0 if k else 0.0) - (k1 / n0 if k1 else 0.0))
            if k1:
                c0 -= tilted * (n0 - k1) / n0
    scale = c1 - c0  # E[C1] - p / (1 - p) E[C0]
    return RuleScale(scale=scale, rollouts=cost, success=hit)


def _weight(ways: int, p: float, k: int, q: float, f: int) -> float:
    """``ways * p^k * q^f``. With ``ways`` below 2**53 it is the plain float product (the
    same float as always); beyond, where ``ways`` overflows a float and the powers
    underflow, it is taken in logarithms."""
    if ways < 1 << 53:
        return ways * p ** k * q ** f
    if (k and p == 0.0) or (f and q == 0.0):
        return 0.0
    log = math.log(ways)
    if k:
        log += k * math.log(p)
    if f:
        log += f * math.log(q)
    return math.exp(log)


def fixed_rule(*counts: int) -> Rule:
    """Draw ``counts[r]`` rollouts in round ``r`` whatever happens (a static plan when
    there is one round)."""
    counts = tuple(validate_count(c, "counts") for c in counts)

    def rule(r, total, successes, first):
        return counts[r] if r < len(counts) else 0

    return rule


def first_success_rule(first: int, then: int = 1, cap: int | None = None) -> Rule:
    """``first`` rollouts, then ``then`` per round until the first success, at most
    ``cap`` in all (docs/theory.md section 9: "2 each, then one at a time to a first
    success")."""
    first = validate_count(first, "first", minimum=1)
    then = validate_count(then, "then", minimum=1)
    cap = None if cap is None else validate_count(cap, "cap", minimum=first)

    def rule(r, total, successes, k1):
        if r == 0:
            return first
        if successes:
            return 0
        return then if cap is None else min(then, cap - total)

    return rule


def balanced_rule(per_round: int = 8, positives: int = 2, negatives: int = 2) -> Rule:
    """Reinforce-Ada's balanced exit: rounds of ``per_round`` until the prompt has at
    least ``positives`` successes and ``negatives`` failures (run it for at most 4
    rounds, as its paper does)."""
    per_round = validate_count(per_round, "per_round", minimum=1)

    def rule(r, total, successes, k1):
        if successes >= positives and total - successes >= negatives:
            return 0
        return per_round

    return rule
