"""First use: a new user's first step compiles only the kernels it runs.

numba compiles a kernel together with everything it can call, so what a first call
compiles is decided by which kernel it enters. The time this takes is measured by
``sera-opt bench first-use`` (docs/benchmarks.md), never here; these tests hold the
structure that keeps it short: a fresh process with an empty kernel cache runs a
planner's first step and reports which kernels numba compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

STEP = r"""
import json, sys
import numpy as np
from numba.core import event
recorder = event.RecordingListener()
event.register("numba:compile", recorder)
import sera_opt
m = int(sys.argv[1])
decay = float(sys.argv[2])
tracker = sera_opt.SuccessTracker(decay=decay)
if sys.argv[3] == "default":
    planner = sera_opt.RolloutPlanner(tracker=tracker)
else:  # the planner by estimates, sera-fair at alpha 1
    planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2,
                                      tracker=tracker)
ids = np.arange(m)
first = planner.plan(ids, 8 * m)
rewards = (np.arange(int(first.counts.sum())) % 3 == 0).astype(np.float64)
planner.observe(np.repeat(ids, first.counts), rewards)
planner.plan(ids, 8 * m)
compiled = []
for _, ev in recorder.buffer:
    if ev.is_start:
        f = ev.data["dispatcher"].py_func
        compiled.append([f.__module__ + "." + f.__qualname__, str(ev.data["args"])])
print(json.dumps(compiled))
"""

# What only the largest problems, other policies or a tracker with decay need.
GENERAL_ENGINE = ("sera_opt.kernels.entries.solve", "sera_opt.kernels.general.select_spare")
LARGEST = ("sera_opt.kernels.closed.closed_counts_sampled_exact",
           "sera_opt.kernels.closed._opened_exactly")
DECAY = ("sera_opt.tracking.evidence_kernels._expire",
         "sera_opt.tracking.evidence_kernels.update_evidence_decayed")


def first_step(tmp_path, prompts: int, decay: float = 1.0,
               planner: str = "sera-fair") -> list[tuple[str, str]]:
    """The kernels (name, signature) a fresh process compiles for a planner's first step
    (plan, observe, plan) over ``prompts`` prompts, the tracker's ``decay`` given:
    ``RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)``, or with
    ``planner="default"`` ``RolloutPlanner()``."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["SERA_OPT_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", STEP, str(prompts), repr(decay), planner],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr
    return [tuple(row) for row in json.loads(out.stdout.strip().splitlines()[-1])]


def names(compiled):
    return {name for name, _ in compiled}


# The closed-form kinds' bracket search: a first step with a small spare never compiles it.
BRACKET = ("sera_opt.kernels.closed.bracket_solve", "sera_opt.kernels.closed._closed_count",
           "sera_opt.kernels.closed._closed_narrow")


@pytest.mark.slow
def test_a_first_step_compiles_only_the_way_of_solving_it_takes(tmp_path):
    """64 and 1,024 prompts, 8 rollouts each, the planner by estimates (sera-fair, no decay).
    64 prompts have 448 spare rollouts, handed out one at a time: that first step compiles
    the one-at-a-time kernel and not the bracket search (the demo's and a small batch's
    first use, a fifth of the bracket search's compile). 1,024 prompts have 7,168: that
    first step compiles the bracket search and not the one-at-a-time kernel. Neither
    compiles the general engine, the largest problems' kernel or the decayed tracker's
    expiry, and no kernel is compiled twice (once per literal value, or for read-only and
    writable arrays)."""
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    small = first_step(tmp_path / "small", 64)
    large = first_step(tmp_path / "large", 1024)
    assert "sera_opt.kernels.closed.stepwise_counts" in names(small)
    assert "sera_opt.tracking.evidence_kernels.update_evidence" in names(small)
    for name in BRACKET:
        assert name not in names(small), f"{name} compiled for a small spare"
        assert name in names(large), f"{name} not compiled for a large spare"
    assert "sera_opt.kernels.closed.stepwise_counts" not in names(large)
    for compiled in (small, large):
        got = names(compiled)
        for name in GENERAL_ENGINE + LARGEST + DECAY:
            assert name not in got, f"{name} compiled on a first step"
        ours = [name for name, _ in compiled if name.startswith("sera_opt.")]
        assert len(ours) == len(set(ours)), sorted(n for n in ours if ours.count(n) > 1)


@pytest.mark.slow
def test_the_default_planner_compiles_no_solver(tmp_path):
    """RolloutPlanner() allocates uniformly: its first step compiles the tracker's update
    and no allocation kernel."""
    got = names(first_step(tmp_path, 1024, planner="default"))
    assert "sera_opt.tracking.evidence_kernels.update_evidence" in got
    solvers = sorted(n for n in got if n.startswith(("sera_opt.kernels.", "sera_opt.solvers.")))
    assert not solvers, solvers


@pytest.mark.slow
def test_a_tracker_with_decay_compiles_its_own_update(tmp_path):
    """With decay the tracker enters the kernel with the expiry calendar, and only it."""
    got = names(first_step(tmp_path, 64, decay=0.97))
    assert "sera_opt.tracking.evidence_kernels.update_evidence_decayed" in got
    assert "sera_opt.tracking.evidence_kernels.update_evidence" not in got


NOTICES = r"""
import sys
import numpy as np
import sera_opt, sera_opt._jit as jit
jit.DONE_AFTER_S = 0.0
planner = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2)
planner.plan(np.arange(64), 512)
print("--", file=sys.stderr, flush=True)
planner.plan(np.arange(64), 512)
"""


@pytest.mark.slow
def test_the_notice_says_what_it_compiles_and_when_it_is_done(tmp_path):
    """A first plan's notices on standard error: one that compiling starts, naming the
    kernel, and one per kernel compiled outermost, naming it with its seconds; the
    solver's kernel among them. A second plan in the process compiles nothing and is
    quiet; so is a new process that loads the kernels from the cache."""
    from sera_opt._jit import MESSAGE

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["SERA_OPT_CACHE_DIR"] = str(tmp_path)
    runs = [subprocess.run([sys.executable, "-c", NOTICES], capture_output=True, text=True,
                           env=env, timeout=900) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    first, again = runs[0].stderr.split("--\n")
    lines = first.splitlines()
    assert sum(MESSAGE in line for line in lines) == 1, first
    assert lines[0].startswith(MESSAGE + ": ") and lines[0].endswith(" ..."), first
    done = [line for line in lines if line.startswith("sera_opt: compiled ")]
    assert any(line.startswith("sera_opt: compiled kernels.closed.stepwise_counts in ")
               and line.endswith(" s") for line in done), first
    assert again == "", again
    assert runs[1].stderr == "--\n", runs[1].stderr
