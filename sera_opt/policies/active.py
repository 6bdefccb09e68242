"""The active set: which prompts of a batch receive rollouts at all, and the authors'
integer rounding of the waterline (docs/theory.md, "SERA as its authors run it").

A prompt whose group of rollouts will almost surely be all successes or all failures
gives the mean-centred MaxRL estimator nothing (its advantages are 0). The active-set
rule ranks the prompts by their chance of a *mixed group* at the cap and keeps the
largest prefix of that ranking whose own counts still give every kept prompt a mixed
group with chance at least ``tau``; the others get 0 rollouts and their budget goes to
the kept ones. When no prefix is useful, or too few prompts are eligible to spend the
budget under the cap, the fewest prompts that can absorb the budget are activated
anyway ("forced activation"): the budget is always spent exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..exceptions import InfeasibleBudgetError, SeraOptError
from ..problem import AllocationProblem, exact_sum, validate_real
from ..result import ACTIVE, SWITCHED_OFF, TOO_EASY, TOO_HARD, Allocation

__all__ = ["DEFAULT_ACTIVE_THRESHOLD", "mixed_group_chance", "paper_rounding",
           "allocate_with_active_set", "check_active_threshold", "ROUNDINGS"]

#: The authors' threshold on the chance of a mixed group.
DEFAULT_ACTIVE_THRESHOLD = 0.05
#: The rounding rules of ``SERAPolicy(rounding=...)``: the library's exact
#: lexicographic max-min, or the authors' floor of the bisected waterline with a
#: least-squared-error refill.
ROUNDINGS = ("exact", "paper")
# Absorbs floating-point noise at the threshold when judging a prefix, as the
# authors' rule does (a realized chance that equals tau up to rounding counts).
_USEFUL_SLACK = 1e-12
# The authors' bisection runs a fixed number of halvings of log(level).
_BISECTION_STEPS = 100


def check_active_threshold(value) -> float | None:
    """``None`` (every prompt active) or a threshold in [0, 1]."""
    if value is None:
        return None
    out = validate_real(value, "active_threshold", minimum=0.0,
                        meaning="the smallest chance of a mixed group that keeps a prompt "
                                "active, at most 1; None keeps every prompt")
    if out > 1.0:
        raise SeraOptError(
            f"active_threshold must be at most 1 (it is a probability: the smallest chance "
            f"of a mixed group that keeps a prompt active); got {value!r}.")
    return out


def mixed_group_chance(success_probs, counts) -> np.ndarray:
    """``1 - (1 - p)^n - p^n``: the chance that ``n`` rollouts are neither all failures
    nor all successes (0 for ``n = 0``), clipped to [0, 1]."""
    p = np.asarray(success_probs, dtype=np.float64)
    n = np.asarray(counts, dtype=np.int64)
    if n.shape == p.shape and p.ndim == 1 and (not n.size or int(n.min()) > 0):
        # Every count positive: the same operations on the same elements, without the
        # masks (an active-set search calls this at every probe).
        chance = 1.0 - np.power(1.0 - p, n) - np.power(p, n)
        np.clip(chance, 0.0, 1.0, out=chance)
        return chance
    n = np.broadcast_to(n, p.shape)
    chance = np.zeros(p.shape, dtype=np.float64)
    positive = n > 0
    chance[positive] = (1.0 - np.power(1.0 - p[positive], n[positive])
                        - np.power(p[positive], n[positive]))
    np.clip(chance, 0.0, 1.0, out=chance)
    return chance


def paper_rounding(problem: AllocationProblem) -> tuple[np.ndarray, np.ndarray, float]:
    """The authors' integer counts for ``problem``: ``(counts, continuous, level)``.

    The continuous waterline ``n_i(L) = clip(c + L / a_i, lo_i, hi_i)`` is found by 100
    halvings of ``log L`` between ``min_i (lo_i - c) a_i`` and ``max_i (hi_i - c) a_i``,
    keeping the end whose counts sum to at most the budget. Its counts are rounded
    down, and each of the ``R`` rollouts left goes to one of the ``R`` prompts below
    their maximum whose factor's squared distance to the level's factor ``1 - e^-L``
    grows least by one more rollout (ties: the lower index). This is close to, but not
    always, the lexicographic max-min (docs/theory.md, the authors' rounding).

    Edges, which the authors' estimates never reach: a prompt with ``p = 1`` (rate
    ``inf``) keeps its minimum and one with ``p = 0`` (rate 0) takes its cap, as the
    continuous formula gives them at every level; the search runs over the others.

    Raises
    ------
    SeraOptError
        When the edges leave the other prompts a budget their bounds cannot take.
    """
    p = problem.success_probs.astype(np.float64, copy=False)
    lo_int, hi_int = problem.min_rollouts, problem.max_rollouts
    lo, hi = lo_int.astype(np.float64), hi_int.astype(np.float64)
    c = float(problem.offset)
    budget = problem.budget
    with np.errstate(divide="ignore"):
        rate = -np.log1p(-p)
    inner = (p > 0.0) & (p < 1.0)
    if budget == exact_sum(lo_int):
        level = float(np.min((lo - c)[inner] * rate[inner])) if inner.any() else 0.0
        return lo_int.astype(np.int64), lo.copy(), level
    fixed = np.where(p >= 1.0, lo, hi)
    fixed_total = float(np.sum(fixed[~inner]))
    left_budget = budget - fixed_total
    r, low_room, high_room = rate[inner], (lo - c)[inner], (hi - c)[inner]
    if not inner.any() or left_budget < float(np.sum(lo[inner])) or (
            left_budget > float(np.sum(hi[inner]))):
        raise SeraOptError(
            "the authors' rounding (rounding='paper') gives prompts with p = 1 their minimum "
            "and prompts with p = 0 their cap; with these the budget cannot be spent within "
            "the other prompts' bounds. Estimate p with a tracker (its estimates never reach "
            "0 or 1) or use rounding='exact'.")
    floor = float(np.min(low_room * r))
    log_low = float(np.log(floor)) if floor > 0.0 else float(np.log(np.nextafter(0.0, 1.0)))
    log_high = float(np.log(float(np.max(high_room * r))))
    lo_in, hi_in = lo[inner], hi[inner]
    log_low = _bisect_log_level(r, lo_in, hi_in, c, left_budget, log_low, log_high)
    level = float(np.exp(log_low))
    continuous = fixed.copy()
    continuous[inner] = np.clip(c + level / r, lo_in, hi_in)
    counts = np.clip(np.floor(continuous).astype(np.int64), lo_int, hi_int)
    left = int(budget - exact_sum(counts))
    if left < 0:  # pragma: no cover - the bisection keeps the feasible end
        raise SeraOptError(f"the authors' rounding overshot the budget by {-left} rollouts.")
    if left:
        room = np.flatnonzero(inner & (counts < hi_int))
        if left > room.size:  # pragma: no cover - floor(x) + 1 > x covers the budget
            raise SeraOptError("the authors' rounding found too few prompts below their cap.")
        target = float(-np.expm1(-level))
        log_failure = np.log1p(-p[room])
        now = -np.expm1(log_failure * (counts[room] - c))
        after = -np.expm1(log_failure * (counts[room] + 1 - c))
        growth = (after - target) ** 2 - (now - target) ** 2
        counts[room[_least(growth, left)]] += 1
    return counts, continuous, level


def _bisect_python(r, lo_in, hi_in, c, left_budget, log_low, log_high, first=0):
    """The authors' bisection of ``log(level)`` (steps ``first ..``), in numpy: the
    reference that :func:`_bisect_log_level` repeats bit for bit."""
    for _ in range(first, _BISECTION_STEPS):
        log_mid = 0.5 * (log_low + log_high)
        level = float(np.exp(log_mid))
        if float(np.sum(np.clip(c + level / r, lo_in, hi_in))) > left_budget:
            log_high = log_mid
        else:
            log_low = log_mid
    return log_low


def _bisect_log_level(r, lo_in, hi_in, c, left_budget, log_low, log_high):
    """:func:`_bisect_python`'s lower end, from compiled passes.

    The kernel's sums are numpy's (the same pairwise order), its ``exp`` may differ from
    numpy's in the last bit: every step whose level differs from ``np.exp`` of its midpoint
    is summed again at numpy's level, and where that changes the step's comparison the
    bisection goes on from there with numpy's decision."""
    from .. import _jit

    kernels = _jit.kernels("sera_opt.kernels.active")
    steps = _BISECTION_STEPS
    lows, highs, mids, levels = (np.empty(steps) for _ in range(4))
    above = np.empty(steps, dtype=np.bool_)
    r = np.ascontiguousarray(r, dtype=np.float64)
    lo_in = np.ascontiguousarray(lo_in, dtype=np.float64)
    hi_in = np.ascontiguousarray(hi_in, dtype=np.float64)
    uniform = bool(lo_in.size) and bool(np.all(lo_in == lo_in[0])) and bool(
        np.all(hi_in == hi_in[0]))
    if uniform:
        lo_in, hi_in = lo_in[:1].copy(), hi_in[:1].copy()
    first = 0
    while True:
        end, done = kernels.bisect(r, lo_in, hi_in, uniform, float(c), float(left_budget),
                                   first, float(log_low), float(log_high), lows, highs, mids,
                                   levels, above)
        exact = np.exp(mids[first:done])
        for step in (np.flatnonzero(exact != levels[first:done]) + first).tolist():
            level = float(exact[step - first])
            total = float(kernels.pairwise_total(r, lo_in, hi_in, uniform, float(c), level, 0,
                                                 r.size))
            over = total > left_budget
            if over != bool(above[step]):
                log_mid = float(mids[step])
                log_low, log_high = (float(lows[step]), log_mid) if over else (
                    log_mid, float(highs[step]))
                first = step + 1
                break
        else:
            return float(end)
        if first == steps or (log_low == float(lows[step]) and log_high == float(highs[step])):
            # The corrected step left its bracket as it was: so would every later one.
            return log_low


def _least(growth: np.ndarray, count: int) -> np.ndarray:
    """The positions of the ``count`` smallest ``growth`` (ties: the lower position):
    ``np.lexsort((positions, growth))[:count]`` as a set, without sorting all of them."""
    if count >= growth.size or np.isnan(growth).any():
        return np.lexsort((np.arange(growth.size), growth))[:count]
    cut = np.partition(growth, count - 1)[count - 1]
    below = np.flatnonzero(growth < cut)
    tied = np.flatnonzero(growth == cut)[:count - below.size]
    return np.concatenate((below, tied))


def _reasons_off(p: np.ndarray) -> np.ndarray:
    """Why a prompt outside the active set is off: too easy where it mostly succeeds."""
    return np.where(p > 0.5, TOO_EASY, TOO_HARD).astype(np.int8)


def allocate_with_active_set(problem: AllocationProblem, threshold: float,
                             solve: Callable[[AllocationProblem, np.ndarray], Allocation],
                             *, name: str,
                             fast: Callable[[np.ndarray, int, int], Allocation | None] | None
                             = None) -> Allocation:
    """The active-set rule on ``problem`` (docs/theory.md, "SERA as its authors run it").

    Every prompt not switched off by the caller is scored by its chance of a mixed group
    at its cap, ``u_i``, and ranked by ``u`` descending (ties keep batch order). With
    ``E`` the prompts with ``u_i >= threshold`` and ``K_req`` the fewest leading prompts
    whose caps can absorb the budget, a binary search over ``k`` in ``[K_req, E]`` finds
    the largest *useful* ``k`` it meets: the top ``k`` prompts, allocated by ``solve``
    on their own problem (batch order), each have a mixed group at their own count with
    chance at least ``threshold``. Without one (or with ``E < K_req``) the top ``K_req``
    are activated: the budget is always spent. ``solve(subproblem, index)`` allocates the
    prompts ``index`` of the batch. ``fast(success_probs, lo, hi)``, where given, allocates a
    probe with scalar bounds in one compiled call, or returns None to take ``solve``.
    """
    start = time.perf_counter()
    p = problem.success_probs.astype(np.float64, copy=False)
    m = problem.num_prompts
    lo_all, hi_all = problem.min_rollouts, problem.max_rollouts
    caller_off = problem.switched_off
    scores = mixed_group_chance(p, hi_all)
    ranking_key = scores if caller_off is None else np.where(caller_off, -1.0, scores)
    ranked = np.argsort(-ranking_key, kind="stable")
    candidates = m if caller_off is None else m - int(np.count_nonzero(caller_off))
    ranked = ranked[:candidates]
    eligible = int(np.count_nonzero(ranking_key >= threshold))
    budget = problem.budget
    # The fewest leading prompts that can absorb the budget, and the most that their
    # minimums allow (a prefix whose minimums exceed the budget cannot be allocated).
    caps = np.cumsum(hi_all[ranked], dtype=np.float64)
    floors = np.cumsum(lo_all[ranked], dtype=np.float64)
    required = int(np.searchsorted(caps, budget, side="left")) + 1
    most = int(np.searchsorted(floors, budget, side="right"))
    if required > candidates or required > most:
        raise InfeasibleBudgetError(
            f"policy {name!r}: no set of prompts can spend budget={budget} with counts in "
            f"[min_rollouts, max_rollouts]: the {required} highest-ranked prompts are the "
            f"fewest whose caps absorb it, and at most {most} fit its minimums. Change the "
            f"budget or the bounds.")
    cache: dict[int, tuple[Allocation, np.ndarray, bool]] = {}
    # A prompt's chance of a mixed group grows with its count, and every active prompt
    # gets at least its minimum: only prompts below the threshold at their minimum can make
    # a prefix useless, so only theirs are checked at each probe.
    slack = threshold - _USEFUL_SLACK
    at_risk = mixed_group_chance(p, lo_all) < slack
    rank_of = np.empty(m, dtype=np.int64)
    rank_of[ranked] = np.arange(candidates, dtype=np.int64)
    if caller_off is not None:
        rank_of[caller_off] = m
    uniform = problem.uniform_bounds
    lo_bound = int(lo_all[0]) if uniform and m else lo_all
    hi_bound = int(hi_all[0]) if uniform and m else hi_all

    def probe(k: int):
        if k not in cache:
            index = np.flatnonzero(rank_of < k)  # the top k, in batch order
            inner = None
            if fast is not None and uniform:
                inner = fast(p[index], lo_bound, hi_bound)
            if inner is None:
                sub = AllocationProblem(p[index], budget,
                                        min_rollouts=lo_bound if uniform else lo_all[index],
                                        max_rollouts=hi_bound if uniform else hi_all[index],
                                        offset=problem.offset)
                inner = solve(sub, index)
            risky = np.flatnonzero(at_risk[index])
            chance = mixed_group_chance(p[index[risky]], inner.counts[risky])
            cache[k] = (inner, index, bool(np.all(chance >= slack)))
        return cache[k]

    # A prefix holding no at-risk prompt is useful whatever its counts: such probes are
    # answered without solving them (the search then takes the same steps). Prompts with
    # p = 0 or 1 can make a solve refuse its prefix, so with them every probe is solved.
    risky_ranks = np.flatnonzero(at_risk[ranked])
    first_risky = int(risky_ranks[0]) if risky_ranks.size else candidates
    if np.any((p == 0.0) | (p == 1.0)):
        first_risky = 0

    def useful(k: int) -> bool:
        return k <= first_risky or probe(k)[2]

    chosen = required
    if eligible >= required:
        low, high = required, min(eligible, most)
        best = None
        while low <= high:
            middle = (low + high) // 2
            if useful(middle):
                best, low = middle, middle + 1
            else:
                high = middle - 1
        if best is not None:
            chosen = best
    inner, index, useful = probe(chosen)
    forced = 0
    if not useful:
        chance = mixed_group_chance(p[index], inner.counts)
        forced = int(np.count_nonzero(chance < threshold - _USEFUL_SLACK))
    active = np.zeros(m, dtype=bool)
    active[index] = True
    reasons = np.where(active, ACTIVE, _reasons_off(p)).astype(np.int8)
    lo_full, hi_full = np.where(active, lo_all, 0), np.where(active, hi_all, 0)
    if caller_off is not None:
        reasons[caller_off] = SWITCHED_OFF
    whole = AllocationProblem(problem.success_probs, budget, min_rollouts=lo_full,
                              max_rollouts=hi_full, offset=problem.offset)
    return Allocation.embed(whole, inner, index, reasons=reasons, threshold=threshold,
                            scores=scores, forced=forced,
                            wall_time=time.perf_counter() - start)


def subset_inputs(inputs: Mapping[str, Any], index: np.ndarray, m: int) -> dict[str, Any]:
    """A policy's extra inputs (per-prompt arrays, a posterior pair) restricted to the
    prompts ``index`` of a batch of ``m``."""
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if key == "posterior" and isinstance(value, (tuple, list)) and len(value) == 2:
            out[key] = tuple(np.asarray(v)[index] for v in value)
        elif np.ndim(value) == 1 and len(value) == m:
            out[key] = np.asarray(value)[index]
        else:
            out[key] = value
    return out
