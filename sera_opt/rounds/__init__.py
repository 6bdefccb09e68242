"""Allocation in rounds within a step: the session that spends one step's budget over
several rounds (:mod:`.session`), what it drew and its driver loop (:mod:`.result`), and
the exact scale of a per-prompt round rule (:mod:`.scales`, :mod:`.reinforce_ada`;
docs/theory.md section 9)."""

from .reinforce_ada import ReinforceAda, ReinforceAdaSession, reinforce_ada_scale
from .scales import BASELINES, RuleScale, balanced_rule, first_success_rule, fixed_rule, rule_scale
from .session import (
    DEFAULT_ROUNDS,
    ROUND_MODES,
    RoundResult,
    RoundSession,
    round_budgets,
    run_rounds,
)

__all__ = ["RoundSession", "RoundResult", "round_budgets", "run_rounds", "DEFAULT_ROUNDS",
           "ROUND_MODES", "RuleScale", "rule_scale", "fixed_rule", "first_success_rule",
           "balanced_rule", "BASELINES", "ReinforceAda", "ReinforceAdaSession",
           "reinforce_ada_scale"]
