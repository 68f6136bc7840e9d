"""The sums vector (:mod:`torchdebug.stats._schema`) with torch ops, on the tensor's own device.

The fallback of the fused kernels (no C compiler, no Triton, dtypes they do not take, other
devices). Counts are built from the schema (:attr:`~torchdebug.stats._schema.Accumulator.equals`),
so a new count needs nothing here.
"""

from __future__ import annotations

import functools
import warnings

import torch

from torchdebug.stats._schema import COUNTS

_INF = float("inf")


NO_STATISTICS = "no statistics: torch reduces no values of this dtype (bits, sub-byte or packed)"
"""The ``capture_error`` of a tensor whose dtype :func:`has_statistics` says no to (its fingerprint
is still taken: it reads bits)."""

_QUANTIZED = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})


@functools.cache
def has_statistics(dtype: torch.dtype) -> bool:
    """Whether torch can turn values of ``dtype`` into numbers to reduce (:func:`as_real`): not for
    ``bits8``, ``uint1``-``uint7``, ``int1``-``int7`` or ``float4_e2m1fn_x2``, whose values are bits
    or packed pairs. Asked of torch once per dtype, so a dtype a later torch adds is answered too."""
    if dtype in _QUANTIZED:
        return True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (complex to real drops the imaginary part: not asked here)
            torch.empty(1, dtype=dtype).to(torch.float64)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def as_real(tensor: torch.Tensor) -> torch.Tensor:
    """The values statistics are taken over: magnitudes for complex, numbers for bool, float8 widened to
    float32 (torch has no reductions over float8), a quantized tensor's dequantized values (the
    numbers it stands for, which a float reference holds)."""
    if tensor.is_quantized:
        return tensor.dequantize()
    if tensor.is_complex():
        return tensor.abs()
    if tensor.dtype == torch.bool:
        return tensor.to(torch.uint8)
    if tensor.is_floating_point() and tensor.element_size() == 1:
        return tensor.float()
    return tensor


def accumulation_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float64 for float64 and integer tensors, float32 for the other floating dtypes."""
    if tensor.dtype == torch.float64 or not tensor.is_floating_point():
        return torch.float64
    return torch.float32


def count(x: torch.Tensor, equals: float) -> torch.Tensor:
    """How many elements of ``x`` equal ``equals`` (NaN: how many are NaN), a 0-d int64 tensor."""
    return (x != x).sum() if equals != equals else (x == equals).sum()


def counts(x: torch.Tensor, *, nonfinite: bool) -> list[torch.Tensor]:
    """The schema's counts of ``x`` in column order, those of NaN and Inf (``nonfinite`` False: known
    to be zero) as 0-d zeros."""
    return [count(x, a.equals) if nonfinite or not a.nonfinite else x.new_zeros((), dtype=torch.int64) for a in COUNTS]


def device_sums(tensor: torch.Tensor) -> torch.Tensor:
    """The sums vector (``schema.COLUMNS``) as float64 on the tensor's device, with torch ops: NaNs
    left out of min, max, sum and squares; min/max ``+inf``/``-inf`` when every element is NaN.
    Never synchronises with the device; the tensor must be non-empty. Integers and bool are taken
    in float64 (exact below 2**53)."""
    x = as_real(tensor.detach())
    if not x.is_floating_point():
        xf = x.to(torch.float64)
        low, high = torch.aminmax(xf)
        flat = xf.reshape(-1)
        return torch.stack([low, high, xf.sum(), torch.dot(flat, flat), *(c.double() for c in counts(x, nonfinite=False))])
    nan = x.isnan()
    low = torch.where(nan, _INF, x).amin()
    high = torch.where(nan, -_INF, x).amax()
    kept = torch.where(nan, 0, x)
    total = kept.sum(dtype=accumulation_dtype(x))
    squares = torch.linalg.vector_norm(kept, dtype=torch.float64).square()  # squares may overflow float32
    return torch.stack([v.to(torch.float64) for v in (low, high, total, squares, *counts(x, nonfinite=True))])
