"""Rank and world size of this process, with or without torch.distributed initialised."""

from __future__ import annotations

import os

import torch
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
    """Rank 0's ``value`` on every rank (identity when torch.distributed is not initialised): its
    UTF-8 bytes in a tensor, not a pickle (``broadcast_object_list``). Called once per run, so the
    length read back to the host costs nothing."""
    if not dist_initialized() or dist.get_world_size() == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    encoded = value.encode()
    size = torch.tensor([len(encoded)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if dist.get_rank() == 0:
        data = (
            torch.frombuffer(bytearray(encoded), dtype=torch.uint8).to(device)
            if encoded
            else torch.empty(0, dtype=torch.uint8, device=device)
        )
    else:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return data.cpu().numpy().tobytes().decode()
