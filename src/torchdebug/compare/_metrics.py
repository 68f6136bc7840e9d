"""Error metrics between two tensors (or two sets of statistics), computed in float64.

Tensor metrics stream over chunks of the flattened tensors, so a large pair never needs more than a
few chunk-sized float64 temporaries. NaN and Inf positions are compared explicitly (a position that
is NaN on one side only counts in ``nonfinite_mismatch``); the numeric metrics use the positions that
are finite on both sides.

``error`` is the one number verdicts use. It is relative to the tensor's *scale*, never to single
elements, so near-zero values (a LayerNorm mean, a masked row) do not inflate it::

    error = max(‖a − b‖₂ / max(‖b‖₂, atol·√n),  max|a − b| / max(max|b|, atol))

With statistics only, ``error`` is the largest difference of min, max and mean relative to the
scale ``max(|min|, |max|)`` of the reference side, or the relative difference of the L2 norms.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from torchdebug.compare._tolerances import MANTISSA_BITS, normalize_dtype

__all__ = ["TENSOR_METRICS", "STATS_METRICS", "RERUN_METRICS", "ELEMENTS_DIFFER", "tensor_metrics", "stats_metrics"]

TENSOR_METRICS = (
    "cosine",
    "max_abs_err",
    "max_rel_err",
    "rmse",
    "rel_l2",
    "within_1e-3",
    "within_5e-3",
    "max_ulp",
    "nonfinite_mismatch",
)
"""Keys of :func:`tensor_metrics`, in the order the CSV lists them."""

STATS_METRICS = (
    "min_diff",
    "max_diff",
    "mean_diff",
    "norm_diff",
    "min_rel",
    "max_rel",
    "mean_rel",
    "norm_rel",
)
"""Keys of :func:`stats_metrics`: differences ``a − b`` and ``|a − b| / |b|`` per statistic."""

ELEMENTS_DIFFER = "elements_differ"
"""The number of positions where two integer or bool tensors differ (not a CSV column: it is in the
JSON row). Compare names how many elements a selection (``topk`` indices, a mask) changed with it."""

RERUN_METRICS = ("own_err_a", "own_err_b", "kernel_err_a", "kernel_err_b")
"""With rerun: the ``error`` of an output on side A / B against its op rerun in float64 on that
side's own inputs, and that of the op re-run on the CPU in the recorded dtypes against the same
rerun: how much a healthy kernel rounds on those inputs (see :mod:`torchdebug.compare._rerun`)."""

_CHUNK = 1 << 18  # elements per float64 chunk: 2 MiB buffers, reused (fresh pages cost more than math)
_REL_EPS = 1e-12  # keeps |a-b|/|b| finite where b == 0; the verdict does not use this metric
_EXPONENT_MASK = 0x7FF0000000000000  # float64 exponent bits: x & mask == 2**floor(log2 x)


class _Buffers(threading.local):
    """Per-thread float64 scratch space, so chunks never allocate (and page-fault) new memory."""

    def __init__(self) -> None:
        self.a = torch.empty(_CHUNK, dtype=torch.float64)
        self.b = torch.empty(_CHUNK, dtype=torch.float64)
        self.d = torch.empty(_CHUNK, dtype=torch.float64)
        self.t = torch.empty(_CHUNK, dtype=torch.float64)
        self.e = torch.empty(_CHUNK, dtype=torch.int64)
        self.mask = torch.empty(_CHUNK, dtype=torch.bool)


_buffers = _Buffers()


def _ulp_params(dtype: str | None) -> tuple[int, int] | None:
    """``(mantissa bits, smallest normal exponent)`` of a floating dtype, for ULP sizes."""
    bits = MANTISSA_BITS.get(dtype or "")
    torch_dtype = getattr(torch, dtype or "", None)
    if bits is None or torch_dtype is None or torch_dtype.is_complex:
        return None
    return bits, round(math.log2(torch.finfo(torch_dtype).tiny))


class _Sums:
    """Running sums and maxima over the chunks of one pair."""

    def __init__(self, low_dtype: str | None) -> None:
        self.n = 0
        self.aa = self.bb = self.dd = 0.0
        self.max_abs = self.max_b = self.max_rel = self.max_ulp = 0.0
        self.within_1 = self.within_5 = 0
        self.ulp = _ulp_params(low_dtype)

    def add(self, a: torch.Tensor, b: torch.Tensor, buffers: _Buffers) -> None:
        """Fold in one chunk: ``a`` and ``b`` are float64 views that may be overwritten."""
        n = a.numel()
        diff, scratch = buffers.d[:n], buffers.t[:n]
        self.n += n
        # squared norms only: float64 BLAS dot stalls on thread hand-offs here; a·b follows from them
        self.aa += float(torch.linalg.vector_norm(a)) ** 2
        self.bb += float(torch.linalg.vector_norm(b)) ** 2
        torch.sub(a, b, out=diff)
        self.dd += float(torch.linalg.vector_norm(diff)) ** 2
        diff.abs_()
        b.abs_()
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.max_b = max(self.max_b, float(b.max()))
        torch.add(b, _REL_EPS, out=scratch)
        torch.div(diff, scratch, out=scratch)
        self.max_rel = max(self.max_rel, float(scratch.max()))
        self.within_1 += int(torch.count_nonzero(torch.le(scratch, 1e-3, out=buffers.mask[:n])))
        self.within_5 += int(torch.count_nonzero(torch.le(scratch, 5e-3, out=buffers.mask[:n])))
        if self.ulp is not None:
            # ulp(|b|) = 2**(max(floor(log2|b|), min_exp) - bits): keep only b's exponent bits
            bits, min_exp = self.ulp
            power = buffers.e[:n]
            torch.bitwise_and(b.view(torch.int64), _EXPONENT_MASK, out=power)
            power = power.view(torch.float64).clamp_min_(2.0**min_exp)
            torch.div(diff, power, out=scratch)
            self.max_ulp = max(self.max_ulp, float(scratch.max()) * 2.0**bits)

    def metrics(self, atol: float) -> dict[str, float]:
        if self.n == 0:
            return {"error": 0.0}
        norm_a, norm_b, norm_d = math.sqrt(self.aa), math.sqrt(self.bb), math.sqrt(self.dd)
        if norm_a == 0.0 and norm_b == 0.0:
            cosine = 1.0
        elif norm_a == 0.0 or norm_b == 0.0:
            cosine = 0.0
        else:
            dot = (self.aa + self.bb - self.dd) / 2  # ‖a−b‖² = ‖a‖² + ‖b‖² − 2a·b
            cosine = max(-1.0, min(1.0, dot / (norm_a * norm_b)))
        rel_l2 = norm_d / max(norm_b, atol * math.sqrt(self.n), 1e-300)
        scaled_max = self.max_abs / max(self.max_b, atol, 1e-300)
        return {
            "cosine": cosine,
            "max_abs_err": self.max_abs,
            "max_rel_err": self.max_rel,
            "rmse": norm_d / math.sqrt(self.n),
            "rel_l2": norm_d / norm_b if norm_b else (0.0 if norm_d == 0 else math.inf),
            "within_1e-3": self.within_1 / self.n,
            "within_5e-3": self.within_5 / self.n,
            "max_ulp": self.max_ulp,
            "error": max(rel_l2, scaled_max),
        }


def _classes(x: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf."""
    out = torch.zeros_like(x, dtype=torch.int8)
    out[x.isnan()] = 1
    out[x == math.inf] = 2
    out[x == -math.inf] = 3
    return out


_IDENTICAL = {
    "cosine": 1.0,
    "max_abs_err": 0.0,
    "max_rel_err": 0.0,
    "rmse": 0.0,
    "rel_l2": 0.0,
    "within_1e-3": 1.0,
    "within_5e-3": 1.0,
    "max_ulp": 0.0,
    "error": 0.0,
    "nonfinite_mismatch": 0.0,
}
"""Metrics of a finite tensor against a bitwise copy of itself."""


def tensor_metrics(a: torch.Tensor, b: torch.Tensor, *, low_dtype: str | None, atol: float) -> dict[str, float]:
    """Metrics of ``a`` against the reference ``b`` (same shape), in float64.

    ``low_dtype`` is the less precise dtype of the pair: ``max_ulp`` counts units in its last place.
    """
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    if a.dtype == b.dtype and torch.equal(a, b) and bool(torch.isfinite(a).all()):
        return dict(_IDENTICAL)  # bitwise copies: one pass instead of twenty
    integral = not (a.is_floating_point() or a.is_complex() or b.is_floating_point() or b.is_complex())
    differ = int(torch.count_nonzero(a != b)) if integral else None  # indices, masks: how many changed
    if a.is_complex() or b.is_complex():
        a, b = torch.view_as_real(a.to(torch.complex128)).reshape(-1), torch.view_as_real(b.to(torch.complex128)).reshape(-1)
    buffers = _buffers
    sums = _Sums(normalize_dtype(low_dtype))
    mismatch = 0
    for start in range(0, a.numel(), _CHUNK):
        part_a, part_b = a[start : start + _CHUNK], b[start : start + _CHUNK]
        n = part_a.numel()
        chunk_a, chunk_b = buffers.a[:n], buffers.b[:n]
        chunk_a.copy_(part_a)
        chunk_b.copy_(part_b)
        if not math.isfinite(float(chunk_a.sum()) + float(chunk_b.sum())):  # rare: compare NaN/Inf positions
            mismatch += int((_classes(chunk_a) != _classes(chunk_b)).sum())
            finite = torch.isfinite(chunk_a) & torch.isfinite(chunk_b)
            kept = int(finite.sum())
            chunk_a[:kept] = chunk_a[finite].clone()
            chunk_b[:kept] = chunk_b[finite].clone()
            chunk_a, chunk_b = chunk_a[:kept], chunk_b[:kept]
        if chunk_a.numel():
            sums.add(chunk_a, chunk_b, buffers)
    out = sums.metrics(atol)
    out["nonfinite_mismatch"] = float(mismatch)
    if differ is not None:
        out[ELEMENTS_DIFFER] = float(differ)
    return out


_STAT_NAMES = ("min", "max", "mean", "norm")
_STAT_METRIC_NAMES = tuple((f"{key}_diff", f"{key}_rel") for key in _STAT_NAMES)
"""The names of each statistic's two metrics, in :data:`STATS_METRICS` order."""


_FLAGS = (0.0, 1.0)
"""``nonfinite_mismatch`` as one shared float each way, not a new one per row (a compare keeps
hundreds of thousands of rows)."""


def _finite(stats: dict[str, Any]) -> list[float | None]:
    """Min, max, mean and L2 norm as floats, each ``None`` unless finite (missing, NaN, ±Inf, or not
    a number): one call per side, as compare runs it for every matched row."""
    found: list[float | None] = []
    for key in _STAT_NAMES:
        value = stats.get(key)
        if value.__class__ is not float:  # floats are the common case: only the rest need converting
            if value is None or value is True or value is False:
                found.append(None)
                continue
            value = float(value)
        found.append(value if -math.inf < value < math.inf else None)  # NaN fails both comparisons
    return found


def nonfinite_flags(stats: dict[str, Any] | None) -> tuple[bool, bool, bool]:
    """Whether statistics report any NaN, +Inf, -Inf: from the counts, or (msprobe, which has no
    counts) from min and max."""
    stats = stats or {}
    nan, posinf, neginf = stats.get("nan"), stats.get("posinf"), stats.get("neginf")
    if nan is not None and posinf is not None and neginf is not None:
        return nan > 0, posinf > 0, neginf > 0
    low, high = float(stats.get("min") or 0.0), float(stats.get("max") or 0.0)
    return math.isnan(low) or math.isnan(high), high == math.inf, low == -math.inf


def stats_metrics(a: dict[str, Any] | None, b: dict[str, Any] | None, *, numel: int, atol: float) -> dict[str, float]:
    """Differences of min, max, mean and L2 norm of ``a`` against the reference ``b``.

    Returns only the metrics both sides have; ``error`` is scale-relative (see the module docstring)
    and ``nonfinite_mismatch`` is 1 when one side reports NaN/Inf the other does not.
    """
    a, b = a or {}, b or {}
    out: dict[str, float] = {}
    error = None
    values_b = _finite(b)
    lo, hi = values_b[0], values_b[1]
    scale = max(abs(lo or 0.0), abs(hi or 0.0), atol, 1e-300)
    for index, (value_a, value_b) in enumerate(zip(_finite(a), values_b)):
        if value_a is None or value_b is None:
            continue
        diff = value_a - value_b
        diff_name, rel_name = _STAT_METRIC_NAMES[index]
        out[diff_name] = diff
        out[rel_name] = abs(diff) / abs(value_b) if value_b else (0.0 if diff == 0 else math.inf)
        if index == 3:  # the norm
            relative = abs(diff) / max(abs(value_b), atol * math.sqrt(max(numel, 1)), 1e-300)
        else:
            relative = abs(diff) / scale
        if error is None or relative > error:
            error = relative
    if error is not None:
        out["error"] = error
    out["nonfinite_mismatch"] = _FLAGS[nonfinite_flags(a) != nonfinite_flags(b)]
    return out
