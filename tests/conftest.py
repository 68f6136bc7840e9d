"""Shared fixtures: a tiny model and a helper to dump one training step of it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `examples.gpt`


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test``) each worker takes its share of the cores for torch's
    intra-op threads: two workers on two cores each running two OpenMP threads would oversubscribe."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, torch.get_num_threads() // int(workers)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def tiny() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet()
