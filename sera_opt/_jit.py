"""Compiling the kernels: where their cache lives, and saying so when they are built.

The numba kernels are compiled on first use and cached on disk: the first call
after installing takes several seconds, every later process loads them in a
fraction of one. Every kernel module compiles with :func:`njit` (numba's, with
the cache in the key-named directory of :mod:`sera_opt._kernel_cache`, outside
the installed package). :func:`announce_compilation` prints one line on
standard error when a kernel is about to be compiled: at most once a minute, so that a
first step that compiles several kernels says so once, and a later call that compiles
another one (a larger batch takes another solver kernel) says so again;
:func:`kernels` imports a kernel module on first use (so that ``import sera_opt``
does not load numba) and announces each kernel the first time it is looked up.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from types import ModuleType

from . import _kernel_cache

__all__ = ["announce_compilation", "kernels", "njit"]

_CHECKED: set[tuple[str, ...]] = set()
_LOADED: dict[str, _Kernels] = {}
# When a compile was last announced, or covered by a notice (time.monotonic); None
# before the first one.
_ANNOUNCED_AT: float | None = None
#: Kernels compiled within this many seconds of a notice are covered by it.
REPEAT_AFTER_S = 60.0
MESSAGE = ("sera_opt: compiling the solver (once per version; later runs load it "
           "from the kernel cache, `sera-opt cache` says where) ...")
_DECORATING = threading.Lock()


@contextlib.contextmanager
def _numba_cache_dir(directory: str):
    """numba's cache directory set to ``directory`` while a kernel is decorated: numba
    fixes a kernel's cache location when ``cache=True`` is applied, so the setting is
    restored at once and other numba users in the process are not affected."""
    from numba.core import config

    with _DECORATING:
        previous = config.CACHE_DIR
        config.CACHE_DIR = directory
        try:
            yield
        finally:
            config.CACHE_DIR = previous


def njit(function=None, **options):
    """``numba.njit``, with ``cache=True`` meaning the kernel cache of
    :mod:`sera_opt._kernel_cache` (outside the installed package), or no disk cache
    at all when that directory cannot be written."""
    if function is None:
        return lambda f: njit(f, **options)
    import numba

    if options.pop("cache", False):
        directory = _kernel_cache.directory_for_compiling()
        if directory is not None:
            with _numba_cache_dir(str(directory)):
                return numba.njit(cache=True, **options)(function)
    return numba.njit(**options)(function)


def _is_cached(dispatcher) -> bool:
    """Whether numba's on-disk cache holds this kernel (its index file exists)."""
    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)
    except AttributeError:  # not a caching dispatcher, or numba's internals moved
        return True


def announce_compilation(module: ModuleType, *names: str) -> None:
    """Print :data:`MESSAGE` if one of the kernels ``names`` of ``module`` (kernels
    called from Python; helpers inlined into them are never cached) is neither
    compiled in this process nor in numba's cache yet, unless a notice was printed in
    the last :data:`REPEAT_AFTER_S` seconds (the compile it announced covers this one)."""
    global _ANNOUNCED_AT
    key = (module.__name__, *names)
    if key in _CHECKED:
        return
    _CHECKED.add(key)
    dispatchers = [getattr(module, name) for name in names]
    missing = [d for d in dispatchers if not d.signatures and not _is_cached(d)]
    if not missing:
        return
    now = time.monotonic()
    if _ANNOUNCED_AT is None or now - _ANNOUNCED_AT > REPEAT_AFTER_S:
        print(MESSAGE, file=sys.stderr, flush=True)
    _ANNOUNCED_AT = now


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
    """The kernel module ``module_name`` (absolute, e.g. ``"sera_opt.tracking.index_kernels"``),
    imported on first use; each kernel is announced when first looked up on it."""
    loaded = _LOADED.get(module_name)
    if loaded is None:
        loaded = _LOADED[module_name] = _Kernels(importlib.import_module(module_name))
    return loaded
