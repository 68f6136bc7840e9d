"""Statistics of a tensor: min, max, mean, L2 norm and NaN/+Inf/-Inf counts.

Computed on the tensor's own device with float32 (half types) or float64 (integers) accumulation.
Min, max, mean and norm ignore NaNs; they are ``None`` for empty tensors or tensors that hold only
NaNs. Complex tensors are described by their magnitudes.

On the CPU, float32, bfloat16 and float64 tensors take one pass of a small C kernel
(:mod:`torchdebug.native`); other dtypes, or a machine without a C compiler, use torch ops: a sum
that comes out finite proves there is no NaN or Inf, so the common case costs three reductions
(min/max, sum, and a BLAS dot product for the norm of float32) and no mask. On other devices the
same host check would synchronise the device once per op, so :class:`StatsStager` keeps the
results as small device tensors and copies them to the host in one batch per flush.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from torchdebug.native.fused_stats import fused_stats
from torchdebug.records import STAT_KEYS

StatsDict = dict[str, Any]

_INF = float("inf")


def _as_real(tensor: torch.Tensor) -> torch.Tensor:
    """The values statistics are taken over: magnitudes for complex, numbers for bool."""
    if tensor.is_complex():
        return tensor.abs()
    if tensor.dtype == torch.bool:
        return tensor.to(torch.uint8)
    return tensor


def _accumulation_dtype(tensor: torch.Tensor) -> torch.dtype:
    if tensor.dtype == torch.float64:
        return torch.float64
    if tensor.is_floating_point():
        return torch.float32
    return torch.float64


def _empty_stats() -> StatsDict:
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


def stats_vector(tensor: torch.Tensor) -> torch.Tensor:
    """The statistics as a float64 vector in ``STAT_KEYS`` order, on the tensor's device.

    Never synchronises with the device. NaN in the first four entries means "no value" (empty or
    all-NaN tensor). The tensor must be non-empty.
    """
    x = _as_real(tensor.detach())
    acc = _accumulation_dtype(x)
    if not x.is_floating_point():
        xf = x.to(acc)
        mn, mx = torch.aminmax(xf)
        zero = xf.new_zeros(())
        return torch.stack([mn, mx, xf.mean(), torch.linalg.vector_norm(xf), zero, zero, zero])
    nan_mask = x.isnan()
    nan = nan_mask.sum()
    posinf = (x == _INF).sum()
    neginf = (x == -_INF).sum()
    valid = (~nan_mask).sum()
    mn = torch.where(nan_mask, _INF, x).amin()
    mx = torch.where(nan_mask, -_INF, x).amax()
    zeroed = torch.where(nan_mask, 0, x)
    total = zeroed.sum(dtype=acc)
    norm = torch.linalg.vector_norm(zeroed, dtype=torch.float64)  # squares may overflow float32
    none = torch.tensor(float("nan"), dtype=torch.float64, device=x.device)
    has = valid > 0
    mean = total.to(torch.float64) / valid.clamp(min=1)
    return torch.stack(
        [
            torch.where(has, mn.to(torch.float64), none),
            torch.where(has, mx.to(torch.float64), none),
            torch.where(has, mean, none),
            torch.where(has, norm.to(torch.float64), none),
            nan.to(torch.float64),
            posinf.to(torch.float64),
            neginf.to(torch.float64),
        ]
    )


def stats_from_sums(sums: list[float], numel: int) -> StatsDict:
    """Stats dict from the native kernels' ``[min, max, sum, sum of squares, nan, posinf, neginf]``
    (:func:`~torchdebug.native.fused_stats.fused_stats`, ``copy_with_stats``)."""
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
    return {
        "min": low,
        "max": high,
        "mean": None if mean != mean else mean,
        "norm": math.sqrt(squares),
        "nan": int(nan),
        "posinf": int(posinf),
        "neginf": int(neginf),
    }


def _cpu_stats(tensor: torch.Tensor) -> StatsDict:
    """Fast path for CPU tensors: one native pass (float32, bfloat16, float64), else three
    reductions and a mask only when the sum is not finite."""
    x = _as_real(tensor.detach())
    sums = fused_stats(x)
    if sums is not None:
        return stats_from_sums(sums, x.numel())
    if not x.is_floating_point():
        return stats_from_vector(stats_vector(x).tolist(), integral=True)
    acc = _accumulation_dtype(x)
    total = float(x.sum(dtype=acc))
    if not math.isfinite(total):
        return stats_from_vector(stats_vector(x).tolist(), integral=False)
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


def finite_sum(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-d float64 tensor on the tensor's device, finite exactly when the floating (or complex)
    ``tensor`` holds no NaN or Inf: one reduction, never a host synchronisation.

    Up to 32-bit floats it is the sum in float64, which values below 2**128 cannot overflow; float64
    values could, so their sum is taken of ``x * 0`` (0 for a finite value, NaN for NaN or Inf).
    """
    x = tensor.detach()
    if x.is_complex():
        x = torch.view_as_real(x.resolve_conj())
    if x.dtype == torch.float64:
        x = x * 0
    return x.sum(dtype=torch.float64)


def tensor_stats(tensor: torch.Tensor) -> StatsDict:
    """Statistics of ``tensor`` as a dict keyed by ``STAT_KEYS`` (synchronises on accelerators)."""
    if tensor.numel() == 0:
        return _empty_stats()
    if tensor.device.type == "cpu":
        return _cpu_stats(tensor)
    integral = not (tensor.is_floating_point() or tensor.is_complex())
    return stats_from_vector(stats_vector(tensor).tolist(), integral=integral)


class StatsStager:
    """Collects per-tensor results computed on the device without a host synchronisation per tensor.

    ``add(tensor, sink)`` computes the statistics now (the tensor may change later) and calls
    ``sink(stats_dict)`` by the next :meth:`flush`; :meth:`stage` does the same for any small
    result (a fingerprint, an overflow flag). CPU tensors are resolved at once; accelerator results
    stay as small device tensors (the device-side table) and are copied to the host in one transfer
    per device and dtype at each flush.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[torch.Tensor, Callable[[list], None]]] = []

    def __len__(self) -> int:
        return len(self._staged)

    def add(self, tensor: torch.Tensor, sink: Callable[[StatsDict], None]) -> None:
        """Compute the statistics of ``tensor`` and deliver them to ``sink`` by the next flush."""
        if tensor.is_cpu:
            sink(_cpu_stats(tensor) if tensor.numel() else _empty_stats())
        elif tensor.numel() == 0 or tensor.is_meta:
            sink(_empty_stats())
        else:
            integral = not (tensor.is_floating_point() or tensor.is_complex())
            self._staged.append((stats_vector(tensor), lambda row: sink(stats_from_vector(row, integral))))

    def stage(self, result: torch.Tensor, sink: Callable[[list], None]) -> None:
        """Deliver ``result`` (a 0-d or 1-D device tensor) to ``sink`` as a list of Python numbers by
        the next flush; at once when it is on the CPU."""
        vector = result.reshape(-1)
        if vector.is_cpu:
            sink(vector.tolist())
        else:
            self._staged.append((vector, sink))

    def flush(self) -> None:
        """Copy staged results to the host (one transfer per device and dtype) and deliver them, in
        the order they were staged on each device; sinks may stage more, delivered in the same flush."""
        while self._staged:
            staged, self._staged = self._staged, []
            groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
            for index, (vector, _) in enumerate(staged):
                groups.setdefault((vector.device, vector.dtype), []).append(index)
            for indices in groups.values():
                flat = torch.cat([staged[i][0] for i in indices]).cpu().tolist()
                start = 0
                for i in indices:
                    vector, sink = staged[i]
                    end = start + vector.shape[0]
                    sink(flat[start:end])
                    start = end
