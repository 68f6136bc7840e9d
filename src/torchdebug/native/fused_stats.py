"""Ctypes binding of ``stats.c``: the statistics of a CPU tensor in one pass over its memory.

Handles float32, bfloat16 and float64 CPU tensors of any layout: the kernel walks runs of contiguous
elements in whatever order memory holds them (statistics do not depend on element order), so
transposes, permutes, slices and broadcasts need no copy. Other dtypes and devices give ``None``
and the caller uses torch ops. :func:`copy_with_stats` snapshots a tensor and takes its statistics in
the same pass. ctypes releases the GIL during the calls. Big contiguous tensors are split over
``torch.get_num_threads()`` threads of torch's OpenMP pool (see ``stats.c``), on whichever thread
the call comes from.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from torchdebug.native.build import load_library

Kernel = Callable[..., int]

MAX_DIMS = 16
"""Dimensions the kernel walks at most (after dropping size-1 dims and merging contiguous ones)."""

_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float64: "f64"}

_Sums = ctypes.c_double * 7
_Dims = [ctypes.c_int64 * n for n in range(MAX_DIMS + 1)]


@functools.cache
def _kernels() -> dict[torch.dtype, tuple[Kernel, Kernel]] | None:
    """``dtype -> (stats kernel, copy-and-stats kernel)``, or ``None`` without the library."""
    library = load_library("stats")
    if library is None:
        return None
    kernels = {}
    for dtype, suffix in _SUFFIXES.items():
        stats = getattr(library, f"td_stats_{suffix}")
        stats.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
        stats.restype = ctypes.c_int
        copy = getattr(library, f"td_copy_stats_{suffix}")
        copy.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
        copy.restype = ctypes.c_int
        kernels[dtype] = (stats, copy)
    return kernels


def _kernel(tensor: torch.Tensor, which: int) -> Kernel | None:
    kernels = _kernels()
    pair = kernels.get(tensor.dtype) if kernels is not None else None
    if pair is None or not tensor.is_cpu or tensor.is_neg():
        return None
    return pair[which]


def available() -> bool:
    """Whether the native kernels could be built and loaded here."""
    return _kernels() is not None


def _runs(tensor: torch.Tensor) -> tuple[list[int], list[int]] | None:
    """Sizes and strides, outer to inner, that visit every element once with an innermost stride
    of 1 (dims of size 1 dropped, dims that continue each other merged, broadcast dims outermost);
    ``None`` when no such walk exists."""
    if tensor.is_contiguous():
        return [tensor.numel()], [1]
    dims = sorted(((st, sz) for sz, st in zip(tensor.shape, tensor.stride()) if sz != 1), key=lambda d: (d[0] != 0, -d[0]))
    sizes: list[int] = []
    strides: list[int] = []
    for stride, size in reversed(dims):  # inner to outer
        if strides and stride == strides[-1] * sizes[-1]:
            sizes[-1] *= size
        else:
            sizes.append(size)
            strides.append(stride)
    if not strides or strides[0] != 1 or len(sizes) > MAX_DIMS:
        return None
    return sizes[::-1], strides[::-1]


def fused_stats(tensor: torch.Tensor) -> list[float] | None:
    """``[min, max, sum, sum of squares, nan, posinf, neginf]`` of a non-empty CPU tensor (NaNs left
    out of the first four; min/max NaN when all are NaN), or ``None`` when the kernel does not apply
    (another dtype or device). Layouts the kernel cannot walk are copied to a contiguous tensor first."""
    kernel = _kernel(tensor, 0)
    if kernel is None:
        return None
    layout = _runs(tensor)
    if layout is None:
        tensor = tensor.contiguous()
        layout = [tensor.numel()], [1]
    sizes, strides = layout
    ndim = len(sizes)
    out = _Sums()
    kernel(tensor.data_ptr(), ndim, _Dims[ndim](*sizes), _Dims[ndim](*strides), out, torch.get_num_threads())
    return list(out)


def copy_with_stats(tensor: torch.Tensor, address: int) -> list[float] | None:
    """Copy a contiguous CPU tensor's bytes to memory at ``address`` and return its statistics as
    :func:`fused_stats` does, in one pass; ``None`` (nothing copied) when the kernel does not apply."""
    kernel = _kernel(tensor, 1)
    if kernel is None or not tensor.is_contiguous():
        return None
    out = _Sums()
    kernel(tensor.data_ptr(), tensor.numel(), address, out, torch.get_num_threads())
    return list(out)
