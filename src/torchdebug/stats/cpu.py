"""Statistics of a tensor: min, max, mean, L2 norm and NaN/+Inf/-Inf counts.

Computed on the tensor's own device with float32 (half types) or float64 (integers) accumulation.
Min, max, mean and norm ignore NaNs; they are ``None`` for empty tensors or tensors that hold only
NaNs. Complex tensors are described by their magnitudes.

On the CPU, float32, bfloat16 and float64 tensors take one pass of a small C kernel
(:mod:`torchdebug.native`); other dtypes, or a machine without a C compiler, use torch ops: a sum
that comes out finite proves there is no NaN or Inf, so the common case costs three reductions
(min/max, sum, and a BLAS dot product for the norm of float32) and no mask. On other devices the
same host check would synchronise the device once per op: :mod:`torchdebug.stats_table` reduces
them there (a Triton kernel on CUDA, :func:`device_sums` elsewhere) into a table the host reads once
per flush.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchdebug.checksum import cpu_fingerprint
from torchdebug.native.fused_stats import fused_stats, stats_and_fingerprint
from torchdebug.records import STAT_KEYS

StatsDict = dict[str, Any]

_INF = float("inf")


def _as_real(tensor: torch.Tensor) -> torch.Tensor:
    """The values statistics are taken over: magnitudes for complex, numbers for bool, float8 widened to
    float32 (torch has no reductions over float8)."""
    if tensor.is_complex():
        return tensor.abs()
    if tensor.dtype == torch.bool:
        return tensor.to(torch.uint8)
    if tensor.is_floating_point() and tensor.element_size() == 1:
        return tensor.float()
    return tensor


def _accumulation_dtype(tensor: torch.Tensor) -> torch.dtype:
    if tensor.dtype == torch.float64:
        return torch.float64
    if tensor.is_floating_point():
        return torch.float32
    return torch.float64


def empty_stats() -> StatsDict:
    return {"min": None, "max": None, "mean": None, "norm": None, "nan": 0, "posinf": 0, "neginf": 0}


def stats_from_vector(values: list[float], integral: bool) -> StatsDict:
    """Stats dict from the 7-vector produced by :func:`stats_vector` (``integral``: the tensor had
    an integer or bool dtype, so min and max are ints)."""
    out: StatsDict = {}
    for key, value in zip(STAT_KEYS, values):
        if key in ("nan", "posinf", "neginf"):
            out[key] = int(value)
        elif math.isnan(value):
            out[key] = None
        elif integral and key in ("min", "max"):
            out[key] = int(value)
        else:
            out[key] = value
    return out


def device_sums(tensor: torch.Tensor) -> torch.Tensor:
    """``[min, max, sum, sum of squares, nan, posinf, neginf]`` as a float64 vector on the tensor's
    device, with torch ops: the torch fallback of the fused kernels' sums (NaNs left out of the first
    four; min/max ``+inf``/``-inf`` when every element is NaN). Never synchronises with the device;
    the tensor must be non-empty. Integers and bool are taken in float64 (exact below 2**53)."""
    x = _as_real(tensor.detach())
    if not x.is_floating_point():
        xf = x.to(torch.float64)
        low, high = torch.aminmax(xf)
        zero = xf.new_zeros(())
        return torch.stack([low, high, xf.sum(), torch.dot(xf.reshape(-1), xf.reshape(-1)), zero, zero, zero])
    nan = x.isnan()
    low = torch.where(nan, _INF, x).amin()
    high = torch.where(nan, -_INF, x).amax()
    kept = torch.where(nan, 0, x)
    total = kept.sum(dtype=_accumulation_dtype(x))
    squares = torch.linalg.vector_norm(kept, dtype=torch.float64).square()  # squares may overflow float32
    counts = (nan.sum(), (x == _INF).sum(), (x == -_INF).sum())
    return torch.stack([v.to(torch.float64) for v in (low, high, total, squares, *counts)])


def stats_vector(tensor: torch.Tensor) -> torch.Tensor:
    """The statistics as a float64 vector in ``STAT_KEYS`` order, on the tensor's device.

    Never synchronises with the device. NaN in the first four entries means "no value" (empty or
    all-NaN tensor). The tensor must be non-empty.
    """
    low, high, total, squares, nan, posinf, neginf = device_sums(tensor).unbind()
    valid = tensor.numel() - nan
    has = valid > 0
    mean = total / valid.clamp(min=1)
    values = [torch.where(has, v, math.nan) for v in (low, high, mean, squares.sqrt())]
    return torch.stack([*values, nan, posinf, neginf])


def stats_from_sums(sums: list[float], numel: int, integral: bool = False) -> StatsDict:
    """Stats dict from ``[min, max, sum, sum of squares, nan, posinf, neginf]`` as the fused kernels
    (:func:`~torchdebug.native.fused_stats.fused_stats`, ``copy_with_stats``, the Triton kernel) and
    :func:`device_sums` give them (``integral``: an integer or bool tensor, so min and max are ints)."""
    low, high, total, squares, nan, posinf, neginf = sums
    valid = numel - int(nan)
    if valid == 0:
        return {
            "min": None,
            "max": None,
            "mean": None,
            "norm": None,
            "nan": int(nan),
            "posinf": int(posinf),
            "neginf": int(neginf),
        }
    mean = total / valid
    if integral:
        low, high = int(low), int(high)
    return {
        "min": low,
        "max": high,
        "mean": None if mean != mean else mean,
        "norm": math.sqrt(squares),
        "nan": int(nan),
        "posinf": int(posinf),
        "neginf": int(neginf),
    }


def cpu_stats(tensor: torch.Tensor) -> StatsDict:
    """Fast path for CPU tensors: one native pass (float32, bfloat16, float64), else three
    reductions and a mask only when the sum is not finite."""
    x = _as_real(tensor.detach())
    sums = fused_stats(x)
    if sums is not None:
        return stats_from_sums(sums, x.numel())
    if not x.is_floating_point():
        return stats_from_sums(device_sums(x).tolist(), x.numel(), integral=True)
    acc = _accumulation_dtype(x)
    total = float(x.sum(dtype=acc))
    if not math.isfinite(total):
        return stats_from_sums(device_sums(x).tolist(), x.numel())
    mn, mx = torch.aminmax(x)
    norm = math.inf
    if x.dtype == torch.float32 and x.is_contiguous():
        flat = x.view(-1)
        norm = math.sqrt(float(torch.dot(flat, flat)))  # BLAS: about 2x faster than vector_norm
    if math.isinf(norm):  # not float32, not contiguous, or the squares overflowed float32
        norm = float(torch.linalg.vector_norm(x, dtype=torch.float64))
    return {
        "min": float(mn),
        "max": float(mx),
        "mean": total / x.numel(),
        "norm": norm,
        "nan": 0,
        "posinf": 0,
        "neginf": 0,
    }


def cpu_stats_and_fingerprint(tensor: torch.Tensor) -> tuple[StatsDict, int]:
    """:func:`cpu_stats` and the fingerprint (:func:`torchdebug.checksum.cpu_fingerprint`) of a
    non-empty CPU tensor: one native pass for both where the kernel takes the dtype (float32,
    bfloat16, float64), else one pass each."""
    x = tensor.detach()
    both = stats_and_fingerprint(x)
    if both is not None:
        sums, value = both
        return stats_from_sums(sums, x.numel()), value
    return cpu_stats(x), cpu_fingerprint(x)


def tensor_stats(tensor: torch.Tensor) -> StatsDict:
    """Statistics of ``tensor`` as a dict keyed by ``STAT_KEYS`` (synchronises on accelerators)."""
    if tensor.numel() == 0:
        return empty_stats()
    if tensor.device.type == "cpu":
        return cpu_stats(tensor)
    integral = not (tensor.is_floating_point() or tensor.is_complex())
    return stats_from_sums(device_sums(tensor).tolist(), tensor.numel(), integral)
