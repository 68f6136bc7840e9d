"""A data-parallel run on three gloo processes, for the cross-rank and distributed compare tests.

Each process trains the same tiny model for two steps on its own batch, all-reducing the gradients
by hand, and dumps three runs: healthy (task=tensor), and with rank 1's parameter update perturbed
(its SGD learning rate is 0.1 % off), once with tensors and once with statistics only.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import torchdebug
from tests import gloo

WORLD_SIZE = 3
PERTURBED_RANK = 1
RUNS = {"healthy": ("tensor", False), "perturbed": ("tensor", True), "perturbed_stats": ("statistics", True)}


def _train(path: Path, rank: int, task: str, perturb: bool) -> None:
    torchdebug.seed_all(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (1.001 if perturb else 1.0))  # planted update bug
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    debugger = torchdebug.Debugger(path, task=task, level="mix")
    for _ in range(2):
        debugger.start(model)
        model(batch).pow(2).mean().backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad.div_(WORLD_SIZE)
        optimizer.step()
        optimizer.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()


def _worker(rank: int, root: str) -> None:
    for name, (task, perturbed) in RUNS.items():
        _train(Path(root) / name, rank, task, perturb=perturbed and rank == PERTURBED_RANK)


def dump_replicas(root: Path) -> dict[str, Path]:
    """The dump path of each run in ``RUNS``, written under ``root`` by three spawned processes."""
    gloo.spawn(_worker, root, str(root), world_size=WORLD_SIZE)
    return {name: root / name for name in RUNS}
