"""Validated allocation problems and the MaxRL attenuation factor.

docs/theory.md section 2: with ``n`` rollouts of a prompt whose success probability
is ``p``, the MaxRL estimator's expectation is the prompt's likelihood gradient
scaled by the attenuation factor ``w_c(p, n) = 1 - (1 - p) ** (n - c)``, where
the offset ``c`` is 0 for the success-average estimator and 1 for the
mean-centred one.

Supported sizes: budgets and per-prompt bounds are whole numbers up to
:data:`MAX_BUDGET` (``2**53``). The solvers compare counts with float64 levels,
which hold every whole number exactly only up to there; larger inputs are
refused with :class:`~sera_opt.SeraOptError`, never rounded.
"""

from __future__ import annotations

import numbers
from functools import cached_property

import numpy as np

from . import _jit
from ._arrays import host_values
from .checks import (  # the checks, re-exported here where they were first documented
    MAX_BUDGET,
    OFFSETS,  # noqa: F401
    checked_probs,
    float_dtype,
    owned_read_only,  # noqa: F401
    refuse_masked,
    validate_count,
    validate_offset,
    validate_real,
    validate_success_probs,
)
from .exceptions import InfeasibleBudgetError, SeraOptError

__all__ = [
    "AllocationProblem",
    "MAX_BUDGET",
    "attenuation",
    "success_rates",
    "validate_success_probs",
    "validate_offset",
    "validate_count",
    "validate_real",
]

def success_rates(success_probs) -> np.ndarray:
    """Return ``a = -log(1 - p)``, the rate at which a prompt's level grows per rollout.

    ``p = 1`` gives ``inf`` and ``p = 0`` gives ``0``. Computed as
    ``p log(w) / (w - 1)`` with ``w = fl(1 - p)`` (Goldberg's form of ``log1p``,
    within an ulp of it, and ``p`` itself where ``w`` rounds to 1), in one compiled
    pass (this loads numba).
    """
    from .kernels.rates import rates_from_probs

    p = np.ascontiguousarray(success_probs, dtype=np.float64)
    flat = p.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.float64)
    rates_from_probs(flat, out)
    return out.reshape(p.shape) if p.ndim else out[0]


def attenuation(success_probs, counts, offset: int = 0):
    """The MaxRL attenuation factor ``w_c(p, n) = 1 - (1 - p) ** (n - c)``.

    Parameters
    ----------
    success_probs : array_like
        Success probabilities in [0, 1]. Broadcasts against ``counts``.
    counts : array_like
        Rollout counts ``n`` (real values are accepted, for continuous
        allocations).
    offset : {0, 1}
        ``c``: 0 for the success-average estimator, 1 for the mean-centred one.

    Returns
    -------
    ndarray or float
        The factor, in [0, 1]; exactly 0 where ``n - c <= 0``. Computed as
        ``-expm1((n - c) * log1p(-p))`` so that it is accurate for ``p`` near 0
        (where ``1 - (1 - p) ** m`` would cancel) and exact at ``p = 1``.
    """
    offset = validate_offset(offset)
    refuse_masked(success_probs, "success_probs")
    refuse_masked(counts, "counts")
    p = np.asarray(host_values(success_probs))
    n = np.asarray(host_values(counts))
    _check_attenuation_inputs(p, n)
    return _attenuation(p, n, offset)


def _check_attenuation_inputs(p: np.ndarray, n: np.ndarray) -> None:
    # Booleans are refused here as everywhere: True is neither a probability nor a count.
    if not np.issubdtype(p.dtype, np.number):
        raise SeraOptError(f"success_probs must be numeric, got dtype {p.dtype}.")
    if not np.issubdtype(n.dtype, np.number):
        raise SeraOptError(f"counts must be numeric, got dtype {n.dtype}.")
    p64 = p.astype(np.float64)
    if np.isnan(p64).any() or (p64 < 0).any() or (p64 > 1).any():
        raise SeraOptError(
            "success_probs must lie in [0, 1] with no NaN; sera_opt does not clip them."
        )
    if np.isnan(n.astype(np.float64)).any():
        raise SeraOptError("counts contain NaN.")


def _attenuation(p: np.ndarray, n: np.ndarray, offset: int):
    """:func:`attenuation` on inputs already known to be valid."""
    dtype = float_dtype(p.dtype)
    p64 = p.astype(np.float64, copy=False)
    exponent = n.astype(np.float64) - offset
    positive = exponent > 0
    # Where the exponent is not positive the factor is 0 by definition; masking
    # the exponent first avoids 0 * (-inf) = NaN at p = 1.
    with np.errstate(divide="ignore", invalid="ignore"):
        w = -np.expm1(np.where(positive, exponent, 1.0) * np.log1p(-p64))
    w = np.where(positive, w, 0.0).astype(dtype, copy=False)
    return w[()] if w.ndim == 0 else w


def _as_bounds(value, name: str, m: int) -> np.ndarray:
    refuse_masked(value, name)
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        # The common scalar case, without numpy's conversion rules (a Python int
        # beyond int64 would raise a bare OverflowError there).
        scalar = validate_count(value, name)
        out = np.full(m, scalar, dtype=np.int64)
        return out
    try:
        arr = np.asarray(value)
    except (OverflowError, ValueError, TypeError) as exc:
        raise SeraOptError(
            f"{name} must be an integer or an array of integers up to 2**53, got {value!r}."
        ) from exc
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        raise SeraOptError(f"{name} must be an integer or an array of integers, got {value!r}.")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise SeraOptError(
                f"{name} must hold whole numbers of rollouts, got {value!r}; round it "
                f"yourself if that is what you mean."
            )
    elif not np.issubdtype(arr.dtype, np.integer):
        raise SeraOptError(f"{name} must hold whole numbers of rollouts, got dtype {arr.dtype}.")
    if arr.ndim == 0:
        return np.full(m, validate_count(arr.item(), name), dtype=np.int64)
    if arr.shape != (m,):
        raise SeraOptError(
            f"{name} must be a scalar or have one entry per prompt (shape ({m},)), got "
            f"shape {arr.shape}."
        )
    if arr.size and (arr.max() > MAX_BUDGET or arr.min() < 0):
        bad = int(np.flatnonzero((arr > MAX_BUDGET) | (arr < 0))[0])
        raise SeraOptError(
            f"{name} must lie in [0, 2**53]; got {arr[bad]!r} at index {bad}."
        )
    return arr.astype(np.int64)


def exact_sum(values: np.ndarray) -> int:
    """``sum(values)`` as a Python int, exact even where int64 would overflow."""
    # Every entry is at most 2**53, so int64 is exact while M < 2**10; beyond, the
    # float estimate tells whether the int64 sum is safe.
    if values.size < 1024 or float(values.sum(dtype=np.float64)) < 2.0**62:
        return int(values.sum())
    return sum(int(v) for v in values.tolist())


class AllocationProblem:
    """A validated rollout-allocation problem.

    Choose integer counts ``n_i`` with ``sum_i n_i = budget`` and
    ``min_rollouts_i <= n_i <= max_rollouts_i``.

    Parameters
    ----------
    success_probs : array_like, shape (M,)
        Success probability of each prompt, finite and in [0, 1].
    budget : int
        Total number of rollouts, ``B``; a whole number up to :data:`MAX_BUDGET`.
    min_rollouts, max_rollouts : int or array_like of int
        Per-prompt bounds (scalars broadcast). ``max_rollouts=None`` means no
        per-prompt cap: prompt ``i`` may take everything the others leave,
        ``budget - sum(min_rollouts) + min_rollouts_i``. (The policies and
        :func:`sera_opt.allocate` put a default cap of their own in place of
        ``None``; this class is the bare problem.)
    offset : {0, 1}
        The estimator's offset ``c``. With ``c = 1`` every prompt needs at least
        two rollouts for its factor to be positive.

    Raises
    ------
    SeraOptError
        On malformed input; :class:`InfeasibleBudgetError` when the budget lies
        outside ``[sum(min_rollouts), sum(max_rollouts)]``.

    Notes
    -----
    The problem is immutable and owns its inputs: it holds read-only copies of the
    probabilities and of array bounds, so changing the caller's buffers afterwards
    changes nothing in it (nor in an :class:`~sera_opt.Allocation` built on it). The
    copy is skipped only for arrays this constructor made itself (a list converted,
    an integer array promoted). Scalar bounds are kept as scalars, and
    :attr:`min_rollouts` / :attr:`max_rollouts` are materialized as arrays only when
    read.
    """

    __slots__ = ("success_probs", "budget", "offset", "capped", "_lo", "_hi", "__dict__")

    def __init__(self, success_probs, budget, min_rollouts=1, max_rollouts=None, offset=0):
        p, fresh = checked_probs(success_probs, "success_probs")
        # The problem's own copy stays writable behind the read-only view it shows, for the
        # kernels (kernel_probs: numba compiles a separate specialization for read-only
        # arrays, and a copy for it cost 2.4 ms at 10^6 prompts).
        owned = p if fresh else np.array(p, copy=True)
        p = owned.view()
        p.setflags(write=False)
        m = p.shape[0]
        offset = validate_offset(offset)
        budget = validate_count(budget, "budget")
        lo = _scalar_or_bounds(min_rollouts, "min_rollouts", m)
        capped = max_rollouts is not None
        hi = _scalar_or_bounds(max_rollouts, "max_rollouts", m) if capped else None
        # A prompt whose maximum is 0 is switched off: it gets no rollouts, whatever the
        # minimum it would have had (docs/theory.md, the active set).
        off = None
        if capped and not isinstance(hi, int) and not (hi > 0).all():
            off = hi == 0
        elif capped and isinstance(hi, int) and hi == 0 and m:
            raise SeraOptError(
                f"max_rollouts=0 switches every prompt off: no rollout can be spent on the "
                f"budget {budget}. Give the prompts to keep a positive max_rollouts (an "
                f"array with 0 only for the prompts to switch off)."
            )
        if off is not None:
            lo = np.where(off, 0, np.broadcast_to(np.asarray(lo, dtype=np.int64), (m,)))
            lo.setflags(write=False)
        need = 1 + offset
        kept_lo = lo if isinstance(lo, int) else (lo if off is None else lo[~off])
        lowest = (kept_lo if isinstance(kept_lo, int)
                  else (int(kept_lo.min()) if kept_lo.size else need))
        if lowest < need:
            if isinstance(lo, int):
                i = 0
            else:
                i = int(np.flatnonzero((lo < need) if off is None else (lo < need) & ~off)[0])
            why = (
                "with offset=1 (mean-centred estimator) a prompt with one rollout has "
                "factor 0 and its advantage is always 0"
                if offset
                else "every prompt in the batch needs at least one rollout"
            )
            raise SeraOptError(
                f"min_rollouts must be at least {need}: {why}. Got {lowest} at index {i}; "
                f"set min_rollouts={need} or more, switch the prompt off with "
                f"max_rollouts=0 for it, or let a policy choose the active prompts "
                f"(get_policy('sera', min_rollouts=0) or active_threshold=)."
            )
        lo_total = lo * m if isinstance(lo, int) else exact_sum(lo)
        if not capped:
            if budget < lo_total:
                raise InfeasibleBudgetError(
                    f"budget={budget} is infeasible for {m} prompts: with no per-prompt cap "
                    f"it must be at least sum(min_rollouts) = {lo_total}. Raise the budget or "
                    f"lower min_rollouts; sera_opt never clips the budget."
                )
            hi = lo + (budget - lo_total)
        else:
            below = np.asarray(np.asarray(hi) < np.asarray(lo))
            if below.any():
                i = 0 if below.ndim == 0 else int(np.flatnonzero(below)[0])
                low_i = lo if isinstance(lo, int) else int(lo[i])
                high_i = hi if isinstance(hi, int) else int(hi[i])
                raise SeraOptError(
                    f"max_rollouts must be >= min_rollouts for every prompt; at index {i} "
                    f"max_rollouts={high_i} < min_rollouts={low_i}."
                )
            hi_total = hi * m if isinstance(hi, int) else exact_sum(hi)
            if budget < lo_total or budget > hi_total:
                raise InfeasibleBudgetError(
                    f"budget={budget} is infeasible for {m} prompts with these bounds: it "
                    f"must lie in [sum(min_rollouts), sum(max_rollouts)] = [{lo_total}, "
                    f"{hi_total}]. Change the budget or the bounds; sera_opt never clips the "
                    f"budget."
                )
        for arr in (lo, hi):
            if not isinstance(arr, int):
                arr.setflags(write=False)
        self._assign(p, budget, offset, capped, lo, hi, budget - lo_total)
        if owned.dtype == np.float64:
            self.__dict__["_kernel_probs"] = owned

    def _assign(self, p, budget, offset, capped, lo, hi, spare) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "success_probs", p)
        setattr_(self, "budget", budget)
        setattr_(self, "offset", offset)
        setattr_(self, "capped", capped)
        setattr_(self, "_lo", lo)
        setattr_(self, "_hi", hi)
        setattr_(self, "_spare", spare)

    @classmethod
    def from_validated(cls, p: np.ndarray, budget: int, lo: int, hi: int, offset: int,
                       capped: bool, rates: np.ndarray | None = None) -> AllocationProblem:
        """The problem of inputs that a caller has already validated: ``p`` a finite,
        read-only 1-D float array in [0, 1] that the problem may keep (nothing outside
        sera_opt can write to its memory: :func:`owned_read_only`), ``offset`` 0 or 1, and Python-int bounds and
        budget with ``1 + offset <= lo <= hi <= MAX_BUDGET`` and ``lo * M <= budget <= hi
        * M`` (``hi`` being ``lo + budget - lo * M`` when not ``capped``); ``rates``, when
        given, its finite positive rates (no prompt at ``p = 0`` or ``1``), which the
        problem keeps (:meth:`cache_rates`)."""
        self = object.__new__(cls)
        self._assign(p, budget, offset, capped, lo, hi, budget - lo * p.shape[0])
        if rates is not None:
            self.cache_rates(rates, 0, 0)
        return self

    def __setattr__(self, name, value):
        raise AttributeError(f"AllocationProblem is immutable; cannot set {name!r}.")

    def __repr__(self) -> str:
        return (f"AllocationProblem(num_prompts={self.num_prompts}, budget={self.budget}, "
                f"offset={self.offset})")

    @cached_property
    def min_rollouts(self) -> np.ndarray:
        """Per-prompt minimums (int64, read-only)."""
        return _read_only(self.kernel_bounds()[0])

    @cached_property
    def max_rollouts(self) -> np.ndarray:
        """Per-prompt maximums (int64, read-only)."""
        return _read_only(self.kernel_bounds()[1])

    def kernel_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The bounds as the writable int64 arrays behind :attr:`min_rollouts` and
        :attr:`max_rollouts`, for kernels only (numba compiles a separate specialization
        for read-only arrays, and copying both for it cost 4 ms at 10^6 prompts); never
        write to them."""
        cache = self.__dict__.get("_kernel_bounds")
        if cache is None:
            m = self.num_prompts
            cache = self.__dict__["_kernel_bounds"] = (_writable_full(self._lo, m),
                                                       _writable_full(self._hi, m))
        return cache

    def kernel_probs(self) -> np.ndarray:
        """The success probabilities as a writable float64 array with the values of
        :attr:`success_probs`, for kernels only (as :meth:`kernel_bounds`); never write
        to it."""
        cache = self.__dict__.get("_kernel_probs")
        if cache is None:
            cache = self.__dict__["_kernel_probs"] = np.array(self.success_probs,
                                                              dtype=np.float64)
        return cache

    @property
    def stored_bounds(self) -> tuple[int | np.ndarray, int | np.ndarray]:
        """The minimum and maximum as the problem keeps them: Python ints when every prompt
        has the same bounds (:attr:`uniform_bounds`), else int64 arrays that callers never
        write to. :attr:`min_rollouts` and :attr:`max_rollouts` are their per-prompt form."""
        return self._lo, self._hi

    @property
    def uniform_bounds(self) -> bool:
        """Whether every prompt has the same minimum and the same maximum."""
        return isinstance(self._lo, int) and isinstance(self._hi, int)

    def _rates_and_edges(self):
        cache = self.__dict__.get("_rates_cache")
        if cache is None:
            kernels = _jit.kernels("sera_opt.kernels.rates")
            p = np.ascontiguousarray(self.success_probs, dtype=np.float64)
            rates = np.empty(p.shape[0], dtype=np.float64)
            zeros, infs, _ = kernels.rates_from_probs(p, rates)  # p is validated
            cache = self.cache_rates(rates, zeros, infs)
        return cache

    def cache_rates(self, rates: np.ndarray, zeros: int, infs: int):
        """Keep the rates (and how many are 0 and inf) that a kernel computed for us.

        The cache holds a read-only view (what :attr:`rates` returns) and the writable
        array behind it, which only the kernels read: numba compiles a separate
        specialization for read-only arrays."""
        view = rates.view()
        view.setflags(write=False)
        cache = self.__dict__["_rates_cache"] = (view, int(zeros), int(infs), rates)
        return cache

    def kernel_rates(self) -> np.ndarray:
        """The rates as the writable array behind :attr:`rates`, for kernels only (numba
        compiles a separate specialization for read-only arrays); never write to it."""
        return self._rates_and_edges()[3]

    @property
    def rates(self) -> np.ndarray:
        """``a_i = -log(1 - p_i)`` (float64, read-only), computed once on first use
        (:func:`success_rates`)."""
        return self._rates_and_edges()[0]

    @property
    def has_edges(self) -> bool:
        """Whether some prompt has ``p = 0`` or ``p = 1`` (rate 0 or inf)."""
        _, zeros, infs, _ = self._rates_and_edges()
        return bool(zeros or infs)

    @property
    def num_prompts(self) -> int:
        """M, the number of prompts."""
        return int(self.success_probs.shape[0])

    @property
    def dtype(self) -> np.dtype:
        """Float dtype of the inputs; factors are returned in it."""
        return self.success_probs.dtype

    @cached_property
    def switched_off(self) -> np.ndarray | None:
        """Which prompts are switched off (``max_rollouts`` 0: they get no rollouts), as a
        read-only bool array; None when every prompt is active."""
        if isinstance(self._hi, int):
            return None
        off = self._hi == 0
        return _read_only(off) if off.any() else None

    def active_subproblem(self) -> tuple[AllocationProblem, np.ndarray]:
        """The problem of the active prompts alone (the same budget, offset and bounds),
        and their positions in this batch, in batch order. Solvers see only such
        problems: a switched-off prompt is not theirs to allocate."""
        off = self.switched_off
        index = np.flatnonzero(~off) if off is not None else np.arange(self.num_prompts)
        lo, hi = self.kernel_bounds()
        inner = AllocationProblem(self.success_probs[index], self.budget,
                                  min_rollouts=lo[index], max_rollouts=hi[index],
                                  offset=self.offset)
        return inner, index

    @property
    def spare_budget(self) -> int:
        """Rollouts left after every prompt has its minimum, ``B - sum(min)``."""
        return self._spare

    def factors(self, counts) -> np.ndarray:
        """Attenuation factors ``w_c(p_i, n_i)`` at ``counts``, in the inputs' float dtype."""
        return _attenuation(self.success_probs, np.asarray(counts), self.offset)

    def check_counts(self, counts) -> np.ndarray:
        """Verify that ``counts`` is a feasible integer allocation; return it as int64."""
        n = np.asarray(counts)
        if n.shape != (self.num_prompts,):
            raise SeraOptError(
                f"counts must have shape ({self.num_prompts},), got {n.shape}."
            )
        if n.dtype == np.bool_:
            raise SeraOptError("counts must be integers, got booleans.")
        if np.issubdtype(n.dtype, np.floating):
            if not np.all(np.isfinite(n)) or not np.all(n == np.round(n)):
                raise SeraOptError("counts must be whole numbers.")
        elif not np.issubdtype(n.dtype, np.integer):
            raise SeraOptError(f"counts must be integers, got dtype {n.dtype}.")
        n = n.astype(np.int64)
        bad = (n < self.min_rollouts) | (n > self.max_rollouts)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise SeraOptError(
                f"counts[{i}]={n[i]} lies outside [{self.min_rollouts[i]}, "
                f"{self.max_rollouts[i]}]."
            )
        total = exact_sum(n)
        if total != self.budget:
            raise SeraOptError(
                f"counts sum to {total}, not to the budget {self.budget}."
            )
        return n


def _scalar_or_bounds(value, name: str, m: int):
    """A bound as a Python int (the same for every prompt) or a read-only int64 array."""
    refuse_masked(value, name)
    if type(value) is int:
        return validate_count(value, name)
    if np.ndim(value) == 0 and not isinstance(value, (bool, np.bool_)):
        try:
            return validate_count(value, name)
        except SeraOptError:
            if isinstance(value, numbers.Number) or np.ndim(value) == 0:
                arr = np.asarray(value)
                if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
                    raise SeraOptError(
                        f"{name} must be an integer or an array of integers, got {value!r}."
                    ) from None
            raise
    arr = _as_bounds(value, name, m)
    if arr.size and arr.min() == arr.max():
        return int(arr[0])
    return arr


def _writable_full(value, m: int) -> np.ndarray:
    """A bound (a Python int, or the problem's read-only int64 array) as a writable
    int64 array of its own."""
    if isinstance(value, int):
        return np.full(m, value, dtype=np.int64)
    return np.array(value, dtype=np.int64)


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.setflags(write=False)
    return view
