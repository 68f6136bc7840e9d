"""Tensor snapshots packed back to back in one reusable byte buffer, written as a safetensors file.

The buffer is written with one ``write`` in the safetensors layout, so any safetensors reader opens
the files (gaps and block padding are ``__pad_N`` uint8 entries: the format forbids unindexed bytes),
with ``O_DIRECT`` where the OS and file system take it. CUDA tensors reach the pinned buffer without
stopping the host or the training stream. Why each: docs/architecture.md, "Eager capture, step by
step" (items 5 and 6) and "Decisions and their reasons"; the files: docs/format.md.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import struct
from pathlib import Path

import torch

from torchdebug.native.fused_stats import copy_with_stats

PAD_PREFIX = "__pad_"
"""Keys of alignment padding entries (not user data)."""

_ALIGN = 8

BLOCK = 4096
"""Alignment of direct writes (the largest logical block size in common use); a batch keeps its
last block free for the padding that ends the data on one."""

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


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}
"""Device index -> the stream that carries snapshots from that device to the host."""


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _SIDE_STREAMS.get(device.index)
    if stream is None:
        stream = _SIDE_STREAMS[device.index] = torch.cuda.Stream(device)
    return stream


def storable(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor in a dtype safetensors stores, its values in its memory: complex as (real, imag)
    pairs; a conjugate or negative view (a bit torch reads its memory through) materialised."""
    tensor = tensor.resolve_conj().resolve_neg()
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


class TensorBatch:
    """A byte buffer that snapshots are copied into until it is written out and reused.

    Reused because copying each snapshot into fresh memory costs a page fault per 4 KiB and makes the
    copy ten times slower than the memory bandwidth allows; a reused buffer is faulted in once."""

    def __init__(self, size: int, pin_memory: bool = False) -> None:
        self.size = size
        """Bytes of the buffer (pinned ones are allocated exactly: torch rounds pinned blocks up to a
        power of two, which the writer's sizes are; others get a block more, to start on one)."""
        self.capacity = size - BLOCK
        """Room for entries."""
        # Pinned memory lets copies from an accelerator run asynchronously (no sync per tensor).
        slack = 0 if pin_memory else BLOCK  # pinned blocks start on a page
        raw = torch.empty(size + slack, dtype=torch.uint8, pin_memory=pin_memory)
        start = -raw.data_ptr() % BLOCK if slack else 0
        self.buffer = raw[start : start + size]
        self.pinned = pin_memory
        self.entries: list[tuple[str, str, tuple[int, ...], int, int]] = []
        """Each tensor's key, dtype code, shape and span, in tuples of plain values that the collector
        stops tracking at its next pass (``task="tensor"`` holds thousands a step)."""
        self.used = 0
        self.staged_bytes = 0
        """Device memory of the snapshots' device copies, at most ``used`` (released by the
        caching allocator as their transfers complete)."""
        self._transfers: set[torch.cuda.Stream] = set()
        self._copies_done: list[torch.cuda.Event] = []

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
            self.entries.append((f"{PAD_PREFIX}{len(self.entries)}", "U8", (pad,), self.used, self.used + pad))
            ctypes.memset(self.buffer.data_ptr() + self.used, 0, pad)  # files hold no stale bytes
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
            if tensor.is_cuda and self.pinned:
                self._transfer(target, tensor)
            else:
                target.copy_(tensor)
        self.entries.append((key, code, tuple(tensor.shape), self.used, self.used + nbytes))
        self.used += nbytes
        return sums

    def _transfer(self, target: torch.Tensor, tensor: torch.Tensor) -> None:
        """Snapshot a CUDA tensor on its stream and send the snapshot to ``target`` (pinned) on the
        side stream, without a host synchronisation: the device copy, made in stream order, cannot see
        an in-place op queued after it, and the transfer runs beside the next ops. :meth:`write`, on
        the writer thread, waits for the batch's transfers through one CUDA event per side stream."""
        side = _side_stream(tensor.device)
        staged = tensor.clone(memory_format=torch.contiguous_format)
        side.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(side):
            target.copy_(staged, non_blocking=True)
        staged.record_stream(side)  # its memory is not reused before the transfer has read it
        self.staged_bytes += target.numel() * target.element_size()
        self._transfers.add(side)

    def clear(self) -> None:
        """Empty the batch for reuse (the buffer is kept)."""
        self.entries.clear()
        self.used = 0
        self.staged_bytes = 0
        self._transfers.clear()
        self._copies_done.clear()

    def seal(self) -> None:
        """Mark the end of the copies (on the capturing thread): the transfers on the side streams
        are waited for by :meth:`write`, on the writer thread, through one CUDA event per stream."""
        for side in self._transfers:
            self._copies_done.append(side.record_event())
        self._transfers.clear()

    def settle(self) -> None:
        """Wait until the transfers into the buffer are done (nothing to wait for on the CPU): on the
        writer thread before the buffer is written, or before a buffer given up after a failed write
        is handed back (once, on the thread that gives it up)."""
        for event in self._copies_done:
            event.synchronize()

    def write(self, path: Path, metadata: dict[str, str]) -> None:
        """Write the batch to ``path`` via a temporary name (one write for all tensor data). Direct
        writes need block-aligned memory, file offsets and lengths: the buffer starts on a block, the
        JSON header is padded with spaces to end on one, and the data with a last ``__pad_N`` entry;
        where the OS or file system refuses (``EINVAL``) the same bytes go through the page cache."""
        self.settle()
        entries = self.entries
        end = self.used + (-self.used) % BLOCK
        if end > self.used:  # the data ends on a block (the buffer's last block is kept for this)
            entries = [*entries, (f"{PAD_PREFIX}{len(entries)}", "U8", (end - self.used,), self.used, end)]
            ctypes.memset(self.buffer.data_ptr() + self.used, 0, end - self.used)
        header: dict[str, object] = {"__metadata__": metadata}
        for key, code, shape, begin, stop in entries:
            header[key] = {"dtype": code, "shape": shape, "data_offsets": [begin, stop]}
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * ((-8 - len(text)) % BLOCK)
        head = mmap.mmap(-1, 8 + len(text))  # anonymous maps are page-aligned, as direct writes need
        head.write(struct.pack("<Q", len(text)) + text)
        data = memoryview(self.buffer[:end].numpy())
        tmp = path.with_name(path.name + ".tmp")
        if not (self.buffer.data_ptr() % BLOCK == 0 and _write_direct(tmp, (head, data))):
            with open(tmp, "wb") as handle:
                handle.write(head)
                handle.write(data)
        os.replace(tmp, path)


def _write_direct(path: Path, parts: tuple[mmap.mmap, memoryview]) -> bool:
    """Write ``parts`` to a new file at ``path`` with ``O_DIRECT``; ``False`` where the OS or the
    file system does not take direct writes of these parts (nothing is left to clean up)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o666)
    except OSError as error:
        if error.errno == errno.EINVAL:
            return False
        raise
    try:
        for part in parts:
            with memoryview(part) as view:
                done = 0
                while done < len(view):  # whole blocks come back: the rest stays aligned
                    done += os.write(descriptor, view[done:])
    except OSError as error:
        if error.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(descriptor)
    return True
