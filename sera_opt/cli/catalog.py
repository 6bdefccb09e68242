"""The benchmarks ``sera-opt bench`` runs, each with its one-line description: the one place
that names them. ``sera-opt bench --help`` prints this list; docs/api.md and docs/cli.md
show the same set between ``<!-- benchmarks: begin -->`` and ``<!-- benchmarks: end -->``
(tests/test_cli_bench_list.py compares them). Nothing here imports a benchmark."""

from __future__ import annotations

__all__ = ["BENCHMARKS", "BENCHMARK_DESCRIPTIONS", "benchmark_list"]

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
