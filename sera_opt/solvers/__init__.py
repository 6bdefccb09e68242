"""Allocation solvers behind one registry, in preference order.

``"waterline"`` (default): closed-form relaxation + exact integer allocation, numba.
``"milp"``: exact lexicographic max-min by MILPs through cvxpy, the certifying reference.
``"greedy"``: one rollout at a time in pure Python, the obviously-correct reference.
"""

from .base import (
    SOLVERS,
    CallableSolver,
    Solver,
    available_solvers,
    get_solver,
    register_solver,
)
from .greedy import GreedySolver
from .milp import MILPSolver
from .waterline import WaterlineSolver

__all__ = [
    "SOLVERS",
    "CallableSolver",
    "GreedySolver",
    "MILPSolver",
    "Solver",
    "WaterlineSolver",
    "available_solvers",
    "get_solver",
    "register_solver",
]
