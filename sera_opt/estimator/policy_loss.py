"""The losses a trainer minimises, from per-token losses or log-probabilities and the
estimator's advantages: :func:`aggregate_loss` and :func:`policy_gradient_loss`.

Their checks and the reduction itself are in :mod:`.losses`; docs/theory.md section 4
and docs/estimator.md say how each mode weights prompts and sequences.
"""

from __future__ import annotations

import torch

from . import losses as _losses
from .losses import LOSS_MODES

__all__ = ["LOSS_MODES", "aggregate_loss", "policy_gradient_loss"]


def aggregate_loss(per_token_loss, mask=None, mode: str = "token-mean", *,
                   process_group=None, validate: bool = True) -> torch.Tensor:
    """Reduce a (sequences, tokens) loss to the scalar a trainer minimises.

    With ``L_k = sum_t mask[k, t]`` the length of sequence ``k``, ``T = sum_k L_k``
    all tokens and ``N'`` the number of sequences with at least one token:

    ========================  ==========================================  ===================
    mode                      loss                                        weight of sequence k
    ========================  ==========================================  ===================
    ``"token-mean"``          ``sum_kt mask * loss / T``                  ``1 / T``
    ``"seq-mean-token-sum"``  ``(1/N') sum_k sum_t mask * loss``          ``1 / N'``
    ``"seq-mean-token-mean"`` ``(1/N') sum_k (1/L_k) sum_t mask * loss``  ``1 / (N' L_k)``
    ``"token-sum"``           ``sum_kt mask * loss``                      ``1``
    ========================  ==========================================  ===================

    For the policy-gradient loss ``loss[k, t] = -A_k log pi(token_kt)`` the
    token scores of a sequence add up to its score ``S_k``, so the gradient of
    "token-mean", "seq-mean-token-sum" and "token-sum" is ``-c sum_k A_k S_k``
    with one constant ``c`` for the whole batch (``1/T``, ``1/N'`` or 1). With
    :func:`maxrl_advantages`' multiplicity correction each prompt's weight is
    then independent of its rollout count, and "seq-mean-token-sum" reproduces
    the contract ``(advantages * seq_logprob).mean()`` exactly (negated).
    "seq-mean-token-mean" instead weights sequence ``k`` by ``1 / L_k``: shorter
    sequences count more, within and across prompts. That is a length
    reweighting the MaxRL estimator does not have; its expectation is no longer
    ``(1/M) sum_i w_c grad log p_i`` unless lengths are independent of outcomes.

    Parameters
    ----------
    per_token_loss : torch.Tensor, shape (N, T)
        Per-token loss, for example ``-advantages[:, None] * token_logprobs`` or a
        PPO-clipped surrogate (see :func:`policy_gradient_loss`).
    mask : torch.Tensor, shape (N, T), optional
        Which tokens count: bool, or non-negative finite numbers (0/1 as a rule;
        other values act as token weights, and ``L_k`` and ``T`` are then sums of
        weights). Tokens with mask 0 are ignored entirely: their loss values,
        even NaN or inf, reach neither the result nor the gradient. None: every
        token.
    mode : str, default "token-mean"
        One of :data:`LOSS_MODES`.
    process_group : torch.distributed.ProcessGroup, optional
        Data parallelism with gradients averaged over the group (DDP, FSDP): the
        token and sequence counts are all-reduced and the result is multiplied by
        the world size, so that the averaged gradient, and the mean over ranks of
        the returned values, equal those of the single-process loss on the whole
        batch.
    validate : bool, default True
        Check that the mask holds no NaN, inf or negative entry and that the
        loss is finite at every token that counts, at the cost of one host
        read-back (under data parallelism the check travels with the count
        all-reduce, also in "token-sum" mode, and every rank raises if any
        rank's input is bad). With False, nothing is checked or read back and
        bad values give a NaN, inf or meaningless loss.

    Returns
    -------
    torch.Tensor, shape ()
        In the dtype of ``per_token_loss``; a bfloat16 or float16 loss is reduced in
        float32 and rounded once (a float16 sum of 8,192 token losses of 8 would
        already overflow). Zero (with gradient) when no token is unmasked.

    Raises
    ------
    SeraOptError
        An unknown mode; a loss that is not a floating (N, T) tensor; a mask of
        another shape or device; with ``validate``, NaN, inf or negative mask
        entries and non-finite losses at unmasked tokens (naming the first).
    """
    return _losses.aggregate_loss(per_token_loss, mask, mode, process_group, validate)


def policy_gradient_loss(token_logprobs, advantages, mask=None, mode: str = "token-mean", *,
                         old_token_logprobs=None, clip_range=None,
                         process_group=None, validate: bool = True) -> torch.Tensor:
    """The MaxRL policy-gradient loss from per-token log-probabilities and advantages.

    Per token, ``loss = -A_k * log pi(token)`` (REINFORCE, whose gradient is
    ``-A_k`` times the token's score), or, with ``old_token_logprobs``, the
    PPO-clipped surrogate ``-min(rho A_k, clip(rho, 1 - lo, 1 + hi) A_k)`` with
    ``rho = exp(logprob - old_logprob)``, which has the same gradient at
    ``rho = 1``. The result is reduced with :func:`aggregate_loss`; see there
    for how each mode weights prompts and sequences.

    Parameters
    ----------
    token_logprobs : torch.Tensor, shape (N, T)
        Log-probabilities of the sampled tokens under the current policy (with
        autograd history).
    advantages : torch.Tensor, shape (N,)
        For example from :func:`maxrl_advantages`; used as constants (detached).
    mask : torch.Tensor, shape (N, T), optional
        Which tokens count; see :func:`aggregate_loss`. Masked tokens are
        ignored, whatever their log-probabilities (padding may hold -inf).
    mode : str, default "token-mean"
        One of :data:`LOSS_MODES`.
    old_token_logprobs : torch.Tensor, shape (N, T), optional
        Log-probabilities under the policy that sampled the rollouts; turns on
        the clipped surrogate.
    clip_range : float or (float, float), optional
        ``eps`` or ``(eps_low, eps_high)`` of the clipped surrogate (default 0.2).
        Only used with ``old_token_logprobs``.
    process_group : torch.distributed.ProcessGroup, optional
        See :func:`aggregate_loss`.
    validate : bool, default True
        Check the mask (as :func:`aggregate_loss` does), that every advantage is
        finite (in the dtype of ``token_logprobs``), that the log-probabilities
        are finite at every token that counts, and that the per-token loss did
        not overflow, with one host read-back; under data parallelism every
        rank raises if any rank's input is bad. With False, nothing is checked
        or read back.

    Returns
    -------
    torch.Tensor, shape ()
        In the dtype of ``token_logprobs``. With bfloat16 or float16 log-probabilities
        the per-token loss (the PPO ratio included) and its reduction are computed in
        float32, with the advantages as given (not rounded to 16 bits first), and the
        result is rounded once; the gradient reaches ``token_logprobs`` in their dtype.

    Raises
    ------
    SeraOptError
        Bad shapes, dtypes or devices, an unknown mode, a bad ``clip_range``; with
        ``validate``, the bad values above (naming the input and the first entry).
    """
    return _losses.policy_gradient_loss(token_logprobs, advantages, mask, mode,
                                        old_token_logprobs, clip_range, process_group, validate)
