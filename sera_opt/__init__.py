"""sera_opt: Scale-Equalized Rollout Allocation for Maximum Likelihood RL.

Decide how many rollouts each prompt gets so that the MaxRL estimator's
per-prompt attenuation factors ``w_c(p, n) = 1 - (1 - p) ** (n - c)`` are as
equal as a fixed budget allows, and turn the rollouts into a
multiplicity-corrected likelihood gradient.

``import sera_opt`` loads numpy and scipy only; numba, cvxpy and torch are
imported by the functions that need them.
"""

from importlib import import_module as _import_module

from . import cache
from ._version import __version__
from .api import allocate, waterline
from .exceptions import (
    InfeasibleBudgetError,
    MissingDependencyError,
    SeraOptError,
    SeraOptWarning,
    SolverError,
)
from .planner import RolloutPlanner
from .policies import (
    DEFAULT_MAX_RATIO,
    AllocationPolicy,
    SeparablePolicy,
    SERAFairPolicy,
    SERAPolicy,
    UniformPolicy,
    available_policies,
    get_policy,
    policy_from_config,
    register_policy,
)
from .problem import MAX_BUDGET, AllocationProblem, attenuation
from .result import Allocation
from .rounds import RoundResult, RoundSession
from .separable import SeparableObjective, solve_separable
from .solvers import Solver, available_solvers, get_solver, register_solver
from .tracking import EpochTracker, SuccessTracker

# Names whose modules import torch: loaded on first access so that
# `import sera_opt` stays light.
_LAZY = {
    # --- estimator (torch) ---
    "maxrl_advantages": ".estimator",
    "aggregate_loss": ".estimator",
    "policy_gradient_loss": ".estimator",
    "advantage_diagnostics": ".estimator",
    "group_statistics": ".estimator",
    "GroupStatistics": ".estimator",
    "ESTIMATORS": ".estimator",
    "ESTIMATOR_OFFSETS": ".estimator",
    "LOSS_MODES": ".estimator",
    "grpo_advantages": ".estimator",
    "GRPO_SCALES": ".estimator",
    "GRPO_EPSILON": ".estimator",
    # --- end estimator ---
}

#: The top-level surface: what ``from sera_opt import *`` binds and docs/api.md documents.
__all__ = [
    "__version__",
    # allocating
    "allocate", "waterline", "attenuation", "AllocationProblem", "Allocation", "MAX_BUDGET",
    # solvers and the separable engine
    "Solver", "available_solvers", "get_solver", "register_solver",
    "SeparableObjective", "solve_separable",
    # policies
    "AllocationPolicy", "SeparablePolicy", "SERAPolicy", "SERAFairPolicy", "UniformPolicy",
    "DEFAULT_MAX_RATIO", "available_policies", "get_policy", "policy_from_config",
    "register_policy",
    # tracking, planning, rounds
    "SuccessTracker", "EpochTracker", "RolloutPlanner", "RoundSession", "RoundResult",
    # the estimator (torch, loaded on first access)
    *_LAZY,
    # errors
    "SeraOptError", "SeraOptWarning", "InfeasibleBudgetError", "MissingDependencyError",
    "SolverError",
    # the compiled-kernel cache (a module)
    "cache",
]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sera_opt' has no attribute {name!r}")
    value = getattr(_import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


