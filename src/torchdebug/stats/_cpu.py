"""A tensor's statistics taken now, on the host: the CPU paths, and the synchronising reference.

On the CPU, float32, bfloat16, float64, integer and bool tensors take one pass of a small C kernel
(:mod:`torchdebug.native.fused_stats`); other dtypes, or a machine without a C compiler, use torch
ops: a sum that comes out finite proves there is no NaN or Inf, so the common case costs three
reductions (min/max, sum, and a BLAS dot product for the squares of float32), the counts that a
finite sum does not rule out, and no mask. On other devices the same host check would synchronise
the device once per op: :mod:`torchdebug.stats_table` reduces them there into a table the host reads
once per flush; :func:`tensor_stats` here synchronises, for tests and one-off reads.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch

from torchdebug.checksum import cpu_fingerprint
from torchdebug.native.addresses import c_array
from torchdebug.native.fused_stats import fused_stats, fused_sums_into, fused_sums_many_into, stats_and_fingerprint
from torchdebug.stats._schema import WIDTH, StatsDict, empty_stats, stats_from_sums
from torchdebug.stats._torch_ops import accumulation_dtype, as_real, counts, device_sums


def cpu_sums(tensor: torch.Tensor) -> list[float]:
    """The sums vector (``schema.COLUMNS``) of a non-empty CPU tensor (its real values, see
    :func:`~torchdebug.stats._torch_ops.as_real`): one native pass (float32, bfloat16, float64, integers), else
    torch ops, with a NaN mask only when the sum is not finite."""
    sums = fused_stats(tensor)
    if sums is not None:
        return sums
    if not tensor.is_floating_point():
        return device_sums(tensor).tolist()
    total = float(tensor.sum(dtype=accumulation_dtype(tensor)))
    if not math.isfinite(total):
        return device_sums(tensor).tolist()
    low, high = torch.aminmax(tensor)
    squares = math.inf
    if tensor.dtype == torch.float32 and tensor.is_contiguous():
        flat = tensor.view(-1)
        squares = float(torch.dot(flat, flat))  # BLAS: about 2x faster than vector_norm
    if math.isinf(squares):  # not float32, not contiguous, or the squares overflowed float32
        squares = float(torch.linalg.vector_norm(tensor, dtype=torch.float64)) ** 2
    return [float(low), float(high), total, squares, *(float(c) for c in counts(tensor, nonfinite=False))]


def cpu_sums_into(tensor: torch.Tensor, address: int) -> None:
    """:func:`cpu_sums` of a non-empty floating or complex CPU tensor, written as ``WIDTH`` doubles
    at ``address``: the native kernel writes them there itself (float32, bfloat16 and float64 read
    as they are), the other paths through a list."""
    if not fused_sums_into(tensor, address):
        c_array(ctypes.c_double, WIDTH).from_address(address)[:] = cpu_sums(as_real(tensor.detach()))


def cpu_sums_many_into(tensors: Sequence[torch.Tensor], addresses: Sequence[int]) -> None:
    """:func:`cpu_sums_into` of each tensor into the address of the same place: the contiguous
    float32, bfloat16 and float64 ones in one native call
    (:func:`~torchdebug.native.fused_stats.fused_sums_many_into`), the others one by one (and a
    tensor alone: one call of its own costs less than the list of entries)."""
    if len(tensors) == 1:
        cpu_sums_into(tensors[0], addresses[0])
        return
    for place in fused_sums_many_into(tensors, addresses):
        cpu_sums_into(tensors[place], addresses[place])


def cpu_stats(tensor: torch.Tensor) -> StatsDict:
    """The statistics of a non-empty CPU tensor (:func:`cpu_sums`, finished)."""
    x = as_real(tensor.detach())
    return stats_from_sums(cpu_sums(x), x.numel(), integral=not x.is_floating_point())


def cpu_stats_and_fingerprint(tensor: torch.Tensor) -> tuple[StatsDict, int]:
    """:func:`cpu_stats` and the fingerprint (:func:`torchdebug.checksum.cpu_fingerprint`) of a
    non-empty CPU tensor: one native pass for both where the kernel takes the dtype (float32,
    bfloat16, float64, integers, bool), else one pass each."""
    x = tensor.detach()
    both = stats_and_fingerprint(x)
    if both is not None:
        sums, value = both
        return stats_from_sums(sums, x.numel(), integral=not (x.is_floating_point() or x.is_complex())), value
    return cpu_stats(x), cpu_fingerprint(x)


def tensor_stats(tensor: torch.Tensor) -> StatsDict:
    """Statistics of ``tensor`` as a dict keyed by ``schema.STAT_KEYS`` (synchronises on accelerators)."""
    if tensor.numel() == 0:
        return empty_stats()
    if tensor.device.type == "cpu":
        return cpu_stats(tensor)
    integral = not (tensor.is_floating_point() or tensor.is_complex())
    return stats_from_sums(device_sums(tensor).tolist(), tensor.numel(), integral)
