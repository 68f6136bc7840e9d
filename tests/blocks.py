"""A residual MLP block shared by the distributed tests (tensor parallelism splits `up` by columns
and `down` by rows)."""

from __future__ import annotations

import torch


class MLPBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) + x
