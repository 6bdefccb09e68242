"""Allocation under uncertainty: SERA on expected factors under Beta posteriors.

docs/theory.md section 5: counts are fixed before the rollouts are drawn, so a
prompt's success probability is known only through a posterior. With
``p_i ~ Beta(alpha_i, beta_i)`` the expected attenuation factor is

    E[w_c(p_i, n)] = 1 - E[(1 - p_i)^(n - c)],
    E[(1 - p)^m]   = prod_{j=0}^{m-1} (beta + j) / (alpha + beta + j),

still increasing in ``n``, so the exact greedy of the separable engine
applies to its lexicographic max-min.
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from typing import Any

import numpy as np

from ..exceptions import SeraOptError
from ..problem import AllocationProblem, owned_read_only, validate_real
from ..result import Allocation
from ..separable import BetaLevels, PointLevels, expected_factors, validate_beta_posterior
from .base import DEFAULT_MAX_RATIO, SeparablePolicy
from .registry import register_policy

__all__ = ["PosteriorPolicy", "SERABayesPolicy", "expected_factors"]

DEFAULT_PRIOR_STRENGTH = 8.0


class PosteriorPolicy(SeparablePolicy):
    """Base of the policies whose objective is an expectation under Beta posteriors.

    :meth:`allocate` takes the posterior as ``posterior=(alpha, beta)`` (its
    declared extra input), for example ``tracker.posterior(prompt_ids)``
    (:class:`sera_opt.RolloutPlanner` passes it). Without one, ``success_probs``
    are read as posterior means with ``prior_strength`` pseudo-counts: ``p_i ~
    Beta(s p_i, s (1 - p_i))``. The default ``s = 8`` is the evidence of one group
    of eight rollouts; ``s = inf`` treats the probabilities as exact.

    Parameters
    ----------
    prior_strength : float, default 8
        Pseudo-count ``s`` used when no posterior is given (> 0, may be inf).
    min_rollouts, max_rollouts, offset
        See :class:`AllocationPolicy`.
    """

    option_names = ("prior_strength",)
    extra_inputs = frozenset({"posterior"})

    def __init__(self, *, prior_strength: float = DEFAULT_PRIOR_STRENGTH, **bounds: Any):
        super().__init__(**bounds)
        self.prior_strength = validate_real(
            prior_strength, "prior_strength", minimum=0.0, strict=True, allow_inf=True,
            meaning="the pseudo-count behind each success probability; inf for point estimates")

    def allocate(self, success_probs, budget, *, min_rollouts=None, max_rollouts=None,
                 posterior=None, **inputs: Any) -> Allocation:
        """Allocate ``budget`` rollouts.

        Parameters
        ----------
        success_probs : array_like of shape (M,), or None
            Success probabilities (posterior means when ``posterior`` is given;
            ``None`` then means "the posterior's means").
        budget : int
            Total rollouts; the counts sum to it exactly.
        min_rollouts, max_rollouts : int or array_like, optional
            Override the policy's default bounds for this call.
        posterior : tuple (alpha, beta) of array_like, optional
            Beta posterior of each prompt's success probability.
        """
        self._check_inputs(inputs)
        if posterior is None:
            if success_probs is None:
                raise SeraOptError("pass success_probs, or posterior=(alpha, beta), or both.")
            return super().allocate(success_probs, budget, min_rollouts=min_rollouts,
                                    max_rollouts=max_rollouts)
        success_probs, (alpha, beta) = self._checked_posterior(success_probs, posterior)
        problem = self.problem(success_probs, budget, min_rollouts=min_rollouts,
                               max_rollouts=max_rollouts)
        return self._allocate_batch(problem, {"posterior": (alpha, beta)})

    def validate(self, success_probs, budget, *, min_rollouts=None, max_rollouts=None,
                 posterior=None, **inputs: Any) -> AllocationProblem:
        """What :meth:`allocate` checks, without allocating (see
        :meth:`AllocationPolicy.validate`): the posterior too, and that
        ``success_probs`` are its means."""
        self._check_inputs(inputs)
        if posterior is None:
            if success_probs is None:
                raise SeraOptError("pass success_probs, or posterior=(alpha, beta), or both.")
        else:
            success_probs, _ = self._checked_posterior(success_probs, posterior)
        return self.problem(success_probs, budget, min_rollouts=min_rollouts,
                            max_rollouts=max_rollouts)

    def _checked_posterior(self, success_probs, posterior):
        """``(success_probs, (alpha, beta))``: the posterior checked (its own read-only
        copies), and the probabilities its means (``None``: the means themselves)."""
        try:
            alpha, beta = posterior
        except (TypeError, ValueError):
            raise SeraOptError(
                "posterior must be a pair (alpha, beta) of arrays, one entry per prompt."
            ) from None
        alpha, beta = validate_beta_posterior(alpha, beta)
        # The allocation keeps the posterior (its factors are computed from it when
        # read): its own read-only copies, so that reused buffers cannot change it.
        alpha, beta = owned_read_only(alpha), owned_read_only(beta)
        means = alpha / (alpha + beta)
        if success_probs is None:
            return means, (alpha, beta)
        p = np.asarray(success_probs)
        if p.shape != means.shape:
            raise SeraOptError(
                f"success_probs has shape {p.shape} but the posterior has {means.shape[0]} "
                f"prompts."
            )
        p = np.asarray(p, dtype=np.float64)
        if not np.all(np.abs(p - means) <= 1e-6):
            i = int(np.flatnonzero(~(np.abs(p - means) <= 1e-6))[0])
            raise SeraOptError(
                f"success_probs must be the posterior means alpha / (alpha + beta) when a "
                f"posterior is given; at index {i} they are {p[i]!r} and {means[i]!r}. Pass "
                f"success_probs=None to use the means."
            )
        return success_probs, (alpha, beta)

    def pseudo_posterior(self, success_probs) -> tuple[np.ndarray, np.ndarray] | None:
        """``(s p, s (1 - p))`` for the pseudo-count ``s``; ``None`` when ``s`` is inf."""
        if math.isinf(self.prior_strength):
            return None
        p = np.asarray(success_probs, dtype=np.float64)
        beta = np.subtract(1.0, p)
        beta *= self.prior_strength  # in place: one temporary fewer (the same floats)
        return self.prior_strength * p, beta

    def _allocate(self, problem: AllocationProblem, posterior=None) -> Allocation:
        start = time.perf_counter()
        if posterior is None:
            posterior = self.pseudo_posterior(problem.success_probs)
        objective = self.objective(problem, posterior=posterior)
        return self._solve(problem, objective, start, posterior=posterior)

    @abstractmethod
    def objective(self, problem: AllocationProblem, posterior=None):
        """The objective under ``posterior = (alpha, beta)`` (``None``: exact probabilities)."""


@register_policy
class SERABayesPolicy(PosteriorPolicy):
    """SERA on expected factors: equalize ``E[w_c(p_i, n_i)]`` under Beta posteriors.

    Solves::

        lexicographically maximize  sort_i( E[w_c(p_i, n_i)] ),  p_i ~ Beta(alpha_i, beta_i)
        subject to  sum_i n_i = B,  lo_i <= n_i <= hi_i,  n_i integer,

    through the levels ``l_i(n) = -log E[(1 - p_i)^(n - c)]`` (so the expected
    factor is ``1 - exp(-l_i(n))``), which are increasing in ``n``: the
    separable engine's greedy is exact. A point-mass posterior gives SERA's
    level ``a_i (n - c)``; with ``prior_strength=inf`` and no posterior this
    policy is SERA. A prompt that is still uncertain has a lower expected
    factor than its mean suggests (Jensen), so it receives more rollouts than
    SERA would give a prompt with the same point estimate.

    Edges, as in SERA: ``alpha = 0`` (``p = 0`` for sure) has expected factor 0
    whatever ``n`` and takes spare rollouts first (pinned at the maximum);
    ``beta = 0`` (``p = 1``) keeps its minimum unless everything else is full.
    Ties: the prompt whose next expected factor is highest, then fewer
    rollouts, then the lower index.

    ``Allocation.factors`` are the expected factors and ``Allocation.levels``
    the levels ``l_i(n_i)``.

    Parameters
    ----------
    prior_strength : float, default 8
        Pseudo-count used when ``allocate`` gets no ``posterior`` (see
        :class:`PosteriorPolicy`).
    min_rollouts, max_rollouts, offset
        See :class:`AllocationPolicy`.
    max_ratio : float or None, default 4
        Cap used when no ``max_rollouts`` is given, as for :class:`SERAPolicy`.
    """

    name = "sera-bayes"
    preference = 3
    default_max_ratio = DEFAULT_MAX_RATIO
    offset_sensitive = True
    # A round solves its objective over the prompts without a success, in the count of
    # the round: its counts follow the expected scales (docs/theory.md section 9).
    round_mode = "scale"

    def objective(self, problem: AllocationProblem, posterior=None):
        if posterior is None:
            return PointLevels.from_problem(problem)
        return BetaLevels(*posterior, offset=problem.offset)

    def round_objective(self, problem: AllocationProblem, posterior=None):
        """:meth:`objective` of a round (:meth:`start_rounds`): the session's posterior
        is the one it checked when it started, updated with failures, which keep it
        valid; it is not checked again each round."""
        if posterior is None:
            return PointLevels.from_problem(problem)
        return BetaLevels.of_checked(*posterior, offset=problem.offset)
