"""The compiled kernels' cache: outside the installed package, keyed so that it is never stale.

The tests that compile the kernels in a fresh process (10 to 30 s each) are marked slow."""

from __future__ import annotations

import ast
import os
import shlex
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from sera_opt import _kernel_cache
from sera_opt._jit import MESSAGE

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sera_opt"
ALLOCATE = ("import sera_opt\n"
            "print(sera_opt.allocate([0.9, 0.5, 0.05], 24, max_rollouts=16)"
            ".counts.tolist())\n")


def _env(**overrides):
    env = {k: v for k, v in os.environ.items() if k not in ("SERA_OPT_CACHE_DIR", "NUMBA_CACHE_DIR")}
    env.update(overrides)
    return env


def _python(code, env, cwd=None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def _cache_files(directory: Path) -> set[Path]:
    return {f for pattern in ("*.nbi", "*.nbc") for f in directory.rglob(pattern)}


def _copy_kernel_tree(destination: Path) -> Path:
    for path in _kernel_cache.kernel_sources():
        target = destination / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return destination


# ----------------------------------------------------------------------------- the key


def test_the_key_names_the_versions_and_changes_with_any_kernel_source(tmp_path):
    import numba

    import sera_opt

    tree = _copy_kernel_tree(tmp_path / "pkg")
    key = _kernel_cache.cache_key(tree)
    assert key == _kernel_cache.cache_key()  # same sources, same key, wherever they lie
    assert key.startswith(f"{sera_opt.__version__}-numba{numba.__version__}-")
    for path in _kernel_cache.kernel_sources(tree):
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit\n")
        assert _kernel_cache.cache_key(tree) != key, f"an edit to {path.name} kept the key"
        path.write_bytes(original)
    assert _kernel_cache.cache_key(tree) == key
    (tree / "not_a_kernel.py").write_text("import numpy\n")
    assert _kernel_cache.cache_key(tree) == key, "a module without kernels changed the key"


def test_a_numba_free_module_that_kernels_compile_in_is_hashed(tmp_path):
    """The kind numbers live in a module without numba (the objectives read them too);
    the kernels compile them in as constants, so an edit there must change the key
    (numba's own cache would not see it: numba issue 1833)."""
    kinds = PACKAGE / "kernels" / "kinds.py"
    assert b"njit" not in kinds.read_bytes()
    assert kinds.resolve() in _kernel_cache.kernel_sources()
    tree = _copy_kernel_tree(tmp_path / "pkg")
    key = _kernel_cache.cache_key(tree)
    copy = tree / "kernels" / "kinds.py"
    copy.write_text(copy.read_text().replace("KNAPSACK = 2", "KNAPSACK = 12"))
    assert _kernel_cache.cache_key(tree) != key


def test_the_hashed_sources_are_every_kernel_and_all_that_they_compile_in():
    """Every module that compiles numba code is hashed, and the hashed modules import
    nothing of sera_opt but each other and the njit that places the cache: so the key
    covers every source a kernel is compiled from (numba's own check sees one file)."""
    sources = _kernel_cache.kernel_sources()
    hashed = {p.relative_to(PACKAGE).as_posix() for p in sources}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if "@njit" in text:
            assert path.relative_to(PACKAGE).as_posix() in hashed, f"{path} is not hashed"
        if path.name != "_jit.py":
            assert "from numba import njit" not in text and "numba.njit(" not in text, \
                f"{path} compiles with numba's njit, not sera_opt._jit's"
    allowed = {"__future__", "math", "decimal", "numpy"}
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                name = (node.module or "").rpartition(".")[2]
                sibling = path.parent.joinpath(*[".."] * (node.level - 1), f"{name}.py").resolve()
                assert name == "_jit" or sibling in sources, \
                    f"{path.name} imports {node.module}, which is not hashed"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(n.partition(".")[0] in allowed for n in names), (path.name, names)


def test_the_base_directory_follows_the_documented_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("SERA_OPT_CACHE_DIR", raising=False)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    key = _kernel_cache.cache_key()
    if sys.platform.startswith("linux"):
        assert _kernel_cache.kernel_cache_dir() == tmp_path / "xdg" / "sera_opt" / key
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert _kernel_cache.kernel_cache_dir() == tmp_path / "numba" / "sera_opt" / key
    monkeypatch.setenv("SERA_OPT_CACHE_DIR", str(tmp_path / "ours"))
    assert _kernel_cache.kernel_cache_dir() == tmp_path / "ours" / key
    assert _kernel_cache.kernel_cache_info(inspect_kernels=False).chosen_by == "SERA_OPT_CACHE_DIR"


# ----------------------------------------------------------------------------- in use


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_kernels_are_cached_in_the_keyed_directory_and_never_in_the_package(tmp_path):
    before = _cache_files(PACKAGE)
    env = _env(SERA_OPT_CACHE_DIR=str(tmp_path))
    first = _python(ALLOCATE, env)
    assert first.returncode == 0 and first.stdout == "[2, 6, 16]\n", first.stderr
    written = _cache_files(tmp_path / _kernel_cache.cache_key())
    assert written, "nothing was cached"
    assert _cache_files(tmp_path) == written, "a cache file landed outside the keyed directory"
    assert _cache_files(PACKAGE) == before, "a cache file was written into the package"
    second = _python(ALLOCATE, env)
    assert second.stdout == first.stdout and MESSAGE not in second.stderr, second.stderr


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_an_unwritable_cache_directory_is_one_notice_and_kernels_in_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    before = _cache_files(PACKAGE)
    code = ALLOCATE + "import sera_opt; t = sera_opt.SuccessTracker(); t.update([1, 2], [1, 0])\n"
    result = _python(code, _env(SERA_OPT_CACHE_DIR=str(blocker / "cache")))
    assert result.returncode == 0 and result.stdout == "[2, 6, 16]\n", result.stderr
    notices = [line for line in result.stderr.splitlines() if "cannot be written" in line]
    assert len(notices) == 1 and "SERA_OPT_CACHE_DIR" in notices[0], result.stderr
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr
    assert _cache_files(PACKAGE) == before, "the fallback wrote into the package"


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_the_setting_applies_before_the_first_kernel_and_is_refused_after(tmp_path):
    code = (f"import sera_opt\n"
            f"sera_opt.cache.set_kernel_cache_dir({str(tmp_path / 'chosen')!r})\n"
            f"sera_opt.allocate([0.5, 0.2], 6)\n"
            f"try:\n    sera_opt.cache.set_kernel_cache_dir(None)\n"
            f"except sera_opt.SeraOptError as e:\n    print('refused:', e)\n")
    result = _python(code, _env(SERA_OPT_CACHE_DIR=str(tmp_path / "env")))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused: the kernels of this process are already loaded"), \
        result.stdout
    assert _cache_files(tmp_path / "chosen"), "the chosen directory was not used"
    assert not (tmp_path / "env").exists(), "the environment won over the explicit setting"


@pytest.mark.parametrize("bad", [3, b"/tmp", ""])
def test_a_setting_that_is_not_a_directory_is_refused(bad):
    import sera_opt

    with pytest.raises(sera_opt.SeraOptError, match="set_kernel_cache_dir"):
        sera_opt.cache.set_kernel_cache_dir(bad)


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_the_command_shows_and_clears_the_cache(tmp_path):
    env = _env(SERA_OPT_CACHE_DIR=str(tmp_path))
    cli = [sys.executable, "-m", "sera_opt.cli"]
    key_dir = tmp_path / _kernel_cache.cache_key()
    cold = subprocess.run([*cli, "--version"], capture_output=True, text=True, env=env)
    assert cold.returncode == 0 and f"kernel cache: {key_dir} (cold" in cold.stdout, cold
    assert _python(ALLOCATE, env).returncode == 0
    warm = subprocess.run([*cli, "cache"], capture_output=True, text=True, env=env)
    assert warm.returncode == 0 and f"kernel cache: {key_dir} (warm: " in warm.stdout, warm
    assert "sera_opt.kernels.waterline: " in warm.stdout
    (tmp_path / "0.0.9-numba0.60.0-0123456789abcdef").mkdir()  # an earlier version's
    (tmp_path / "keep.txt").write_text("not ours")
    cleared = subprocess.run([*cli, "cache", "clear"], capture_output=True, text=True, env=env)
    assert cleared.returncode == 0 and cleared.stdout.startswith("removed 2 kernel cache "), cleared
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    again = subprocess.run([*cli, "cache", "clear"], capture_output=True, text=True, env=env)
    assert again.stdout.startswith("nothing to remove"), again.stdout


# ----------------------------------------------------------------------------- a cache not to trust

CLI = [sys.executable, "-m", "sera_opt.cli"]
# Allocation, a tracker with decay and a fitted prior, the sparse estimator: kernels of
# every kernel package.
EVERY_KIND = ALLOCATE + (
    "import torch\n"
    "t = sera_opt.SuccessTracker(decay=0.9, prior='fit')\n"
    "t.update([1, 1, 2, 3, 3], [1, 0, 1, 0, 0]); t.update([1, 4], [1, 1])\n"
    "print(t.estimate([1, 2, 3, 4, 5]).round(6).tolist())\n"
    "print(sera_opt.maxrl_advantages(torch.tensor([1., 0, 1, 1]), "
    "torch.tensor([0, 0, 10**12, 10**12])).tolist())\n")


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache base holding EVERY_KIND's kernels (compiled once for the tests that start
    from a warm cache), and EVERY_KIND's output."""
    base = tmp_path_factory.mktemp("warm")
    run = _python(EVERY_KIND, _env(SERA_OPT_CACHE_DIR=str(base)))
    assert run.returncode == 0 and run.stdout.startswith("[2, 6, 16]\n"), run.stderr
    return base, run.stdout


def _warm(directory: Path, warm_cache) -> Path:
    """A copy of the warm cache under ``directory``; returns the key folder."""
    key_dir = directory / _kernel_cache.cache_key()
    shutil.copytree(warm_cache[0] / _kernel_cache.cache_key(), key_dir)
    assert _cache_files(key_dir), "nothing was cached"
    return key_dir


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_a_damaged_cached_kernel_is_told_apart_then_compiled_again_with_one_notice(tmp_path,
                                                                                 warm_cache):
    key_dir = _warm(tmp_path, warm_cache)
    env = _env(SERA_OPT_CACHE_DIR=str(tmp_path))
    for data in key_dir.rglob("*.nbc"):
        data.write_bytes(data.read_bytes()[:len(data.read_bytes()) // 2])
    index = sorted(key_dir.rglob("*.nbi"))[0]
    index.write_bytes(index.read_bytes()[:7])
    info = subprocess.run([*CLI, "cache"], capture_output=True, text=True, env=env)
    assert info.returncode == 0 and f"kernel cache: {key_dir} (damaged: " in info.stdout, info
    again = _python(EVERY_KIND, env)
    assert again.returncode == 0 and again.stdout == warm_cache[1], again.stderr
    notices = [line for line in again.stderr.splitlines() if "could not be loaded" in line]
    assert len(notices) == 1 and "compiled again" in notices[0], again.stderr
    assert "Traceback" not in again.stderr, again.stderr
    healed = subprocess.run([*CLI, "cache"], capture_output=True, text=True, env=env)
    assert f"kernel cache: {key_dir} (warm: " in healed.stdout, healed.stdout
    quiet = _python(EVERY_KIND, env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_a_full_disk_while_caching_leaves_the_kernels_in_memory_with_one_notice(tmp_path):
    code = ("import errno\n"
            "from numba.core import caching\n"
            "def full(self, *args):\n"
            "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "caching.IndexDataCacheFile._save_data = full\n"
            "caching.IndexDataCacheFile._save_index = full\n" + ALLOCATE
            + "import sera_opt; t = sera_opt.SuccessTracker(); t.update([1, 2], [1, 0])\n")
    result = _python(code, _env(SERA_OPT_CACHE_DIR=str(tmp_path)))
    assert result.returncode == 0 and result.stdout == "[2, 6, 16]\n", result.stderr
    notices = [line for line in result.stderr.splitlines() if "No space left" in line]
    assert len(notices) == 1 and "SERA_OPT_CACHE_DIR" in notices[0], result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_cache_clear_removes_a_symlinked_key_folder_and_nothing_else(tmp_path, capsys,
                                                                      monkeypatch):
    from sera_opt.cli import main

    monkeypatch.setenv("SERA_OPT_CACHE_DIR", str(tmp_path / "base"))
    monkeypatch.setitem(_kernel_cache._STATE, "override", None)
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    (elsewhere / "kernel.py-10.nbi").write_bytes(b"x" * 100)
    (elsewhere / "kernel.py-10.1.nbc").write_bytes(b"x" * 300)
    (elsewhere / "notes.txt").write_text("not a cache file")
    (tmp_path / "base").mkdir()
    link = tmp_path / "base" / _kernel_cache.cache_key()
    link.symlink_to(elsewhere, target_is_directory=True)
    assert main(["cache", "clear"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("removed 1 kernel cache entry"), (out, err)
    assert not link.exists() and not link.is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["notes.txt"]


def test_cache_clear_on_a_read_only_cache_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from sera_opt.cli import main

    monkeypatch.setenv("SERA_OPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(_kernel_cache._STATE, "override", None)
    (tmp_path / _kernel_cache.cache_key()).mkdir()

    def read_only(path, *args, **kwargs):  # root is not stopped by chmod; a mount would be
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(_kernel_cache.shutil, "rmtree", read_only)
    assert main(["cache", "clear"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, (out, err)
    assert "cannot remove the kernel cache" in err and "Read-only file system" in err, err
    assert "unexpected" not in err


def test_the_version_does_not_call_an_unwritable_cache_cold(tmp_path):
    code = ("import errno, sys, tempfile\n"
            "def read_only(*args, **kwargs):\n"
            "    raise OSError(errno.EROFS, 'Read-only file system')\n"
            "tempfile.TemporaryFile = read_only\n"
            "from sera_opt.cli import main\n"
            "sys.exit(main(['--version']))\n")
    result = _python(code, _env(SERA_OPT_CACHE_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "(cannot be written" in result.stdout and "cold" not in result.stdout, result.stdout


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_the_setting_is_allowed_after_only_looking_at_the_cache(tmp_path):
    code = (f"import sera_opt\n"
            f"sera_opt.cache.kernel_cache_info()\n"
            f"sera_opt.cache.set_kernel_cache_dir({str(tmp_path / 'chosen')!r})\n" + ALLOCATE)
    result = _python(code, _env(SERA_OPT_CACHE_DIR=str(tmp_path / "env")))
    assert result.returncode == 0 and result.stdout == "[2, 6, 16]\n", result.stderr
    assert _cache_files(tmp_path / "chosen"), "the chosen directory was not used"
    assert not _cache_files(tmp_path / "env"), "the kernels were cached where they were looked at"


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_the_kernels_run_as_python_with_numba_disable_jit(tmp_path, warm_cache):
    env = _env(SERA_OPT_CACHE_DIR=str(tmp_path), NUMBA_DISABLE_JIT="1")
    interpreted = _python(EVERY_KIND, env)
    assert interpreted.returncode == 0, interpreted.stderr
    assert interpreted.stdout == warm_cache[1]  # what the compiled kernels printed


# ----------------------------------------------------------------------------- notices


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_notices_never_reach_stdout_even_with_stderr_closed(tmp_path):
    """With stderr closed, print(file=sys.stderr) writes to stdout: a CSV would start with
    the notice. The cache cannot be written here, so both notices are due."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = tmp_path / "c.csv"
    command = (f"printf '0.9\\n0.5\\n0.05\\n' | {shlex.quote(sys.executable)} -m sera_opt.cli "
               f"allocate - --budget 24 --max 16 2>&- > {shlex.quote(str(out))}")
    result = subprocess.run(["bash", "-c", command],
                            env=_env(SERA_OPT_CACHE_DIR=str(blocker / "cache")), timeout=600)
    assert result.returncode == 0
    assert out.read_text() == "count\n2\n6\n16\n"


@pytest.mark.slow  # compiles the kernels in a fresh process
def test_notices_are_records_of_the_sera_opt_logger(tmp_path):
    silenced = _python("import logging\nlogging.getLogger('sera_opt').setLevel(logging.ERROR)\n"
                       + ALLOCATE, _env(SERA_OPT_CACHE_DIR=str(tmp_path / "a")))
    assert silenced.returncode == 0 and silenced.stderr == "", silenced.stderr
    # (that the same run says MESSAGE on stderr otherwise: tests/test_solvers.py)
    assert _cache_files(tmp_path / "a"), "nothing was compiled, so nothing was silenced"


# ----------------------------------------------------------------------------- installs


def _site_packages(env_dir: Path) -> Path:
    python = _venv_python(env_dir)
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _venv_python(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _recorded(site: Path) -> set[Path]:
    records = list(site.glob("sera_opt-*.dist-info/RECORD"))
    assert len(records) == 1, records
    rows = records[0].read_text().splitlines()
    return {(site / row.split(",")[0]).resolve() for row in rows if row}


def _nested_environment(env_dir: Path) -> str:
    """A virtual environment to install the checkout into, which sees the packages of the
    environment running the tests (numpy, numba, pip, setuptools) whatever that is: a
    venv, conda, a system Python. ``system_site_packages=True`` would not do: from inside
    a venv it sees the base interpreter's packages, not the venv's. Returns its python."""
    venv.EnvBuilder(with_pip=False).create(env_dir)
    outer = [path for path in (*site.getsitepackages(),
                               site.getusersitepackages() if site.ENABLE_USER_SITE else "")
             if path and Path(path).is_dir()]
    assert outer, "the running environment has no site-packages folder"
    # Plain paths, appended after the environment's own site-packages: the outer .pth
    # files (an editable install of this checkout among them) are not run.
    (_site_packages(env_dir) / "_outer_environment.pth").write_text("\n".join(outer) + "\n")
    return str(_venv_python(env_dir))


def _can_build_offline(python: str) -> bool:
    """Whether the build requirements (pyproject's [build-system]) are importable, so that
    pip can build without an index (``--no-build-isolation``)."""
    probe = ("import importlib.util, sys, setuptools\n"
             "major = int(setuptools.__version__.split('.')[0])\n"
             "sys.exit(0 if major >= 68 and importlib.util.find_spec('wheel') else 1)\n")
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def _pip(python: str, args: list, env: dict, cwd: Path) -> None:
    result = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, env=env,
                            cwd=cwd, timeout=900)
    assert result.returncode == 0, (f"pip {' '.join(map(str, args))} failed "
                                    f"({result.returncode}):\n{result.stdout}\n{result.stderr}")


@pytest.mark.slow
def test_an_editable_install_over_a_used_regular_install_imports_from_anywhere(tmp_path):
    """README's two commands, one after the other in one environment: a regular
    install whose kernels were used, then an editable install over it; the package
    must import from outside the checkout, and nothing unrecorded is left in
    site-packages."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to copy its tracked files")
    outer_regular = [Path(path) / "sera_opt" for path in site.getsitepackages()
                     if (Path(path) / "sera_opt" / "__init__.py").is_file()]
    if outer_regular:
        pytest.skip(f"a regular install of sera_opt in the running environment "
                    f"({outer_regular[0]}) would shadow the editable one under test; run the "
                    f"tests from an editable install (README's test command)")
    checkout = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    env_dir = tmp_path / "venv"
    python = _nested_environment(env_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "home" / ".cache"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    install = ["install", "-q", "--no-deps"]
    if _can_build_offline(python):
        install.append("--no-build-isolation")
        env["PIP_NO_INDEX"] = "1"
    # else pip fetches the build requirements from the index the environment is configured with

    _pip(python, [*install, str(checkout)], env, elsewhere)
    site_dir = _site_packages(env_dir)
    used = subprocess.run(
        [python, "-c", "import sera_opt\nassert 'site-packages' in sera_opt.__file__, "
                       "sera_opt.__file__\n" + ALLOCATE],
        capture_output=True, text=True, env=env, cwd=elsewhere, timeout=600)
    assert used.returncode == 0 and used.stdout == "[2, 6, 16]\n", used.stderr
    installed = {p.resolve() for p in (site_dir / "sera_opt").rglob("*") if p.is_file()}
    unrecorded = {p for p in installed - _recorded(site_dir) if p.suffix != ".pyc"}
    assert not unrecorded, f"files under site-packages that pip does not know: {sorted(unrecorded)}"
    assert _cache_files(tmp_path / "home" / ".cache" / "sera_opt"), "the kernels were not cached"

    _pip(python, [*install, "-e", str(checkout)], env, elsewhere)
    assert not (site_dir / "sera_opt").exists(), "the regular install left sera_opt/ behind"
    check = subprocess.run(
        [python, "-c", "import sera_opt; print(sera_opt.__file__); print(sera_opt.allocate)"
                       "; print(sera_opt.ESTIMATORS)"],
        capture_output=True, text=True, env=env, cwd=elsewhere, timeout=600)
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines()[0] == str(checkout / "sera_opt" / "__init__.py"), check.stdout
    script = env_dir / ("Scripts/sera-opt.exe" if os.name == "nt" else "bin/sera-opt")
    helped = subprocess.run([str(script), "--help"], capture_output=True, text=True, env=env,
                            cwd=elsewhere, timeout=600)
    assert helped.returncode == 0 and "allocate" in helped.stdout, helped.stderr
