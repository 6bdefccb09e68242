"""Where the compiled kernels are cached on disk, and the key that keeps that cache honest.

numba's ``cache=True`` writes next to the source by default, into the installed
package's ``__pycache__``. That has two faults for a library: pip does not know
those files, so an uninstall leaves a ``site-packages/sera_opt/`` directory
behind that shadows a later (editable) install, and numba checks only the
timestamp of the file that defines a kernel, so a kernel that calls one in
another file can be served stale after an upgrade (numba issue 1833). A
read-only install (system site-packages, a container image) cannot be written
at all.

So the kernels are cached in a directory of their own, outside the package:

``<base>/<key>``, where ``<key>`` is ``<sera_opt version>-numba<numba version>-<hash>``
and ``<hash>`` is a SHA-256 over every kernel module's source (the modules that
compile with :func:`sera_opt._jit.njit`, and the package modules they import, such as
the numba-free list of kind numbers; beyond those they import only numpy and the
standard library, so these sources are all that is compiled in).
An edit to any kernel file, a new release or a new numba gives a new, empty
directory; nothing stale is ever loaded.

``<base>`` is, in order of precedence:

1. the directory given to :func:`set_kernel_cache_dir` (before the first kernel
   is used);
2. the environment variable ``SERA_OPT_CACHE_DIR``;
3. ``$NUMBA_CACHE_DIR/sera_opt`` when numba's own setting is given;
4. the per-user cache directory: ``$XDG_CACHE_HOME/sera_opt`` or
   ``~/.cache/sera_opt`` on Linux, ``~/Library/Caches/sera_opt`` on macOS,
   ``%LOCALAPPDATA%\\sera_opt\\Cache`` on Windows.

If that directory cannot be written, the kernels compile in memory in every
process, and one notice on standard error says so and how to fix it; nothing is
ever written into the installed package. A damaged cached kernel is removed and
compiled again, and a full disk leaves the kernels compiled in memory, each with
one notice (:mod:`sera_opt._jit`): an unusable cache never fails a run.
"""

from __future__ import annotations

import ast
import hashlib
import os
import pickle
import re
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ._notices import notice
from ._version import __version__
from .exceptions import SeraOptError

__all__ = [
    "KernelCacheInfo",
    "kernel_cache_info",
    "kernel_cache_dir",
    "set_kernel_cache_dir",
    "clear_kernel_cache",
    "kernel_sources",
    "cache_key",
]

ENV_VAR = "SERA_OPT_CACHE_DIR"
PACKAGE_ROOT = Path(__file__).resolve().parent
# The line by which a kernel module says it compiles with sera_opt's njit; the
# source hash covers exactly the modules that carry it.
_KERNEL_MARKER = re.compile(rb"^from \.+_jit import njit\b", re.MULTILINE)
_KEY_PATTERN = re.compile(r"^[0-9][\w.+!-]*-numba[\w.+!-]+-[0-9a-f]{16}$")

_LOCK = threading.Lock()
# "decorated": a kernel has been given its cache directory (it can still be given
# another); "loaded": a kernel has been loaded or compiled, so the directory is fixed.
_STATE: dict = {"override": None, "resolved": None, "notice_printed": False, "decorated": False,
                "loaded": False, "key": None}


def kernel_sources(root: str | os.PathLike | None = None) -> list[Path]:
    """The kernel sources under the package directory ``root`` (default: this
    installation), sorted: every ``.py`` file that compiles with sera_opt's njit, and
    every module of the package that those import (relative imports, followed
    through; ``_jit`` itself, which only decorates, aside). A numba-free module of
    constants that kernels compile in is part of what they compile."""
    root = (PACKAGE_ROOT if root is None else Path(root)).resolve()
    found = {path.resolve() for path in root.rglob("*.py")
             if "__pycache__" not in path.parts and _KERNEL_MARKER.search(path.read_bytes())}
    if not found:
        raise SeraOptError(f"no kernel module found under {root}: the installation is incomplete; "
                           f"reinstall sera_opt.")
    pending = sorted(found)
    while pending:
        for imported in _relative_imports(pending.pop(), root):
            if imported not in found:
                found.add(imported)
                pending.append(imported)
    return sorted(found)


def _relative_imports(path: Path, root: Path) -> list[Path]:
    """The package modules under ``root`` that ``path`` imports with a relative import."""
    package = path.parent
    modules = []
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package
        for _ in range(node.level - 1):
            base = base.parent
        stem = base.joinpath(*node.module.split(".")) if node.module else base
        targets = [stem] + [stem / alias.name for alias in node.names]
        for target in targets:
            for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                if (candidate.is_file() and candidate.is_relative_to(root)
                        and candidate.name != "_jit.py"):
                    modules.append(candidate.resolve())
    return modules


def _source_hash(root: Path) -> str:
    root = root.resolve()
    digest = hashlib.sha256()
    for path in kernel_sources(root):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _numba_version() -> str:
    try:
        return metadata.version("numba")
    except metadata.PackageNotFoundError:  # numba importable but without metadata
        import numba

        return numba.__version__


def cache_key(root: str | os.PathLike | None = None) -> str:
    """``<sera_opt version>-numba<numba version>-<hash of the kernel sources under root>``
    (default: this installation's, computed once per process)."""
    if root is None:
        if _STATE.get("key") is None:
            _STATE["key"] = f"{__version__}-numba{_numba_version()}-{_source_hash(PACKAGE_ROOT)}"
        return _STATE["key"]
    return f"{__version__}-numba{_numba_version()}-{_source_hash(Path(root))}"


def _user_cache_base() -> Path:
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(local) / "sera_opt" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "sera_opt"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "sera_opt"


def _base() -> tuple[Path, str]:
    """The base directory and what chose it."""
    if _STATE["override"] is not None:
        return _STATE["override"], "set_kernel_cache_dir()"
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser(), ENV_VAR
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]).expanduser() / "sera_opt", "NUMBA_CACHE_DIR"
    try:
        return _user_cache_base(), "the per-user cache directory"
    except RuntimeError:  # no home directory to be found
        user = os.getuid() if hasattr(os, "getuid") else "user"
        return (Path(tempfile.gettempdir()) / f"sera_opt-{user}",
                "the temporary directory (no home directory)")


def kernel_cache_dir() -> Path:
    """The directory that holds (or will hold) this installation's compiled kernels."""
    base, _ = _base()
    return base.absolute() / cache_key()


def set_kernel_cache_dir(path: str | os.PathLike | None) -> None:
    """Cache the compiled kernels under ``path`` (a key-named directory is made
    inside it), or go back to the default with ``None``.

    It must be called before the first kernel is used in the process (before the
    first allocation, tracker update or estimator call): kernels already loaded
    keep the directory they were loaded from. Looking at the cache first
    (:func:`kernel_cache_info`) is fine. The environment variable
    ``SERA_OPT_CACHE_DIR`` does the same for every process.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise SeraOptError(f"set_kernel_cache_dir takes a directory path or None, got "
                           f"{type(path).__name__}.")
    if path is not None and not str(path):
        raise SeraOptError("set_kernel_cache_dir got an empty path; pass a directory, or None "
                           "for the default.")
    with _LOCK:
        if _STATE["loaded"]:
            raise SeraOptError(
                f"the kernels of this process are already loaded from {_STATE['resolved'] or 'memory'}; "
                f"call set_kernel_cache_dir before the first allocation, tracker update or "
                f"estimator call, or set {ENV_VAR} in the environment before starting Python.")
        _STATE["override"] = None if path is None else Path(path).expanduser()
        if not _STATE["decorated"]:
            return
        # Kernels were decorated (kernel_cache_info imports them) but none was loaded:
        # give them the new directory.
        _STATE["decorated"] = False
        _STATE["resolved"] = None
    directory = directory_for_compiling()
    jit = sys.modules.get(f"{__package__}._jit")
    if jit is not None:
        jit.repoint_caches(directory)


def mark_loaded() -> None:
    """Record that a kernel is being loaded or compiled: the directory is fixed from now."""
    _STATE["loaded"] = True


def _writable(directory: Path) -> OSError | None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return exc
    return None


def _can_write(directory: Path) -> bool:
    """Whether ``directory`` could be written, without creating it: a file is made
    and removed in it (or in its nearest existing parent), since ``os.access`` says
    yes to root, and to a read-only file system on some platforms."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return False
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError:
        return False
    return True


def directory_for_compiling() -> Path | None:
    """The cache directory for the kernels of this process, checked writable once;
    ``None`` (after a one-line notice on stderr) when it cannot be written."""
    with _LOCK:
        if not _STATE["decorated"]:
            _STATE["decorated"] = True
            directory = kernel_cache_dir()
            problem = _writable(directory)
            if problem is None:
                _STATE["resolved"] = directory
            elif not _STATE["notice_printed"]:
                _STATE["notice_printed"] = True
                reason = problem.strerror or type(problem).__name__
                notice(f"sera_opt: the kernel cache directory {directory} cannot be written "
                       f"({reason}); the kernels compile in memory in every process. Set "
                       f"{ENV_VAR} to a writable directory to cache them.")
        return _STATE["resolved"]


@dataclass(frozen=True)
class KernelCacheInfo:
    """Where the kernels are cached and what is there.

    Attributes
    ----------
    directory : the key-named directory of this installation's kernels.
    chosen_by : what chose its base (``set_kernel_cache_dir()``, ``SERA_OPT_CACHE_DIR``,
        ``NUMBA_CACHE_DIR`` or the per-user cache directory).
    key : ``<sera_opt version>-numba<numba version>-<hash of the kernel sources>``.
    writable : whether the directory can be written (if not, kernels compile in memory).
    cached : kernel module name -> number of its kernels found in the cache, intact.
    size_bytes : bytes on disk under ``directory``.
    damaged : the cache files that cannot be read back (truncated or corrupt); the
        next use of their kernels removes them and compiles again.
    """

    directory: Path
    chosen_by: str
    key: str
    writable: bool
    cached: dict
    size_bytes: int
    damaged: tuple = ()

    @property
    def state(self) -> str:
        """``"damaged"`` when a cache file cannot be read back, ``"warm"`` when compiled
        kernels are cached (a kernel not used yet still compiles on its first use),
        ``"cold"`` when nothing is."""
        if self.damaged:
            return "damaged"
        return "warm" if any(self.cached.values()) else "cold"

    def summary(self) -> str:
        if not self.writable:
            where = f"{self.directory} (cannot be written: the kernels compile in memory)"
        elif self.state == "damaged":
            where = (f"{self.directory} (damaged: {len(self.damaged)} file"
                     f"{'' if len(self.damaged) == 1 else 's'} cannot be read back; their "
                     f"kernels are compiled again on first use, or run `sera-opt cache clear`)")
        elif self.state == "warm":
            where = (f"{self.directory} (warm: {sum(self.cached.values())} kernels, "
                     f"{self.size_bytes / 2**20:.1f} MiB)")
        else:
            where = f"{self.directory} (cold: the first call compiles the kernels it needs)"
        return f"kernel cache: {where}, chosen by {self.chosen_by}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
    return ".".join(("sera_opt", *parts))


def kernel_cache_info(*, inspect_kernels: bool = True) -> KernelCacheInfo:
    """Where this installation's kernels are cached, and how many are there.

    ``inspect_kernels=True`` imports the kernel modules (numba, no compiling) to
    count the kernels whose cache index exists; ``False`` counts nothing and is
    instant."""
    import importlib

    base, chosen_by = _base()
    directory = kernel_cache_dir()
    writable = _can_write(directory)
    cached: dict = {}
    damaged = _damaged_files(directory) if directory.is_dir() else []
    if inspect_kernels:
        for path in kernel_sources():
            name = _module_name(path)
            module = importlib.import_module(name)
            dispatchers = [value for value in vars(module).values()
                           if hasattr(value, "signatures") and hasattr(value, "py_func")
                           and value.py_func.__module__ == name]
            if dispatchers:  # a numba-free module of constants has no kernel to count
                cached[name] = sum(_index_exists(d, damaged) for d in dispatchers)
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) \
        if directory.is_dir() else 0
    return KernelCacheInfo(directory, chosen_by, cache_key(), writable, cached, size,
                           tuple(damaged))


def _index_exists(dispatcher, damaged=()) -> bool:
    cache = getattr(dispatcher, "_cache", None)
    path = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    return bool(path) and os.path.exists(path) and Path(path) not in damaged


def _damaged_files(directory: Path) -> list[Path]:
    """The numba cache files under ``directory`` that cannot be read back: an index
    that does not unpickle, or a data file (named by its index) that does not. numba
    writes each file whole (a temporary file, then a rename), so a file that fails
    here was damaged afterwards, or by a full disk."""
    damaged: list[Path] = []
    for index in sorted(directory.rglob("*.nbi")):
        try:
            with open(index, "rb") as f:
                pickle.load(f)  # numba's version
                _stamp, overloads = pickle.loads(f.read())
            names = list(overloads.values())
        except Exception:  # truncated or corrupt: whatever unpickling raises
            damaged.append(index)
            continue
        for name in names:
            data = index.parent / name
            try:
                pickle.loads(data.read_bytes())
            except FileNotFoundError:
                continue  # numba treats a missing data file as not cached
            except Exception:
                damaged.append(data)
    return damaged


def _in_package_leftovers() -> list[Path]:
    """numba cache files inside the installed package (written by earlier versions)."""
    return [f for pattern in ("*.nbi", "*.nbc") for f in PACKAGE_ROOT.rglob(pattern)
            if "__pycache__" in f.parts]


def clear_kernel_cache() -> tuple[list[Path], int]:
    """Remove every sera_opt kernel cache under the current base directory (all
    versions and keys; other files there are left alone) and any numba cache
    files that earlier versions wrote inside the installed package. Returns the
    paths removed and the bytes freed.

    A key folder that is a symbolic link (to a cache kept on another disk) loses
    the link and the numba cache files in the folder it points to; nothing else
    there is touched. A cache that cannot be removed (a read-only file system, a
    folder of another user) raises :class:`SeraOptError` naming it."""
    base, _ = _base()
    removed: list[Path] = []
    freed = 0
    try:
        targets = [p for p in base.iterdir() if p.is_dir() and _KEY_PATTERN.match(p.name)] \
            if base.is_dir() else []
        for directory in targets:
            freed += _remove_key_folder(directory)
            removed.append(directory)
        for leftover in _in_package_leftovers():
            size = leftover.stat().st_size
            leftover.unlink()
            freed += size
            removed.append(leftover)
    except OSError as exc:
        where = exc.filename or base
        raise SeraOptError(
            f"cannot remove the kernel cache at {where} ({exc.strerror or exc}); "
            f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'} removed before it. "
            f"Remove it as a user who may write there, or point {ENV_VAR} to a writable "
            f"directory (an unwritable cache is not used: the kernels compile in memory)."
        ) from None
    return removed, freed


def _remove_key_folder(directory: Path) -> int:
    """Remove one key folder (or, for a symbolic link, the link and the numba cache
    files where it points); return the bytes freed."""
    if directory.is_symlink():
        target = directory.resolve()
        files = [f for pattern in ("*.nbi", "*.nbc", "*.tmp.*") for f in target.rglob(pattern)
                 if f.is_file()] if target.is_dir() else []
        freed = 0
        for f in files:
            size = f.stat().st_size
            f.unlink()
            freed += size
        directory.unlink()
        return freed
    freed = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    shutil.rmtree(directory)
    return freed
