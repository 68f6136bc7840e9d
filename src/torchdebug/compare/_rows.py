"""One row of a comparison: a tensor slot (or argument) of side A next to its match on side B."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from torchdebug.records import Record, call_name

__all__ = ["OLD_COLUMNS", "Row", "VERDICTS"]

VERDICTS = ("pass", "warning", "undecided", "error", "incomparable", "unmatched")
"""``undecided``: beyond tolerance, and statistics cannot tell whether the op or its inputs made it
(a tensor dump decides); ``incomparable``: the two sides hold values that cannot be compared — their
shapes differ because the runs' inputs do, or they were computed from such values, or (checksums)
their dtypes differ — so the row is neither a pass nor an error; ``unmatched``: the slot exists on
one side only (listed, never judged)."""


OLD_COLUMNS = {"error": "difference"}
"""Columns written under their former name too, for one release (old name -> new name): readers of
the CSV and JSON written before the rename keep working."""

_NAMED_BY_B = frozenset({"value", "group"})


def _compared_shapes(a: Record, b: Record) -> tuple[list[int] | None, list[int] | None]:
    """The shapes two records are compared under. A wrapper subclass's record (a DTensor: the
    statistics of this rank's local shard, under the global shape) against a plain record of its
    local shape (a compiled graph computes on the shards, and so does tensor parallelism between its
    layers) describes the same local tensor: both compare under the local shape."""
    local_a, local_b = a.extra.get("local_shape"), b.extra.get("local_shape")
    if local_a is not None and local_b is None and local_a == b.shape:
        return b.shape, b.shape
    if local_b is not None and local_a is None and local_b == a.shape:
        return a.shape, a.shape
    return a.shape, b.shape


@dataclass(slots=True, eq=False)
class Row:
    """A compared slot: where it is, both sides' dtype and shape, metrics and the verdict."""

    rank: int
    step: int
    phase: str
    module: str
    op: str
    call: int
    io: str
    arg: str
    name: str
    """Side A's stable name (side B's for a B-only row, and for a ``value`` or ``group`` row: a slot of
    A aligned with a call of B it is not a call of, see :mod:`torchdebug.compare._boundaries`)."""
    name_b: str | None
    """Side B's stable name (``None`` for an A-only row; for an ``inside`` row, the call of B it is inside)."""
    match: str
    """``exact``, ``mapped``, ``aligned``, ``value``, ``group``, ``only_a``, ``only_b`` or ``inside``
    (see :mod:`torchdebug.compare._matching` and :mod:`torchdebug.compare._boundaries`)."""
    order: float
    kind: str = "tensor"
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_a: list[int] | None = None
    shape_b: list[int] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """Rows with the same statistics on both sides share one dict of statistics metrics (a compare
    keeps hundreds of thousands of rows): give a row more metrics by replacing its dict, not by
    updating it in place."""
    difference: float | None = None
    """The scale-relative difference the verdict is based on (see :mod:`torchdebug.compare._metrics`)."""
    tolerance: float | None = None
    verdict: str = "pass"
    attribution: str = ""
    """``blamed`` (the error starts here), ``inherited`` (its inputs already carry it), ``undecided``,
    ``dtype`` (a constant made for the dtype, such as ``torch.finfo(dtype).min``, that differs because
    the runs' dtypes do: it passes) or empty."""
    message: str = ""
    source: str | None = None
    record_a: Record | None = field(default=None, repr=False)
    record_b: Record | None = field(default=None, repr=False)
    unreadable: str | None = field(default=None, repr=False)
    """Why its saved tensors could not be read (a damaged tensor file): compared by statistics instead."""
    block: Any = field(default=None, repr=False)
    """For a slot only one side holds: the structure difference it belongs to (a
    :class:`~torchdebug.compare._structure.StructureBlock`, shared by the block's rows)."""

    @classmethod
    def from_records(
        cls, rank: int, a: Record | None, b: Record | None, how: str, order: float, inside: str | None = None
    ) -> Row:
        """A row for two paired records (either may be ``None``; ``inside``: the call of B an A-only
        slot is inside)."""
        first = b if a is None or how in _NAMED_BY_B else a
        assert first is not None
        shape_a, shape_b = a.shape if a else None, b.shape if b else None
        if shape_a != shape_b and a is not None and b is not None:
            shape_a, shape_b = _compared_shapes(a, b)
        # every field by position: keywords cost about 0.5 µs a row (a compare makes hundreds of thousands)
        return cls(
            rank,
            first.step,
            first.phase,
            first.module,
            first.op,
            first.call,
            first.io,
            first.arg,
            first.name,
            b.name if b is not None else inside,
            how,
            order,
            first.kind,
            a.dtype if a else None,
            b.dtype if b else None,
            shape_a,
            shape_b,
            {},  # metrics
            None,  # difference
            None,  # tolerance
            "pass",
            "",  # attribution
            "",  # message
            a.source if a and a.source else b.source if b else None,
            a,
            b,
        )

    @property
    def error(self) -> float | None:
        """Former name of :attr:`difference` (one release, with a ``FutureWarning``)."""
        warnings.warn("Row.error is deprecated; read Row.difference", FutureWarning, stacklevel=2)
        return self.difference

    @error.setter
    def error(self, value: float | None) -> None:
        warnings.warn("Row.error is deprecated; set Row.difference", FutureWarning, stacklevel=2)
        self.difference = value

    @property
    def call_name(self) -> str:
        """The op call this slot belongs to (side A's name)."""
        return call_name(self.name)

    @property
    def matched(self) -> bool:
        return self.record_a is not None and self.record_b is not None

    def to_dict(self) -> dict[str, Any]:
        """A flat, JSON-ready dict (metrics inlined, :data:`OLD_COLUMNS` under their former names too),
        without the record references."""
        out: dict[str, Any] = {
            "rank": self.rank,
            "step": self.step,
            "phase": self.phase,
            "module": self.module,
            "op": self.op,
            "call": self.call,
            "io": self.io,
            "arg": self.arg,
            "name": self.name,
            "name_b": self.name_b,
            "match": self.match,
            "kind": self.kind,
            "dtype_a": self.dtype_a,
            "dtype_b": self.dtype_b,
            "shape_a": self.shape_a,
            "shape_b": self.shape_b,
            "difference": self.difference,
            "tolerance": self.tolerance,
            "verdict": self.verdict,
            "attribution": self.attribution,
            "message": self.message,
            "source": self.source,
        }
        out.update(self.metrics)
        out.update({old: out[new] for old, new in OLD_COLUMNS.items()})
        return out
