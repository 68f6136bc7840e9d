"""Megatron's vocabulary-parallel embedding on plain local tensors (not DTensor), for the sharded
compare tests and ``bench/structure.py``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class SumOverRanks(torch.autograd.Function):
    """An all-reduce whose backward passes the (replicated) gradient on: Megatron's reduce."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        torch.distributed.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class VocabShard(nn.Module):
    """A vocabulary-parallel embedding on plain local tensors (Megatron's layout, not DTensor): each
    rank holds a block of the table's rows, looks up the ids in it, zeroes the others and the ranks'
    pieces are summed. ``offset`` moves the first id a rank looks up (a wrong shard offset)."""

    def __init__(self, weight: torch.Tensor, rank: int, world: int, offset: int = 0) -> None:
        super().__init__()
        rows = weight.shape[0] // world
        self.weight = nn.Parameter(weight.detach()[rank * rows : (rank + 1) * rows].clone())
        self.start = rank * rows + offset

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        pieces = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[..., None], 0.0)
        return SumOverRanks.apply(pieces)
