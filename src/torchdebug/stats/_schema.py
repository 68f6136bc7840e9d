"""The one declaration of what a tensor's statistics are: the accumulators every path computes and
how the host finishes them into a record's ``stats``.

Every path (C and Triton kernels, torch ops, compiled graphs, the device table) reduces a tensor to
the same vector of sums, one column per :data:`ACCUMULATORS` entry in this order, and
:func:`stats_from_sums` finishes it; readers iterate over :data:`STAT_KEYS`. Who checks what, and
how to add a count: docs/architecture.md, "Decisions and their reasons" ("One schema for
statistics") and "Where a change goes".
No torch here: records and readers import this module without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

StatsDict = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Accumulator:
    """One column of the sums every path computes."""

    name: str
    """The column's name (``min``, ``sum``, ``nan``, ...)."""
    field: str
    """The key of the record's ``stats`` it is finished into."""
    reduction: str
    """``min``, ``max``, ``sum`` (of the non-NaN values or their squares, float32 lanes for narrow
    dtypes and float64 partial sums) or ``count`` (int lanes, float64 in the vector)."""
    identity: float
    """The column's value before any element: that of an empty tensor, and what partial rows start from."""
    equals: float | None = None
    """A count's constant: it counts elements equal to it (``nan``: the NaN elements)."""
    nonfinite: bool = False
    """A count of NaN or infinite elements: zero when the sum of the values is finite, and for
    integer and bool tensors, so fast paths skip it."""
    label: str = ""
    """How ``show`` names a count (``+inf``); the field's name when empty."""


ACCUMULATORS: tuple[Accumulator, ...] = (
    Accumulator("min", "min", "min", math.inf),
    Accumulator("max", "max", "max", -math.inf),
    Accumulator("sum", "mean", "sum", 0.0),
    Accumulator("squares", "norm", "sum", 0.0),
    Accumulator("nan", "nan", "count", 0.0, equals=math.nan, nonfinite=True),
    Accumulator("posinf", "posinf", "count", 0.0, equals=math.inf, nonfinite=True, label="+inf"),
    Accumulator("neginf", "neginf", "count", 0.0, equals=-math.inf, nonfinite=True, label="-inf"),
    Accumulator("zeros", "zeros", "count", 0.0, equals=0.0),  # dead activations, gradients that underflowed
)
"""Every accumulator, in column order: the four value accumulators first, then the counts."""

COLUMNS = tuple(a.name for a in ACCUMULATORS)
"""Column names of the sums vector, in order (``native/stats.c`` reports the same at load)."""

WIDTH = len(ACCUMULATORS)
"""Columns of the sums vector (of a device table row)."""

COUNTS = tuple(a for a in ACCUMULATORS if a.reduction == "count")
"""The count accumulators, in column order (after the four value accumulators)."""

FIRST_COUNT = COLUMNS.index(COUNTS[0].name)

COUNT_KEYS = tuple(a.field for a in COUNTS)
"""Integer statistics: counts of elements; pieces of one tensor add theirs up."""

VALUE_KEYS = tuple(a.field for a in ACCUMULATORS[:FIRST_COUNT])
"""Float statistics of the non-NaN values (``None`` when there are none): ``min, max, mean, norm``."""

STAT_KEYS = (*VALUE_KEYS, *COUNT_KEYS)
"""The keys of a record's ``stats``, in the order they are written."""

NONFINITE_KEYS = tuple(a.field for a in COUNTS if a.nonfinite)
"""Counts of NaN and infinite elements (what overflow checks read)."""

IDENTITY = tuple(a.identity for a in ACCUMULATORS)
"""The sums of no elements (an empty tensor)."""

_NAN = COLUMNS.index("nan")
_SUM, _SQUARES = COLUMNS.index("sum"), COLUMNS.index("squares")

if COLUMNS[:FIRST_COUNT] != ("min", "max", "sum", "squares") or any(a.reduction != "count" for a in ACCUMULATORS[FIRST_COUNT:]):
    raise ImportError("torchdebug.stats._schema: the value accumulators must be min, max, sum, squares, then the counts")


def empty_stats() -> StatsDict:
    """The statistics of an empty tensor: no values, every count 0."""
    return stats_from_sums(IDENTITY, 0)


def stats_from_sums(sums: list[float] | tuple[float, ...], numel: int, integral: bool = False) -> StatsDict:
    """A record's statistics from a sums vector (:data:`COLUMNS` order) of ``numel`` elements:
    mean and norm of the non-NaN values, ``None`` for the four value statistics when there is none,
    counts as ints (``integral``: an integer or bool tensor, so min and max are ints)."""
    counts = [int(value) for value in sums[FIRST_COUNT:]]
    valid = numel - counts[_NAN - FIRST_COUNT]
    if valid == 0:
        out: StatsDict = {"min": None, "max": None, "mean": None, "norm": None}
    else:
        low, high, total, squares = sums[:FIRST_COUNT]
        mean = total / valid
        out = {
            "min": int(low) if integral else low,
            "max": int(high) if integral else high,
            "mean": None if mean != mean else mean,
            "norm": math.sqrt(squares),
        }
    out.update(zip(COUNT_KEYS, counts))
    return out


def stats_array_from_sums(sums: np.ndarray, numel: np.ndarray) -> np.ndarray:
    """:func:`stats_from_sums` of many floating tensors at once: ``sums[..., WIDTH]`` (``COLUMNS``)
    of ``numel[...]`` elements into ``[..., len(STAT_KEYS)]`` float64, NaN where the dict has
    ``None`` (and everywhere in a row whose sums are NaN: a slot not seen). The flight recorder's
    ring keeps sums and finishes a step in one vectorised call instead of one dict per tensor."""
    out = np.array(sums, dtype=np.float64)
    valid = numel - out[..., _NAN]
    with np.errstate(divide="ignore", invalid="ignore"):
        out[..., _SUM] = out[..., _SUM] / valid  # the mean
        out[..., _SQUARES] = np.sqrt(out[..., _SQUARES])  # the norm
    out[..., :FIRST_COUNT][valid == 0] = math.nan
    return out
