"""Tolerances from the run itself (``noise=``): each slot's tolerance measured from B's own round-off.

The user dumps the reference step twice, the second time (C) with a tiny perturbation: inputs or
weights rounded through a lower precision and back, or another reduction order. B against C is
compared with the same metric as A against B (:mod:`torchdebug.compare._metrics`), and each slot's
error there is its measured **noise**: how far a healthy run may drift at that slot from a
perturbation of the size of round-off, amplified by every op before it (TTrace, arXiv 2506.09280,
at op level). A against B is then judged, slot by slot, at

    tolerance = max(NOISE_MULTIPLE × noise, rounding_tolerance(less precise dtype of A and B))

instead of the dtype's constant; the floor is the round-off one healthy op makes in the pair's less
precise dtype (:func:`~torchdebug.compare._tolerances.rounding_tolerance`), so a slot the
perturbation did not reach still allows A's own rounding. Slots without a measurement (B-only rows,
slots C lacks or holds in another shape, integer slots, a non-finite noise) keep the dtype rule.
Only ``row.tolerance`` changes: inheritance and attribution read it as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from torchdebug.compare._rows import Row
from torchdebug.compare._tolerances import lower_precision, rounding_tolerance
from torchdebug.records import Record

__all__ = ["NOISE_MULTIPLE", "NoiseKey", "measured_noise", "calibrate"]

NOISE_MULTIPLE = 4.0
"""How many times its measured noise a slot of A may differ from B: A's lower precision rounds at
every op, where C's perturbation enters once at its inputs, so A's drift is a few times C's."""

NoiseKey = tuple[int, str]
"""A slot of B: its step and stable name."""


def _key(record: Record) -> NoiseKey:
    return record.step, record.name


def measured_noise(rows: Iterable[Row]) -> dict[NoiseKey, float]:
    """Per slot of B, its difference from C: ``rows`` are B (side A of that comparison) against C,
    with metrics filled in. Slots with no finite difference measure nothing and are left out."""
    noise: dict[NoiseKey, float] = {}
    for row in rows:
        difference = row.difference
        if row.record_a is None or row.record_b is None or row.kind != "tensor" or row.tolerance is None:
            continue
        if difference is not None and math.isfinite(difference):
            noise[_key(row.record_a)] = difference
    return noise


def calibrate(rows: Iterable[Row], noise: Mapping[NoiseKey, float]) -> int:
    """Set the tolerance of each row of A against B whose slot of B has a measured ``noise`` (see the
    module docstring); the others keep their dtype's. Returns how many rows were calibrated."""
    floors: dict[str | None, float | None] = {}  # per less precise dtype: a handful
    calibrated = 0
    for row in rows:
        if row.tolerance is None or row.record_b is None:
            continue
        measured = noise.get(_key(row.record_b))
        if measured is None:
            continue
        dtype = lower_precision(row.dtype_a, row.dtype_b)
        if dtype not in floors:
            floors[dtype] = rounding_tolerance(dtype)
        floor = floors[dtype]
        if floor is None:  # integer or bool slots must match exactly
            continue
        row.tolerance = max(NOISE_MULTIPLE * measured, floor)
        calibrated += 1
    return calibrated
