"""A tiny Llama-3-style decoder, the model of the Llama benchmarks and diagnose tests: RMSNorm, one
fused QKV projection, rotary position embeddings from a complex64 buffer (``torch.polar``,
``view_as_complex``), ``F.scaled_dot_product_attention`` and a ReLU-GLU feed-forward (the relu is
what inductor's planted bugs break). ``model(tokens, targets)`` returns the loss as
:class:`examples.gpt.GPT` does, so ``examples.gpt.train_step`` trains it; ``model(tokens)`` the
logits. The sequence may be shorter than ``seq`` (its RoPE table).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rope_frequencies(head_dim: int, seq: int, theta: float = 10000.0) -> torch.Tensor:
    """``exp(i * position * frequency)``, complex64, shaped ``(seq, head_dim // 2)``."""
    frequencies = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq).float(), frequencies)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of ``x``'s last dimension by the complex ``frequencies``."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * frequencies).flatten(-2).type_as(x)  # ROPE LINE


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, dim // heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, self.head_dim).unbind(2)
        q, k = apply_rope(q, frequencies[:seq, None]), apply_rope(k, frequencies[:seq, None])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)  # SDPA LINE
        return self.out(y.transpose(1, 2).reshape(batch, seq, dim))


class FeedForward(nn.Module):
    """ReLU-GLU: ``w2(relu(a) * g)`` with ``a`` and ``g`` from one fused projection."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.w13(x).chunk(2, dim=-1)
        return self.w2(torch.relu(a) * g)  # RELU LINE


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention, self.ffn = Attention(dim, heads, dropout), FeedForward(dim, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x), frequencies))
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(
        self,
        vocab: int = 128,
        dim: int = 64,
        heads: int = 4,
        layers: int = 2,
        seq: int = 32,
        hidden: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden or 4 * dim, dropout) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("frequencies", rope_frequencies(dim // heads, seq), persistent=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x, self.frequencies)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
