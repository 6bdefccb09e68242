"""Compiling a large kernel in a child process while a small exact kernel serves.

numba compiles a kernel with everything it can call, and the bracket search of the
closed-form kinds (:func:`sera_opt.kernels.closed.bracket_solve`) is a large call tree:
about ten seconds of compile on a first call, once per installation. The one-at-a-time
kernel (:func:`~sera_opt.kernels.closed.stepwise_counts`) gives the same counts (the same
optimum, the same tie rule) at any spare, compiles in a tenth of that time, and costs a
fraction of a millisecond per call at a thousand prompts. So a first call that needs
the bracket search does not wait for it: a child process compiles it into the kernel
cache, at a lower scheduling priority, while the one-at-a-time kernel hands out the
rollouts; once the child is done, the next call loads the bracket search from the cache.

A :class:`BackgroundKernel` answers :meth:`~BackgroundKernel.ready`: True once the
kernel is compiled or loaded in this process, is in the cache, or cannot be compiled
in the background (the kernels compile in memory because the cache cannot be written,
``NUMBA_DISABLE_JIT=1``, the child could not be started, failed or took longer than
:data:`TIMEOUT_S`, or ``SERA_OPT_BACKGROUND_COMPILE=0``): then the caller calls the
kernel and numba loads or compiles it here, as it would without this module. Each
start, end and failure is one notice (:mod:`sera_opt._notices`). A process forked while
the child compiles (it cannot wait on another's child) keeps the smaller kernel until
the kernel's cache index appears.

The child runs :func:`_main` with ``MODULE:FUNCTION`` from the caller's ``sys.path`` (so
that it imports the same copy of the package, whose kernels cache under the same key): it
imports the module and calls the function, which calls the kernel with the argument types
of the library's own calls (so the cached signature is the one the caller loads), and
prints the seconds it took. ``python -m sera_opt._background MODULE:FUNCTION`` does the
same by hand.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time

from . import _kernel_cache
from ._notices import notice

__all__ = ["BackgroundKernel", "ENV_VAR", "TIMEOUT_S", "wait_for_kernels"]

#: ``SERA_OPT_BACKGROUND_COMPILE=0`` (or ``false``, ``no``, ``off``) compiles every
#: kernel in the calling process, on the call that first needs it.
ENV_VAR = "SERA_OPT_BACKGROUND_COMPILE"
#: A child still compiling after this many seconds is stopped, and the kernel compiled
#: in the calling process.
TIMEOUT_S = 600.0

_KERNELS: list[BackgroundKernel] = []
# The child: the caller's sys.path (from _PATH_VAR), then _main with the warm-up's name.
_PATH_VAR = "SERA_OPT_BACKGROUND_SYS_PATH"
_CHILD = ("import json, os, sys; "
          f"sys.path[:] = json.loads(os.environ.pop({_PATH_VAR!r})); "
          "from sera_opt._background import _main; sys.exit(_main(sys.argv[1:]))")


def enabled() -> bool:
    """Whether kernels may be compiled in a child process (``SERA_OPT_BACKGROUND_COMPILE``)."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


class BackgroundKernel:
    """The kernel ``name`` of the kernel module ``module``, compiled by a child process
    that runs ``warm`` (``"package.module:function"``) when :meth:`ready` is first asked
    and the kernel is neither loaded nor cached; ``interim`` names the kernel that serves
    meanwhile (for the notice)."""

    def __init__(self, module: str, name: str, warm: str, interim: str):
        self.module = module
        self.name = name
        self.warm = warm
        self.interim = interim
        self.label = f"{module.removeprefix('sera_opt.')}.{name}"
        self._ready = False
        self._child: subprocess.Popen | None = None
        self._output = None
        self._started = 0.0
        self._owner = 0  # the process that started the child (a forked copy cannot wait on it)
        self._lock = threading.Lock()
        _KERNELS.append(self)

    def ready(self) -> bool:
        """Whether the caller should call the kernel now (loaded, cached, or to be compiled
        in this process); False while a child compiles it. Starts the child on the first
        call that finds the kernel neither loaded nor cached."""
        if self._ready:
            return True
        with self._lock:
            if not self._ready:
                self._ready = self._check()
        return self._ready

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a child started for this kernel has ended (at most ``timeout``
        seconds); whether the kernel is ready then. Starts no child."""
        with self._lock:
            child = self._child
        if child is not None and not self._ready:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
        return self._ready or child is None or self.ready()

    # ------------------------------------------------------------ internals
    def _dispatcher(self):
        return getattr(importlib.import_module(self.module), self.name)

    def _check(self) -> bool:
        if self._child is not None:
            if self._owner != os.getpid():
                # A process forked while the child compiled (a data loader's worker, say):
                # the child is not its own to wait on, so it waits for the cache instead.
                return (self._index_exists(self._dispatcher())
                        or time.monotonic() - self._started >= TIMEOUT_S)
            return self._poll()
        dispatcher = self._dispatcher()
        if not hasattr(dispatcher, "signatures") or dispatcher.signatures:
            return True  # NUMBA_DISABLE_JIT (a Python function), or already compiled here
        if not enabled():
            return True
        directory = _kernel_cache.directory_for_compiling()
        if directory is None:
            return True  # no disk cache to hand the kernel over: compile it here
        if self._index_exists(dispatcher, missing=True):
            return True  # in the cache (numba loads it), or a cache numba does not index
        return not self._start(directory)

    @staticmethod
    def _index_exists(dispatcher, missing: bool = False) -> bool:
        """Whether the kernel's cache index is on disk (``missing`` when it has none)."""
        index = getattr(getattr(getattr(dispatcher, "_cache", None), "_cache_file", None),
                        "_index_path", None)
        return missing if not index else os.path.exists(index)

    def _start(self, directory) -> bool:
        """Start the child; whether it started."""
        env = dict(os.environ)
        env[_kernel_cache.ENV_VAR] = str(directory.parent)
        env[ENV_VAR] = "0"
        env.pop("NUMBA_CACHE_DIR", None)
        # The child imports what this process imports (a source tree put on sys.path, say,
        # rather than an installed release, which would compile under another cache key):
        # it starts from this process's sys.path, as multiprocessing's spawned children do.
        env[_PATH_VAR] = json.dumps(sys.path)
        self._output = tempfile.TemporaryFile(mode="w+")
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, self.warm],
                stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT,
                env=env, close_fds=True)
        except (OSError, ValueError) as exc:
            self._output.close()
            self._output = None
            notice(f"sera_opt: could not start a process to compile {self.label} in the "
                   f"background ({exc}); compiling it in this process.", level=logging.INFO)
            return False
        self._started = time.monotonic()
        self._owner = os.getpid()
        notice(f"sera_opt: compiling {self.label} in a background process (once per version, "
               f"into the kernel cache); until it is ready, {self.interim} gives the same "
               f"counts.", level=logging.INFO)
        return True

    def _poll(self) -> bool:
        child = self._child
        code = child.poll()
        if code is None:
            if time.monotonic() - self._started < TIMEOUT_S:
                return False
            child.kill()
            child.wait()
            notice(f"sera_opt: the background compile of {self.label} took over "
                   f"{TIMEOUT_S:.0f} s and was stopped; compiling it in this process.")
            return True
        output = self._read_output()
        if code == 0:
            lines = output.split()
            took = lines[-1] if lines else "?"
            notice(f"sera_opt: compiled {self.label} in a background process in {took} s; it "
                   f"is used from now on.", level=logging.INFO)
        else:
            last = output.strip().splitlines()[-1] if output.strip() else "no output"
            notice(f"sera_opt: the background compile of {self.label} failed (exit {code}: "
                   f"{last}); compiling it in this process.")
        return True

    def _read_output(self) -> str:
        output, self._output = self._output, None
        if output is None:
            return ""
        try:
            output.seek(0)
            return output.read()
        finally:
            output.close()


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Wait until every kernel being compiled in a background process is ready.

    The first call that needs a large kernel (the closed-form kinds' bracket search)
    compiles it in a child process while an exact smaller kernel serves (the same
    counts); later calls use it once it is in the kernel cache. Call this to have the
    large kernel before timing a loop, or set ``SERA_OPT_BACKGROUND_COMPILE=0`` to compile
    every kernel in the calling process. Returns False if ``timeout`` seconds passed
    first, True otherwise (also when nothing was being compiled).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    for kernel in list(_KERNELS):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not kernel.wait(left):
            return False
    return True


def _main(argv: list[str]) -> int:
    """The child: call ``MODULE:FUNCTION`` and print the seconds it took."""
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m sera_opt._background MODULE:FUNCTION", file=sys.stderr)
        return 2
    if hasattr(os, "nice"):
        try:
            os.nice(10)  # the caller's own work goes first
        except OSError:
            pass
    module, function = argv[0].split(":", 1)
    started = time.perf_counter()
    getattr(importlib.import_module(module), function)()
    print(f"{time.perf_counter() - started:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
