"""Group-normalized (GRPO) advantages, as TRL's ``GRPOTrainer`` computes them (PyTorch).

The comparison the benchmarks make is MaxRL against GRPO as well as one
allocation against another, so the library's own loops need GRPO's advantages
with the same inputs as :func:`sera_opt.maxrl_advantages`: binary outcomes,
any integer prompt ids, groups of any size, prompts the plan switched off
simply absent. Prompt ``i`` has ``n_i`` rollouts, ``K_i`` of them successes,
mean ``rbar_i = K_i / n_i`` and, for ``n_i >= 2``, the unbiased standard
deviation ``s_i = sqrt(K_i (n_i - K_i) / (n_i (n_i - 1)))`` of its binary
rewards (TRL's ``nanstd`` applies Bessel's correction). With
``scale_rewards="group"`` (TRL's default)

    A_ij = (r_ij - rbar_i) / (s_i + eps),   eps = 1e-4,

a singleton gets 0 (TRL's standard deviation of one value is NaN, and its
NaN advantage is replaced by 0), and so does every rollout of a prompt whose
rewards are all equal. ``"batch"`` divides by the unbiased standard deviation
of the whole batch's rewards instead, ``"none"`` by nothing (the mean-centred
reward of Dr. GRPO). The expected gradient is in docs/estimator.md, "GRPO".
"""

from __future__ import annotations

import math
import numbers

import torch

from ..exceptions import SeraOptError
from .advantages import _COMMON_PARAMETERS
from .groups import check_flag, group

__all__ = ["GRPO_SCALES", "GRPO_EPSILON", "grpo_advantages"]

#: The values of ``scale_rewards``, as ``trl.GRPOConfig`` names them.
GRPO_SCALES = ("group", "batch", "none")

#: What TRL adds to the standard deviation before dividing by it.
GRPO_EPSILON = 1e-4


def _check_scale(scale_rewards) -> str:
    if isinstance(scale_rewards, bool):
        # GRPOConfig once took True / False; say what they became.
        raise SeraOptError(
            f"scale_rewards={scale_rewards!r}: pass a name, {GRPO_SCALES}; trl's True is "
            f"'group' and its False is 'none'."
        )
    if scale_rewards not in GRPO_SCALES:
        raise SeraOptError(f"unknown scale_rewards {scale_rewards!r}; use one of {GRPO_SCALES}.")
    return scale_rewards


def _check_epsilon(epsilon) -> float:
    if (isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real)
            or not math.isfinite(float(epsilon)) or float(epsilon) < 0):
        raise SeraOptError(
            f"epsilon must be a finite number >= 0 (TRL adds {GRPO_EPSILON} to the standard "
            f"deviation), got {epsilon!r}."
        )
    return float(epsilon)


def grpo_advantages(rewards, prompt_index, *, scale_rewards: str = "group",
                    epsilon: float = GRPO_EPSILON, success_threshold=None, num_prompts=None,
                    process_group=None, validate: bool = True, dtype=None) -> torch.Tensor:
    """One GRPO advantage per rollout: the reward centred on its prompt's mean and scaled.

    With ``K_i`` successes among the ``n_i`` rollouts of prompt ``i``,
    ``rbar_i = K_i / n_i`` and ``s_i`` the unbiased standard deviation of the
    prompt's rewards, ``A_ij = (r_ij - rbar_i) / (s_i + epsilon)``: what
    ``trl.GRPOTrainer`` computes with ``scale_rewards="group"`` for one reward
    function, extended to groups of different sizes. A singleton, and every
    prompt whose rollouts all agree, gets exactly 0.

    **Expectation.** With the counts fixed before sampling and ``S_ij`` the score
    of rollout ``j``, ``E[sum_j A_ij S_ij] = rho(p_i, n_i) grad log p_i`` with
    ``rho(p, n) = p E[(n - 1 - B) / (s(B + 1) + eps) + B / (s(B) + eps)]``,
    ``B ~ Binomial(n - 1, p)`` and ``s(K)`` the standard deviation of ``K``
    successes in ``n`` (docs/estimator.md, "GRPO"). For large ``n`` and small
    ``eps``, ``rho`` is about ``(n - 1) sqrt(p / (1 - p))``: unlike MaxRL's
    factor, it grows with ``n`` (no multiplicity correction) and vanishes as
    ``p -> 0``.

    Parameters
    ----------
    {common}
    scale_rewards : {"group", "batch", "none"}, default "group"
        What the centred reward is divided by: the prompt's standard deviation
        plus ``epsilon`` (TRL's default), that of the whole batch's rewards plus
        ``epsilon`` (0 for a batch of one rollout, as TRL has it), or nothing.
    epsilon : float, default 1e-4
        Added to the standard deviation, as TRL does.
    dtype : torch.dtype, optional
        Floating dtype of the result. Default: that of ``rewards`` if floating,
        else :func:`torch.get_default_dtype`. The per-prompt values are computed
        in float64 and rounded once.

    Returns
    -------
    torch.Tensor, shape (N,)
        The advantages, on the device of the inputs, without autograd history.
        Every rollout of a prompt with the same outcome gets a bit-identical value.

    Raises
    ------
    SeraOptError
        Bad shapes or dtypes, non-binary rewards without ``success_threshold``,
        ids out of range with ``num_prompts``, an unknown ``scale_rewards``, a
        negative or non-finite ``epsilon``.
    """
    scale_rewards = _check_scale(scale_rewards)
    epsilon = _check_epsilon(epsilon)
    validate = check_flag(validate, "validate")
    groups = group(rewards, prompt_index, success_threshold=success_threshold,
                   num_prompts=num_prompts, process_group=process_group, validate=validate,
                   dtype=dtype)
    compute = torch.float32 if groups.device.type == "mps" else torch.float64
    pair = groups.table.view(-1, 2).to(compute)
    failures, successes = pair[:, 0], pair[:, 1]
    counts = failures + successes
    safe = counts.clamp_min(1)
    if scale_rewards == "group":
        # K (n - K) / (n (n - 1)); a singleton's NaN standard deviation means a 0 advantage,
        # as TRL's nan_to_num makes it.
        std = (successes * failures / (safe * (counts - 1).clamp_min(1))).sqrt()
        scale = torch.where(counts >= 2, 1.0 / (std + epsilon), 0.0)
    elif scale_rewards == "batch":
        total, hits = counts.sum(), successes.sum()
        std = (hits * (total - hits) / (total.clamp_min(1) * (total - 1).clamp_min(1))).sqrt()
        scale = torch.ones_like(counts) / (std + epsilon)
    else:
        scale = torch.ones_like(counts)
    values = torch.empty(pair.shape, dtype=groups.dtype, device=groups.device)
    # Written with the failure count, prompts whose rollouts agree get exactly 0 without
    # relying on a cancellation of rbar against r.
    values[:, 1] = failures / safe * scale
    values[:, 0] = torch.rsub(successes / safe * scale, 0)
    return values.view(-1).index_select(0, groups.codes)


grpo_advantages.__doc__ = grpo_advantages.__doc__.replace(
    "    {common}\n", _COMMON_PARAMETERS.lstrip("\n"))
