"""Compiling the kernels: where their cache lives, and saying so when they are built.

The numba kernels are compiled on first use and cached on disk: the first call
after installing takes several seconds, every later process loads them in a
fraction of one. Every kernel module compiles with :func:`njit` (numba's, with
the cache in the key-named directory of :mod:`sera_opt._kernel_cache`, outside
the installed package). A kernel that numba compiles (one not in its cache) is
announced by name when its compile starts, with about how long it takes
(:data:`COMPILE_SECONDS`), and again when it is done, with the seconds it took
(:class:`_CompileNotices`, a listener of numba's compile events, so that only real
compiles are announced, never a load from the cache). The explanation (:data:`MESSAGE`:
once per version, the cache) comes at most once a minute; within that minute a kernel
known to compile in under a second starts without a line, and every other kernel still
gets its own start line, so that no long compile begins in silence. The done notice
comes for every kernel that took at least :data:`DONE_AFTER_S` seconds.
:func:`kernels` imports a kernel module on first use (so that ``import sera_opt``
does not load numba).

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

__all__ = ["kernels", "njit"]

_LOADED: dict[str, ModuleType] = {}
# When a compile was last announced, or ended within a notice's cover (time.monotonic);
# None before the first one.
_ANNOUNCED_AT: float | None = None
#: Kernels compiled within this many seconds of a notice are covered by it.
REPEAT_AFTER_S = 60.0
#: A compile that took at least this many seconds says when it is done.
DONE_AFTER_S = 0.5
#: The start of every notice that a compile begins (the kernel's name follows).
MESSAGE = ("sera_opt: compiling the solver (once per version; later runs load it "
           "from the kernel cache, `sera-opt cache` says where)")
#: About how long a kernel's compile takes, in seconds: rough figures from the CPU time of a
#: first compile on the 2-core development machine (a busy machine takes longer, in wall
#: time, than they say); kernels not named here compile in a few seconds.
#: The start notice quotes it, so that a long compile is not taken for a hang.
COMPILE_SECONDS = {
    "kernels.waterline.waterline_solve": 15.0,
    "kernels.closed.bracket_solve": 20.0,
    "kernels.closed.collect_solve": 10.0,
    "kernels.entries.solve": 20.0,
    "kernels.gains.prepare": 1.0,
    "tracking.evidence_kernels.update_evidence": 1.0,
    "tracking.evidence_kernels.posterior_means": 0.2,
    "tracking.index_kernels.direct_insert": 0.2,
}
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
    _listen_to_compiles()
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


def _kernel_name(dispatcher) -> str | None:
    """``module.kernel`` within the package for a kernel of sera_opt (``kernels.closed.
    stepwise_counts``), else None."""
    function = getattr(dispatcher, "py_func", None)
    module = getattr(function, "__module__", "") or ""
    if not module.startswith("sera_opt."):
        return None
    return f"{module[len('sera_opt.'):]}.{function.__name__}"


class _CompileNotices:
    """Says which kernel numba compiles and when it is done, from numba's
    ``numba:compile`` events (sent only when a kernel is compiled, not when it is loaded
    from the cache). Only the outermost compile of a sera_opt kernel is announced: the
    kernels it calls compile within it and are covered by its notices."""

    def __init__(self):
        self.depth = 0
        self.started = 0.0

    def notify(self, event) -> None:
        name = _kernel_name(event.data.get("dispatcher"))
        if name is None:
            return
        if event.is_start:
            self.depth += 1
            if self.depth == 1:
                self.started = time.monotonic()
                _announce_start(name, self.started)
        elif self.depth > 0:
            self.depth -= 1
            if self.depth == 0:
                _announce_done(name, self.started, time.monotonic())


def _about(name: str) -> str:
    seconds = COMPILE_SECONDS.get(name)
    if seconds is None:
        return "a few seconds"
    return "under a second" if seconds < 1 else f"about {seconds:.0f} s"


def _announce_start(name: str, now: float) -> None:
    """One line: :data:`MESSAGE` with the kernel's name and about how long it takes, or
    within :data:`REPEAT_AFTER_S` seconds of the last notice (or covered compile) the
    name and the time alone, except for a kernel known to take under a second."""
    global _ANNOUNCED_AT
    if _ANNOUNCED_AT is None or now - _ANNOUNCED_AT > REPEAT_AFTER_S:
        notice(f"{MESSAGE}: {name} ({_about(name)}) ...", level=logging.INFO)
    elif COMPILE_SECONDS.get(name, DONE_AFTER_S) >= DONE_AFTER_S:
        notice(f"sera_opt: compiling {name} ({_about(name)}) ...", level=logging.INFO)
    _ANNOUNCED_AT = now


def _announce_done(name: str, started: float, now: float) -> None:
    global _ANNOUNCED_AT
    _ANNOUNCED_AT = now  # the next kernel of the same step is covered by this notice
    if now - started >= DONE_AFTER_S:
        notice(f"sera_opt: compiled {name} in {now - started:.1f} s", level=logging.INFO)


_LISTENER: _CompileNotices | None = None


def _listen_to_compiles() -> None:
    """Register :class:`_CompileNotices` with numba's events, once per process."""
    global _LISTENER
    if _LISTENER is not None:
        return
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, ev):
            notices.notify(ev)

        def on_end(self, ev):
            notices.notify(ev)

    notices = _CompileNotices()
    event.register("numba:compile", Listener())
    _LISTENER = notices


def kernels(module_name: str) -> ModuleType:
    """The kernel module ``module_name`` (absolute, e.g. ``"sera_opt.tracking.index_kernels"``),
    imported on first use (so that ``import sera_opt`` does not load numba)."""
    loaded = _LOADED.get(module_name)
    if loaded is None:
        loaded = _LOADED[module_name] = importlib.import_module(module_name)
    return loaded
