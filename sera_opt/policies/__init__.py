"""Allocation policies: the protocol, the registry, SERA, uniform, the alpha-fair family and
the peers' rules."""

from .base import DEFAULT_MAX_RATIO, AllocationPolicy, SeparablePolicy
from .bayes import PosteriorPolicy, SERABayesPolicy
from .core import EvenCounts, PaperSERAPolicy, SERAPolicy, UniformPolicy, uniform_counts
from .fair import SERAFairPolicy
from .peers import GVMPolicy, HORAPolicy, KnapsackPolicy, VIPPolicy
from .registry import (
    POLICIES,
    available_policies,
    get_policy,
    policy_from_config,
    register_policy,
)

__all__ = [
    "DEFAULT_MAX_RATIO",
    "POLICIES",
    "AllocationPolicy",
    "EvenCounts",
    "GVMPolicy",
    "HORAPolicy",
    "KnapsackPolicy",
    "PaperSERAPolicy",
    "PosteriorPolicy",
    "SERABayesPolicy",
    "SERAFairPolicy",
    "SERAPolicy",
    "SeparablePolicy",
    "UniformPolicy",
    "VIPPolicy",
    "available_policies",
    "get_policy",
    "policy_from_config",
    "register_policy",
    "uniform_counts",
]
