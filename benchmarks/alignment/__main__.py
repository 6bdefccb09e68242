"""``python -m sera_opt.benchmarks.alignment``: the same as ``sera-opt bench alignment``."""

import sys

from sera_opt.benchmarks._harness import run_command
from sera_opt.benchmarks.alignment import main

if __name__ == "__main__":
    sys.exit(run_command("alignment", main))
