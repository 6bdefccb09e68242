"""``python -m sera_opt.benchmarks.maze``: the same as ``sera-opt bench maze``."""

import sys

from sera_opt.benchmarks._harness import run_command
from sera_opt.benchmarks.maze import main

if __name__ == "__main__":
    sys.exit(run_command("maze", main))
