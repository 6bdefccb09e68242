"""What each optimizer step of a training run spends, with the evaluations taken out.

The training experiments (``arithmetic``, ``maze``, ``trl_coverage``) compare their
arms at equal cost as well as at equal steps, so each records per step the CPU
seconds of training and generation (cumulative, evaluations excluded), the step's
wall seconds, and the task's counters (generated tokens or moves, generation
calls). :class:`StepCost` is that bookkeeping, written once::

    cost = StepCost(curves, {"tokens": ("tokens", float), "calls": ("generation_calls", int)})
    for step in steps:
        with cost.excluded():
            checkpoint(step)              # an evaluation: not the arm's CPU time
        cost.begin_step()
        ...                               # train; cost.count("tokens", n) as it generates
        with cost.end_step() as spent:    # records the step; the block is evaluation
            grid.step_end(step + 1, spent)

``spent`` holds the cumulative amounts (``cpu_s`` and one entry per counter), the
input of :meth:`sera_opt.benchmarks._harness.CostGrid.step_end`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StepCost", "cost_per_step"]


class StepCost:
    """Per-step cost curves of one run, appended to ``curves``.

    Parameters
    ----------
    curves : dict
        The run's curves; ``cpu_s`` (cumulative CPU seconds at each step's end),
        ``wall_key`` (the step's wall seconds) and each counter's curve (the step's
        amount) are created there as empty lists.
    counters : dict
        Each counter's name in :attr:`spent` mapped to ``(curve key, type)``, e.g.
        ``{"calls": ("generation_calls", int)}``.
    wall_key : str, default "step_wall_s"
        The curve of the steps' wall seconds.

    The CPU clock starts when the object is made: make it right before the first step.
    """

    def __init__(self, curves: dict[str, list], counters: dict[str, tuple[str, type]], *,
                 wall_key: str = "step_wall_s"):
        if "cpu_s" in counters:
            raise ValueError("cpu_s is the CPU clock, not a counter; name the counter otherwise.")
        self.curves = curves
        self.counters = dict(counters)
        self.wall_key = wall_key
        for key in ("cpu_s", wall_key, *(curve for curve, _ in self.counters.values())):
            curves[key] = []
        #: Cumulative amounts: ``cpu_s`` (at the last step's end) and every counter.
        self.spent: dict[str, float] = {"cpu_s": 0.0, **{name: 0.0 for name in self.counters}}
        self._excluded = 0.0
        self._cpu_start = time.process_time()
        self._wall = time.perf_counter()
        self._before = dict(self.spent)

    def count(self, name: str, amount: float) -> None:
        """Add ``amount`` to counter ``name`` (tokens generated, one generation call)."""
        self.spent[name] += float(amount)

    def begin_step(self) -> None:
        """Mark the start of a step: its wall clock and its counters start here."""
        self._wall = time.perf_counter()
        self._before = dict(self.spent)

    def cpu_s(self) -> float:
        """CPU seconds spent so far, evaluations excluded."""
        return time.process_time() - self._cpu_start - self._excluded

    @contextmanager
    def end_step(self) -> Iterator[dict[str, float]]:
        """Record the step that :meth:`begin_step` started and yield the cumulative amounts;
        the CPU time of the ``with`` block (evaluations) is not the run's."""
        wall = time.perf_counter() - self._wall
        pause = time.process_time()
        self.spent["cpu_s"] = pause - self._cpu_start - self._excluded
        self.curves["cpu_s"].append(self.spent["cpu_s"])
        self.curves[self.wall_key].append(wall)
        for name, (curve, kind) in self.counters.items():
            self.curves[curve].append(kind(self.spent[name] - self._before[name]))
        try:
            yield dict(self.spent)
        finally:
            self._excluded += time.process_time() - pause

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """A block whose CPU time is not the run's (an evaluation between steps)."""
        pause = time.process_time()
        try:
            yield
        finally:
            self._excluded += time.process_time() - pause

    @property
    def excluded_cpu_s(self) -> float:
        """The CPU seconds taken out so far."""
        return self._excluded


def cost_per_step(curves_by_run: list[dict[str, Any]], counters: dict[str, str]
                  ) -> dict[str, float]:
    """Means over runs of what a step spends: ``cpu_s_per_step`` and ``training_cpu_s``
    from the ``cpu_s`` curves, and ``<name>_per_step`` for each ``name -> curve key`` of
    ``counters`` (runs without steps are left out)."""
    import numpy as np

    runs = [c for c in curves_by_run if c.get("cpu_s")]
    out = {"cpu_s_per_step": float(np.mean([c["cpu_s"][-1] / len(c["cpu_s"]) for c in runs]))
           if runs else float("nan"),
           "training_cpu_s": float(np.mean([c["cpu_s"][-1] for c in runs]))
           if runs else float("nan")}
    for name, curve in counters.items():
        rows = [np.mean(c[curve]) for c in runs if c.get(curve)]
        out[f"{name}_per_step"] = float(np.mean(rows)) if rows else float("nan")
    return out
