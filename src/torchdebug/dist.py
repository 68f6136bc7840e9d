"""Rank and world size of this process, with or without torch.distributed initialised."""

from __future__ import annotations

import os

import torch.distributed as dist


def dist_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when initialised, else from torchrun's
    environment variables, else ``(0, 1)``."""
    if dist_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def broadcast_from_rank0(value: str) -> str:
    """Rank 0's ``value`` on every rank (identity when torch.distributed is not initialised)."""
    if not dist_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])
