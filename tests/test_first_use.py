"""First use: a new user's first step compiles only the kernels it runs.

numba compiles a kernel together with everything it can call, so what a first call
compiles is decided by which kernel it enters. The time this takes is measured by
``sera-opt bench first-use`` (docs/benchmarks.md), never here; these tests hold the
structure that keeps it short: a fresh process with an empty kernel cache runs the
default planner's first step and reports which kernels numba compiled.
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
planner = sera_opt.RolloutPlanner(tracker=sera_opt.SuccessTracker(decay=decay))
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

# What only larger problems, other policies or a tracker with decay need.
GENERAL_ENGINE = ("sera_opt.kernels.entries.solve", "sera_opt.kernels.general.select_spare")
SUBSAMPLE_SEARCH = ("sera_opt.kernels.closed.closed_counts_sampled",
                    "sera_opt.kernels.closed.closed_counts_sampled_exact",
                    "sera_opt.kernels.closed.strided_subsample")
BRACKET_SEARCH = ("sera_opt.kernels.closed.closed_counts",)
DECAY = ("sera_opt.tracking.evidence_kernels._expire",
         "sera_opt.tracking.evidence_kernels.update_evidence_decayed")


def first_step(tmp_path, prompts: int, decay: float = 1.0) -> list[tuple[str, str]]:
    """The kernels (name, signature) a fresh process compiles for the default planner's
    first step (plan, observe, plan) over ``prompts`` prompts, the tracker's ``decay``
    given."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["SERA_OPT_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", STEP, str(prompts), repr(decay)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr
    return [tuple(row) for row in json.loads(out.stdout.strip().splitlines()[-1])]


def names(compiled):
    return {name for name, _ in compiled}


@pytest.mark.slow
def test_a_small_first_step_compiles_the_one_at_a_time_kernel_only(tmp_path):
    """64 prompts, 8 rollouts each, the default planner (sera-fair, no decay): the spare
    rollouts are few, so the step enters ``stepwise_counts``; neither bracket search, nor
    the general engine, nor the decayed tracker's expiry is compiled, and no kernel is
    compiled twice (once per literal value, or for read-only and writable arrays)."""
    compiled = first_step(tmp_path, 64)
    got = names(compiled)
    assert "sera_opt.kernels.closed.stepwise_counts" in got
    assert "sera_opt.tracking.evidence_kernels.update_evidence" in got
    for name in GENERAL_ENGINE + SUBSAMPLE_SEARCH + BRACKET_SEARCH + DECAY:
        assert name not in got, f"{name} compiled on a small first step"
    ours = [name for name, _ in compiled if name.startswith("sera_opt.")]
    assert len(ours) == len(set(ours)), sorted(n for n in ours if ours.count(n) > 1)


@pytest.mark.slow
def test_a_batch_of_a_thousand_compiles_each_helper_once_and_no_general_engine(tmp_path):
    """1,024 prompts open the closed-form search from a subsample solved by the search
    itself: the general engine (which only subsamples of 32,768-prompt batches use) is not
    compiled, and each helper compiles for one signature."""
    compiled = first_step(tmp_path, 1024)
    got = names(compiled)
    assert "sera_opt.kernels.closed.closed_counts_sampled" in got
    for name in GENERAL_ENGINE + ("sera_opt.kernels.closed.closed_counts_sampled_exact",) + DECAY:
        assert name not in got, f"{name} compiled for 1,024 prompts"
    ours = [name for name, _ in compiled if name.startswith("sera_opt.")]
    assert len(ours) == len(set(ours)), sorted(n for n in ours if ours.count(n) > 1)


@pytest.mark.slow
def test_a_tracker_with_decay_compiles_its_own_update(tmp_path):
    """With decay the tracker enters the kernel with the expiry calendar, and only it."""
    got = names(first_step(tmp_path, 64, decay=0.97))
    assert "sera_opt.tracking.evidence_kernels.update_evidence_decayed" in got
    assert "sera_opt.tracking.evidence_kernels.update_evidence" not in got
