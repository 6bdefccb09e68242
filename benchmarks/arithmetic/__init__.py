"""Reasoning coverage: a tiny transformer learns addition by MaxRL, uniform versus the policies.

``task`` holds the addition problems, the tokenizer and the verifier, ``model``
the transformer and its sampler, ``train`` the configuration, the warm start,
the MaxRL runs and the evaluation of one seed, ``runner`` the command
(``sera-opt bench arithmetic`` or ``python -m sera_opt.benchmarks.arithmetic``),
the summary over seeds and the plots.
"""

from sera_opt.benchmarks.arithmetic.runner import (
    NAME,
    REPORT_ARMS,
    build_parser,
    config_from_args,
    main,
    resolve_device,
    run_experiment,
)
from sera_opt.benchmarks.arithmetic.train import PRESETS, ExperimentConfig, pass_at_k_curve

__all__ = ["NAME", "PRESETS", "REPORT_ARMS", "ExperimentConfig", "build_parser",
           "config_from_args", "main", "pass_at_k_curve", "resolve_device", "run_experiment"]
