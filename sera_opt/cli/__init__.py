"""The ``sera-opt`` command.

``sera-opt allocate``  allocate a budget over prompts read from CSV, JSON, .npy or stdin
``sera-opt bench NAME``  run a benchmark or experiment (solvers, estimator, alignment, ...)
``sera-opt demo``  the quick alignment comparison on scikit-learn's digits
``sera-opt replay RECORD``  replay a recorded run under allocation policies (docs/replay.md)
``sera-opt cache [info|clear]``  where the compiled kernels are cached, whether they are there; remove them
``sera-opt --version``  the versions, and where the kernel cache is

Exit status: 0 on success; 2 when the command line or the input is wrong, with one line
on stderr that says what to fix; 1 when sera_opt fails in a way it did not foresee (one
line on stderr naming the exception and the file that holds its traceback;
``sera-opt --traceback ...`` prints the traceback instead); 130 when interrupted.

The package's modules: :mod:`.sources` and :mod:`.tables` read the input,
:mod:`.options` builds the policy from ``--option``, :mod:`.commands` runs the
subcommands, :mod:`.errors` reports failures and :mod:`.parser` holds :func:`main`.
"""

from __future__ import annotations

from .commands import BENCH_DEFAULT_OUT, BENCHMARKS
from .options import MAX_DIGITS
from .parser import build_parser, main
from .sources import MAX_INPUT_BYTES, read_success_probs

__all__ = ["main", "build_parser", "read_success_probs"]
