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
# --- end peers ---
