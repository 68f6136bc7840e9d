"""Slots of a sharded run that hold no piece of a whole value, read against another world size.

:class:`~torchdebug.compare._shards.ShardedRank` merges the pieces of split values; these slots
are read otherwise, each saying why:

* a vocabulary-sharded embedding's local ids, its lookups before the ids outside the shard are
  zeroed (a DTensor's ``MaskPartial`` output) and the masked gradient its backward reads hold this
  rank's part of another value: ``incomparable`` (:func:`vocabulary_slots`);
* a summand (``Partial``) that plain code combines with another value before any collective sums
  the ranks' summands is what that rank computes on: kept as its local value and noted as a
  missing all-reduce (:func:`unreduced_summands`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchdebug.compare._value_graph import identity
from torchdebug.records import COLLECTIVES, Record

__all__ = [
    "Layout",
    "EMBEDDINGS",
    "summand",
    "unmerged",
    "unreduced_summands",
    "vocabulary_slots",
]


@dataclass(frozen=True, slots=True)
class Layout:
    """How one record's tensor is laid out over a device mesh."""

    placements: tuple[str, ...]
    mesh: tuple[int, ...]
    coordinate: tuple[int, ...]
    shape: tuple[int, ...]
    """The whole tensor's shape."""
    local_shape: tuple[int, ...]

    @property
    def split(self) -> tuple[int, ...]:
        """Mesh dimensions whose placement splits the value (Shard or Partial)."""
        return tuple(i for i, p in enumerate(self.placements) if p.startswith(("S(", "P(")))

    @property
    def group(self) -> tuple:
        """What the records of one value's pieces share: placements, mesh, the coordinate elsewhere."""
        split = self.split
        return self.placements, self.mesh, tuple(-1 if i in split else c for i, c in enumerate(self.coordinate))

    @property
    def piece(self) -> tuple[int, ...]:
        """Which piece this is: the coordinate along the splitting mesh dimensions."""
        return tuple(self.coordinate[i] for i in self.split)

    @property
    def pieces(self) -> int:
        return math.prod(self.mesh[i] for i in self.split)

    @property
    def partial(self) -> tuple[str, ...]:
        return tuple(p for p in self.placements if p.startswith("P("))


_OUTPUTS = ("output", "parameter_grad")
EMBEDDINGS = frozenset({"aten.embedding.default", "aten.embedding_bag.default", "aten._embedding_bag.default"})


def _calls(records: Sequence[Record]) -> list[list[Record]]:
    """``records`` (in execution order) grouped by call, in the order the calls start (a call's
    argument values may be written among another call's slots)."""
    calls: dict[tuple[int, str], list[Record]] = {}
    for record in records:
        calls.setdefault((record.step, record.call_name), []).append(record)
    return list(calls.values())


_LOOKUPS = (
    "holds this rank's lookups in its vocabulary shard, ids outside its rows not yet zeroed: "
    "no summand of the whole value, which the next collective makes"
)
_LOCAL_IDS = (
    "holds the ids of this rank's vocabulary shard (shifted to its rows, the others masked), the other side the global ones"
)
_LOCAL_GRADIENT = "holds the gradient of this rank's lookups alone (ids outside its vocabulary shard masked)"


def vocabulary_slots(records: Sequence[Record], found: Mapping[int, Layout]) -> dict[int, str]:
    """``id(record)`` → why it cannot be compared, for the slots of a vocabulary-sharded embedding
    that hold this rank's part of another value: a DTensor embedding's output (``MaskPartial``: ids
    outside the shard read row 0, zeroed only when the value is reduced), and, on plain local shards
    (Megatron's layout: the table's rows split, :func:`~torchdebug.compare._shards.plain_shards`), the local ids and lookups of
    the forward and the masked gradient and local ids its backward reads."""
    why: dict[int, str] = {}
    for call in _calls(records):
        first = call[0]
        if first.extra.get("subclass"):
            for record in call:
                placements = record.extra.get("placements") or ()
                if any(str(p).startswith("MaskP(") for p in placements):
                    why[id(record)] = _LOOKUPS
            continue
        slots = {(r.io, r.arg): r for r in call if r.kind == "tensor"}
        if first.op in EMBEDDINGS:
            table = found.get(id(slots.get(("input", "0"))))
            marks = {("input", "1"): _LOCAL_IDS, ("output", "0"): _LOOKUPS}
        elif first.op == "aten.embedding_dense_backward.default":
            table = found.get(id(slots.get(("output", "0"))))
            marks = {("input", "0"): _LOCAL_GRADIENT, ("input", "1"): _LOCAL_IDS}
        else:
            continue
        if table is not None and table.placements == ("S(0)",):
            why.update((id(slots[slot]), text) for slot, text in marks.items() if slot in slots)
    return why


def unreduced_summands(records: Sequence[Record], found: Mapping[int, Layout]) -> dict[int, str]:
    """``id(record)`` → the call that combines it, for the DTensor records holding a summand (Partial;
    ``found``: the records' layouts) whose local tensor plain code combines with another value
    before any collective sums the ranks' summands (a ``RowwiseParallel`` output left ``Partial()``,
    a ``to_local()`` before the reduction): each rank then computes on its own summand."""
    calls = _calls(records)
    combined: dict[int, str] = {}
    for index, call in enumerate(calls):
        for record in call:
            layout = found.get(id(record)) if record.io in _OUTPUTS and record.extra.get("subclass") else None
            if layout is None or not layout.partial:
                continue
            reader_name = _combined_unreduced(identity(record, layout.local_shape), calls[index + 1 :])
            if reader_name is not None:
                combined[id(record)] = reader_name
    return combined


def _combined_unreduced(value: tuple | None, following: Sequence[list[Record]]) -> str | None:
    """The first plain call that combines ``value`` (a summand's local tensor), or what plain calls
    made of it alone (views, splits, copies, scalings), with another tensor before a collective
    reads it (``None``: reduced, or never combined)."""
    held, step = {value}, following[0][0].step if following else None
    for call in following:
        first = call[0]
        if first.step != step:
            return None
        inputs = [r for r in call if r.io == "input" and r.kind == "tensor"]
        if first.extra.get("subclass") or not any(identity(r) in held for r in inputs):
            continue
        if first.op.startswith(COLLECTIVES):
            return None
        if any(identity(r) not in held and math.prod(r.shape or ()) > 1 for r in inputs):
            return first.call_name
        held.update(identity(r) for r in call if r.kind == "tensor" and r.io in _OUTPUTS)
    return None


def unmerged(record: Record, why: str) -> Record:
    """``record`` marked as a piece that cannot be merged (:func:`~torchdebug.compare._shards.one_shard` says why)."""
    return dataclasses.replace(record, extra={**record.extra, "one_shard": why})


def summand(record: Record, reader_name: str) -> Record:
    """A summand's record kept as this rank's local value (:func:`unreduced_summands`), noted."""
    local = record.extra.get("local_shape", record.shape)
    extra = {**record.extra, "unreduced": reader_name}
    return dataclasses.replace(record, shape=list(local), extra=extra)
