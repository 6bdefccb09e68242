"""The task, model and evaluation of the TRL coverage experiment, built in code.

The prompts are the arithmetic experiment's addition problems
(:mod:`sera_opt.benchmarks.arithmetic.task`): ``"{a}+{b}="`` left-padded with
blanks to one width, answered by the sum written least significant digit first,
then the end token. Prompts of one width need no pad tokens: GPT-2's learned
positions would otherwise differ between ``generate`` (positions counted from
the first real token) and the trainers' log-probability pass (counted from the
first pad). Sums of 1 to
``max_digits + 1`` digits make completions of varying length. The model is the
2-layer GPT-2 of :mod:`sera_opt.integrations.trl_tiny` with its character-level
tokenizer over the task's characters; nothing is downloaded.

A completion is correct when it is exactly the reversed sum followed by the end
token (a completion cut off by ``max_completion_length`` before its end token is
wrong). :func:`make_reward` is that check as a TRL reward function;
:func:`count_correct` samples the held-out problems with ``generate`` at the
trainers' sampling settings (temperature 1, no top-k or top-p cut) and counts
the correct completions; :func:`warm_start` is the supervised phase that every
arm of a seed starts from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CHARACTERS", "build", "make_reward", "encode_prompts", "count_correct",
           "warm_start"]

#: The characters of prompts and answers; each is one token of the tokenizer.
CHARACTERS = " 0123456789+="


def build(*, seed: int, n_embd: int, n_layer: int, n_head: int):
    """``(tokenizer, model)``: the character tokenizer and a fresh tiny GPT-2 (weights from ``seed``)."""
    from sera_opt.integrations.trl_tiny import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer(CHARACTERS)
    # No dropout: GRPOTrainer samples its completions in training mode, where dropout would
    # make them noisier than the policy being evaluated.
    model = build_tiny_model(tokenizer, seed=seed, n_embd=n_embd, n_layer=n_layer,
                             n_head=n_head, dropout=0.0)
    return tokenizer, model


def prompts_and_answers(problems) -> tuple[list[str], list[str]]:
    """The prompts (``"a+b="``, blank-padded to one width) and the reversed sums."""
    prompts = problems.prompts()
    answers = [str(a + b)[::-1] for a, b in zip(problems.a.tolist(), problems.b.tolist())]
    return prompts, answers


def make_reward(eos_token_id: int, record: list | None = None):
    """A TRL reward function: 1.0 for the exact reversed sum ended by the end token.

    Reads the dataset's ``answer`` column (TRL passes every column as a keyword)
    and the completion's token ids. When ``record`` is a list, each call appends
    ``(rows, correct)`` to it, so that the experiment counts reward calls.
    """
    def addition_reward(prompts, completions, completion_ids, answer, **_: Any) -> list[float]:
        rewards = [float(bool(ids) and ids[-1] == eos_token_id and text == expected)
                   for text, ids, expected in zip(completions, completion_ids, answer,
                                                  strict=True)]
        if record is not None:
            record.append((len(rewards), sum(rewards)))
        return rewards

    return addition_reward


def _token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    # One token per character: a table lookup instead of the tokenizer's pipeline.
    vocab = tokenizer.get_vocab()
    return [[vocab[ch] for ch in text] for text in texts]


def encode_prompts(tokenizer, prompts: list[str]):
    """Left-padded ``(input_ids, attention_mask)`` tensors, as TRL's generation path builds them."""
    import torch

    rows = _token_ids(tokenizer, prompts)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


def count_correct(model, tokenizer, prompts: list[str], answers: list[str], samples: int,
                  *, max_new_tokens: int, seed: int, chunk: int = 4096) -> np.ndarray:
    """Correct completions out of ``samples`` per prompt, sampled at temperature 1.

    Runs under :func:`torch.random.fork_rng` with ``seed``: the caller's random
    state is untouched, and every model evaluated with the same seed draws from
    the same random stream (common random numbers across arms).
    """
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=max_new_tokens,
                              pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    expected = [[vocab[ch] for ch in answer] + [tokenizer.eos_token_id] for answer in answers]
    index = np.repeat(np.arange(len(prompts)), samples)
    correct = np.zeros(len(prompts), dtype=np.int64)
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for start in range(0, index.size, chunk):
            part = index[start:start + chunk]
            ids, mask = encode_prompts(tokenizer, [prompts[i] for i in part.tolist()])
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            completions = out[:, ids.shape[1]:].tolist()
            for row, i in zip(completions, part.tolist()):
                want = expected[i]
                if row[:len(want)] == want:
                    correct[i] += 1
    model.train(was_training)
    return correct


def warm_start(model, tokenizer, cfg, train, exclude, seed: int) -> dict[str, Any]:
    """Supervised phase: teacher-forced cross-entropy of the answers on fresh problems.

    Every ``cfg.sft_check_every`` steps the training pool is sampled
    ``cfg.sft_probe_samples`` times per prompt; the phase stops as soon as the
    mean success reaches ``cfg.sft_target_success`` (or after ``cfg.sft_steps``),
    so that every seed starts its reinforcement learning from a comparable level
    with success rates spread over (0, 1) (as the arithmetic experiment's warm start).
    """
    import torch

    from sera_opt.benchmarks.arithmetic.task import sample_problems

    rng = np.random.default_rng([seed, 11])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    train_prompts, train_answers = prompts_and_answers(train)
    losses: list[float] = []
    probes: dict[str, list] = {"step": [], "mean_success": []}
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.train()
    for step in range(cfg.sft_steps):
        if step and step % cfg.sft_check_every == 0:
            correct = count_correct(model, tokenizer, train_prompts, train_answers,
                                    cfg.sft_probe_samples, max_new_tokens=cfg.answer_width,
                                    seed=seed * 1000 + 47)
            probes["step"].append(step)
            probes["mean_success"].append(float(correct.mean() / cfg.sft_probe_samples))
            if probes["mean_success"][-1] >= cfg.sft_target_success:
                break
        batch = sample_problems(rng, cfg.sft_batch, cfg.max_digits, exclude=exclude)
        prompts, answers = prompts_and_answers(batch)
        prompt_ids, answer_ids = _token_ids(tokenizer, prompts), _token_ids(tokenizer, answers)
        rows = [p + a + [eos] for p, a in zip(prompt_ids, answer_ids)]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        labels = torch.tensor([[-100] * len(p) + a + [eos] + [-100] * (width - len(p) - len(a) - 1)
                               for p, a in zip(prompt_ids, answer_ids)], dtype=torch.long)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {"steps": len(losses), "losses": losses, "probes": probes}
