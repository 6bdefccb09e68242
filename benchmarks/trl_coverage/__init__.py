"""More coverage per hour: SERA inside TRL against stock GRPOTrainer, at equal steps and CPU time.

``task`` holds the addition prompts, the tiny GPT-2, the reward, the held-out
evaluation and the supervised warm start; ``train`` the configuration, the arms
and one (seed, arm) run with its per-step costs; ``runner`` the command
(``sera-opt bench trl-coverage`` or ``python -m sera_opt.benchmarks.trl_coverage``),
the paired summary over seeds and the plots. Needs trl 1.16 (``pip install
'sera_opt[trl]'``); importing this package does not import trl.
"""

from sera_opt.benchmarks.trl_coverage.runner import NAME, build_parser, main, summarize
from sera_opt.benchmarks.trl_coverage.train import (
    ARMS,
    BASELINES,
    PRESETS,
    CoverageConfig,
    parse_arm,
    parse_arms,
)

__all__ = ["ARMS", "BASELINES", "NAME", "PRESETS", "CoverageConfig", "build_parser", "main",
           "parse_arm", "parse_arms", "summarize"]
