"""A small GPT (decoder-only transformer) used by the demo, the tests and the benchmarks.

Plain PyTorch, no dependencies: token + position embeddings, ``n_layer`` pre-norm blocks of causal
self-attention and an MLP, a tied output head. ``train_step`` runs forward, backward and AdamW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(kw_only=True)
class GPTConfig:
    n_layer: int = 4
    d_model: int = 256
    n_head: int = 4
    seq_len: int = 128
    vocab: int = 512
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q = q.view(batch, seq, self.n_head, -1).transpose(1, 2)
        k = k.view(batch, seq, self.n_head, -1).transpose(1, 2)
        v = v.view(batch, seq, self.n_head, -1).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = self.dropout(torch.softmax(scores, dim=-1))
        out = (attn @ v).transpose(1, 2).reshape(batch, seq, width)
        return self.proj(out)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.out = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or GPTConfig()
        self.tok = nn.Embedding(config.vocab, config.d_model)
        self.pos = nn.Embedding(config.seq_len, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        for embedding in (self.tok, self.pos):
            nn.init.normal_(embedding.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for layer in self.layers:
            x = layer(x)
        logits = self.ln_f(x) @ self.tok.weight.t()
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_batch(config: GPTConfig, batch: int = 8, seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens and their next-token targets (deterministic for a seed)."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(0, config.vocab, (batch, config.seq_len + 1), generator=generator)
    return data[:, :-1].to(device), data[:, 1:].to(device)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """One step: forward to the loss (under autocast to ``autocast`` if given), backward, optimizer
    step. Returns the detached loss."""
    tokens, targets = batch
    with torch.autocast(tokens.device.type, dtype=autocast, enabled=autocast is not None):
        loss = model(tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
