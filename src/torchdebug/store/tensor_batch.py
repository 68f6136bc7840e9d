"""Tensor snapshots packed back to back in one reusable byte buffer, written as a safetensors file.

Copying each snapshot into fresh memory costs a page fault per 4 KiB and makes the copy ten times
slower than the memory bandwidth allows; a buffer that is reused from batch to batch is faulted in
once. The buffer is written with a single ``write`` in the safetensors layout (8-byte header size,
JSON header, data), so any safetensors reader opens the files. Entries are 8-byte aligned; the gaps
are indexed as ``__pad_N`` uint8 tensors because the format forbids unindexed bytes.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from pathlib import Path

import torch

from torchdebug.native.fused_stats import copy_with_stats

PAD_PREFIX = "__pad_"
"""Keys of alignment padding entries (not user data)."""

_ALIGN = 8

_DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
):
    if hasattr(torch, _name):  # newer dtypes, absent from older torch releases
        _DTYPE_CODES[getattr(torch, _name)] = _code


def storable(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor in a dtype safetensors stores: complex as (real, imag) pairs."""
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


class TensorBatch:
    """A byte buffer that snapshots are copied into until it is written out and reused."""

    def __init__(self, capacity: int, pin_memory: bool = False) -> None:
        self.capacity = capacity
        # Pinned memory lets copies from an accelerator run asynchronously (no sync per tensor).
        self.buffer = torch.empty(capacity, dtype=torch.uint8, pin_memory=pin_memory)
        self.entries: list[tuple[str, str, list[int], int, int]] = []
        self.used = 0
        self._copies_done: torch.cuda.Event | None = None
        self._async = False

    def __len__(self) -> int:
        return len(self.entries)

    def fits(self, nbytes: int) -> bool:
        return self.used + (-self.used) % _ALIGN + nbytes <= self.capacity

    def add(self, key: str, tensor: torch.Tensor, with_stats: bool = False) -> list[float] | None:
        """Copy ``tensor`` (any device, any layout; a supported dtype) into the buffer now.

        ``with_stats``: also return :func:`~torchdebug.native.fused_stats.copy_with_stats`' sums,
        taken during the copy, where the native kernel applies (else ``None``). Contiguous CPU
        tensors are copied by one single-threaded ``memcpy`` without the GIL: torch's two-thread
        copy stalls badly when another process shares the cores.
        """
        code = _DTYPE_CODES.get(tensor.dtype)
        if code is None:
            raise TypeError(f"dtype {tensor.dtype} cannot be saved in safetensors")
        pad = (-self.used) % _ALIGN
        if pad:
            self.entries.append((f"{PAD_PREFIX}{len(self.entries)}", "U8", [pad], self.used, self.used + pad))
            self.used += pad
        nbytes = tensor.numel() * tensor.element_size()
        if self.used + nbytes > self.capacity:
            raise ValueError(f"{key}: {nbytes} bytes do not fit in the batch ({self.capacity - self.used} left)")
        sums = None
        if tensor.is_cpu and tensor.is_contiguous():
            address = self.buffer.data_ptr() + self.used
            sums = copy_with_stats(tensor, address) if with_stats else None
            if sums is None:
                ctypes.memmove(address, tensor.data_ptr(), nbytes)
        else:
            target = self.buffer[self.used : self.used + nbytes].view(tensor.dtype).view(tensor.shape)
            non_blocking = tensor.is_cuda and self.buffer.is_pinned()
            target.copy_(tensor, non_blocking=non_blocking)
            self._async = self._async or non_blocking
        self.entries.append((key, code, list(tensor.shape), self.used, self.used + nbytes))
        self.used += nbytes
        return sums

    def clear(self) -> None:
        """Empty the batch for reuse (the buffer is kept)."""
        self.entries.clear()
        self.used = 0
        self._copies_done = None
        self._async = False

    def seal(self) -> None:
        """Mark the end of the copies (on the capturing thread): asynchronous device copies are
        waited for by :meth:`write`, on the writer thread, through a CUDA event."""
        if self._async:
            self._copies_done = torch.cuda.Event()
            self._copies_done.record()

    def write(self, path: Path, metadata: dict[str, str]) -> None:
        """Write the batch to ``path`` via a temporary name (one write for all tensor data)."""
        if self._copies_done is not None:
            self._copies_done.synchronize()
        header: dict[str, object] = {"__metadata__": metadata}
        for key, code, shape, begin, end in self.entries:
            header[key] = {"dtype": code, "shape": shape, "data_offsets": [begin, end]}
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * ((-len(text)) % _ALIGN)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as handle:
            handle.write(struct.pack("<Q", len(text)))
            handle.write(text)
            handle.write(memoryview(self.buffer[: self.used].numpy()))
        os.replace(tmp, path)
