"""Distributed tests on CPU: gloo processes with a file rendezvous and an orderly teardown.

``spawn(worker, tmp_path, *args)`` runs ``worker(rank, *args)`` in ``world_size`` processes that
share one default process group. Every rank meets at a barrier before the group is destroyed, so
no rank tears its gloo pairs down while another still has work on them (torch 2.11 aborted a rank
with "terminate called without an active exception" when one rank left early).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

_RENDEZVOUS = itertools.count()


def spawn(worker: Callable[..., None], tmp_path: Path, *args: Any, world_size: int = 2) -> None:
    """Run ``worker(rank, *args)`` on ``world_size`` gloo ranks; raises when any rank fails."""
    init_file = tmp_path / f"gloo-init-{next(_RENDEZVOUS)}"  # a used rendezvous file cannot serve again
    mp.spawn(_rank_main, args=(worker, str(init_file), world_size, args), nprocs=world_size, join=True)


def _rank_main(rank: int, worker: Callable[..., None], init_file: str, world_size: int, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        worker(rank, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
