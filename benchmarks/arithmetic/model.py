"""A tiny character-level decoder-only transformer, its sampler and its log-likelihoods.

Pre-norm blocks (causal self-attention, a GELU MLP), learned position
embeddings and a tied output layer. Prompts in the arithmetic task all have
the same length, so batches need no padding mask; generation keeps a
key/value cache and feeds one token per step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sera_opt.exceptions import SeraOptError

__all__ = ["ModelConfig", "TinyTransformer", "generate", "completion_logprobs", "answer_mask"]


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model: vocabulary, context length, width, depth and heads."""

    vocab_size: int
    max_len: int
    d_model: int = 64
    n_layers: int = 3
    n_heads: int = 4
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise SeraOptError(
                f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}."
            )
        for field in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads", "mlp_ratio"):
            if getattr(self, field) < 1:
                raise SeraOptError(f"{field} must be a positive integer.")

    def to_dict(self) -> dict:
        return asdict(self)


class _Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, past=None):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, length, self.n_heads, width // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        keys = k.shape[2]
        if length == 1:
            # one new query attends to every cached key: no mask needed
            y = F.scaled_dot_product_attention(q, k, v)
        elif keys == length:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(length, keys, dtype=torch.bool, device=x.device).tril(keys - length)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(batch, length, width)
        return self.proj(y), (k, v)


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.attn = _Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
        )

    def forward(self, x, past=None):
        h, present = self.attn(self.norm1(x), past)
        x = x + h
        x = x + self.mlp(self.norm2(x))
        return x, present


class TinyTransformer(nn.Module):
    """Decoder-only transformer over characters.

    ``forward(tokens, cache=None)`` returns ``(logits, cache)``: logits of shape
    ``(batch, length, vocab_size)`` for the next token at every position, and a
    per-layer list of key/value tensors to pass back when feeding further
    tokens.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor, cache=None):
        start = 0 if cache is None else cache[0][0].shape[2]
        length = tokens.shape[1]
        if start + length > self.cfg.max_len:
            raise SeraOptError(
                f"sequence of {start + length} tokens exceeds the model's max_len={self.cfg.max_len}."
            )
        pos = torch.arange(start, start + length, device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        presents = []
        for i, block in enumerate(self.blocks):
            x, present = block(x, None if cache is None else cache[i])
            presents.append(present)
        logits = self.norm(x) @ self.tok.weight.T
        return logits, presents


@torch.no_grad()
def generate(model: TinyTransformer, prompts: torch.Tensor, max_new_tokens: int, *,
             temperature: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample completions autoregressively with a key/value cache.

    Parameters
    ----------
    prompts : LongTensor, shape (batch, prompt_len)
        Token ids; all prompts have the same length.
    max_new_tokens : int
        Tokens to sample after each prompt (a fixed number: the caller cuts at
        the end marker).
    temperature : float
        Softmax temperature; 1 samples from the model's distribution.
    generator : torch.Generator, optional
        Source of randomness, for reproducible draws.

    Returns
    -------
    LongTensor, shape (batch, max_new_tokens)
    """
    if temperature <= 0:
        raise SeraOptError(f"temperature must be positive, got {temperature}.")
    was_training = model.training
    model.eval()
    try:
        logits, cache = model(prompts)
        out = []
        for step in range(max_new_tokens):
            probs = torch.softmax(logits[:, -1, :].float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            out.append(nxt)
            if step + 1 < max_new_tokens:
                logits, cache = model(nxt, cache)
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)


def answer_mask(completions: torch.Tensor, end_id: int) -> torch.Tensor:
    """1 for completion tokens up to and including the first end marker, else 0."""
    is_end = completions == end_id
    # tokens strictly after the first end marker are padding
    after_end = (torch.cumsum(is_end.long(), dim=1) - is_end.long()) > 0
    return (~after_end).to(torch.float32)


def completion_logprobs(model: TinyTransformer, prompts: torch.Tensor,
                        completions: torch.Tensor) -> torch.Tensor:
    """Per-token log-probabilities of ``completions`` after ``prompts`` (with gradients).

    Returns a tensor of shape ``completions.shape``.
    """
    tokens = torch.cat([prompts, completions], dim=1)
    logits, _ = model(tokens[:, :-1])
    logits = logits[:, prompts.shape[1] - 1:, :]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(2, completions.unsqueeze(2)).squeeze(2)
