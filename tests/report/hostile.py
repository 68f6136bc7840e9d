"""Dumps of a model whose module names and source lines try to inject markup into a report."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import torchdebug

HOSTILE = "<img src=x onerror=alert(1)>"
SCRIPT = "</script><script>alert(3)</script>"


class Hostile(nn.Module):
    """Two submodules with hostile names (one with a child, so the module tree nests under it)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.add_module(HOSTILE, nn.Linear(4, 4))
        self.add_module(SCRIPT, nn.Sequential(nn.Linear(4, 4)))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = getattr(self, HOSTILE)(x) * self.scale  # </script><script>alert(2)</script>
        return getattr(self, SCRIPT)(x)


def dump(path: Path, scale: float, task: str = "tensor") -> Path:
    """One training step of :class:`Hostile` (``scale`` 1.0 is the reference)."""
    torchdebug.seed_all(0)
    model = Hostile(scale)
    with torchdebug.dump(path, model=model, task=task):
        model(torch.randn(2, 4)).sum().backward()
    return path
