"""Ctypes binding of ``stats.c``: the statistics of a CPU tensor in one pass over its memory.

Handles float32, bfloat16 and float64 CPU tensors of any layout: the kernel walks runs of contiguous
elements in whatever order memory holds them (statistics do not depend on element order), so
transposes, permutes, slices and broadcasts need no copy. Other dtypes and devices give ``None``
and the caller uses torch ops. ctypes releases the GIL during the call.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from torchdebug.native.build import load_library

Kernel = Callable[[int, int, ctypes.Array, ctypes.Array, ctypes.Array], int]


@functools.cache
def _kernels() -> dict[torch.dtype, Kernel] | None:
    library = load_library("stats")
    if library is None:
        return None
    kernels = {}
    for dtype, symbol in ((torch.float32, "td_stats_f32"), (torch.bfloat16, "td_stats_bf16"), (torch.float64, "td_stats_f64")):
        function = getattr(library, symbol)
        function.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        function.restype = ctypes.c_int
        kernels[dtype] = function
    return kernels


def available() -> bool:
    """Whether the native kernels could be built and loaded here."""
    return _kernels() is not None


MAX_DIMS = 16
"""Dimensions the kernel walks at most (after dropping size-1 dims and merging contiguous ones)."""


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
    kernels = _kernels()
    kernel = kernels.get(tensor.dtype) if kernels is not None else None
    if kernel is None or tensor.device.type != "cpu" or tensor.is_neg():
        return None
    layout = _runs(tensor)
    if layout is None:
        tensor = tensor.contiguous()
        layout = [tensor.numel()], [1]
    sizes, strides = layout
    ndim = len(sizes)
    out = (ctypes.c_double * 7)()
    kernel(tensor.data_ptr(), ndim, (ctypes.c_int64 * ndim)(*sizes), (ctypes.c_int64 * ndim)(*strides), out)
    return list(out)
