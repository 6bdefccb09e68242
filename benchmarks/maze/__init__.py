"""Maze navigation coverage: pass@k after MaxRL training under matched rollout budgets.

``env`` holds the mazes and the vectorized environment, ``train`` the policy,
the warm-up, the MaxRL arms and the evaluation, ``runner`` the command
(``sera-opt bench maze`` or ``python -m sera_opt.benchmarks.maze``), the
summary over seeds and the plots.
"""

from sera_opt.benchmarks.maze.runner import (
    BIN_KS,
    NAME,
    PATH_BINS,
    REPORT_ARMS,
    REPORT_KS,
    build_parser,
    main,
    plot,
    run,
    summarize,
)

__all__ = ["BIN_KS", "NAME", "REPORT_ARMS", "PATH_BINS", "REPORT_KS", "build_parser", "main",
           "plot", "run", "summarize"]
