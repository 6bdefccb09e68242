"""What the trainer adapters share: estimators, loss modes, outcomes, counts, checkpoints, versions.

The TRL, verl and plain-PyTorch adapters each translate a trainer's settings into
the same few :mod:`sera_opt` calls. The rules they have in common live here, once:

* the MaxRL estimator names and their offsets c (read from
  :data:`sera_opt.ESTIMATOR_OFFSETS`, never restated), and the default count
  bounds that follow from them;
* the lookup of a trainer's loss setting in its table of
  :data:`sera_opt.LOSS_MODES` equivalents;
* how rewards become the binary outcomes a planner observes;
* the checks on per-prompt counts;
* the planner's file inside a trainer checkpoint;
* the policy for trainer releases the adapters were not written against.

This module imports torch (through :mod:`sera_opt`'s estimator); ``import
sera_opt`` does not import it.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import sera_opt
from sera_opt import checked_state
from sera_opt.exceptions import SeraOptError, SeraOptWarning

__all__ = [
    "ALLOW_UNTESTED_VERSIONS_ENV",
    "ESTIMATORS",
    "ESTIMATOR_OFFSETS",
    "LEGACY_PLANNER_STATE_FILES",
    "LOSS_MODES",
    "MAX_ROLLOUTS_PER_MEAN_COUNT",
    "PLANNER_STATE_FILE",
    "binary_outcomes",
    "active_set_metrics",
    "check_counts",
    "count_minimum",
    "check_success_threshold",
    "check_version",
    "default_max_rollouts",
    "default_min_rollouts",
    "estimator_offset",
    "load_planner",
    "loss_mode",
    "planner_state_path",
    "save_planner",
    "version_supported",
]

#: The MaxRL estimators (:data:`sera_opt.ESTIMATORS`).
ESTIMATORS: tuple[str, ...] = tuple(sera_opt.ESTIMATORS)

#: Estimator name -> offset c of its attenuation factor (:data:`sera_opt.ESTIMATOR_OFFSETS`).
ESTIMATOR_OFFSETS: Mapping[str, int] = sera_opt.ESTIMATOR_OFFSETS

#: The aggregation modes of :func:`sera_opt.aggregate_loss` (:data:`sera_opt.LOSS_MODES`).
LOSS_MODES: tuple[str, ...] = tuple(sera_opt.LOSS_MODES)

#: The adapters' default cap on a prompt's count, as a multiple of the mean count
#: (``num_generations`` in TRL, ``rollout.n`` in verl).
MAX_ROLLOUTS_PER_MEAN_COUNT = 4

#: File name of the planner state inside a trainer's checkpoint folder (TRL's
#: ``checkpoint-<step>``, verl's ``global_step_<n>``).
PLANNER_STATE_FILE = "sera_planner.pt"

#: Names earlier releases wrote (the TRL adapter's), still read on restore so that
#: existing checkpoints resume with their planner.
LEGACY_PLANNER_STATE_FILES: tuple[str, ...] = ("sera_planner_state.pt",)

#: Set to ``1`` to run an adapter on a trainer release it was not written against
#: (a :class:`sera_opt.SeraOptWarning` instead of an error).
ALLOW_UNTESTED_VERSIONS_ENV = "SERA_OPT_ALLOW_UNTESTED_VERSIONS"


# --------------------------------------------------------------------------- estimators


def estimator_offset(estimator: Any, *, option: str = "estimator") -> int:
    """The offset c of a MaxRL estimator, or a :class:`SeraOptError` naming ``option``.

    Parameters
    ----------
    estimator : str
        One of :data:`ESTIMATORS`.
    option : str
        How the user spells the setting (``"estimator"``,
        ``"algorithm.sera_maxrl.estimator"``), for the message.
    """
    if not isinstance(estimator, str) or estimator not in ESTIMATOR_OFFSETS:
        raise SeraOptError(
            f"{option} must be one of {ESTIMATORS}, got {estimator!r} ('mean_centred' is the "
            f"official MaxRL form with offset c = 1; 'success_average' has c = 0)."
        )
    return int(ESTIMATOR_OFFSETS[estimator])


def default_min_rollouts(estimator: str) -> int:
    """``1 + c``: the fewest rollouts with which the estimator's factor is positive."""
    return 1 + estimator_offset(estimator)


def default_max_rollouts(mean_count: int, min_rollouts: int = 1) -> int:
    """``MAX_ROLLOUTS_PER_MEAN_COUNT * mean_count``, and never below ``min_rollouts``."""
    return max(MAX_ROLLOUTS_PER_MEAN_COUNT * int(mean_count), int(min_rollouts))


# --------------------------------------------------------------------------- loss modes


def loss_mode(table: Mapping[str, str], name: Any, *, option: str) -> str:
    """The :func:`sera_opt.aggregate_loss` mode of a trainer's loss setting.

    Parameters
    ----------
    table : mapping
        The trainer's settings -> a mode of :data:`LOSS_MODES`.
    name : str
        The setting's value.
    option : str
        The setting's name in the trainer (``"loss_type"``,
        ``"actor_rollout_ref.actor.loss_agg_mode"``), for the message.

    Raises
    ------
    SeraOptError
        For a value the table does not list.
    """
    try:
        mode = table[name]
    except (KeyError, TypeError):
        raise SeraOptError(
            f"{option}={name!r} is not one of {sorted(table)}, the settings whose batch-wide "
            f"normalisation the multiplicity correction is matched to."
        ) from None
    if mode not in LOSS_MODES:  # pragma: no cover - a typo in an adapter's table
        raise AssertionError(f"{option}={name!r} maps to {mode!r}, not one of {LOSS_MODES}")
    return mode


# --------------------------------------------------------------------------- outcomes


def check_planner(planner: Any, *methods: str) -> Any:
    """``planner`` if it is a :class:`sera_opt.RolloutPlanner` (or, where ``methods`` are
    named, has them all), else the library's error naming the fix.

    A policy name or a policy instance in place of a planner would otherwise fail at
    the first step, after the model has generated, with an ``AttributeError``.
    """
    if isinstance(planner, sera_opt.RolloutPlanner) or (
        methods and all(callable(getattr(planner, name, None)) for name in methods)
    ):
        return planner
    name = planner if isinstance(planner, str) else getattr(planner, "name", None)
    example = name if isinstance(name, str) else "sera-fair"
    duck = (f" (or an object with {' and '.join(f'{m}()' for m in methods)})" if methods
            else "")
    as_policy = (" (RolloutPlanner(policy) takes a policy instance too)"
                 if isinstance(planner, sera_opt.AllocationPolicy) else "")
    raise SeraOptError(
        f"planner must be a sera_opt.RolloutPlanner{duck}; got {type(planner).__name__} "
        f"{planner!r}. Build one, e.g. planner=sera_opt.RolloutPlanner({example!r}, ...){as_policy}, "
        f"which tracks each prompt's success rate and plans with that policy."
    )


def check_success_threshold(value: Any, *, option: str = "success_threshold") -> float | None:
    """None, or a finite real number (not a bool), as a float."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise SeraOptError(f"{option} must be a finite number or None (null), got {value!r}.")
    return float(value)


def binary_outcomes(rewards: Any, success_threshold: float | None = None) -> np.ndarray:
    """The 0/1 outcome of every rollout, as a planner observes it (float64, on the host).

    The same rule as :func:`sera_opt.maxrl_advantages`: boolean rewards are the
    outcomes; numbers must be exactly 0 or 1 unless ``success_threshold`` is given,
    in which case a rollout succeeds when its reward is at least the threshold.

    Parameters
    ----------
    rewards : array-like or torch.Tensor, shape (N,)
        Any real dtype, bfloat16 and float16 included.
    success_threshold : float, optional

    Raises
    ------
    SeraOptError
        Rewards that are not one number per rollout, NaN or infinite rewards, or
        non-binary rewards without a threshold.
    """
    threshold = check_success_threshold(success_threshold)
    if isinstance(rewards, torch.Tensor):
        rewards = rewards.detach().cpu()
        if rewards.is_floating_point() and rewards.element_size() < 4:
            # numpy has no bfloat16; float32 holds every bfloat16 and float16 value exactly.
            rewards = rewards.float()
        rewards = rewards.numpy()
    values = np.asarray(rewards)
    if values.ndim != 1:
        raise SeraOptError(
            f"rewards must hold one number per rollout (shape (N,)), got shape {values.shape}."
        )
    if values.dtype == bool:
        return values.astype(np.float64)
    if not np.issubdtype(values.dtype, np.number) or np.iscomplexobj(values):
        raise SeraOptError(f"rewards must be real numbers or booleans, got dtype {values.dtype}.")
    values = values.astype(np.float64)
    if not np.all(np.isfinite(values)):
        raise SeraOptError(
            f"{int(np.count_nonzero(~np.isfinite(values)))} rewards are NaN or infinite; every "
            "rollout needs a finite reward (its outcome) before the planner can observe it."
        )
    if threshold is not None:
        return (values >= threshold).astype(np.float64)
    if not np.all((values == 0) | (values == 1)):
        bad = values[(values != 0) & (values != 1)]
        raise SeraOptError(
            f"rewards must be binary (0 or 1) outcomes, got {bad[:5].tolist()}; pass "
            "success_threshold= to count rewards at or above it as successes."
        )
    return values


# --------------------------------------------------------------------------- counts


def check_counts(
    counts: Any, num_prompts: int, *, minimum: int = 1, budget: int | None = None
) -> np.ndarray:
    """Validated per-prompt rollout counts as int64.

    Parameters
    ----------
    counts : array-like, torch.Tensor or Allocation
        One whole number per prompt (an Allocation's ``.counts`` are used).
    num_prompts : int
        The number of prompts the counts are for.
    minimum : int
        The smallest count allowed (0 lets a prompt be dropped).
    budget : int, optional
        When given, the counts must sum to it.

    Raises
    ------
    SeraOptError
        Wrong shape, booleans, fractions, NaN, counts below ``minimum``, counts that
        sum to 0, or a sum other than ``budget``.
    """
    counts = getattr(counts, "counts", counts)
    if isinstance(counts, torch.Tensor):
        counts = counts.detach().cpu().numpy()
    array = np.asarray(counts)
    if array.ndim != 1 or array.shape[0] != num_prompts:
        raise SeraOptError(
            f"counts must be a 1-D sequence with one entry per prompt ({num_prompts}), got "
            f"shape {array.shape}."
        )
    whole = np.issubdtype(array.dtype, np.integer) or (
        np.issubdtype(array.dtype, np.floating)
        and bool(np.all(np.isfinite(array)))
        and bool(np.all(array == np.round(array)))
    )
    if array.dtype == bool or not whole:
        raise SeraOptError(f"counts must be whole numbers of rollouts, got {array.tolist()!r}.")
    array = array.astype(np.int64)
    if num_prompts and int(array.min()) < minimum:
        hint = " Drop prompts with no rollouts from the batch before planning." if minimum else ""
        raise SeraOptError(
            f"every prompt needs at least {minimum} rollout(s); got counts {array.tolist()}.{hint}"
        )
    total = int(array.sum())
    if num_prompts and total == 0:
        raise SeraOptError("the counts sum to 0: no rollouts would be generated.")
    if budget is not None and total != int(budget):
        raise SeraOptError(
            f"the counts sum to {total}; a planner must return one count per prompt summing to "
            f"the budget ({int(budget)})."
        )
    return array


def count_minimum(allocation: Any) -> int:
    """The smallest count a planner's allocation may give a prompt: 0 where it switches
    prompts off (an active set), else 1."""
    return 0 if getattr(allocation, "active_set", None) is not None else 1


def active_set_metrics(allocation: Any) -> dict[str, float]:
    """What a trainer logs per step about the prompts a plan switched off: the active
    fraction, the prompts switched off as too easy and as too hard, and the forced
    activations (all prompts active, none off, when the plan has no active set)."""
    active_set = getattr(allocation, "active_set", None)
    if active_set is None:
        return {"active_fraction": 1.0, "switched_off_too_easy": 0.0,
                "switched_off_too_hard": 0.0, "forced_activations": 0.0}
    summary = active_set.summary()
    return {"active_fraction": float(summary["active_fraction"]),
            "switched_off_too_easy": float(summary["too_easy"]),
            "switched_off_too_hard": float(summary["too_hard"]),
            "forced_activations": float(summary["forced"])}


# --------------------------------------------------------------------------- checkpoints


def planner_state_path(folder: str | os.PathLike) -> str:
    """Where :func:`save_planner` writes the planner inside a checkpoint folder."""
    return os.path.join(os.fspath(folder), PLANNER_STATE_FILE)


def save_planner(planner: Any, folder: str | os.PathLike) -> str:
    """Write ``planner.state_dict()`` as :data:`PLANNER_STATE_FILE` in ``folder``.

    The file is whole or absent: it is written beside the destination and renamed over
    it, so an exception or a killed process mid-save leaves the previous file intact. It
    carries the SHA-256 of the state (:func:`sera_opt.checked_state.seal`), which
    :func:`load_planner` checks.

    Returns
    -------
    str
        The file written.
    """
    os.makedirs(folder, exist_ok=True)
    path = planner_state_path(folder)
    payload = checked_state.seal(planner.state_dict())
    # A temporary file renamed over the old one: an interrupted save keeps the previous state.
    checked_state.write_atomic(path, lambda f: torch.save(payload, f))
    return path


def _numpy_globals() -> list[Any]:
    """What a pickled numpy array or scalar refers to (for ``torch.load(weights_only=True)``)."""
    reconstruct = np.zeros(1).__reduce__()[0]
    scalar = np.float64(0).__reduce__()[0]
    # A pickled dtype names its class (numpy.dtypes.Int64DType, ...): allow every numpy dtype class.
    dtype_classes = [getattr(np.dtypes, name) for name in np.dtypes.__all__]
    return [np.ndarray, np.dtype, reconstruct, scalar, *dtype_classes]


def load_planner(planner: Any, folder: str | os.PathLike) -> str | None:
    """Restore ``planner`` from a checkpoint folder written by :func:`save_planner`.

    Reads :data:`PLANNER_STATE_FILE`, or else one of
    :data:`LEGACY_PLANNER_STATE_FILES`. The file is loaded with
    ``torch.load(weights_only=True)`` and numpy's array types allowed, so a
    checkpoint from elsewhere cannot run code when it is resumed, and its checksum is
    verified (files written before states carried one are taken as they are).

    Raises
    ------
    SeraOptError
        When the file cannot be read, holds anything but a planner state, or its state
        differs from the one saved (a damaged or altered file); the planner is left as
        it was.

    Returns
    -------
    str or None
        The file read, or None when the folder holds none (the planner is left as
        it was).
    """
    for name in (PLANNER_STATE_FILE, *LEGACY_PLANNER_STATE_FILES):
        path = os.path.join(os.fspath(folder), name)
        if os.path.exists(path):
            break
    else:
        return None
    with torch.serialization.safe_globals(_numpy_globals()):
        try:
            payload = torch.load(path, weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError (or RuntimeError) here
            # torch's own message advises weights_only=False, which would run the file's
            # code: say what is wrong in the library's words instead.
            unsafe = "global" in str(exc).lower()
            what = ("it refers to objects other than arrays, numbers and strings, and loading "
                    "it could run code" if unsafe else
                    f"it is damaged, truncated or not a torch file ({type(exc).__name__})")
            raise SeraOptError(
                f"{path} cannot be loaded safely as a planner state: {what}; it should hold "
                "what save_planner writes (RolloutPlanner.state_dict(), sealed with its "
                "checksum). Restore the checkpoint folder from a copy, or delete the file to "
                "resume with a fresh planner."
            ) from None
    # A file written before states were sealed carries no checksum and is taken as it is.
    state = (checked_state.unseal(payload, source=path) if checked_state.is_sealed(payload)
             else payload)
    try:
        planner.load_state_dict(state)
    except SeraOptError as exc:
        raise SeraOptError(
            f"{path} cannot be resumed into this planner: {exc} A trainer resumes with the "
            "planner it is given, never another: pass it a planner configured as the one the "
            "checkpoint was trained with, or delete the file to resume with a fresh planner."
        ) from None
    return path


# --------------------------------------------------------------------------- versions


def version_supported(version: str, supported: tuple[str, ...]) -> bool:
    """True when ``version`` starts with one of the ``supported`` release prefixes."""
    return any(str(version).startswith(prefix) for prefix in supported)


def check_version(
    package: str,
    version: str,
    supported: tuple[str, ...],
    *,
    adapter: str,
    reason: str,
    stacklevel: int = 2,
) -> None:
    """Refuse a trainer release an adapter was not written against.

    Both trainer adapters override internals of one release series (TRL's
    private ``GRPOTrainer`` methods, verl's V1 trainer methods and call
    conventions); on another release they could run and compute something else
    without a word. So an unsupported release is an error, unless
    ``SERA_OPT_ALLOW_UNTESTED_VERSIONS=1`` is set, which turns it into a
    :class:`sera_opt.SeraOptWarning` for users who check the results themselves.

    Parameters
    ----------
    package : str
        The distribution name (``"trl"``, ``"verl"``), for the message.
    version : str
        The installed version.
    supported : tuple of str
        Release prefixes the adapter supports (``("1.16.",)``).
    adapter : str
        The adapter's name, for the message.
    reason : str
        What the adapter relies on in that release.
    """
    if version_supported(version, supported):
        return
    series = ", ".join(prefix + "*" for prefix in supported)
    pins = " or ".join(f"'{package}=={prefix}*'" for prefix in supported)
    message = (
        f"{adapter} supports {package} {series}; found {package} {version}. {reason} "
        f"Install a supported release (pip install {pins})"
    )
    if os.environ.get(ALLOW_UNTESTED_VERSIONS_ENV) == "1":
        warnings.warn(
            f"{message}; running anyway because {ALLOW_UNTESTED_VERSIONS_ENV}=1.",
            SeraOptWarning,
            stacklevel=stacklevel + 1,
        )
        return
    raise SeraOptError(
        f"{message}, or set {ALLOW_UNTESTED_VERSIONS_ENV}=1 to run it anyway with a warning."
    )


def check_rounds(rounds: Any, first: Any = None, *, option: str = "rounds",
                 first_option: str = "first_round") -> tuple[int | None, int | None]:
    """Validate a trainer's round switch: ``rounds`` None (the default, resolved by
    :func:`resolve_rounds`) or a positive integer, ``first`` None or a positive
    integer (the first round's rollouts per prompt), given only with ``rounds >= 2``."""
    if rounds is not None and (
        isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1
    ):
        raise SeraOptError(
            f"{option} must be a positive integer (R >= 2 generates each step in R calls, 1 in one) "
            f"or None (the default, {sera_opt.rounds.DEFAULT_ROUNDS}: the static plan in one call); "
            f"got {rounds!r}."
        )
    if first is not None and (
        isinstance(first, bool) or not isinstance(first, (int, np.integer)) or first < 1
    ):
        raise SeraOptError(
            f"{first_option} must be None (half the mean count) or a positive integer; got {first!r}."
        )
    if first is not None and resolve_rounds(None if rounds is None else int(rounds)) == 1:
        raise SeraOptError(
            f"{first_option} is the first of several rounds, and each step is generated in one call "
            f"{'by default' if rounds is None else f'with {option}=1'}; set {option} >= 2 (for example "
            f"{option}=4) to sample in rounds, or drop {first_option}."
        )
    return (None if rounds is None else int(rounds)), (None if first is None else int(first))


def resolve_rounds(rounds: int | None) -> int:
    """The rounds a trainer samples each step in: ``rounds`` when given, else
    :data:`sera_opt.rounds.DEFAULT_ROUNDS` (1, the static plan in one generation call).

    Rounds are opt-in: each is one more call of the generation backend, which through
    TRL on CPU made a step in 4 rounds cost 2.04x to 2.24x a step in one
    (docs/benchmarks.md). A trainer refuses an explicit ``rounds >= 2`` where it cannot
    run them; the default, one call, runs everywhere and warns about nothing.
    """
    return sera_opt.rounds.DEFAULT_ROUNDS if rounds is None else rounds


def round_diagnostics(result: Any) -> dict[str, float]:
    """A round session's per-step diagnostics (:class:`sera_opt.RoundResult`): the rounds
    used, each round's budget, the fraction of prompts still active after each round (no
    success yet and below their cap: ``RoundResult.active_fraction``), and the mean and smallest expected scale of the prompts'
    likelihood gradients (``factors``), where the rule has one."""
    out = {"rounds": float(result.rounds)}
    if np.isfinite(result.factors).all():  # a peer's rule without a MaxRL scale has NaN
        out["mean_scale"] = float(np.mean(result.factors))
        out["min_scale"] = float(np.min(result.factors))
    for r, (budget, active) in enumerate(zip(result.round_budgets, result.active_fraction)):
        out[f"round_{r}_budget"] = float(budget)
        out[f"round_{r}_active"] = float(active)
    return out
