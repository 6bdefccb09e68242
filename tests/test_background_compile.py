"""A large kernel compiled in a background process while an exact smaller one serves.

The fast tests drive :class:`sera_opt._background.BackgroundKernel` with a stand-in
kernel (a child that runs a function of the standard library), so each case is
quick: a disabled or cacheless setting compiles in the caller, a child that fails,
cannot start or runs too long gives the kernel back to the caller with one notice.
The slow tests run a planner's first step in a fresh process with an empty cache:
the bracket search is compiled by the child and loaded from the cache, never compiled
in the planner's process, and the counts are those of a process that compiled it
itself.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types

import pytest

import sera_opt
from sera_opt import _background, _kernel_cache


class FakeDispatcher:
    """What :class:`BackgroundKernel` reads of a numba dispatcher: its compiled
    signatures and where its cache index would be."""

    def __init__(self, index_path, signatures=()):
        self.signatures = list(signatures)
        self._cache = types.SimpleNamespace(
            _cache_file=types.SimpleNamespace(_index_path=str(index_path)))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A BackgroundKernel over a fake dispatcher in a fake module, background enabled,
    the kernel cache under ``tmp_path``; the notices it gives are collected."""
    module = types.ModuleType("sera_opt_fake_kernels")
    module.kernel = FakeDispatcher(tmp_path / "kernel.nbi")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setenv(_background.ENV_VAR, "1")
    monkeypatch.setattr(_kernel_cache, "directory_for_compiling", lambda: tmp_path / "key")
    said = []
    monkeypatch.setattr(_background, "notice", lambda message, level=logging.WARNING:
                        said.append(message))
    made = []

    def make(warm="builtins:dict"):
        kernel = _background.BackgroundKernel(module.__name__, "kernel", warm, "the interim")
        made.append(kernel)
        return kernel

    yield types.SimpleNamespace(make=make, module=module, said=said)
    for kernel in made:
        if kernel._child is not None and kernel._child.poll() is None:
            kernel._child.kill()
            kernel._child.wait()
        _background._KERNELS.remove(kernel)


def test_a_kernel_not_cached_is_compiled_by_a_child_then_ready(fake):
    kernel = fake.make()
    assert kernel.ready() is False
    assert len(fake.said) == 1 and "in a background process" in fake.said[0]
    assert "the interim gives the same counts" in fake.said[0]
    assert kernel.wait(60) is True
    assert kernel.ready() is True
    assert len(fake.said) == 2 and fake.said[1].startswith(
        "sera_opt: compiled sera_opt_fake_kernels.kernel in a background process in ")
    assert kernel._child.returncode == 0


def test_the_child_imports_this_package_and_caches_where_the_caller_does(fake, tmp_path,
                                                                           monkeypatch):
    """The child starts from the caller's sys.path (another copy of sera_opt would compile
    under another cache key), is told the caller's cache base, and compiles nothing in
    the background itself."""
    seen = {}
    real = subprocess.Popen

    def spy(argv, **kwargs):
        seen.update(kwargs["env"], argv=argv)
        return real(argv, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spy)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "first"), *sys.path])
    kernel = fake.make()
    assert kernel.ready() is False
    assert json.loads(seen[_background._PATH_VAR]) == sys.path
    assert seen[_kernel_cache.ENV_VAR] == str(tmp_path)
    assert seen[_background.ENV_VAR] == "0"
    assert seen["argv"][-1] == "builtins:dict"
    kernel._child.wait(60)
    assert kernel.ready() is True, fake.said


@pytest.mark.parametrize("setting", ["0", "false", "Off", "no"])
def test_background_compiles_can_be_switched_off(fake, monkeypatch, setting):
    monkeypatch.setenv(_background.ENV_VAR, setting)
    kernel = fake.make()
    assert kernel.ready() is True
    assert kernel._child is None and fake.said == []


def test_a_kernel_in_the_cache_or_compiled_here_is_ready_at_once(fake, tmp_path):
    (tmp_path / "kernel.nbi").write_bytes(b"")
    assert fake.make().ready() is True
    (tmp_path / "kernel.nbi").unlink()
    fake.module.kernel.signatures.append("int64")
    assert fake.make().ready() is True
    assert fake.said == []


def test_without_a_disk_cache_the_caller_compiles(fake, monkeypatch):
    """A child cannot hand a kernel over without a cache it can write."""
    monkeypatch.setattr(_kernel_cache, "directory_for_compiling", lambda: None)
    kernel = fake.make()
    assert kernel.ready() is True and kernel._child is None


def test_a_failed_child_gives_the_kernel_back_with_its_error(fake):
    kernel = fake.make(warm="builtins:no_such_function")
    assert kernel.ready() is False
    kernel._child.wait(60)
    assert kernel.ready() is True
    assert "failed (exit 1: AttributeError" in fake.said[-1], fake.said
    assert fake.said[-1].endswith("compiling it in this process.")


def test_a_child_that_cannot_start_gives_the_kernel_back(fake, monkeypatch):
    monkeypatch.setattr(sys, "executable", os.path.join(os.sep, "no", "such", "python"))
    kernel = fake.make()
    assert kernel.ready() is True
    assert len(fake.said) == 1 and fake.said[0].startswith("sera_opt: could not start")


def test_a_child_that_runs_too_long_is_stopped(fake, monkeypatch):
    kernel = fake.make()
    assert kernel.ready() is False
    monkeypatch.setattr(_background, "TIMEOUT_S", 0.0)
    assert kernel.ready() is True
    assert kernel._child.returncode is not None
    assert "was stopped; compiling it in this process." in fake.said[-1]


def test_a_forked_process_waits_for_the_cache_not_for_the_child(fake, tmp_path, monkeypatch):
    """A process forked while the child compiles cannot wait on the child: it keeps the
    interim kernel until the kernel's cache index appears (or the timeout passes)."""
    kernel = fake.make()
    assert kernel.ready() is False
    monkeypatch.setattr(kernel, "_owner", -1)
    assert kernel.ready() is False
    (tmp_path / "kernel.nbi").write_bytes(b"")
    assert kernel.ready() is True


def test_wait_for_kernels_returns_at_once_when_nothing_compiles():
    assert sera_opt.cache.wait_for_kernels(timeout=0) is True


def test_the_child_entry_checks_its_argument(capsys):
    assert _background._main([]) == 2
    assert "usage: python -m sera_opt._background MODULE:FUNCTION" in capsys.readouterr().err


FIRST_STEP = r"""
import json, sys
import numpy as np
from numba.core import event
recorder = event.RecordingListener()
event.register("numba:compile", recorder)
import sera_opt
from sera_opt._jit import kernels
m = int(sys.argv[1])
planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)
ids = np.arange(m)
first = planner.plan(ids, 8 * m)
rewards = (np.arange(int(first.counts.sum())) % 3 == 0).astype(np.float64)
planner.observe(np.repeat(ids, first.counts), rewards)
second = planner.plan(ids, 8 * m)
ready = sera_opt.cache.wait_for_kernels(timeout=600)
third = planner.plan(ids, 8 * m)
bracket = kernels("sera_opt.kernels.closed").bracket_solve
compiled = sorted({ev.data["dispatcher"].py_func.__qualname__
                   for _, ev in recorder.buffer if ev.is_start})
print(json.dumps({"counts": [first.counts.tolist(), second.counts.tolist(),
                             third.counts.tolist()],
                  "ready": ready, "loaded": len(bracket.signatures), "compiled": compiled}))
"""


def _first_step(cache, background: str, m: int = 1024):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update({"SERA_OPT_CACHE_DIR": str(cache), _background.ENV_VAR: background})
    out = subprocess.run([sys.executable, "-c", FIRST_STEP, str(m)], capture_output=True,
                         text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.slow
def test_a_first_large_step_does_not_wait_for_the_bracket_search(tmp_path):
    """1,024 prompts with 7,168 spare rollouts and an empty cache: the planner's process
    compiles the one-at-a-time kernel and not the bracket search, which a background
    process puts in the cache and the planner then loads; every plan's counts equal
    those of a process that compiled the bracket search itself."""
    (tmp_path / "background").mkdir()
    (tmp_path / "here").mkdir()
    got, notices = _first_step(tmp_path / "background", "1")
    want, _ = _first_step(tmp_path / "here", "0")
    assert got["counts"] == want["counts"]
    assert got["ready"] is True and got["loaded"] == 1
    assert "stepwise_counts" in got["compiled"]
    assert "bracket_solve" not in got["compiled"] and "_closed_count" not in got["compiled"]
    assert "bracket_solve" in want["compiled"]
    lines = notices.splitlines()
    assert sum("compiling kernels.closed.bracket_solve in a background process" in line
               for line in lines) == 1, notices
    assert sum(line.startswith("sera_opt: compiled kernels.closed.bracket_solve in a "
                               "background process in ") for line in lines) == 1, notices


@pytest.mark.slow
def test_the_warm_up_compiles_the_signature_the_library_calls(tmp_path):
    """The children's warm-up calls, solves through the policies and a round session's
    rounds compile one signature of each search between them (else the parent would
    compile it again)."""
    code = ("import sera_opt\n"
            "from sera_opt.kernels import closed\n"
            "from sera_opt.separable import utilities\n"
            "utilities.warm_bracket_search()\n"
            "utilities.warm_collecting_search()\n"
            "import numpy as np\n"
            "p = np.random.default_rng(0).uniform(0, 1, 1024)\n"
            "for alpha in (0.0, 1.0, 2.0):\n"
            "    sera_opt.get_policy('sera-fair', alpha=alpha).allocate(p, 8192, max_rollouts=64)\n"
            "planner = sera_opt.RolloutPlanner('sera-fair', alpha=1.0, offset=1, min_rollouts=2)\n"
            "session = planner.start_rounds(np.arange(1024), 16384, rounds=2, observe=False)\n"
            "while not session.done:\n"
            "    session.record(np.ones(int(session.next_round().sum())))\n"
            "sera_opt.get_policy('knapsack').allocate(p, 8192, max_rollouts=64)\n"
            "print(len(closed.bracket_solve.signatures), len(closed.collect_solve.signatures))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update({"SERA_OPT_CACHE_DIR": str(tmp_path), _background.ENV_VAR: "0"})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["1", "1"], out.stdout
