"""How well MaxRL gradient estimates align with the exact likelihood gradient (digits).

``digits`` holds the data and the classifier that plays the policy, ``runner``
the comparison, its commands (``sera-opt bench alignment``, ``sera-opt demo``,
``python -m sera_opt.benchmarks.alignment``), the tables and the plot.
"""

from sera_opt.benchmarks.alignment.runner import (
    FULL,
    NAME,
    PEERS,
    QUICK,
    REPORT_PEERS,
    AlignmentConfig,
    Method,
    build_methods,
    check_peers,
    demo,
    format_table,
    main,
    plot,
    prepare,
    run,
)

__all__ = ["FULL", "NAME", "PEERS", "QUICK", "REPORT_PEERS", "AlignmentConfig", "Method",
           "build_methods", "check_peers", "demo", "format_table", "main", "plot", "prepare",
           "run"]
