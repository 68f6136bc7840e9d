"""Per-dtype tolerances: how much error a comparison accepts before a row stops being ``pass``.

A pair is judged at the tolerance of its *less precise* side, so a bf16 run compared with an fp32
run is allowed bf16 rounding, not fp32 rounding. The defaults are ``torch.testing``'s
(``rtol``/``atol`` per dtype). Errors are measured relative to the tensor's scale (see
:mod:`torchdebug.compare._metrics`), so ``rtol`` bounds that scale-relative error and ``atol`` is the
floor of the scale: tensors whose values are all below ``atol`` are compared in absolute terms.

:func:`rounding_tolerance` is a different bound: how far one healthy op's output may be from its
exact (float64) value, which rerun (:mod:`torchdebug.compare._rerun`) measures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torchdebug.errors import ConfigError

__all__ = ["DEFAULT_TOLERANCES", "Tolerance", "tolerance_for", "rounding_tolerance"]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """Accepted error for one dtype: ``rtol`` relative to the tensor's scale, ``atol`` its floor."""

    rtol: float
    atol: float

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0:
            raise ConfigError(f"tolerance: got rtol={self.rtol}, atol={self.atol}; both must be >= 0")


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-7),
    "complex128": Tolerance(1e-7, 1e-7),
    "float32": Tolerance(1.3e-6, 1e-5),
    "complex64": Tolerance(1.3e-6, 1e-5),
    "float16": Tolerance(1e-3, 1e-5),
    "bfloat16": Tolerance(1.6e-2, 1e-5),
    # fp8: torch.testing has no defaults; two units of the 3- and 2-bit mantissas
    "float8_e4m3fn": Tolerance(0.125, 1e-3),
    "float8_e4m3fnuz": Tolerance(0.125, 1e-3),
    "float8_e5m2": Tolerance(0.25, 1e-3),
    "float8_e5m2fnuz": Tolerance(0.25, 1e-3),
}
"""``torch.testing.assert_close`` defaults; integer and bool dtypes must match exactly."""

_EXACT = Tolerance(0.0, 0.0)

# How precise each floating dtype is, in mantissa bits: the less precise side sets the tolerance.
MANTISSA_BITS: dict[str, int] = {
    "float64": 52,
    "complex128": 52,
    "float32": 23,
    "complex64": 23,
    "float16": 10,
    "bfloat16": 7,
    "float8_e4m3fn": 3,
    "float8_e4m3fnuz": 3,
    "float8_e5m2": 2,
    "float8_e5m2fnuz": 2,
}


MIN_EXPONENTS: dict[str, int] = {
    "float64": -1022,
    "complex128": -1022,
    "float32": -126,
    "complex64": -126,
    "float16": -14,
    "bfloat16": -126,
    "float8_e4m3fn": -6,
    "float8_e4m3fnuz": -7,
    "float8_e5m2": -14,
    "float8_e5m2fnuz": -15,
}
"""Exponent of the smallest normal number of each floating dtype: below it values are subnormal,
spaced ``2 ** (exponent - mantissa bits)`` apart, so their relative precision drops (fp16 gradients
of 1e-5 keep about 7 bits)."""


ACCUMULATION_UNITS = 64
"""Units in the last place of float32 (or of the op's dtype when more precise) a healthy op's
accumulations may add to its output's error: bf16 and fp16 ops accumulate in float32, float32
matmuls and sums over ~1k elements were seen at 8 units, and errors grow about as the square root
of the reduction length."""


def normalize_dtype(dtype: str | None) -> str | None:
    """``torch.float32`` or ``float32`` → ``float32`` (msprobe writes the former)."""
    if dtype is None:
        return None
    return dtype.removeprefix("torch.")


def lower_precision(dtype_a: str | None, dtype_b: str | None) -> str | None:
    """The less precise of two dtypes (fewer mantissa bits); a non-float side wins (exact match)."""
    a, b = normalize_dtype(dtype_a), normalize_dtype(dtype_b)
    if a is None or b is None:
        return a or b
    bits_a, bits_b = MANTISSA_BITS.get(a), MANTISSA_BITS.get(b)
    if bits_a is None or bits_b is None:
        return a if bits_a is None else b
    return a if bits_a <= bits_b else b


def tolerance_for(dtype_a: str | None, dtype_b: str | None, overrides: Mapping[str, Tolerance] | None = None) -> Tolerance:
    """The tolerance of a pair: the less precise dtype's entry, user ``overrides`` first."""
    dtype = lower_precision(dtype_a, dtype_b)
    if dtype is None:
        return _EXACT
    if overrides and dtype in overrides:
        return overrides[dtype]
    return DEFAULT_TOLERANCES.get(dtype, _EXACT)


def parse_tolerances(spec: Mapping[str, object] | None, key: str = "tolerances") -> dict[str, Tolerance]:
    """Turn ``{"bfloat16": {"rtol": 0.02, "atol": 1e-5}}`` or ``{"bfloat16": 0.02}`` into tolerances.

    A bare number sets ``rtol`` and keeps the default ``atol``.
    """
    out: dict[str, Tolerance] = {}
    for dtype, value in (spec or {}).items():
        name = normalize_dtype(str(dtype)) or ""
        default = DEFAULT_TOLERANCES.get(name, _EXACT)
        if isinstance(value, Tolerance):
            out[name] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = Tolerance(float(value), default.atol)
        elif isinstance(value, Mapping) and set(value) <= {"rtol", "atol"}:
            out[name] = Tolerance(float(value.get("rtol", default.rtol)), float(value.get("atol", default.atol)))
        else:
            raise ConfigError(f"{key}.{name}: got {value!r}, expected a number (rtol) or {{'rtol': ..., 'atol': ...}}")
    return out


def rounding_tolerance(dtype: str | None, scale: float | None = None) -> float | None:
    """Scale-relative error a healthy op may make in ``dtype``, against its float64 rerun: one unit
    in the last place (twice the output's rounding) plus :data:`ACCUMULATION_UNITS` units of its
    accumulation dtype (float32 or more precise); with the output's ``scale`` (its largest magnitude),
    plus the spacing of the dtype's subnormals relative to it, which dominates for outputs near the
    smallest normal number (fp16 gradients without loss scaling). ``None`` for dtypes that are not
    floating."""
    name = normalize_dtype(dtype) or ""
    bits = MANTISSA_BITS.get(name)
    if bits is None:
        return None
    tolerance = 2.0**-bits + ACCUMULATION_UNITS * 2.0 ** -max(bits, MANTISSA_BITS["float32"])
    if scale:
        tolerance += 2.0 ** (MIN_EXPONENTS[name] - bits) / scale
    return tolerance
