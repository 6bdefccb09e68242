"""Slots for sparse prompt ids without sorting the rollouts (private).

Wide-ranging ids (hashes) cannot index a table directly, and sorting the N
rollouts (``torch.unique``) costs tens of times one scatter. So the ids are
hashed into a table, and exactness never rests on the hash.

One round over a set of ids, with a table of ``T = 2**b`` buckets:

* ``y = id * a mod 2**64`` for an odd multiplier ``a`` is a bijection of the
  64-bit integers. Its top ``b`` bits pick the bucket (Fibonacci hashing); its
  other ``64 - b`` bits, shifted up to ``z = y << b``, tell apart the ids of a
  bucket: two ids are equal exactly when their buckets and their ``z`` are.
* Every rollout scatters its ``z`` into its bucket; one of the competing
  values wins each bucket. Written entries have their low ``b`` bits clear, so
  the table, filled with -1 beforehand, shows which buckets are occupied;
  numbering them in bucket order gives each occupied bucket a compact *rank*,
  stored in those low bits.
* Each rollout gathers its bucket's entry and XORs its own ``z`` into it: when
  its id won the bucket, the high bits cancel and what is left, in ``[0, T)``,
  is the rank; anything else means that another id won.

A round thus costs a multiply, a few shifts, one scatter, one gather and one
XOR per rollout, and gives every winner its compact slot. The losers (all
rollouts of an id share its fate) go to the next round, with the next
multiplier, a table sized from an estimate of their distinct ids, and slots
numbered after the previous rounds'. Every round makes progress (each
occupied bucket has a winner); whatever is left after ``_MAX_ROUNDS`` rounds
is numbered by ``torch.unique`` (only those rollouts are sorted). Two rollouts
therefore share a slot exactly when their ids are equal, whatever the ids:
negative, int64 extremes, or chosen to collide.

The rounds run as torch ops on any device (no host loop; one read-back per
round for the number of losers), or, for CPU tensors, as the fused numba
kernels of :mod:`.hashing_kernels`, about twice as fast because
they need one full-size temporary where torch ops need several. Both compute
the same rounds, so on CPU with one thread (where torch's scatter lets the
last writer win, like the kernel) they give the same codes, bit for bit.

Slots are numbered in the order the rounds find them, not by id; the ids of
the slots are recovered from the tables on request (the inverse multiplier
undoes the hash), for :func:`sera_opt.group_statistics` and data parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Odd 64-bit multipliers: 2**64 / golden ratio (Fibonacci hashing), splitmix64's two
# and MurmurHash3's finaliser constant. Round r uses the r-th, so an id set that
# collides under one multiplier is spread by the next.
_MULTIPLIERS_U64 = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB,
                    0xFF51AFD7ED558CCD)
_MAX_ROUNDS = len(_MULTIPLIERS_U64)
_MIN_BITS, _MAX_BITS = 4, 30  # ranks below 2**30 keep int32 codes valid
#: The backend of CPU tensors: "numba" (about twice as fast as torch ops at every
#: size; loading numba costs a second or so once per process) or "torch".
_CPU_BACKEND = "numba"


def cpu_backend() -> str:
    """The backend of the hashing rounds on CPU (``"numba"`` or ``"torch"``)."""
    return _CPU_BACKEND


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_MULTIPLIERS = tuple(_signed(a) for a in _MULTIPLIERS_U64)
_INVERSES = tuple(_signed(pow(a, -1, 1 << 64)) for a in _MULTIPLIERS_U64)


def table_bits(count: int, per_slot: float) -> int:
    """Bits of a table with at least ``count / per_slot`` buckets, within the limits."""
    target = max(1, int(count / per_slot))
    return min(_MAX_BITS, max(_MIN_BITS, (target - 1).bit_length()))


@dataclass(frozen=True)
class _Round:
    table: torch.Tensor  # (T,) int64: z | rank where occupied, -1 elsewhere
    won: int  # occupied buckets
    bits: int
    round_index: int

    @property
    def occupied(self) -> torch.Tensor:
        """Which buckets are occupied, (T,) bool: those whose entry is not -1.

        An occupied entry ``z | rank`` is -1 only if its rank is ``T - 1``, that
        is when every bucket is occupied, so the entries alone tell, with the count.
        """
        if self.won == self.table.numel():
            return torch.ones(self.table.shape, dtype=torch.bool, device=self.table.device)
        return self.table != -1


@dataclass(frozen=True)
class HashedSlots:
    """How many slots the hashing rounds made, and how to name them."""

    num_slots: int
    rounds: tuple[_Round, ...]
    rest: torch.Tensor | None  # ids numbered by torch.unique after the last round
    backend: str = "torch"  # which backend ran the rounds

    def slot_ids(self, device=None) -> torch.Tensor:
        """The id of every slot, shape (num_slots,), in slot order."""
        parts = [_round_ids(r) for r in self.rounds]
        if self.rest is not None:
            parts.append(self.rest)
        if not parts:
            return torch.zeros(0, dtype=torch.int64, device=device)
        return torch.cat([part.to(device) for part in parts] if device is not None else parts)


def kernel_histogram(codes: torch.Tensor, length: int) -> torch.Tensor:
    """``torch.bincount(codes, minlength=length)`` for the codes the numba rounds wrote.

    Failures and successes per slot side by side, int64: the same table, in one
    pass over the codes where ``bincount`` takes two (the first for their minimum
    and maximum, which the rounds already bound).
    """
    from .. import _jit

    kernels = _jit.kernels("sera_opt.estimator.hashing_kernels")
    table = torch.zeros(1 << max(0, length - 1).bit_length(), dtype=torch.int64)
    kernels.histogram(codes.numpy(), table.numpy())
    return table[:length]


def _round_ids(r: _Round) -> torch.Tensor:
    """Invert the hash of the occupied buckets of a round, in rank (= bucket) order."""
    buckets = torch.nonzero(r.occupied).squeeze(1)
    low = torch.bitwise_right_shift(r.table.index_select(0, buckets), r.bits)
    low &= (1 << (64 - r.bits)) - 1
    y = torch.bitwise_left_shift(buckets, 64 - r.bits) | low
    return y * _INVERSES[r.round_index]


def _torch_round(ids, success, rows, bits, round_index, first_slot, codes, carry=None):
    """One round with torch ops over all rollouts (``rows`` None) or the listed ones.

    Writes the winners' codes; returns (the losers' rollout indices, winners, round,
    None): ``carry`` is :func:`_numba_round`'s, unused here.
    """
    if rows is not None:
        sub_codes = codes.new_empty(rows.shape)
        lost, won, r, _ = _torch_round(ids.index_select(0, rows), success.index_select(0, rows),
                                       None, bits, round_index, first_slot, sub_codes)
        codes.index_copy_(0, rows, sub_codes)
        return rows.index_select(0, lost), won, r, None
    size = 1 << bits
    y = torch.mul(ids, _MULTIPLIERS[round_index])
    # The top bits, as an unsigned number (the shift is arithmetic, the mask undoes it).
    buckets = torch.bitwise_right_shift(y, 64 - bits)
    buckets &= size - 1
    z = y.bitwise_left_shift_(bits)
    table = torch.full((size,), -1, dtype=torch.int64, device=ids.device)
    table.scatter_(0, buckets, z)
    occupied = (table & (size - 1)) == 0
    ranks = torch.cumsum(occupied, 0)
    winners = ranks[-1:].clone()
    ranks -= 1
    table |= torch.where(occupied, ranks, 0)
    found = table.index_select(0, buckets)
    found.bitwise_xor_(z)  # the rank where this rollout's id won its bucket
    # Anything outside [0, T) has high bits set: another id won the bucket.
    # (A cast to bool tests != 0 several times faster than a comparison.)
    lost = torch.bitwise_right_shift(found, bits, out=buckets).bool()
    if first_slot:
        found += first_slot
    # Cast first, then add in the codes' dtype: a mixed-dtype add is much slower.
    torch.add(success, codes.copy_(found), alpha=2, out=codes)
    any_lost, won = (int(v) for v in
                     torch.cat([lost.view(torch.uint8).amax().reshape(1).long(), winners]).tolist())
    positions = torch.nonzero(lost).squeeze(1) if any_lost else lost.new_zeros(0, dtype=torch.int64)
    return positions, won, _Round(table, won, bits, round_index), None


def _numba_round(ids, success, rows, bits, round_index, first_slot, codes, carry=None):
    """The same round as :func:`_torch_round`, by the fused CPU kernels.

    ``carry`` is what the previous round left for this one: its losers' ids and outcomes
    as compact numpy arrays, in the order of ``rows`` (None for the first round, which
    reads every rollout). Returns (the losers' rollout indices, winners, round, carry).
    """
    import numpy as np

    from .. import _jit

    kernels = _jit.kernels("sera_opt.estimator.hashing_kernels")

    multiplier = np.uint64(_MULTIPLIERS_U64[round_index])
    subset = rows is not None
    rows_np = rows.numpy() if subset else np.zeros(0, dtype=np.int64)
    if carry is None:
        ids_np, success_np = ids.numpy(), success.view(torch.uint8).numpy()
        if subset:  # one pass for both (numpy's fancy indexing takes two, and slower)
            every_id, every_success = ids_np, success_np
            ids_np = np.empty(rows_np.shape[0], dtype=np.int64)
            success_np = np.empty(rows_np.shape[0], dtype=np.uint8)
            kernels.take_rows(every_id, every_success, rows_np, ids_np, success_np)
    else:
        ids_np, success_np = carry
    count = ids_np.shape[0]
    table = np.full(1 << bits, -1, dtype=np.int64)
    kernels.scatter_round(ids_np, multiplier, bits, table)
    won = int(kernels.rank_round(table, bits))
    found = np.empty(count, dtype=np.int64)
    kernels.gather_round(ids_np, multiplier, bits, table, found)
    # The first round's losers are read back through their indices by the next round (a
    # gather of a sixth of the rollouts, typically): compact copies of every rollout's
    # would be as large as the ids, and with glibc's default allocator that much more
    # memory per call comes back as page faults. Later rounds are small and keep them.
    lost_ids = np.empty(count if subset else 0, dtype=np.int64)
    lost_success = np.empty(count if subset else 0, dtype=np.uint8)
    num_lost = kernels.finish_round(ids_np, success_np, rows_np, subset, bits, found,
                                    first_slot, codes.numpy(), lost_ids, lost_success)
    # The losers are the fronts of these arrays; copied out only when few, so that the
    # next round does not keep the whole arrays alive.
    positions = found[:num_lost]
    carry = (lost_ids[:num_lost], lost_success[:num_lost]) if subset else None
    if 8 * num_lost < count:
        positions = positions.copy()
        carry = carry and (carry[0].copy(), carry[1].copy())
    r = _Round(torch.from_numpy(table), won, bits, round_index)
    return torch.from_numpy(positions), won, r, carry


def _numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:  # pragma: no cover - numba is a dependency
        return False
    return True


def hashed_codes(ids: torch.Tensor, success: torch.Tensor, codes: torch.Tensor, *,
                 per_slot: float = 4.0, backend: str | None = None) -> HashedSlots:
    """Write ``2 * slot + success`` into ``codes`` for int64 ``ids``; return the slots' names.

    Slots are exact and compact (see the module docstring). ``per_slot`` sizes
    the first table: about ``N / per_slot`` buckets, a load of at most 1/2 when
    prompts have ``2 * per_slot`` rollouts or more on average; the losers' rounds
    size theirs from an estimate of their distinct ids, at a load of at most 1/8.
    ``backend`` is "numba" (fused kernels, CPU tensors; the default there) or
    "torch" (torch ops, any device; the default elsewhere). Both compute the
    same rounds; on CPU with one thread they write the same codes.
    """
    if backend is None:
        fused = ids.device.type == "cpu" and _CPU_BACKEND == "numba"
        backend = "numba" if fused and _numba_available() else "torch"
    one_round = {"numba": _numba_round, "torch": _torch_round}[backend]
    n = ids.numel()
    if n == 0:
        return HashedSlots(0, (), None)
    if backend == "numba":
        ids, success = ids.contiguous(), success.contiguous()
    rows, num_slots, first, carry = one_round(ids, success, None, table_bits(n, per_slot), 0, 0,
                                              codes)
    rounds = [first]
    while rows.numel() and len(rounds) < _MAX_ROUNDS:
        # The losers' distinct ids, estimated from the rollouts per id of the winners
        # (and never more than the losing rollouts, which bounds the table by O(N)).
        lost = rows.numel()
        distinct = max(1, min(lost, round(lost * num_slots / max(1, n - lost))))
        rows, won, r, carry = one_round(ids, success, rows, table_bits(distinct, 1 / 8),
                                        len(rounds), num_slots, codes, carry)
        rounds.append(r)
        num_slots += won
    rest = None
    if rows.numel():
        rest, inverse = torch.unique(ids.index_select(0, rows), return_inverse=True)
        inverse += num_slots
        codes.index_copy_(0, rows, torch.add(success.index_select(0, rows), inverse,
                                             alpha=2).to(codes.dtype))
        num_slots += rest.numel()
    return HashedSlots(num_slots, tuple(rounds), rest, backend)
