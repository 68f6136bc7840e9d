"""Tiny programs with a relu (the planted bugs' target) and an entry for the command line."""

from __future__ import annotations

import torch
from torch import nn


class ReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc1(x)
        return self.fc2(torch.relu(hidden) * 2).sin()  # RELU LINE


class TanhNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.fc1(x))
        return self.fc2(hidden).sin()  # SIN LINE


def broken_in_the_middle(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    print("graph break")  # BREAK LINE
    return torch.relu(y) + 1


def line_of(marker: str, path: str = __file__) -> int:
    """The line number of the line of ``path`` (this file by default) ending with ``# marker``."""
    with open(path) as handle:
        return next(i for i, line in enumerate(handle, 1) if line.rstrip().endswith(f"# {marker}"))


def make_model_and_inputs() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The command line's entry: a model and its example inputs."""
    torch.manual_seed(0)
    return ReluNet(), (torch.randn(4, 8),)
