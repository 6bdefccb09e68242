"""The object a training loop holds: estimates before sampling, evidence after.

    planner = sera_opt.RolloutPlanner("sera", max_rollouts=32)
    for batch in loader:
        alloc = planner.plan(batch.prompt_ids, budget=8 * len(batch))
        rollouts = sample(batch, alloc.counts)              # the trainer's job
        planner.observe(rollouts.prompt_ids, rollouts.rewards)
    torch.save({"planner": planner.state_dict(), ...}, path)
"""

from __future__ import annotations

import inspect
from typing import Any

from .exceptions import SeraOptError
from .policies import AllocationPolicy, get_policy
from .result import Allocation
from .tracking import SuccessTracker

__all__ = ["RolloutPlanner"]

_FORMAT = "sera_opt.RolloutPlanner/1"


def _keywords(func) -> set[str]:
    return set(inspect.signature(func).parameters)


class RolloutPlanner:
    """A success tracker and an allocation policy behind two calls.

    :meth:`plan` turns the next batch's prompt ids and a rollout budget into
    counts: the tracker's posterior-mean estimates go to the policy (policies
    that allocate under uncertainty, such as ``"sera-bayes"`` and ``"hora"``,
    also receive the Beta posteriors). :meth:`observe` feeds the rewards of
    the rollouts back into the tracker.

    Parameters
    ----------
    policy : str or AllocationPolicy, default "sera"
        A registered policy name (see :func:`sera_opt.available_policies`) or
        an instance.
    tracker : SuccessTracker, optional
        Defaults to ``SuccessTracker()`` (fitted prior, no forgetting).
    **policy_options
        Passed to the policy's constructor (e.g. ``max_rollouts=32``,
        ``offset=1``).
    """

    def __init__(self, policy="sera", tracker: SuccessTracker | None = None,
                 **policy_options: Any):
        self.policy: AllocationPolicy = get_policy(policy, **policy_options)
        if tracker is None:
            tracker = SuccessTracker()
        elif not isinstance(tracker, SuccessTracker):
            raise SeraOptError(
                f"tracker must be a sera_opt.SuccessTracker, got {type(tracker).__name__}."
            )
        self.tracker = tracker

    @property
    def uses_posterior(self) -> bool:
        """Whether the policy receives the tracker's Beta posteriors."""
        return bool(getattr(self.policy, "accepts_posterior", False))

    def plan(self, prompt_ids, budget, *, min_rollouts=None, max_rollouts=None,
             **allocate_options: Any) -> Allocation:
        """Counts for the prompts ``prompt_ids`` (one entry per prompt, in order).

        Parameters
        ----------
        prompt_ids : array_like of int or str, shape (M,)
            The batch's prompts. Unseen prompts are estimated from the prior.
        budget : int
            Total rollouts for the batch.
        min_rollouts, max_rollouts : int or array_like, optional
            Override the policy's bounds for this batch.
        **allocate_options
            Extra keywords for the policy's ``allocate`` (e.g. GVM's
            ``gradient_norms``).

        Returns
        -------
        Allocation
            ``counts[j]`` is the number of rollouts for ``prompt_ids[j]``.
        """
        if self.uses_posterior:
            if "posterior" in allocate_options:
                raise SeraOptError(
                    "the planner passes the tracker's posterior itself; do not pass posterior=."
                )
            alpha, beta = self.tracker.posterior(prompt_ids)
            allocate_options["posterior"] = (alpha, beta)
            success_probs = None
        else:
            success_probs = self.tracker.estimate(prompt_ids)
        accepted = _keywords(self.policy.allocate)
        unknown = sorted(set(allocate_options) - accepted)
        if unknown:
            raise SeraOptError(
                f"policy {self.policy.name!r} does not take {', '.join(map(repr, unknown))}; "
                f"its allocate() takes {sorted(accepted - {'success_probs', 'budget'})}."
            )
        return self.policy.allocate(success_probs, budget, min_rollouts=min_rollouts,
                                    max_rollouts=max_rollouts, **allocate_options)

    def observe(self, prompt_ids, rewards) -> RolloutPlanner:
        """Record rollout outcomes (one entry per rollout); see :meth:`SuccessTracker.update`."""
        self.tracker.update(prompt_ids, rewards)
        return self

    def state_dict(self) -> dict[str, Any]:
        """The tracker's state and the policy's name and options, for checkpoints."""
        return {
            "format": _FORMAT,
            "policy": self.policy.name,
            "policy_options": self.policy._options(),
            "tracker": self.tracker.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> RolloutPlanner:
        """Restore a :meth:`state_dict`: the tracker exactly, and the policy (rebuilt
        from its registered name and options). Returns ``self``."""
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise SeraOptError(
                f"not a RolloutPlanner state (expected format {_FORMAT!r}); pass the dict that "
                f"RolloutPlanner.state_dict() returned."
            )
        try:
            policy = get_policy(state["policy"], **dict(state["policy_options"]))
        except KeyError as exc:
            raise SeraOptError(f"malformed RolloutPlanner state: missing {exc}.") from None
        self.tracker.load_state_dict(state["tracker"])
        self.policy = policy
        return self

    def __repr__(self) -> str:
        return f"RolloutPlanner(policy={self.policy!r}, tracker={self.tracker!r})"
