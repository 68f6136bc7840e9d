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


def _device() -> torch.device:
    """Where the default group's collectives take their tensors: the current GPU under NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def broadcast_from_rank0(value: str) -> str:
    """Rank 0's ``value`` on every rank (identity when torch.distributed is not initialised)."""
    return broadcast_from(value, 0)


def broadcast_from(value: str, source: int) -> str:
    """Rank ``source``'s ``value`` on every rank (identity when torch.distributed is not
    initialised): its UTF-8 bytes in a tensor, not a pickle (``broadcast_object_list``). Called once
    per run, so the length read back to the host costs nothing."""
    if not dist_initialized() or dist.get_world_size() == 1:
        return value
    device = _device()
    encoded = value.encode()
    size = torch.tensor([len(encoded)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=source)
    if dist.get_rank() == source:
        data = (
            torch.frombuffer(bytearray(encoded), dtype=torch.uint8).to(device)
            if encoded
            else torch.empty(0, dtype=torch.uint8, device=device)
        )
    else:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=source)
    return data.cpu().numpy().tobytes().decode()


def first_failure(message: str) -> tuple[int, str] | None:
    """The lowest rank whose ``message`` is not empty, with that message, on every rank (``None``
    when every rank's is empty). Ranks that check something before a collective agree on it through
    this, so they fail together and none waits for a rank that raised. A single process: its own."""
    if not dist_initialized() or dist.get_world_size() == 1:
        return (rank_and_world_size()[0], message) if message else None
    world = dist.get_world_size()
    first = torch.tensor([dist.get_rank() if message else world], dtype=torch.int64, device=_device())
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    rank = int(first.item())  # once per run, like the broadcast's length
    return None if rank == world else (rank, broadcast_from(message, rank))


def gather_to_rank0(value: bytes) -> list[bytes] | None:
    """Every rank's ``value``, in rank order, on rank 0 (``None`` on the others; ``[value]`` when
    torch.distributed is not initialised): bytes in tensors, padded to the longest, not pickles
    (``gather_object``). The lengths are read back to the host once per call."""
    if not dist_initialized() or dist.get_world_size() == 1:
        return [value]
    device = _device()
    size = torch.tensor([len(value)], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    lengths = torch.cat(sizes).tolist()
    data = torch.zeros(max(1, *lengths), dtype=torch.uint8, device=device)
    if value:
        data[: len(value)] = torch.frombuffer(bytearray(value), dtype=torch.uint8)
    gathered = [torch.empty_like(data) for _ in lengths] if dist.get_rank() == 0 else None
    dist.gather(data, gathered, dst=0)
    if gathered is None:
        return None
    return [tensor[:length].cpu().numpy().tobytes() for tensor, length in zip(gathered, lengths)]
