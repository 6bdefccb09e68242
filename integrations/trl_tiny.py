"""A tiny causal language model and task, built in code, for offline CPU runs.

Used by the TRL demo and tests: a 2-layer GPT-2 from a config (random weights),
a character-level tokenizer made with the ``tokenizers`` library, and a "copy a
digit" task whose prompts differ in difficulty. Nothing is downloaded.

The task: a prompt is a set of distinct digits followed by ``":"`` (e.g. ``"147:"``);
a completion succeeds (reward 1) when its first character is one of the prompt's
digits. A random policy succeeds on a prompt with k digits with probability about
k / (vocabulary size), so prompts with one digit are hard and prompts with many
digits are easy: the planner has something to allocate.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from sera_opt.exceptions import MissingDependencyError

__all__ = [
    "DIGITS",
    "build_tiny_model",
    "build_tokenizer",
    "copy_digit_reward",
    "make_prompts",
]

DIGITS = "0123456789"
_SPECIAL_TOKENS = ("<pad>", "<eos>")


def build_tokenizer(characters: str = DIGITS + ":"):
    """Character-level ``PreTrainedTokenizerFast`` over ``characters`` (digits and ``":"``).

    Padding is on the left (as ``GRPOTrainer`` requires); ``<pad>`` is id 0 and
    ``<eos>`` id 1; every character of ``characters`` is its own token, in order.
    """
    if len(set(characters)) != len(characters) or not characters:
        raise ValueError(f"characters must be distinct and non-empty, got {characters!r}")
    try:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "the tiny model needs transformers and tokenizers: pip install 'sera_opt[trl]'"
        ) from error
    vocab = {token: index for index, token in enumerate((*_SPECIAL_TOKENS, *characters))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    # One token per character; Fuse joins them back without spaces when decoding.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )


def build_tiny_model(
    tokenizer,
    *,
    seed: int = 0,
    n_embd: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    dropout: float = 0.1,
):
    """A randomly initialised GPT-2 with ``n_layer`` layers sized for ``tokenizer``.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast
        From :func:`build_tokenizer`.
    seed : int
        Seed of the weight initialisation.
    dropout : float
        GPT-2's dropout of the embeddings, residuals and attention (its default
        0.1); 0 makes sampling in training mode the same as in evaluation mode.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        embd_pdrop=dropout,
        resid_pdrop=dropout,
        attn_pdrop=dropout,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model


def make_prompts(num_prompts: int, *, seed: int = 0, max_digits: int = 5) -> list[str]:
    """``num_prompts`` distinct prompts with 1..``max_digits`` distinct digits each.

    Digit-set sizes cycle through 1..max_digits so that every difficulty is present.
    """
    rng = np.random.default_rng(seed)
    prompts: list[str] = []
    seen: set[str] = set()
    size = 0
    attempts = 0
    while len(prompts) < num_prompts:
        attempts += 1
        if attempts > 100 * num_prompts + 1000:
            raise ValueError(
                f"cannot draw {num_prompts} distinct prompts with up to {max_digits} digits"
            )
        digits = "".join(
            sorted(rng.choice(list(DIGITS), size=size % max_digits + 1, replace=False))
        )
        if digits in seen:
            continue
        seen.add(digits)
        prompts.append(digits + ":")
        size += 1
    return prompts


def copy_digit_reward(
    prompts: Sequence[str], completions: Sequence[str], **_: object
) -> list[float]:
    """1.0 when the completion starts with one of the prompt's digits, else 0.0.

    Has the signature of a TRL reward function (extra keyword arguments ignored).
    """
    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        allowed = prompt.split(":", 1)[0]
        rewards.append(1.0 if completion[:1] != "" and completion[:1] in allowed else 0.0)
    return rewards


def offline_transformers():
    """Prepare transformers for an offline run of the tiny model: ``HF_HUB_OFFLINE=1`` and
    ``TOKENIZERS_PARALLELISM=false`` unless already set (before transformers loads, so
    nothing is downloaded), its logging at errors only. Returns the transformers module."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def prompt_dataset(prompts: Sequence[str]):
    """The prompts as the ``datasets.Dataset`` the trainers read: a ``prompt`` column and a
    ``prompt_id`` column (each prompt's position in ``prompts``), the id the planner's
    tracker keys its estimates by."""
    from datasets import Dataset

    prompts = list(prompts)
    return Dataset.from_dict({"prompt": prompts, "prompt_id": list(range(len(prompts)))})
