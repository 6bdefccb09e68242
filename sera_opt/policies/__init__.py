"""Allocation policies: the interface, the registry, SERA, uniform and the peers' rules."""

from .base import (
    POLICIES,
    AllocationPolicy,
    available_policies,
    get_policy,
    register_policy,
)
from .core import SERAPolicy, UniformPolicy, uniform_counts

__all__ = [
    "POLICIES",
    "AllocationPolicy",
    "SERAPolicy",
    "UniformPolicy",
    "available_policies",
    "get_policy",
    "register_policy",
    "uniform_counts",
]

# --- peers ---
from .bayes import PosteriorPolicy, SERABayesPolicy  # noqa: E402
from .fair import SERAFairPolicy  # noqa: E402
from .peers import GVMPolicy, HORAPolicy, KnapsackPolicy, VIPPolicy  # noqa: E402

__all__ += ["GVMPolicy", "HORAPolicy", "KnapsackPolicy", "PosteriorPolicy", "SERABayesPolicy",
            "SERAFairPolicy", "VIPPolicy"]
# --- end peers ---
