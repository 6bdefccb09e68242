"""Replay a recorded run under other allocation policies: what each would have spent.

A recorded run (verl's rollout dump, or a plain table of ``step, prompt_id, reward``)
is replayed step by step: each arm's planner plans the step's prompts at the recorded
budget from its own tracker, and its counts are scored against the recorded outcomes.
The replay measures the first-order effect only (:data:`FIRST_ORDER_NOTE`). ``records``
reads and writes the formats, ``engine`` replays, ``scores`` scores a step's counts and
summarizes over steps. The command is ``sera-opt replay`` (docs/replay.md).
"""

from .engine import FEEDS, FIRST_ORDER_NOTE, ReplayResult, ReplaySettings, replay
from .records import (
    EPOCH_RULE,
    PLAIN_FIELDS,
    VERL_FIELDS,
    RecordedRun,
    RecordedStep,
    RecordError,
    read_record,
    read_table,
    read_verl_dump,
    write_table,
    write_verl_dump,
)
from .scores import (
    DEFAULT_PRIOR,
    SCORE_NAMES,
    StepScores,
    beta_tail_moments,
    block_bootstrap_interval,
    score_counts,
    summarize,
)

__all__ = ["FEEDS", "FIRST_ORDER_NOTE", "ReplayResult", "ReplaySettings", "replay",
           "EPOCH_RULE", "PLAIN_FIELDS", "VERL_FIELDS", "RecordedRun", "RecordedStep",
           "RecordError", "read_record", "read_table", "read_verl_dump", "write_table",
           "write_verl_dump", "DEFAULT_PRIOR", "SCORE_NAMES", "StepScores",
           "beta_tail_moments", "block_bootstrap_interval", "score_counts", "summarize"]
