"""Per-prompt group tables for the MaxRL estimator (private).

Every rollout gets a *code* ``2 * slot + success``: its prompt's slot in a
table of ``S`` slots, and whether it succeeded. One histogram of the codes
gives, for every slot, the number of failures and of successes side by side
(``table[2 s]`` and ``table[2 s + 1]``), and the same codes later pick each
rollout's advantage out of a ``(S, 2)`` table of per-prompt values. So the
whole estimator costs one comparison, one integer add, one scatter and one
gather over the N rollouts, whatever the number of prompts.

Slots are assigned without sorting the rollouts:

* ``num_prompts`` given: the ids must already lie in ``[0, num_prompts)`` and
  are their own slots (no host synchronisation at all when ``validate=False``).
* otherwise, if the ids span a range of at most ``_DENSE_RANGE_FACTOR * N``
  values, the slot is ``id - min(id)`` (one host read of the min and max);
* otherwise (sparse ids, such as hashes) the ids are hashed into compact slots
  by :mod:`._estimator_hashing`, exactly: two rollouts share a slot if and
  only if their ids are equal. Under data parallelism each rank's distinct ids
  (not its rollouts) are gathered and sorted into one global numbering. Below
  ``_HASH_MIN_ROLLOUTS`` rollouts the ids are sorted instead (``torch.unique``),
  which is cheaper at that size.

Slots without rollouts are harmless: their count is 0 and they are not
counted as prompts of the batch. Under data parallelism the histogram is
all-reduced, so every rank sees the global counts of every prompt.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
from dataclasses import dataclass

import torch

from ..exceptions import SeraOptError
from .hashing import HashedSlots, hashed_codes, kernel_histogram

# Ids spanning at most this many values per rollout use a dense table indexed
# by ``id - min(id)``; its memory (16 bytes per slot) stays O(N).
_DENSE_RANGE_FACTOR = 4
_DENSE_RANGE_SLACK = 1024

_INT64_MIN = torch.iinfo(torch.int64).min


@dataclass(frozen=True)
class _Groups:
    """What the public functions need from the grouping pass."""

    codes: torch.Tensor  # (N,) int32 (int64 for huge tables): 2 * slot + success
    table: torch.Tensor  # (2 S,) int64: failures and successes per slot (global)
    num_slots: int
    slot_offset: int  # slot = id - slot_offset on the dense paths
    # The ids of the slots on the sparse paths: sorted (data parallelism, or the
    # sort-based reference), or the hashing rounds that can name them; None if dense.
    slot_ids: torch.Tensor | HashedSlots | None
    dtype: torch.dtype  # the floating dtype of the results
    device: torch.device

    @property
    def failures(self) -> torch.Tensor:
        return self.table[0::2]

    @property
    def successes(self) -> torch.Tensor:
        return self.table[1::2]

    @property
    def ids_increasing(self) -> bool:
        """Whether slot order is id order (False only for hashed single-process slots)."""
        return not isinstance(self.slot_ids, HashedSlots)

    def prompt_ids(self) -> torch.Tensor:
        if isinstance(self.slot_ids, HashedSlots):
            return self.slot_ids.slot_ids()
        if self.slot_ids is not None:
            return self.slot_ids
        return torch.arange(self.num_slots, device=self.device) + self.slot_offset


def check_not_meta(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """``tensor``, unless it lives on the ``meta`` device (shapes without data)."""
    if tensor.device.type == "meta":
        raise SeraOptError(
            f"{name} is a meta tensor (a shape with no data), so there is nothing to compute "
            f"from; pass the real values (materialize the tensor on the CPU or an "
            f"accelerator first)."
        )
    return tensor


def as_tensor(value, name: str, device=None) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return check_not_meta(value, name)
    import numpy as np

    if isinstance(value, np.ma.MaskedArray):
        raise SeraOptError(
            f"{name} is a numpy masked array; sera_opt does not read masks, and converting it "
            f"would use whatever the masked entries hold. Pass {name}.compressed() (and the "
            f"matching entries of the other inputs) to drop them, or {name}.filled(value)."
        )
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        # A read-only array (an Allocation's or a RoundResult's) would share memory that
        # torch may not write to: copy it rather than warn.
        value = np.array(value)
    try:
        return torch.as_tensor(value, device=device)
    except Exception as exc:  # ragged lists, strings and the like
        raise SeraOptError(
            f"{name} must be a 1-D tensor (or array-like of numbers) with one entry per "
            f"rollout; could not convert it ({type(exc).__name__}: {exc}). Pass a flat list, "
            f"array or tensor of numbers."
        ) from exc


#: Unsigned integer dtypes torch stores but barely computes with (uint8 is complete).
WIDE_UNSIGNED = tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64")
                      if hasattr(torch, name))


def computable_integers(values: torch.Tensor) -> torch.Tensor:
    """``values`` as int64 if its dtype is one of :data:`WIDE_UNSIGNED`, else as it is.

    torch has almost no kernels for those dtypes (not even a comparison or a minimum).
    Every uint16 and uint32 value fits int64; a uint64 value of 2**63 or more turns
    negative, which the callers refuse where a negative value is not allowed.
    """
    return values.to(torch.int64) if values.dtype in WIDE_UNSIGNED else values


def check_flag(value, name: str) -> bool:
    """``value`` if it is a bool, else the library's error naming ``name``."""
    if not isinstance(value, bool):
        raise SeraOptError(f"{name} must be True or False, got {value!r}.")
    return value


def _check_num_prompts(num_prompts) -> int | None:
    if num_prompts is None:
        return None
    if isinstance(num_prompts, bool):
        raise SeraOptError(f"num_prompts must be a positive int or None, got {num_prompts!r}.")
    try:
        value = operator.index(num_prompts)
    except TypeError:
        raise SeraOptError(
            f"num_prompts must be a positive int or None, got {num_prompts!r}."
        ) from None
    if value < 1:
        raise SeraOptError(
            f"num_prompts must be at least 1, got {value}; pass None to size the table "
            f"from the ids themselves."
        )
    return value


def _check_threshold(success_threshold):
    if success_threshold is None:
        return None
    if isinstance(success_threshold, torch.Tensor) and success_threshold.numel() == 1:
        success_threshold = success_threshold.item()
    if isinstance(success_threshold, bool) or not isinstance(success_threshold, numbers.Real):
        raise SeraOptError(
            f"success_threshold must be a real number (rewards >= it count as successes) "
            f"or None, got {success_threshold!r}."
        )
    success_threshold = float(success_threshold)
    if not math.isfinite(success_threshold):
        raise SeraOptError(f"success_threshold must be finite, got {success_threshold!r}.")
    return success_threshold


def result_dtype(rewards: torch.Tensor, dtype) -> torch.dtype:
    """The floating dtype of the advantages: ``dtype``, else the rewards', else the default."""
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise SeraOptError(f"dtype must be a floating torch dtype, got {dtype!r}.")
        return dtype
    if rewards.dtype.is_floating_point:
        return rewards.dtype
    return torch.get_default_dtype()


def _success_mask(rewards: torch.Tensor, success_threshold, validate: bool):
    """Return (success, bad_flag): the boolean outcomes and a 0-d int64 validity flag."""
    device = rewards.device
    no_problem = torch.zeros((), dtype=torch.int64, device=device)
    if rewards.dtype == torch.bool:
        if success_threshold is None:
            return rewards, no_problem
        # A bool reward is the number 0 or 1, compared with the threshold like any other
        # reward: True succeeds iff 1 >= t, False iff 0 >= t.
        if success_threshold > 1:
            return torch.zeros_like(rewards), no_problem
        if success_threshold <= 0:
            return torch.ones_like(rewards), no_problem
        return rewards, no_problem
    if rewards.is_complex():
        raise SeraOptError("rewards must be real numbers, got a complex tensor.")
    if success_threshold is not None:
        success = rewards >= success_threshold
        if validate and rewards.is_floating_point() and rewards.numel() > 0:
            # NaN would silently count as a failure.
            bad = (~torch.isfinite(rewards)).any().to(torch.int64)
            return success, bad
        return success, no_problem
    # Binary rewards: once they are known to be 0 or 1, a cast to bool (several
    # times cheaper than comparing with 1) gives the outcomes. Unvalidated,
    # any nonzero reward counts as a success.
    success = rewards.bool()
    if not validate or rewards.numel() == 0:
        return success, no_problem
    low, high = torch.aminmax(rewards)
    bad = (low < 0) | (high > 1)
    if rewards.is_floating_point():
        # aminmax propagates NaN; within [0, 1] the only values with a zero
        # fractional part are 0 and 1, so one max of frac() finds the rest.
        bad = bad | torch.isnan(low) | (rewards.frac().amax() > 0)
    return success, bad.to(torch.int64)


def _reward_error(rewards: torch.Tensor, success_threshold) -> SeraOptError:
    if success_threshold is not None:
        count = int((~torch.isfinite(rewards)).sum())
        return SeraOptError(
            f"rewards contain {count} non-finite value(s) (NaN or inf); with "
            f"success_threshold={success_threshold!r} they cannot be classified. Replace "
            f"them (for example with 0 for a failed rollout) before computing advantages."
        )
    nonbinary = ~((rewards == 0) | (rewards == 1))
    count = int(nonbinary.sum())
    first = int(torch.nonzero(nonbinary)[0, 0])
    return SeraOptError(
        f"rewards must be binary (0 or 1, or bool): {count} value(s) are not, first "
        f"{rewards[first].item()!r} at index {first}. MaxRL needs success/failure outcomes; "
        f"pass success_threshold=t to count rewards >= t as successes."
    )


def _index_error(prompt_index: torch.Tensor, num_prompts: int) -> SeraOptError:
    low, high = (int(v) for v in torch.aminmax(prompt_index))
    return SeraOptError(
        f"prompt_index must lie in [0, num_prompts) = [0, {num_prompts}) when num_prompts "
        f"is given, but it spans [{low}, {high}]. Pass num_prompts=None to accept "
        f"arbitrary ids, or renumber the prompts densely."
    )


def distributed_world(process_group):
    """(torch.distributed module, world size) for ``process_group``, or (None, 1)."""
    if process_group is None:
        return None, 1
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise SeraOptError(
            "process_group was given but torch.distributed is not initialized; call "
            "torch.distributed.init_process_group first, or pass process_group=None for a "
            "single process."
        )
    return dist, dist.get_world_size(process_group)


def _histogram(codes: torch.Tensor, length: int) -> torch.Tensor:
    if codes.device.type == "cpu":
        # bincount is the fastest CPU histogram; on accelerators it reads the
        # maximum back to the host, so index_add_ is used there instead.
        table = torch.bincount(codes, minlength=length)
        if table.numel() != length:
            raise SeraOptError(
                "prompt_index has ids outside [0, num_prompts); validate=False skips this "
                "check, so pass valid ids or validate=True."
            )
        return table
    ones = torch.ones((), dtype=torch.int64, device=codes.device).expand(codes.numel())
    return torch.zeros(length, dtype=torch.int64, device=codes.device).index_add_(0, codes, ones)


#: How sparse ids get their slots: "hash" (the default, no sort of the rollouts) or
#: "sort" (torch.unique; the reference the tests compare the hashing against).
_SPARSE_SLOTS = "hash"
#: Below this many (local) rollouts sparse ids are sorted anyway: a sort of a few
#: thousand values is cheaper than the hashing rounds' fixed costs.
_HASH_MIN_ROLLOUTS = 1 << 13


@contextlib.contextmanager
def sorted_sparse_slots():
    """Within the block, sparse ids get their slots by sorting (``torch.unique``), the
    reference the hashed slots are tested and benchmarked against. It changes a module
    setting: not for use while other threads run the estimator."""
    global _SPARSE_SLOTS
    saved, _SPARSE_SLOTS = _SPARSE_SLOTS, "sort"
    try:
        yield
    finally:
        _SPARSE_SLOTS = saved


def sparse_slot_method(num_rollouts: int) -> str:
    """How sparse ids of ``num_rollouts`` (local) rollouts on CPU get their slots."""
    from .hashing import cpu_backend

    if _SPARSE_SLOTS == "sort":
        return "sort (the reference)"
    if num_rollouts < _HASH_MIN_ROLLOUTS:
        return "sort (below the hashing threshold)"
    return f"hashing, {cpu_backend()} backend"


def _index_dtype(num_slots: int) -> torch.dtype:
    # int32 codes halve the largest temporary and speed up both the histogram
    # and the gather; int64 only for tables of more than 2**30 slots.
    return torch.int32 if 2 * num_slots <= torch.iinfo(torch.int32).max else torch.int64


def _sparse_codes(prompt_index, success, dist, process_group, world: int, n_max: int):
    """Codes ``2 * slot + success`` of sparse ids, and the slots' ids (tensor or HashedSlots)."""
    ids = prompt_index.long()
    if _SPARSE_SLOTS == "sort" or ids.numel() < _HASH_MIN_ROLLOUTS:
        slot_ids, slots = _compress(ids, dist, process_group, world)
        codes = slots.to(_index_dtype(slot_ids.numel()))
        return torch.add(success, codes, alpha=2, out=codes), slot_ids
    # Slots <= rollouts: local codes fit the dtype the local count allows.
    codes = torch.empty(ids.shape, dtype=_index_dtype(ids.numel()), device=ids.device)
    hashed = hashed_codes(ids, success, codes)
    if dist is None:
        return codes, hashed
    # One global numbering: the union of every rank's distinct ids, sorted. Only
    # the distinct ids are sorted and searched; the rollouts follow their codes.
    local = hashed.slot_ids(device=ids.device)
    union = _union(local, dist, process_group, world)
    place = torch.searchsorted(union, local)
    recode = torch.stack([2 * place, 2 * place + 1], dim=1).view(-1)
    return recode.to(_index_dtype(union.numel())).index_select(0, codes), union


def _compress(ids, dist, process_group, world: int):
    """Sorted prompt ids (the union over ranks) and each rollout's position among them."""
    local, inverse = torch.unique(ids, return_inverse=True)
    if dist is None:
        return local, inverse
    union = _union(local, dist, process_group, world)
    return union, torch.searchsorted(union, local)[inverse]


def _union(local, dist, process_group, world: int):
    """The sorted union over ranks of each rank's distinct ids ``local``."""
    size = torch.tensor([local.numel()], dtype=torch.int64, device=local.device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=process_group)
    sizes = [int(s) for s in sizes]
    padded = torch.zeros(max(sizes), dtype=torch.int64, device=local.device)
    padded[: local.numel()] = local
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=process_group)
    return torch.unique(torch.cat([g[:s] for g, s in zip(gathered, sizes, strict=True)]))


def group(rewards, prompt_index, *, success_threshold=None, num_prompts=None,
          process_group=None, validate: bool = True, dtype=None) -> _Groups:
    """Validate the inputs, assign slots and build the (global) per-slot table."""
    rewards = as_tensor(rewards, "rewards")
    prompt_index = as_tensor(prompt_index, "prompt_index", device=rewards.device)
    if rewards.ndim != 1:
        raise SeraOptError(
            f"rewards must be 1-D (one outcome per rollout), got shape {tuple(rewards.shape)}; "
            f"flatten it so that it lines up with prompt_index."
        )
    if prompt_index.ndim != 1 or prompt_index.shape[0] != rewards.shape[0]:
        raise SeraOptError(
            f"prompt_index must be 1-D with one prompt id per rollout, i.e. shape "
            f"({rewards.shape[0]},) like rewards; got shape {tuple(prompt_index.shape)}."
        )
    if prompt_index.dtype == torch.bool or prompt_index.is_floating_point() or prompt_index.is_complex():
        raise SeraOptError(
            f"prompt_index must be an integer tensor of prompt ids, got dtype {prompt_index.dtype}; "
            f"convert it with .long() if the values are whole numbers."
        )
    if prompt_index.device != rewards.device:
        raise SeraOptError(
            f"rewards and prompt_index must be on the same device, got {rewards.device} and "
            f"{prompt_index.device}."
        )
    unsigned_64 = prompt_index.dtype == getattr(torch, "uint64", None)
    prompt_index = computable_integers(prompt_index)
    out_dtype = result_dtype(rewards, dtype)
    success_threshold = _check_threshold(success_threshold)
    num_prompts = _check_num_prompts(num_prompts)
    dist, world = distributed_world(process_group)
    device = rewards.device
    n_local = rewards.shape[0]

    success, bad_rewards = _success_mask(rewards, success_threshold, validate)

    # Everything the host must know goes through one read-back (and, across
    # ranks, one MAX all-reduce, so that every rank raises together instead of
    # leaving the others waiting in a collective).
    if num_prompts is not None:
        if validate:
            if n_local:
                low, high = torch.aminmax(prompt_index)
                bad_index = ((low < 0) | (high >= num_prompts)).to(torch.int64)
            else:
                bad_index = torch.zeros((), dtype=torch.int64, device=device)
            flags = torch.stack([bad_rewards, bad_index])
            if dist is not None:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=process_group)
            bad_r, bad_i = flags.tolist()
            _raise_if(bad_r, bad_i, rewards, prompt_index, success_threshold, num_prompts, dist)
        num_slots, offset, slot_ids = num_prompts, 0, None
    else:
        if n_local:
            low, high = (v.long() for v in torch.aminmax(prompt_index))
            # ~low = -low - 1 turns the minimum into a maximum without overflow.
            info = torch.stack([bad_rewards, ~low, high,
                                torch.tensor(n_local, dtype=torch.int64, device=device)])
        else:
            info = torch.tensor([0, _INT64_MIN, _INT64_MIN, 0], dtype=torch.int64, device=device)
        if dist is not None:
            dist.all_reduce(info, op=dist.ReduceOp.MAX, group=process_group)
        bad_r, not_low, high, n_max = info.tolist()
        _raise_if(bad_r, 0, rewards, prompt_index, success_threshold, None, dist)
        if n_max == 0:  # no rollouts anywhere
            num_slots, offset, slot_ids = 0, 0, None
        else:
            low = ~not_low
            if unsigned_64 and low < 0:
                raise SeraOptError(
                    "prompt_index holds uint64 ids of 2**63 or more, which torch cannot compute "
                    "with; number the distinct ids first (np.unique(ids, return_inverse=True)[1])."
                )
            span = high - low + 1
            if span <= _DENSE_RANGE_FACTOR * n_max * world + _DENSE_RANGE_SLACK:
                num_slots, offset, slot_ids = span, low, None
            else:
                codes, slot_ids = _sparse_codes(prompt_index, success, dist, process_group,
                                                world, n_max)
                num_slots = (slot_ids.num_slots if isinstance(slot_ids, HashedSlots)
                             else slot_ids.numel())
                offset = 0

    if slot_ids is None:
        index_dtype = _index_dtype(num_slots)
        if offset:
            codes = torch.sub(prompt_index.long(), offset).to(index_dtype)
        else:
            codes = prompt_index.to(index_dtype, copy=True)
        torch.add(success, codes, alpha=2, out=codes)
    try:
        if isinstance(slot_ids, HashedSlots) and slot_ids.backend == "numba":
            table = kernel_histogram(codes, 2 * num_slots)
        else:
            table = _histogram(codes, 2 * num_slots)
    except (MemoryError, RuntimeError) as exc:
        if not _is_allocation_failure(exc):
            raise
        raise SeraOptError(
            f"the per-prompt table for {num_slots} prompt slots (two int64 counts each, "
            f"{16 * num_slots / 2**30:.3g} GiB) could not be allocated. "
            + (f"num_prompts={num_prompts} sizes it: pass the number of distinct prompt ids "
               f"(the ids must lie in [0, num_prompts)), or num_prompts=None to size it "
               f"from the ids themselves."
               if num_prompts is not None else "Renumber the prompt ids more densely.")
        ) from exc
    if dist is not None:
        dist.all_reduce(table, group=process_group)
    return _Groups(codes=codes, table=table, num_slots=num_slots, slot_offset=offset,
                   slot_ids=slot_ids, dtype=out_dtype, device=device)


def _is_allocation_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed allocation (host or device), not some other error."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return "allocate" in text or "out of memory" in text


def _raise_if(bad_rewards, bad_index, rewards, prompt_index, success_threshold, num_prompts, dist):
    if not (bad_rewards or bad_index):
        return
    # Under data parallelism every rank raises; the one whose shard is at fault
    # says what is wrong, the others say where to look.
    if bad_rewards:
        if _shard_has_bad_rewards(rewards, success_threshold):
            raise _reward_error(rewards, success_threshold)
        raise SeraOptError("rewards on another rank are invalid (see that rank's error).")
    if prompt_index.numel() and _shard_has_bad_index(prompt_index, num_prompts):
        raise _index_error(prompt_index, num_prompts)
    raise SeraOptError("prompt_index on another rank is out of range (see that rank's error).")


def _shard_has_bad_rewards(rewards, success_threshold) -> bool:
    if rewards.numel() == 0 or rewards.dtype == torch.bool:
        return False
    if success_threshold is not None:
        return bool((~torch.isfinite(rewards)).any()) if rewards.is_floating_point() else False
    return not bool(((rewards == 0) | (rewards == 1)).all())


def _shard_has_bad_index(prompt_index, num_prompts) -> bool:
    return bool(((prompt_index < 0) | (prompt_index >= num_prompts)).any())
