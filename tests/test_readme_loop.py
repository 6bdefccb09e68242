"""README.md's trainer loop ("## With a trainer") and docs/api.md's loop in rounds run as
written on a toy task.

The block is taken from the README itself, so it cannot drift. The toy task: prompts with
fixed success probabilities, a "model" of one logit per prompt, token log-probabilities that
depend on it. Checks: the default planner and the default estimator agree (offset 1, at least
two rollouts per prompt), the loss is finite with a gradient, the evidence arrives; and the
same loop with the counts planned for the other estimator is refused by the estimator.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sera_opt  # noqa: E402
from sera_opt import SeraOptError  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
PLANNER_LINE = "planner = sera_opt.RolloutPlanner(max_rollouts=32)"


def trainer_loop() -> str:
    section = README.read_text().split("## With a trainer", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the trainer section should hold one python block"
    return blocks[0]


class ToyTask:
    """Prompts with known success probabilities; a sampler that records what it was asked."""

    def __init__(self, num_prompts: int = 24, batch_size: int = 8, steps: int = 6):
        rng = np.random.default_rng(0)
        self.probs = rng.uniform(0.05, 0.95, num_prompts)
        self.ids = np.asarray([f"q{i}" for i in range(num_prompts)], dtype=str)
        self.batches = [rng.choice(num_prompts, batch_size, replace=False) for _ in range(steps)]
        self.logits = torch.zeros(num_prompts, requires_grad=True)
        self.generator = torch.Generator().manual_seed(0)
        self.calls: list[tuple[np.ndarray, torch.Tensor]] = []

    def loader(self):
        for rows in self.batches:
            yield _Batch(self.ids[rows], rows)

    def sample(self, batch, prompt_index):
        rows = torch.as_tensor(batch.rows)[prompt_index]
        p = torch.as_tensor(self.probs)[rows]
        rewards = torch.bernoulli(p, generator=self.generator)
        tokens = 5
        mask = torch.ones(len(rows), tokens)
        token_logprobs = torch.nn.functional.logsigmoid(self.logits[rows])[:, None].expand(-1, tokens)
        self.calls.append((batch.rows, prompt_index))
        return SimpleNamespace(rewards=rewards, prompt_ids=batch.prompt_ids[prompt_index.numpy()],
                               token_logprobs=token_logprobs, mask=mask)


class _Batch:
    def __init__(self, prompt_ids, rows):
        self.prompt_ids = prompt_ids
        self.rows = rows

    def __len__(self) -> int:
        return len(self.prompt_ids)


class _Model:
    """The toy task's one logit per prompt, as the parameters the README's optimizer takes."""

    def __init__(self, task: ToyTask):
        self._task = task

    def parameters(self):
        return [self._task.logits]


def run(code: str, task: ToyTask) -> dict:
    namespace = {"loader": task.loader(), "sample": task.sample, "model": _Model(task)}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (the README is ours)
    return namespace


def test_the_readme_loop_pairs_the_planner_with_the_estimator():
    code = trainer_loop()
    assert PLANNER_LINE in code, "the README's planner line changed; update this test"
    assert '"seq-mean-token-sum"' in code and "prompt_index=prompt_index" in code
    task = ToyTask()
    namespace = run(code, task)
    planner, alloc = namespace["planner"], namespace["alloc"]
    assert alloc.offset == sera_opt.ESTIMATOR_OFFSETS["mean_centred"] == 1
    assert planner.policy.name == sera_opt.planner.DEFAULT_POLICY
    assert planner.policy.min_rollouts == 2
    assert len(task.calls) == len(task.batches)
    for rows, prompt_index in task.calls:
        counts = np.bincount(prompt_index.numpy(), minlength=len(rows))
        assert counts.min() >= 2 and counts.sum() == 8 * len(rows)
    advantages, loss = namespace["advantages"], namespace["loss"]
    assert torch.isfinite(advantages).all() and torch.isfinite(loss)
    assert task.logits.grad is not None and torch.isfinite(task.logits.grad).all()
    # The optimizer stepped: the logits moved from their start at 0.
    assert "optimizer.step()" in code and bool((task.logits.detach() != 0).any())
    assert planner.tracker.step == len(task.batches)
    successes, failures = planner.tracker.evidence(task.ids[task.batches[0]])
    assert (successes + failures).min() >= 2  # every rollout of the first batch was observed


def test_the_estimator_refuses_the_planner_defaults_of_the_other_estimator():
    # The success-average pairing (offset 0, min_rollouts 1: the planner's defaults before)
    # under the README's mean-centred estimator.
    wrong = "planner = sera_opt.RolloutPlanner(offset=0, min_rollouts=1, max_rollouts=32)"
    with pytest.raises(SeraOptError, match="planned with offset=0.*Plan with offset=1"):
        run(trainer_loop().replace(PLANNER_LINE, wrong), ToyTask())


API = README.parent / "docs" / "api.md"


def rounds_loop() -> str:
    """The loop in rounds of docs/api.md's "Rounds within a step" (README links to it)."""
    section = API.read_text().split("## Rounds within a step", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, flags=re.S)
              if "start_rounds" in b]
    assert len(blocks) == 1, "the rounds section should hold one loop in rounds"
    return blocks[0]


def test_the_readme_rounds_loop_trains_at_the_fixed_budget():
    code = rounds_loop()
    assert "round_index=out.round_index" in code and "start_rounds" in code
    task = ToyTask()
    namespace = run("import torch\nimport sera_opt\n" + code, task)
    planner, out = namespace["planner"], namespace["out"]
    # rounds=4, asked for: four generation calls per step, every step's counts summing to its budget
    assert planner.round_policy.name == "uniform" and "rounds=4" in code
    assert len(task.calls) == 4 * len(task.batches) == 4 * 6
    assert out.counts.sum() == 8 * len(task.batches[-1]) and out.rounds == 4
    assert torch.isfinite(namespace["loss"]) and torch.isfinite(task.logits.grad).all()
    assert planner.tracker.step == len(task.batches)  # one update per step, no observe()
