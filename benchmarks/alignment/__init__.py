"""How well MaxRL gradient estimates align with the exact likelihood gradient (digits).

``digits`` holds the data and the classifier that plays the policy, ``config`` the
configuration and the methods, ``gradients`` the gradient mathematics, ``runner``
the comparison, ``report`` the tables and the plot, ``command`` the commands
(``sera-opt bench alignment``, ``sera-opt demo``, ``python -m sera_opt.benchmarks.alignment``).
"""

from sera_opt.benchmarks.alignment.command import demo, main
from sera_opt.benchmarks.alignment.config import (
    FULL,
    NAME,
    PEERS,
    QUICK,
    REPORT_PEERS,
    AlignmentConfig,
    Method,
    build_methods,
    check_peers,
)
from sera_opt.benchmarks.alignment.gradients import prepare
from sera_opt.benchmarks.alignment.report import format_table, plot
from sera_opt.benchmarks.alignment.runner import run

__all__ = ["FULL", "NAME", "PEERS", "QUICK", "REPORT_PEERS", "AlignmentConfig", "Method",
           "build_methods", "check_peers", "demo", "format_table", "main", "plot", "prepare",
           "run"]
