"""Compiling the kernels: where their cache lives, and saying so when they are built.

The numba kernels are compiled on first use and cached on disk: the first call
after installing takes several seconds, every later process loads them in a
fraction of one. Every kernel module compiles with :func:`njit` (numba's, with
the cache in the key-named directory of :mod:`sera_opt._kernel_cache`, outside
the installed package). :func:`announce_compilation` writes one line on
standard error when a kernel is about to be compiled: at most once a minute, so that a
first step that compiles several kernels says so once, and a later call that compiles
another one (a larger batch takes another solver kernel) says so again;
:func:`kernels` imports a kernel module on first use (so that ``import sera_opt``
does not load numba) and announces each kernel the first time it is looked up.

The notices are records of the ``sera_opt`` logger on standard error
(:mod:`sera_opt._notices`), never lines on standard output.

A cache that cannot be trusted or written never fails a run: a cached kernel that
cannot be loaded (a truncated or damaged file) is removed and compiled again, and a
kernel that cannot be written to the cache (a full disk) stays compiled in memory;
each says so in one notice per process. With ``NUMBA_DISABLE_JIT=1`` (how numba code
is debugged) the kernels run as Python, their structured-array arguments viewed as
record arrays so that fields read as attributes, as they do when compiled.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib
import logging
import os
import threading
import time
import weakref
from types import ModuleType

from . import _kernel_cache
from ._notices import notice

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


# The caching kernels made by njit, so that a cache directory chosen after they were
# decorated (but before any was loaded) can still be given to them.
_CACHING: weakref.WeakSet = weakref.WeakSet()
# Problems already reported in this process (each is one notice, not one per kernel).
_REPORTED: set[str] = set()


def njit(function=None, **options):
    """``numba.njit``, with ``cache=True`` meaning the kernel cache of
    :mod:`sera_opt._kernel_cache` (outside the installed package), or no disk cache
    at all when that directory cannot be written."""
    if function is None:
        return lambda f: njit(f, **options)
    import numba
    from numba.core import config

    if config.DISABLE_JIT:
        return _as_python(function)
    if options.pop("cache", False):
        dispatcher = numba.njit(**options)(function)
        _CACHING.add(dispatcher)
        point_cache(dispatcher, _kernel_cache.directory_for_compiling())
        return dispatcher
    return numba.njit(**options)(function)


def point_cache(dispatcher, directory) -> None:
    """Cache ``dispatcher``'s compiled code under ``directory`` (no disk cache when it is
    ``None``), with the guards that keep a damaged or full cache from failing a run."""
    from numba.core.caching import NullCache

    if directory is None:
        cache = NullCache()
        load = cache.load_overload

        def load_overload(sig, target_context):
            _kernel_cache.mark_loaded()  # compiled in memory: the choice is made
            return load(sig, target_context)

        cache.load_overload = load_overload
        dispatcher._cache = cache
        return
    with _numba_cache_dir(str(directory)):
        dispatcher.enable_caching()
    _guard(dispatcher._cache)


def repoint_caches(directory) -> None:
    """Give every caching kernel decorated so far the cache ``directory`` (or none)."""
    for dispatcher in list(_CACHING):
        point_cache(dispatcher, directory)


def _guard(cache) -> None:
    """Wrap numba's ``load_overload`` and ``save_overload`` of one kernel's cache: an
    entry that cannot be loaded is evicted and the kernel compiled again; an entry that
    cannot be written leaves the kernel compiled in memory."""
    load, save = cache.load_overload, cache.save_overload

    def load_overload(sig, target_context):
        _kernel_cache.mark_loaded()
        try:
            return load(sig, target_context)
        except Exception as exc:  # a truncated pickle, a file numba cannot rebuild
            _evict(cache)
            _report_once("damaged", f"sera_opt: a cached kernel in {cache.cache_path} could "
                                    f"not be loaded ({type(exc).__name__}: damaged or "
                                    f"truncated); it was removed and is compiled again.")
            return None

    def save_overload(sig, data):
        try:
            save(sig, data)
        except OSError as exc:  # a full disk, a quota, a directory made read-only since
            _report_once("unwritable", f"sera_opt: the kernel cache {cache.cache_path} could "
                                       f"not be written ({exc.strerror or exc}); the kernels "
                                       f"stay compiled in memory for this process. Free space "
                                       f"there, or set {_kernel_cache.ENV_VAR} to another "
                                       f"directory.")

    cache.load_overload = load_overload
    cache.save_overload = save_overload


def _evict(cache) -> None:
    """Remove one kernel's index and data files (all its signatures)."""
    index = cache._cache_file._index_path
    stem = index[:-len(".nbi")] if index.endswith(".nbi") else index
    for path in [index, *glob.glob(glob.escape(stem) + ".*.nbc")]:
        with contextlib.suppress(OSError):
            os.remove(path)


def _report_once(kind: str, message: str) -> None:
    if kind not in _REPORTED:
        _REPORTED.add(kind)
        notice(message)


def _as_python(function):
    """``function`` to run as Python (``NUMBA_DISABLE_JIT=1``): structured arrays are
    passed as record arrays, whose rows read and write fields as attributes, as
    numba's records do."""
    import numpy as np

    @functools.wraps(function)
    def python_kernel(*args, **kwargs):
        args = tuple(_records(a, np) for a in args)
        kwargs = {k: _records(v, np) for k, v in kwargs.items()}
        return function(*args, **kwargs)

    python_kernel.py_func = function
    return python_kernel


def _records(value, np):
    if type(value) is np.ndarray and value.dtype.names is not None:
        return value.view(np.recarray)
    return value


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
        notice(MESSAGE, level=logging.INFO)
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
