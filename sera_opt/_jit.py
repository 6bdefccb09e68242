"""Saying so when the compiled kernels are built, instead of going quiet for seconds.

The numba kernels are compiled on first use and cached on disk (``cache=True``):
the first call after installing takes several seconds, every later process
loads them in a fraction of one. :func:`announce_compilation` prints one line on
standard error, once per process, when a kernel module is about to be compiled;
:func:`kernels` imports a kernel module on first use (so that ``import sera_opt``
does not load numba) and announces each kernel the first time it is looked up.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

__all__ = ["announce_compilation", "kernels"]

_CHECKED: set[tuple[str, ...]] = set()
_LOADED: dict[str, _Kernels] = {}
_ANNOUNCED = False
MESSAGE = ("sera_opt: compiling the solver (once per installation; later runs load it "
           "from numba's cache) ...")


def _is_cached(dispatcher) -> bool:
    """Whether numba's on-disk cache holds this kernel (its index file exists)."""
    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)
    except AttributeError:  # not a caching dispatcher, or numba's internals moved
        return True


def announce_compilation(module: ModuleType, *names: str) -> None:
    """Print :data:`MESSAGE` if one of the kernels ``names`` of ``module`` (kernels
    called from Python; helpers inlined into them are never cached) is neither
    compiled in this process nor in numba's cache yet."""
    global _ANNOUNCED
    key = (module.__name__, *names)
    if _ANNOUNCED or key in _CHECKED:
        return
    _CHECKED.add(key)
    dispatchers = [getattr(module, name) for name in names]
    missing = [d for d in dispatchers if not d.signatures and not _is_cached(d)]
    if missing:
        _ANNOUNCED = True
        print(MESSAGE, file=sys.stderr, flush=True)


class _Kernels:
    """A kernel module whose kernels are announced (:func:`announce_compilation`) the
    first time each is looked up: a kernel that is never called is never reported as
    about to compile. After the first lookup a kernel is a plain attribute."""

    def __init__(self, module: ModuleType):
        self._module = module

    def __getattr__(self, name: str):
        kernel = getattr(self._module, name)
        if hasattr(kernel, "signatures"):
            announce_compilation(self._module, name)
        setattr(self, name, kernel)
        return kernel


def kernels(module_name: str) -> _Kernels:
    """The kernel module ``module_name`` (absolute, e.g. ``"sera_opt._tracking_kernels"``),
    imported on first use; each kernel is announced when first looked up on it."""
    loaded = _LOADED.get(module_name)
    if loaded is None:
        loaded = _LOADED[module_name] = _Kernels(importlib.import_module(module_name))
    return loaded
