"""``python -m sera_opt.benchmarks.arithmetic``: the same as ``sera-opt bench arithmetic``."""

import sys

from sera_opt.benchmarks._harness import run_command
from sera_opt.benchmarks.arithmetic import main

if __name__ == "__main__":
    sys.exit(run_command("arithmetic", main))
