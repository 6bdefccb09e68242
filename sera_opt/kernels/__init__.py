"""The compiled kernels (numba), by concept; the bottom of the data path.

Importing this package loads nothing: each kernel module is imported on first use
through :func:`sera_opt._jit.kernels`, which loads numba. :mod:`.kinds` is numba-free
and is the one list of the objectives' kind numbers.

* :mod:`.rates`: ``a = -log(1 - p)`` in one pass (what :mod:`sera_opt.problem` needs);
* :mod:`.waterline`, :mod:`.waterline_counts`: SERA's linear levels, counts per level;
* :mod:`.entries`: the general separable engine's entry kernel, over
  :mod:`.gains` (per-kind gains, from :mod:`.betamath`), :mod:`.crossing` (a row's
  crossing of a value), :mod:`.bracket` and :mod:`.general`, :mod:`.selection` and
  :mod:`.floatkeys`; :mod:`.closed`: the closed-form engine's entry kernels, one per
  opening of its bracket (:func:`.kinds.closed_entry` chooses), over :mod:`.handout`
  (rollouts handed out from a heap or by water fill) and :mod:`.memo` (rows with equal
  parameters).
"""


def compiled(name: str):
    """The kernel module ``sera_opt.kernels.<name>`` with its kernels compiled by numba (or
    loaded from the kernel cache): what the library's own calls use, for the benchmarks
    that time a kernel by itself. Imports numba."""
    from .. import _jit

    return _jit.kernels(f"{__name__}.{name}")
