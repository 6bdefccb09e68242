"""``python -m sera_opt.benchmarks.trl_coverage``: the same as ``sera-opt bench trl-coverage``."""

import sys

from sera_opt.benchmarks._harness import run_command
from sera_opt.benchmarks.trl_coverage import main

if __name__ == "__main__":
    sys.exit(run_command("trl-coverage", main))
