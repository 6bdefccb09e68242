"""verl integration: the ``sera_maxrl`` advantage estimator and per-prompt rollout counts.

Written against verl 0.9.1. Importing this module (``pip install 'sera_opt[verl]'``)

* registers :func:`compute_sera_maxrl_advantage` with verl's ``register_adv_est``
  under the name ``"sera_maxrl"`` (idempotent; verl's own estimators are left
  alone), so that ``algorithm.adv_estimator=sera_maxrl`` selects it in verl's
  ``compute_advantage``. It computes one outcome per response (the sum of its
  ``token_level_rewards``), calls :func:`sera_opt.maxrl_advantages` grouped by
  the batch's ``uid`` column, and broadcasts each response's advantage over its
  ``response_mask``;
* gives per-prompt rollout counts two ways: :func:`repeat_by_counts` repeats the
  rows of a :class:`verl.DataProto` n_i times (``DataProto.sample_level_repeat``,
  with uid bookkeeping), for loops that repeat prompts before generation; and
  :func:`assign_rollout_counts` writes the ``__rollout_n__`` column that verl's V1
  agent loop reads to start n_i sessions for prompt i. The trainer modes
  ``sera_sync``, ``sera_colocate_async`` and ``sera_separate_async``
  (:mod:`sera_opt.integrations._verl_trainer`, registered by :func:`register_trainers`)
  plan the counts with a :class:`sera_opt.RolloutPlanner` at every step, feed the
  outcomes back to it, log :func:`sera_opt.advantage_diagnostics` and checkpoint it;
  ``sera_sync`` generates each step in one agent-loop call by default (the static
  plan), or, when asked for (``algorithm.sera_maxrl.rounds=4``, say), in that many
  rounds through verl's agent loop (:func:`round_groups` gives the estimator each
  row's prompt and round);
* lets verl's ``apply_monkey_patch`` run beside trl 1.16, which lacks the value-head
  class verl patches when trl is installed (:mod:`sera_opt.integrations._verl_compat`;
  applied only when the installed versions need it).

verl releases other than 0.9.x are refused on import unless
``SERA_OPT_ALLOW_UNTESTED_VERSIONS=1`` is set (:func:`sera_opt.integrations._common.check_version`).

**Multiplicity correction and ``loss_agg_mode``.** Every ``loss_agg_mode`` of
verl 0.9.1's ``agg_loss`` sums the per-token losses over all responses of a
mini-batch and divides by one batch-wide number (tokens for ``token-mean``,
sequences for ``seq-mean-token-sum`` and ``seq-mean-token-mean``, sequences
times the horizon for ``seq-mean-token-sum-norm``, nothing for ``token-sum``).
Prompt i's rollouts therefore enter n_i times; the correction ``nbar / n_i`` of
:func:`sera_opt.maxrl_advantages` cancels that for every mode, so the same
advantages serve them all (:data:`LOSS_AGG_MODES` maps each to its
:func:`sera_opt.aggregate_loss` equivalent). ``seq-mean-token-mean`` also
weights each response by 1 / its length; that is a different distortion, which
the correction does not touch (docs/integrations/verl.md).

Run a training job with per-prompt counts through this module's launcher, which
takes verl's Hydra overrides::

    python -m sera_opt.integrations.verl algorithm.adv_estimator=sera_maxrl \\
        trainer.v1.trainer_mode=sera_sync ...
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from sera_opt.exceptions import MissingDependencyError, SeraOptError, SeraOptWarning

try:
    import torch
    import verl
    from verl import DataProto
    from verl.trainer.ppo import core_algos
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "sera_opt.integrations.verl needs verl 0.9.1 and its core dependencies; see "
        "docs/integrations/verl.md for the install lines (pip install 'sera_opt[verl]')."
    ) from _error

import sera_opt
from sera_opt.integrations import _common, _verl_compat

__all__ = [
    "ESTIMATOR_NAME",
    "LOSS_AGG_MODES",
    "ROLLOUT_COUNT_KEY",
    "ROUND_KEY",
    "SUPPORTED_VERL_VERSIONS",
    "TRAINER_MODES",
    "PLANNER_STATE_FILE",
    "EstimatorCall",
    "SeraMaxRLConfig",
    "assign_rollout_counts",
    "build_planner",
    "check_trainer_config",
    "collect_estimator_calls",
    "compute_sera_maxrl_advantage",
    "main",
    "plan_rollout_counts",
    "prompt_codes",
    "prompt_ids_from_batch",
    "register_estimator",
    "register_trainers",
    "repeat_by_counts",
    "round_groups",
    "round_index",
]

#: The name under which the estimator is registered (``algorithm.adv_estimator``).
ESTIMATOR_NAME = "sera_maxrl"

#: The column of a V1 training batch that verl's agent loop pops to decide how many
#: sessions (rollouts) to start for each prompt (``AgentLoopWorkerTQ._run_prompt``).
ROLLOUT_COUNT_KEY = "__rollout_n__"

#: verl release series this adapter was written and tested against; other releases
#: are refused (:func:`sera_opt.integrations._common.check_version`).
SUPPORTED_VERL_VERSIONS = ("0.9.",)

#: File, inside verl's ``global_step_<n>`` checkpoint folder, holding the planner state.
PLANNER_STATE_FILE = _common.PLANNER_STATE_FILE

#: Trainer modes registered by :func:`register_trainers` -> the verl mode they extend.
TRAINER_MODES = {
    "sera_sync": "sync",
    "sera_colocate_async": "colocate_async",
    "sera_separate_async": "separate_async",
}

#: verl's ``actor.loss_agg_mode`` values (``core_algos.agg_loss``) and the
#: :func:`sera_opt.aggregate_loss` mode each equals, up to a factor that is the same
#: for every response of a mini-batch. All of them normalise by a batch-wide count,
#: so the multiplicity correction ``nbar / n_i`` is the right one for each.
LOSS_AGG_MODES = {
    "token-mean": "token-mean",
    "seq-mean-token-sum": "seq-mean-token-sum",
    "seq-mean-token-sum-norm": "seq-mean-token-sum",
    "seq-mean-token-mean": "seq-mean-token-mean",
    "token-sum": "token-sum",
}


def _check_verl_version() -> None:
    _common.check_version(
        "verl",
        getattr(verl, "__version__", "unknown"),
        SUPPORTED_VERL_VERSIONS,
        adapter="sera_opt.integrations.verl",
        reason=(
            "Its trainer modes override internals of verl's V1 trainer (_next_train_batch, "
            "_compute_advantage, the checkpoint methods) and its estimator relies on how "
            "compute_advantage calls it."
        ),
        stacklevel=3,
    )


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SeraMaxRLConfig:
    """The ``algorithm.sera_maxrl`` block of a verl config.

    verl's ``algorithm`` config has no such block; add it with Hydra's ``+`` prefix
    (``+algorithm.sera_maxrl.estimator=mean_centred``). Every key is optional.

    Attributes
    ----------
    estimator : {"mean_centred", "success_average"}
        The MaxRL estimator (offset c = 1 and c = 0 of ``w_c(p, n)``).
    multiplicity_correction : bool
        Scale prompt i's advantages by ``nbar / n_i`` (docs/theory.md section 4).
    success_threshold : float or None
        Count a response as a success when its summed reward is at least this.
        None: rewards must be exactly 0 or 1.
    policy : str or None
        Allocation policy of the planner (:func:`sera_opt.get_policy` names). None: the
        library's default (:data:`sera_opt.planner.DEFAULT_POLICY`, and
        :data:`sera_opt.planner.DEFAULT_ROUND_POLICY` for the rounds after the first).
    min_rollouts, max_rollouts : int or None
        Bounds on each prompt's count. None: 2 (mean-centred) or 1 (success-average)
        for the minimum, and 4 x ``actor_rollout_ref.rollout.n`` for the maximum.
    prompt_key : str
        The batch column that identifies a prompt across steps (verl's RLHFDataset
        copies ``extra_info.index`` into ``index``).
    policy_options, tracker_options : dict
        Extra keyword arguments for :class:`sera_opt.RolloutPlanner` (passed on to the
        policy) and :class:`sera_opt.SuccessTracker` (empty: the planner's default).
    rounds : int or None
        Generation calls per step (docs/theory.md section 9). ``R >= 2`` (``sera_sync``
        only): the trainer submits the step's prompts R times through verl's agent
        loop, each round with the counts a :class:`sera_opt.RoundSession` gives on
        the rewards of the rounds before it; the step still spends ``M * rollout.n``
        rollouts, and the estimator takes the mean-centred baseline from the first
        round. 1: the whole plan in one call. None (the default), resolved by
        :func:`check_trainer_config`: :data:`sera_opt.rounds.DEFAULT_ROUNDS`, 1, the
        static plan in one call, in every mode. Rounds are opt-in: each is one more
        generation call, and through TRL on CPU a step in 4 rounds took 2.04x to 2.24x
        a one-call step (docs/benchmarks.md).
    first_round : int or None
        Rollouts per prompt in the first round (needs ``rounds >= 2``). None: half of
        ``rollout.n``; a prompt gets at least its ``min_rollouts`` in it.
    """

    estimator: str = "mean_centred"
    multiplicity_correction: bool = True
    success_threshold: float | None = None
    policy: str | None = None
    min_rollouts: int | None = None
    max_rollouts: int | None = None
    prompt_key: str = "index"
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    tracker_options: Mapping[str, Any] = field(default_factory=dict)
    rounds: int | None = None
    first_round: int | None = None

    def __post_init__(self):
        _common.estimator_offset(self.estimator, option="algorithm.sera_maxrl.estimator")
        if not isinstance(self.multiplicity_correction, bool):
            raise SeraOptError(
                "algorithm.sera_maxrl.multiplicity_correction must be true or false, got "
                f"{self.multiplicity_correction!r}."
            )
        _common.check_success_threshold(
            self.success_threshold, option="algorithm.sera_maxrl.success_threshold"
        )
        for name in ("min_rollouts", "max_rollouts"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
            ):
                raise SeraOptError(
                    f"algorithm.sera_maxrl.{name} must be a positive integer or null, got {value!r}."
                )
        if (
            self.min_rollouts is not None
            and self.max_rollouts is not None
            and self.min_rollouts > self.max_rollouts
        ):
            raise SeraOptError(
                f"algorithm.sera_maxrl.min_rollouts ({self.min_rollouts}) exceeds max_rollouts "
                f"({self.max_rollouts})."
            )
        if not isinstance(self.policy, (str, type(None))) or not isinstance(self.prompt_key,
                                                                             str):
            raise SeraOptError("algorithm.sera_maxrl.policy and prompt_key must be strings.")
        for name in ("policy_options", "tracker_options"):
            if not isinstance(getattr(self, name), Mapping):
                raise SeraOptError(f"algorithm.sera_maxrl.{name} must be a mapping (a dict).")
        _common.check_rounds(
            self.rounds,
            self.first_round,
            option="algorithm.sera_maxrl.rounds",
            first_option="algorithm.sera_maxrl.first_round",
        )

    @property
    def offset(self) -> int:
        """The offset c of the estimator's attenuation factor."""
        return _common.estimator_offset(self.estimator)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> SeraMaxRLConfig:
        """Build from a dict or OmegaConf node; unknown keys are an error (typos)."""
        if mapping is None:
            return cls()
        mapping = _plain(mapping)
        if not isinstance(mapping, Mapping):
            raise SeraOptError(
                f"algorithm.sera_maxrl must be a mapping of options, got {type(mapping).__name__}."
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise SeraOptError(
                f"unknown key(s) {unknown} in algorithm.sera_maxrl; the keys are {sorted(known)}."
            )
        return cls(**dict(mapping))

    @classmethod
    def from_algorithm_config(cls, config: Any) -> SeraMaxRLConfig:
        """Read ``config.sera_maxrl`` from verl's algorithm config (DictConfig, AlgoConfig or dict)."""
        if config is None:
            return cls()
        getter = getattr(config, "get", None)
        block = getter("sera_maxrl", None) if callable(getter) else None
        return cls.from_mapping(block)


def _plain(node: Any) -> Any:
    """An OmegaConf node as plain containers; anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        return node
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _select(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        getter = getattr(node, "get", None)
        if not callable(getter):
            return default
        node = getter(part, None)
        if node is None:
            return default
    return node


# --------------------------------------------------------------------------- estimator


def prompt_codes(index: Any) -> tuple[np.ndarray, int]:
    """Dense integer codes for verl's per-response group ids (the ``uid`` column).

    Parameters
    ----------
    index : sequence of hashable, length N
        The group id of every response; usually an object array of uuid strings.

    Returns
    -------
    codes : numpy.ndarray of int64, shape (N,)
        ``codes[k]`` in ``[0, M)``, numbered by first appearance.
    num_prompts : int
        M, the number of distinct ids.
    """
    values = index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)
    table: dict[Any, int] = {}
    try:
        codes = np.fromiter(
            (table.setdefault(value, len(table)) for value in values),
            dtype=np.int64,
            count=len(values),
        )
    except TypeError as exc:
        raise SeraOptError(
            f"the prompt ids (verl's uid column) must be hashable values such as strings: {exc}"
        ) from exc
    return codes, len(table)


@dataclass(frozen=True)
class EstimatorCall:
    """What one call of the estimator saw, for :func:`collect_estimator_calls`.

    Attributes
    ----------
    uids : numpy.ndarray, shape (N,)
        The ``uid`` of every response, in batch order.
    successes : numpy.ndarray of float64, shape (N,)
        1.0 for a successful response, 0.0 otherwise.
    diagnostics : dict[str, float]
        :func:`sera_opt.advantage_diagnostics` of the batch.
    """

    uids: np.ndarray
    successes: np.ndarray
    diagnostics: dict[str, float]


_CALL_SINK: contextvars.ContextVar[list[EstimatorCall] | None] = contextvars.ContextVar(
    "sera_opt_verl_estimator_calls", default=None
)


#: Non-tensor column holding each row's round (0 for the first), written by
#: :func:`repeat_by_counts` with ``round_number=``.
ROUND_KEY = "sera_round"

_ROUND_INDEX: contextvars.ContextVar[np.ndarray | None] = contextvars.ContextVar(
    "sera_opt_verl_round_index", default=None
)


@contextlib.contextmanager
def round_index(values: Any) -> Iterator[np.ndarray]:
    """Give the estimator each row's round for the calls made inside the ``with`` block.

    verl's ``compute_advantage`` passes an estimator only the batch's ``uid``; a
    batch generated in rounds (rows of each round laid out by
    :func:`repeat_by_counts` with ``round_number=r`` and concatenated) carries its
    rounds in the :data:`ROUND_KEY` column::

        with round_index(batch.non_tensor_batch[ROUND_KEY]):
            batch = compute_advantage(batch, adv_estimator="sera_maxrl", config=...)

    The estimator then takes the mean-centred baseline from the first round
    (:func:`sera_opt.maxrl_advantages` with ``round_index``). The values must be
    non-negative integers, one per row of the batch the estimator gets.
    """
    array = np.asarray(values)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.dtype == object):
        raise SeraOptError(
            f"round_index takes one integer round per row (a 1-D array); got dtype {array.dtype}, "
            f"shape {array.shape}."
        )
    try:
        array = array.astype(np.int64)
    except (TypeError, ValueError) as exc:
        raise SeraOptError(f"round_index takes one integer round per row: {exc}") from exc
    if array.size and array.min() < 0:
        raise SeraOptError("round_index values are rounds, 0 for the first; got a negative one.")
    token = _ROUND_INDEX.set(array)
    try:
        yield array
    finally:
        _ROUND_INDEX.reset(token)


_ROUND_GROUPS: contextvars.ContextVar[Mapping[Any, tuple[Any, int]] | None] = contextvars.ContextVar(
    "sera_opt_verl_round_groups", default=None
)


@contextlib.contextmanager
def round_groups(groups: Mapping[Any, tuple[Any, int]]) -> Iterator[Mapping[Any, tuple[Any, int]]]:
    """Map each round's uid to its prompt and round, for the estimator calls made inside.

    verl's V1 agent loop stores a prompt's rollouts under keys
    ``{uid}_{session}_{output}`` with sessions numbered from 0 at every submission,
    so a step generated in rounds submits each prompt under a fresh uid per round
    (the same uid twice would overwrite the first round's rows). Inside this block
    the estimator reads every row's ``uid`` through ``groups``: ``groups[uid] =
    (prompt_uid, round)`` pools a prompt's rows of all rounds into one group and
    gives each row its round (the mean-centred baseline then comes from the first
    round, as with :func:`round_index`). Rows whose uid is not in ``groups`` are
    not rollouts of the rounds (verl's padding rows, added after generation to
    make the batch divisible by the data-parallel size): they get advantage 0 and
    count in neither N nor M, so the advantages of the real rows are those of
    :func:`sera_opt.maxrl_advantages` on the rounds' rollouts alone.

    Parameters
    ----------
    groups : mapping
        Round uid -> ``(prompt_uid, round)``, rounds counted from 0.
    """
    if not isinstance(groups, Mapping):
        raise SeraOptError(
            "round_groups takes a mapping uid -> (prompt_uid, round); got "
            f"{type(groups).__name__}."
        )
    for uid, value in groups.items():
        if (
            not isinstance(value, tuple)
            or len(value) != 2
            or isinstance(value[1], bool)
            or not isinstance(value[1], numbers.Integral)
            or value[1] < 0
        ):
            raise SeraOptError(
                f"round_groups maps each uid to (prompt_uid, round) with round an integer >= 0; "
                f"got {value!r} for {uid!r}."
            )
    token = _ROUND_GROUPS.set(groups)
    try:
        yield groups
    finally:
        _ROUND_GROUPS.reset(token)


_MEAN_COUNT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "sera_opt_verl_mean_count", default=None
)


@contextlib.contextmanager
def fixed_mean_count(value: float) -> Iterator[float]:
    """Use ``value`` as the multiplicity correction's ``nbar`` in the estimator calls
    made inside (:func:`sera_opt.maxrl_advantages`' ``mean_count``).

    The ``sera_sync`` mode sets it to ``actor_rollout_ref.rollout.n`` (``N0``) when its
    planner can switch prompts off: their rollouts went to the active prompts, whose
    weights stay ``N0 / n_i`` (docs/theory.md, "SERA as its authors run it").
    """
    from sera_opt.problem import validate_real

    value = validate_real(value, "mean_count", minimum=0.0, strict=True)
    token = _MEAN_COUNT.set(value)
    try:
        yield value
    finally:
        _MEAN_COUNT.reset(token)


def _advantages_of_round_rows(token_level_rewards, response_mask, index, config, groups):
    """The estimator on the rows that ``groups`` names (see :func:`round_groups`); 0 elsewhere."""
    values = index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)
    if len(values) != token_level_rewards.shape[0]:
        raise SeraOptError(
            f"index has {len(values)} entries for {token_level_rewards.shape[0]} responses."
        )
    rows = [k for k, value in enumerate(values) if value in groups]
    advantages = torch.zeros_like(token_level_rewards)
    if rows:
        keep = torch.as_tensor(rows, dtype=torch.long, device=token_level_rewards.device)
        prompt_uids = np.empty(len(rows), dtype=object)
        prompt_uids[:] = [groups[values[k]][0] for k in rows]
        rounds = np.array([groups[values[k]][1] for k in rows], dtype=np.int64)
        token = _ROUND_GROUPS.set(None)
        try:
            kept, _ = compute_sera_maxrl_advantage(
                token_level_rewards[keep], response_mask[keep], index=prompt_uids, config=config,
                round_index=rounds,
            )
        finally:
            _ROUND_GROUPS.reset(token)
        advantages[keep] = kept
    return advantages, advantages


@contextlib.contextmanager
def collect_estimator_calls() -> Iterator[list[EstimatorCall]]:
    """Record every call of the estimator made inside the ``with`` block.

    The trainer modes use it around verl's ``_compute_advantage`` to get the
    outcomes (for the planner's tracker) and the diagnostics without fetching the
    batch a second time. Outside such a block the estimator records nothing and
    reads nothing back to the host beyond what grouping needs.
    """
    calls: list[EstimatorCall] = []
    token = _CALL_SINK.set(calls)
    try:
        yield calls
    finally:
        _CALL_SINK.reset(token)


def compute_sera_maxrl_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    round_index: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MaxRL advantages for verl, registered as ``algorithm.adv_estimator=sera_maxrl``.

    The outcome of response k is ``token_level_rewards[k].sum()`` (verl places an
    outcome reward on the last response token). Responses are grouped by ``index``
    (verl passes the batch's ``uid`` column: one id per prompt, shared by its
    rollouts), and :func:`sera_opt.maxrl_advantages` gives each response its
    advantage, which is broadcast over the response's tokens.

    Every row counts as one rollout of its group, as in verl's GRPO, including rows
    whose ``response_mask`` is all zero (their advantage is masked out). verl's
    padding rows carry their own ``uid`` and zero reward, so they form a group
    whose advantages are zero; they raise N and M, which rescales every prompt's
    correction ``nbar / n_i`` by the same factor.

    Parameters
    ----------
    token_level_rewards : torch.Tensor, shape (bs, response_length)
    response_mask : torch.Tensor, shape (bs, response_length)
    index : array-like, shape (bs,)
        Group id of every response (verl: ``data.non_tensor_batch["uid"]``).
    config : AlgoConfig, DictConfig or dict, optional
        verl's ``algorithm`` config; its ``sera_maxrl`` block
        (:class:`SeraMaxRLConfig`) selects the estimator, the correction and the
        success threshold. ``use_kl_in_reward`` must be off: a KL penalty folded
        into the reward makes outcomes non-binary (use ``actor.use_kl_loss``).
    round_index : array-like of int, shape (bs,), optional
        Each response's round, for a batch generated in rounds: the mean-centred
        estimator's baseline then comes from the first round (docs/theory.md section 9).
        Default: the one set by a :func:`round_index` block, if any (verl's
        ``compute_advantage`` does not pass it). Inside a :func:`round_groups` block
        the rounds and the groups come from that block instead.
    **kwargs
        Other batch fields verl may pass (``reward_baselines``); ignored, with a
        :class:`sera_opt.SeraOptWarning`.

    Returns
    -------
    advantages, returns : torch.Tensor, shape (bs, response_length)
        The same tensor twice (outcome estimators have no value target), like
        verl's GRPO.
    """
    options = SeraMaxRLConfig.from_algorithm_config(config)
    if config is not None and _select(config, "use_kl_in_reward", False):
        raise SeraOptError(
            "algorithm.use_kl_in_reward=True folds a KL penalty into token_level_rewards, so the "
            "outcomes are no longer 0/1 successes; set algorithm.use_kl_in_reward=False and use "
            "actor_rollout_ref.actor.use_kl_loss=True for the KL term instead."
        )
    ignored = sorted(key for key, value in kwargs.items() if value is not None)
    if ignored:
        warnings.warn(
            f"the {ESTIMATOR_NAME} estimator ignores {ignored}.", SeraOptWarning, stacklevel=2
        )
    if not isinstance(token_level_rewards, torch.Tensor) or token_level_rewards.ndim != 2:
        raise SeraOptError(
            "token_level_rewards must be a tensor of shape (responses, response_length)."
        )
    if (
        not isinstance(response_mask, torch.Tensor)
        or response_mask.shape != token_level_rewards.shape
    ):
        raise SeraOptError(
            f"response_mask must be a tensor of the shape of token_level_rewards, "
            f"{tuple(token_level_rewards.shape)}."
        )
    if index is None:
        raise SeraOptError(
            f"the {ESTIMATOR_NAME} estimator groups responses by prompt and needs verl's 'uid' "
            "column (data.non_tensor_batch['uid']); give every prompt one uid shared by its "
            "rollouts (repeat_by_counts does)."
        )
    groups = _ROUND_GROUPS.get()
    if groups is not None:
        if round_index is not None or _ROUND_INDEX.get() is not None:
            raise SeraOptError(
                "the rounds were given twice (round_groups and round_index); give them one way."
            )
        return _advantages_of_round_rows(token_level_rewards, response_mask, index, config, groups)
    codes, num_prompts = prompt_codes(index)
    if codes.shape[0] != token_level_rewards.shape[0]:
        raise SeraOptError(
            f"index has {codes.shape[0]} entries for {token_level_rewards.shape[0]} responses."
        )
    device = token_level_rewards.device
    with torch.no_grad():
        outcomes = token_level_rewards.sum(dim=-1)
        prompt_index = torch.from_numpy(codes).to(device)
        rounds = _ROUND_INDEX.get() if round_index is None else round_index
        if rounds is not None:
            rounds = torch.as_tensor(np.asarray(rounds, dtype=np.int64), device=device)
            if rounds.shape != (codes.shape[0],):
                raise SeraOptError(
                    f"round_index has {tuple(rounds.shape)} entries for {codes.shape[0]} responses; give one "
                    "round per row of the batch the estimator gets."
                )
        try:
            scalars = sera_opt.maxrl_advantages(
                outcomes,
                prompt_index,
                estimator=options.estimator,
                multiplicity_correction=options.multiplicity_correction,
                success_threshold=options.success_threshold,
                num_prompts=max(num_prompts, 1),
                round_index=rounds,
                mean_count=_MEAN_COUNT.get(),
            )
        except SeraOptError as exc:
            raise SeraOptError(
                f"{exc} (verl: the outcome of a response is the sum of its token_level_rewards; for "
                "graded rewards set +algorithm.sera_maxrl.success_threshold=<value>.)"
            ) from exc
        advantages = scalars.unsqueeze(-1) * response_mask
        sink = _CALL_SINK.get()
        if sink is not None:
            sink.append(_record_call(index, outcomes, prompt_index, num_prompts, options))
    return advantages, advantages


def _record_call(index, outcomes, prompt_index, num_prompts, options) -> EstimatorCall:
    diagnostics = sera_opt.advantage_diagnostics(
        outcomes,
        prompt_index,
        estimator=options.estimator,
        multiplicity_correction=options.multiplicity_correction,
        success_threshold=options.success_threshold,
        num_prompts=max(num_prompts, 1),
        mean_count=_MEAN_COUNT.get(),
    )
    return EstimatorCall(
        uids=np.asarray(index, dtype=object).copy(),
        successes=_common.binary_outcomes(outcomes, options.success_threshold),
        diagnostics=diagnostics,
    )


def _same_function(a: Any, b: Any) -> bool:
    """The same estimator, possibly from a reloaded or ``python -m``-run copy of this file."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (
        code_a is not None
        and code_b is not None
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
        and code_a.co_filename == code_b.co_filename
    )


def _registered_estimator(name: str) -> Any:
    """verl's estimator under ``name``, or None (``get_adv_estimator_fn`` raises for unknown names)."""
    try:
        return core_algos.get_adv_estimator_fn(name)
    except ValueError:
        return None


def register_estimator(name: str = ESTIMATOR_NAME):
    """Register :func:`compute_sera_maxrl_advantage` with verl's ``register_adv_est``.

    Idempotent: registering again is a no-op, also when the name already holds a
    copy of this function from a reloaded module (``importlib.reload`` runs the same
    code in the same module namespace, so the registered copy behaves exactly like
    the live one; verl's public API has no way to swap it, and none is needed). A
    name that verl uses for one of its own estimators, or that another function
    already holds, is refused, so verl's estimators keep working. Only verl's
    public ``register_adv_est`` and ``get_adv_estimator_fn`` are used; verl's
    registry dict is never written.

    Returns
    -------
    callable
        The registered function, as ``core_algos.get_adv_estimator_fn(name)`` returns it.
    """
    if not isinstance(name, str) or not name:
        raise SeraOptError(f"the estimator name must be a non-empty string, got {name!r}.")
    builtin = {member.value for member in core_algos.AdvantageEstimator}
    if name in builtin:
        raise SeraOptError(
            f"{name!r} is one of verl's own advantage estimators {sorted(builtin)}; register "
            f"sera_maxrl under another name."
        )
    existing = _registered_estimator(name)
    if existing is compute_sera_maxrl_advantage or (
        existing is not None and _same_function(existing, compute_sera_maxrl_advantage)
    ):
        return existing
    if existing is not None:
        raise SeraOptError(
            f"verl already has an advantage estimator named {name!r} ({existing!r}); "
            f"register sera_maxrl under another name."
        )
    return core_algos.register_adv_est(name)(compute_sera_maxrl_advantage)


# --------------------------------------------------------------------------- rollout counts


def repeat_by_counts(
    batch: DataProto, counts: Any, *, uid_key: str = "uid", round_number: int | None = None
) -> DataProto:
    """Repeat row i of a prompt batch ``counts[i]`` times, keeping one uid per prompt.

    The variable-count replacement of verl's ``batch.repeat(rollout.n, interleave=True)``,
    built on ``DataProto.sample_level_repeat``: the rollouts of a prompt are
    contiguous and share the prompt's ``uid``, which is how verl's
    ``compute_advantage`` groups them.

    Parameters
    ----------
    batch : verl.DataProto
        One row per prompt (before generation).
    counts : array-like of int, or Allocation
        n_i for each row, at least 0 (a prompt with 0 rollouts is dropped).
    uid_key : str, default "uid"
        The non-tensor column holding the group id. Missing: a fresh uuid4 string is
        given to every prompt. Present: the ids must be distinct across rows, or two
        prompts would be pooled into one group.
    round_number : int, optional
        For one round of a step generated in rounds: every row gets this round in
        the :data:`ROUND_KEY` column (see :func:`round_index`). The prompt batch must
        then carry its uids, so that every round's rows of a prompt share one.

    Returns
    -------
    verl.DataProto
        ``sum(counts)`` rows; tensors, non-tensor columns and ``meta_info`` are those
        of the prompt rows. The input batch is not modified.
    """
    if not isinstance(batch, DataProto):
        raise SeraOptError(f"batch must be a verl.DataProto, got {type(batch).__name__}.")
    counts = _common.check_counts(counts, len(batch), minimum=0)
    non_tensor = dict(batch.non_tensor_batch)
    if round_number is not None:
        if (
            isinstance(round_number, bool)
            or not isinstance(round_number, numbers.Integral)
            or round_number < 0
        ):
            raise SeraOptError(
                f"round_number must be a round, an integer >= 0; got {round_number!r}."
            )
        if uid_key not in non_tensor:
            raise SeraOptError(
                f"round_number needs the prompt batch's {uid_key!r} column, so that every round's rows of a "
                "prompt share one uid; assign the uids once, before the first round."
            )
        non_tensor[ROUND_KEY] = np.full(len(batch), int(round_number), dtype=np.int64)
    if uid_key in non_tensor:
        uids = np.asarray(non_tensor[uid_key], dtype=object)
        _, distinct = prompt_codes(uids)
        if distinct != len(uids):
            raise SeraOptError(
                f"the {uid_key!r} column repeats ids across prompt rows ({len(uids)} rows, "
                f"{distinct} distinct ids); give every prompt its own uid before repeating, or "
                f"drop the column to have fresh ones assigned."
            )
    else:
        non_tensor[uid_key] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    source = DataProto(batch=batch.batch, non_tensor_batch=non_tensor, meta_info=batch.meta_info)
    return source.sample_level_repeat(counts)


def assign_rollout_counts(batch: Any, counts: Any) -> Any:
    """Write per-prompt rollout counts into a V1 training batch (``__rollout_n__``).

    verl 0.9.1's V1 agent loop (``AgentLoopWorkerTQ._run_prompt``) pops this column
    from each prompt and starts that many sessions instead of ``rollout.n``.

    Parameters
    ----------
    batch : tensordict.TensorDict
        One row per prompt, as the V1 trainer's ``_next_train_batch`` returns it.
    counts : array-like of int, or Allocation
        n_i >= 1 for each row.

    Returns
    -------
    TensorDict
        The same batch, with the column set (a stack of Python ints).
    """
    from verl.utils import tensordict_utils as tu

    counts = _common.check_counts(counts, len(batch), minimum=1)
    tu.assign_non_tensor_stack(batch, ROLLOUT_COUNT_KEY, [int(c) for c in counts])
    return batch


def prompt_ids_from_batch(batch: Any, prompt_key: str = "index") -> list:
    """The stable prompt id of every row of a V1 prompt batch (for the planner's tracker).

    Raises
    ------
    SeraOptError
        If the column is missing, or all rows of a multi-prompt batch share one id
        (verl's RLHFDataset sets ``index`` to 0 when a row has no ``extra_info.index``,
        which would pool every prompt's history).
    """
    from verl.utils import tensordict_utils as tu

    if prompt_key not in batch.keys():
        raise SeraOptError(
            f"the training batch has no {prompt_key!r} column to identify prompts across steps; "
            f"give every dataset row a unique extra_info.index (verl copies it into 'index') or "
            f"set +algorithm.sera_maxrl.prompt_key to a column that identifies the prompt."
        )
    values = tu.get(batch, prompt_key)
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    elif not isinstance(values, list):  # one value stored for the whole batch
        values = [values] * len(batch)
    ids = [value.item() if isinstance(value, np.generic) else value for value in values]
    if len(ids) > 1 and len(set(map(repr, ids))) == 1:
        raise SeraOptError(
            f"every prompt of the batch has the same {prompt_key!r} ({ids[0]!r}); verl's "
            f"RLHFDataset uses 0 when a row lacks extra_info.index. Give every dataset row a "
            f"unique extra_info.index, or set +algorithm.sera_maxrl.prompt_key."
        )
    return ids


def build_planner(options: SeraMaxRLConfig, mean_count: int):
    """The :class:`sera_opt.RolloutPlanner` that the trainer modes use.

    Parameters
    ----------
    options : SeraMaxRLConfig
    mean_count : int
        ``actor_rollout_ref.rollout.n``: the budget of a batch of M prompts is
        ``M * mean_count``, so a step costs what verl's uniform allocation costs.
    """
    min_rollouts, max_rollouts = _bounds(options, mean_count)
    tracker = None
    if options.tracker_options:
        # The authors' configuration keeps its own estimates (frozen per epoch).
        kind = sera_opt.EpochTracker if options.policy == "sera-paper" else sera_opt.SuccessTracker
        tracker = kind(**dict(options.tracker_options))
    return sera_opt.RolloutPlanner(
        policy=options.policy,
        tracker=tracker,
        min_rollouts=min_rollouts,
        max_rollouts=max_rollouts,
        offset=options.offset,
        **dict(options.policy_options),
    )


def _bounds(options: SeraMaxRLConfig, mean_count: int) -> tuple[int, int]:
    min_rollouts = options.min_rollouts
    if min_rollouts is None:
        min_rollouts = _common.default_min_rollouts(options.estimator)
    max_rollouts = options.max_rollouts
    if max_rollouts is None:
        max_rollouts = _common.default_max_rollouts(mean_count, min_rollouts)
    if not min_rollouts <= mean_count <= max_rollouts:
        raise SeraOptError(
            f"actor_rollout_ref.rollout.n={mean_count} is the mean count per prompt and must lie "
            f"within [min_rollouts, max_rollouts] = [{min_rollouts}, {max_rollouts}] "
            f"(algorithm.sera_maxrl), or no allocation meets the budget."
        )
    return min_rollouts, max_rollouts


def plan_rollout_counts(planner: Any, prompt_ids: Sequence[Any], mean_count: int) -> np.ndarray:
    """Ask the planner for the counts of one batch, with budget ``len(prompt_ids) * mean_count``.

    Returns
    -------
    numpy.ndarray of int64
        One count per prompt, summing to the budget.
    """
    if (
        isinstance(mean_count, bool)
        or not isinstance(mean_count, numbers.Integral)
        or mean_count < 1
    ):
        raise SeraOptError(f"mean_count must be a positive integer, got {mean_count!r}.")
    budget = len(prompt_ids) * int(mean_count)
    allocation = planner.plan(list(prompt_ids), budget)
    return _common.check_counts(allocation, len(prompt_ids), minimum=1, budget=budget)


def check_trainer_config(config: Any) -> SeraMaxRLConfig:
    """Check a full verl trainer config for the ``sera_*`` trainer modes.

    Returns
    -------
    SeraMaxRLConfig
        The validated ``algorithm.sera_maxrl`` block, with ``rounds`` resolved (see
        :attr:`SeraMaxRLConfig.rounds`).

    Raises
    ------
    SeraOptError
        The estimator is not ``sera_maxrl``, the actor's ``loss_agg_mode`` is not one
        whose normalisation the multiplicity correction is matched to
        (:data:`LOSS_AGG_MODES`), the KL penalty is folded into the reward,
        ``rollout.n`` lies outside the count bounds, or ``rounds >= 2`` is asked for
        where it cannot run: another mode than ``sera_sync``, a first round above
        ``rollout.n``, DAPO's group filtering, refills of failed groups, a custom
        sampler, ``parameter_sync_step > 1``, a colocated reward model, replayed
        rollouts (``skip.rollout_tq``).
    """
    estimator = _select(config, "algorithm.adv_estimator")
    if estimator != ESTIMATOR_NAME:
        raise SeraOptError(
            f"the sera trainer modes plan counts for the {ESTIMATOR_NAME} estimator; set "
            f"algorithm.adv_estimator={ESTIMATOR_NAME} (got {estimator!r})."
        )
    options = SeraMaxRLConfig.from_algorithm_config(_select(config, "algorithm"))
    _common.loss_mode(
        LOSS_AGG_MODES,
        _select(config, "actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
        option="actor_rollout_ref.actor.loss_agg_mode",
    )
    if _select(config, "algorithm.use_kl_in_reward", False):
        raise SeraOptError(
            "algorithm.use_kl_in_reward=True makes outcomes non-binary; use "
            "actor_rollout_ref.actor.use_kl_loss=True instead."
        )
    mean_count = _select(config, "actor_rollout_ref.rollout.n")
    if (
        isinstance(mean_count, bool)
        or not isinstance(mean_count, numbers.Integral)
        or mean_count < 1
    ):
        raise SeraOptError(
            f"actor_rollout_ref.rollout.n must be a positive integer (the mean count), got "
            f"{mean_count!r}."
        )
    _bounds(options, int(mean_count))
    if options.rounds is None:
        # The default is one call per step, which every mode and feature can run (a
        # first_round without rounds was refused when the options were built).
        options = replace(options, rounds=_common.resolve_rounds(None))
    if options.rounds > 1:
        _check_round_config(config, options, int(mean_count))
    return options


def _check_round_config(config: Any, options: SeraMaxRLConfig, mean_count: int) -> None:
    """Refuse what the round mode of ``sera_sync`` cannot honour, before any worker starts."""
    mode = _select(config, "trainer.v1.trainer_mode")
    if mode not in (None, "sera_sync"):
        raise SeraOptError(
            f"algorithm.sera_maxrl.rounds={options.rounds} generates each step in rounds through the "
            f"synchronous trainer; set trainer.v1.trainer_mode=sera_sync (got {mode!r}), or rounds=1. "
            "The asynchronous modes generate later steps' prompts while one trains, so a step's "
            "later rounds cannot wait for its first round's rewards there."
        )
    if options.first_round is not None and options.first_round > mean_count:
        raise SeraOptError(
            f"algorithm.sera_maxrl.first_round={options.first_round} exceeds "
            f"actor_rollout_ref.rollout.n={mean_count}: the first round alone would spend more than "
            "the step's budget of rollout.n per prompt. Lower first_round or raise rollout.n."
        )
    refused = _round_refusals(config)
    if refused:
        raise SeraOptError(
            f"algorithm.sera_maxrl.rounds={options.rounds}: {refused[0]}, or set "
            "algorithm.sera_maxrl.rounds=1."
        )


def _round_refusals(config: Any) -> list[str]:
    """Why and how to turn off each feature of ``config`` that ``sera_sync``'s rounds
    cannot honour, for the features that are on (empty: rounds can run)."""
    features = [
        (
            bool(_select(config, "algorithm.filter_groups.enable", False)),
            "algorithm.filter_groups.enable=true (DAPO) evicts and refills prompt groups, which "
            "would drop rounds a prompt's later rounds were planned on; set it to false",
        ),
        (
            bool(_select(config, "trainer.v1.sampler.sync_refill_failed_groups", False)),
            "trainer.v1.sampler.sync_refill_failed_groups=true replaces a failed group by a new "
            "prompt in the middle of the rounds; set it to false (a round with a failed session "
            "stops the step with an error instead)",
        ),
        (
            bool(_select(config, "trainer.v1.sampler.custom_sampler.path", None)),
            "trainer.v1.sampler.custom_sampler replaces verl's replay buffer, whose sampling the "
            "rounds wait on; remove it",
        ),
        (
            int(_select(config, "trainer.v1.sync.parameter_sync_step", 1) or 1) != 1,
            "trainer.v1.sync.parameter_sync_step > 1 splits a step into several samples of the "
            "replay buffer; the rounds produce the step's batch at once, so leave it at 1",
        ),
        (
            bool(_select(config, "reward.reward_model.enable", False))
            and not bool(_select(config, "reward.reward_model.enable_resource_pool", False)),
            "a colocated reward model (reward.reward_model.enable=true without "
            "enable_resource_pool) scores the batch only after sampling, but each round needs its "
            "rewards before the next is planned; use a rule-based reward or set "
            "reward.reward_model.enable_resource_pool=true",
        ),
        (
            bool(_select(config, "skip.rollout_tq.enable", False)),
            "skip.rollout_tq replays one recorded generation per step, not one per round; set "
            "skip.rollout_tq.enable=false",
        ),
    ]
    return [reason for on, reason in features if on]


# --------------------------------------------------------------------------- trainer modes


def register_trainers() -> dict[str, type]:
    """Register the ``sera_*`` V1 trainer modes (needs verl's V1 trainer and TransferQueue).

    Idempotent. Not done at import, because importing verl's trainer pulls in the
    agent loop and TransferQueue, which worker processes do not need; the launcher
    (:func:`main`) calls it inside verl's task runner.

    Returns
    -------
    dict
        Mode name -> trainer class.
    """
    from sera_opt.integrations import _verl_trainer

    return _verl_trainer.register()


def main(argv: Sequence[str] | None = None) -> None:
    """Launch verl's PPO trainer with the ``sera_*`` trainer modes available.

    ``python -m sera_opt.integrations.verl <hydra overrides>`` takes the same
    overrides as ``python -m verl.trainer.main_ppo`` and runs the same job, with a
    task runner that registers this module's estimator and trainer modes in the
    process that builds the trainer.
    """
    from sera_opt.integrations import _verl_trainer

    _verl_trainer.launch(argv)


if __name__ == "__main__":  # pragma: no cover - a GPU job
    # `python -m` runs this file as __main__, a second copy of the module. The
    # importable copy does the version check, the verl-beside-trl fix and the
    # registrations, so that verl holds one estimator function, not two.
    from sera_opt.integrations.verl import main as _main

    _main()
else:
    _check_verl_version()
    _verl_compat.apply()
    register_estimator()
