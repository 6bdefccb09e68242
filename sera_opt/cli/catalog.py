"""The benchmarks ``sera-opt bench`` runs, each with its one-line description: the one place
that names them. ``sera-opt bench --help`` prints this list; docs/api.md and docs/cli.md
show the same set between ``<!-- benchmarks: begin -->`` and ``<!-- benchmarks: end -->``
(tests/test_cli_bench_list.py compares them).

The command line reaches the benchmarks through two entry-point groups the package declares
in pyproject.toml, :data:`BENCHMARK_GROUP` (``sera-opt bench NAME``) and :data:`COMMAND_GROUP`
(``sera-opt demo`` and ``sera-opt replay``): :func:`load_entry` loads one when it runs, so
that nothing in ``sera_opt`` imports ``sera_opt.benchmarks`` (the layers of
docs/architecture.md)."""

from __future__ import annotations

from ..exceptions import SeraOptError

__all__ = ["BENCHMARKS", "BENCHMARK_DESCRIPTIONS", "BENCHMARK_GROUP", "COMMAND_GROUP",
           "benchmark_list", "load_entry"]

#: Entry-point group of the benchmarks, one entry per name of :data:`BENCHMARKS` (its ``main``).
BENCHMARK_GROUP = "sera_opt.benchmarks"
#: Entry-point group of the other commands the benchmarks package provides (``demo``, ``replay``).
COMMAND_GROUP = "sera_opt.commands"

#: Name -> what the benchmark measures, in the order ``sera-opt bench --help`` lists them.
BENCHMARK_DESCRIPTIONS: dict[str, str] = {
    "solvers": "speed of every solver and policy against np.sort and np.log1p of the same array",
    "estimator": "the MaxRL estimator against one index_add_ over the same tensors",
    "tracking": "tracker, planner and peer-policy speed against numpy baselines",
    "rounds": "planning a step in rounds, the gradient scales it buys, the estimators' noise",
    "first-use": "what a new process with an empty kernel cache pays, and where it goes",
    "default-path": "the default allocation path: its kernels, the planner and first use",
    "trl-rounds": "what rounds cost through TRL's generation path on CPU (needs trl)",
    "alignment": "cosine of the MaxRL gradient estimates with the exact likelihood gradient",
    "maze": "pass@k coverage after MaxRL training on grid mazes, uniform against the policies",
    "arithmetic": "pass@k coverage of a tiny transformer learning addition by MaxRL",
    "trl-coverage": "SERA inside TRL against stock GRPOTrainer at equal steps and CPU time",
    "device": "the checks that need a CUDA device, in one command",
    "replay": "a recorded run replayed under other allocation policies (also `sera-opt replay`)",
    "verl": "a verl training step on CPU: generation, log-probs, update, sync, sera_opt's share",
}
BENCHMARKS: tuple[str, ...] = tuple(BENCHMARK_DESCRIPTIONS)


def benchmark_list(indent: str = "  ") -> str:
    """The names and descriptions, one benchmark a line, names aligned."""
    width = max(map(len, BENCHMARKS))
    return "\n".join(f"{indent}{name:<{width}}  {text}"
                     for name, text in BENCHMARK_DESCRIPTIONS.items())


def load_entry(group: str, name: str):
    """The callable that entry point ``name`` of ``group`` names, loaded (importing its
    module), or a :class:`SeraOptError` saying how to get it."""
    from importlib.metadata import entry_points

    found = sorted(entry_points(group=group, name=name), key=lambda entry: entry.value)
    if not found:
        raise SeraOptError(
            f"the installed sera_opt declares no {group!r} entry point named {name!r}, so "
            f"'{name}' cannot be run: the benchmarks are found through the package's metadata. "
            f"Reinstall it from the checkout (pip install -e . or pip install .)."
        )
    return found[0].load()
