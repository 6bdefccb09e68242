"""The alignment comparison's configuration and its methods: the budgets, the peers and
the arms (policy, probabilities it is fed, estimator offset, multiplicity correction)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import sera_opt
from sera_opt.benchmarks import _harness

NAME = "alignment"


#: Every registered policy but the ones the runner always draws (uniform, SERA and the
#: default sera-fair), in the registry's order.
PEERS = tuple(name for name in sera_opt.available_policies()
              if name not in ("uniform", "sera", "sera-fair"))


#: The peers of the run that decides the recommended default (docs/benchmarks.md,
#: "Choosing the default allocation"; uniform and SERA are always compared):
#: ``sera-opt bench alignment --peers`` followed by ``" ".join(REPORT_PEERS)``.
REPORT_PEERS = ("hora", "sera-fair:alpha=0", "sera-fair:alpha=1", "sera-fair:alpha=2")


ESTIMATORS = {0: "success_average", 1: "mean_centred"}


HISTOGRAM_BINS = (0.0, 1e-3, 0.01, 0.05, 0.2, 0.5, 0.8, 0.95, 0.99, 1.0)


@dataclass(frozen=True)
class AlignmentConfig:
    """Everything that determines the numbers (with ``seed``)."""

    budgets: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    batch_size: int = 256
    num_batches: int = 7
    draws: int = 32
    history_rollouts: int = 4
    max_ratio: int = 4
    peers: tuple[str, ...] = PEERS
    offsets: tuple[int, ...] = (0, 1)
    train_steps: int = 300
    history_lag: int = 50
    label_noise: float = 0.3
    hidden: int = 64
    temperature: float = 0.5
    seed: int = 0
    # Allocation in rounds within a step (arms with ``:rounds=R``), on the tracker's
    # posteriors updated round by round and on the true p. Their counts depend on the
    # rewards, so the expected estimator is a simulation: ``round_sessions`` sessions per
    # batch and budget (docs/theory.md section 9: kappa_i = P(K_i >= 1) - c p_i (1-p_i)^(n0-1)).
    round_arms: tuple[str, ...] = ("uniform:rounds=4", "sera-fair:alpha=1:rounds=4")
    round_sessions: int = 128


FULL = AlignmentConfig()


QUICK = replace(FULL, num_batches=2, draws=8, round_sessions=32)


@dataclass(frozen=True)
class Method:
    """One way of producing a batch gradient: allocation, its inputs, estimator."""

    policy: str  # a registered policy name, or a specification such as "sera-fair:alpha=1"
    source: str  # "true" (the exact p), "tracker" (posterior means) or "none" (uniform)
    offset: int
    multiplicity_correction: bool
    capped: bool = True  # max_rollouts = max_ratio * nbar; False: the policy's default

    @property
    def estimator(self) -> str:
        return ESTIMATORS[self.offset]

    @property
    def arm(self) -> _harness.ArmSpec:
        return _harness.parse_arm(self.policy)

    @property
    def in_rounds(self) -> bool:
        """Whether the method samples a step in rounds (``:rounds=R``, R >= 2)."""
        return self.policy != "uniform" and self.arm.rounds > 1

    @property
    def key(self) -> str:
        if self.policy == "uniform":
            return f"uniform c={self.offset}"
        corr = "corrected" if self.multiplicity_correction else "uncorrected"
        cap = "" if self.capped else "/uncapped"
        return f"{self.policy}/{self.source}/{corr}{cap} c={self.offset}"


def build_methods(config: AlignmentConfig, available: tuple[str, ...]) -> tuple[list[Method], list[str]]:
    """The methods to compare, and notes about peers that are not registered.

    Per offset: uniform; SERA on the tracker's estimates and on the true ``p``,
    with and without the multiplicity correction, under the common cap; SERA
    (corrected) on both sources with no cap at all (``max_ratio=None``), which is
    where raw probabilities pin hopeless prompts (docs/theory.md section 5); the
    registered peers on the tracker's estimates, with and without the correction.
    """
    methods: list[Method] = []
    notes: list[str] = []
    peers = []
    for name in dict.fromkeys(config.peers):
        if name in ("uniform", "sera"):
            notes.append(f"policy {name!r} is always compared; not repeated as a peer.")
        elif _harness.arm_policy_name(name) not in available:
            notes.append(f"policy {_harness.arm_policy_name(name)!r} is not registered in this "
                         f"sera_opt; {name!r} skipped.")
        else:
            peers.append(_harness.parse_arm(name, available=available).label)
    rounds = []
    for name in dict.fromkeys(config.round_arms):
        if _harness.arm_policy_name(name) not in available:
            notes.append(f"policy {_harness.arm_policy_name(name)!r} is not registered in this "
                         f"sera_opt; round arm {name!r} skipped.")
            continue
        spec = _harness.parse_arm(name, available=available)
        if spec.rounds < 2 or spec.is_reinforce_ada:
            raise sera_opt.SeraOptError(
                f"round arm {name!r} must be a policy with rounds=R (R >= 2), such as "
                "'uniform:rounds=4'; static arms go in peers.")
        rounds.append(spec.label)
    for c in config.offsets:
        # Uniform counts are all equal, so the correction (nbar / n_i = 1) changes nothing.
        methods.append(Method("uniform", "none", c, True))
        for source in ("tracker", "true"):
            for corr in (True, False):
                methods.append(Method("sera", source, c, corr))
        for source in ("tracker", "true"):
            methods.append(Method("sera", source, c, True, capped=False))
        for name in peers:
            for corr in (True, False):
                methods.append(Method(name, "tracker", c, corr))
        # In rounds: the counts are the rewards' doing, so only the corrected estimator
        # (the one whose per-prompt weight does not follow them).
        for name in rounds:
            for source in ("tracker", "true"):
                methods.append(Method(name, source, c, True))
    return methods, notes


# The demo's one peer beside uniform allocation (the planner's default) and SERA: the
# allocation by estimates to try first, sera-fair at alpha = 1 (docs/policies.md), as an
# arm. Its offset and minimum are the experiment's, set for every arm alike
# (RESERVED_OPTIONS).
DEMO_PEER_POLICY = "sera-fair"
DEMO_OPTIONS = {"alpha": 1.0}
DEMO_PEER = DEMO_PEER_POLICY + "".join(f":{k}={v:g}" for k, v in DEMO_OPTIONS.items())


def check_peers(config: AlignmentConfig) -> None:
    """Refuse, before anything runs, a peer that is malformed, unknown, or whose policy does
    not build and allocate with the benchmark's bounds (at each offset, largest budget)."""
    specs = _harness.parse_arms(config.peers)
    nbar = max(config.budgets)
    for c in config.offsets:
        lo = 1 + c
        _harness.check_arms(specs, min_rollouts=lo, max_rollouts=max(config.max_ratio * nbar, lo),
                            offset=c, num_prompts=config.batch_size,
                            budget=nbar * config.batch_size)
