"""Where each judged row's value came from, and what blame or dtype constant it carries.

The rules (:mod:`torchdebug.compare._rules`) judge an input against the tensor its producer made
(:func:`torchdebug.compare._matching.producers`; those matching found, when it hands them on: by
the value ids capture recorded, else the same saved tensor or the same dtype, shape and statistics;
looking through casts), traced through
the calls only one side runs back to matched rows; and an inherited row names the blamed row, or
the constant made for the dtype, whose error it carries. :class:`Flow` holds both for one judging of one rank's rows.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, Sequence
from fractions import Fraction

from torchdebug.compare._comparable import DataShapes, data_records
from torchdebug.compare._judgement import Judgement
from torchdebug.compare._rows import Row
from torchdebug.compare._tolerances import Tolerance
from torchdebug.compare._value_graph import Producers, execution_order, run_position
from torchdebug.records import Record

__all__ = ["Flow", "OUTPUT_IO"]

OUTPUT_IO = ("output", "parameter_grad")
"""The ``io`` of a call's output slots; every other ``io`` is an input."""
_MAX_TRACE = 8
"""How many ops only one side runs are followed back from an input (a cast chain, a hook)."""


def _records(rows: Sequence[Row], side: str) -> list[Record]:
    """One side's records of ``rows``, in row order."""
    if side == "a":
        return [row.record_a for row in rows if row.record_a is not None]
    return [row.record_b for row in rows if row.record_b is not None]


class Flow:
    """The data flow of one rank's rows and what the rows judged so far carry."""

    def __init__(
        self,
        rows: Sequence[Row],
        split: Fraction | None = None,
        made: Producers | None = None,
        tolerances: Mapping[str, Tolerance] | None = None,
    ) -> None:
        """``made``: the producers matching found for the rows' records (else traced from the rows);
        ``tolerances``: the compare's per-dtype overrides (values only one side holds are compared
        with them, :mod:`torchdebug.compare._structure`)."""
        self.tolerances: Mapping[str, Tolerance] = tolerances or {}
        self._rows = rows
        self._stepped: set[tuple[str, int, int]] | None = None
        self._optimizer_steps: set[tuple[str, int]] = set()
        """The sides and training steps with optimizer ops, with :attr:`_stepped` (found once, when first asked)."""
        self.slots: dict[str, dict[int, dict[str, Row]]] = {"a": {}, "b": {}}
        """Per side and step, the row of each output slot's name (producers are outputs)."""
        self.one_sided: dict[tuple[str, int, str], list[Row]] = {}
        reshaped = False
        slots_a, slots_b = self.slots["a"], self.slots["b"]
        for row in rows:  # one pass, most rows matched: each side written out rather than looped over
            a, b = row.record_a, row.record_b
            if a is not None and b is not None:
                if not reshaped and row.shape_a != row.shape_b and row.kind == "tensor":
                    reshaped = True
                if a.io in OUTPUT_IO:
                    slots_a.setdefault(a.step, {})[a.name] = row
                if b.io in OUTPUT_IO:
                    slots_b.setdefault(b.step, {})[b.name] = row
                continue
            side, record = ("a", a) if a is not None else ("b", b)
            if record is None:
                continue
            if record.io in OUTPUT_IO:
                self.slots[side].setdefault(record.step, {})[record.name] = row
            self.one_sided.setdefault((side, record.step, record.call_name), []).append(row)
        if made is None:
            made = Producers.of(_records(rows, "a"), _records(rows, "b"))
        self.made = {"a": made.a, "b": made.b}
        """Per side, the candidate producers of its input slots (the first is where the tensor came from)."""
        data: dict[str, set[int]] = {"a": set(), "b": set()}
        parameters: set[int] = set()
        if reshaped:  # which values are data matters only where shapes differ
            for side in ("a", "b"):
                side_records = _records(rows, side)
                ordered = [side_records[i] for i in execution_order(side_records)]
                data[side], held = data_records(ordered, {key: found[0] for key, found in self.made[side].items()})
                parameters |= held
        self.shapes = DataShapes(rows, data, ChainMap(made.a, made.b), parameters, split)
        """Where shapes differ because the runs' inputs do."""
        self.carrying: dict[Row, Judgement] = {}
        """The judgements of the rows that are or carry a blame or a constant made for the dtype."""
        self.follows: dict[Row, Row] = {}
        """The rows that are or were computed from a selection whose result differs (the routing
        changed), whatever their verdict, and that selection's row."""

    def stepped_by_optimizer(self, row: Row) -> bool:
        """Whether the tensor ``row`` holds, on either side, is one its step's optimizer reads (a
        parameter, or its state): found once, when first asked (a rule asks for an input no captured
        op made)."""
        return any(
            record is not None and (side, record.step, record.value_id) in self._optimizer_reads()
            for side, record in (("a", row.record_a), ("b", row.record_b))
        )

    def optimizer_stepped(self, side: str, step: int) -> bool:
        """Whether ``side``'s dump records an optimizer step in training step ``step`` (ops in phase
        ``optimizer``: a graph dump records none, its optimizer running outside the graphs)."""
        self._optimizer_reads()
        return (side, step) in self._optimizer_steps

    def _optimizer_reads(self) -> set[tuple[str, int, int]]:
        if self._stepped is None:
            self._stepped = set()
            for each in self._rows:
                for side, record in (("a", each.record_a), ("b", each.record_b)):
                    if record is not None and record.phase == "optimizer":
                        self._optimizer_steps.add((side, record.step))
                        if record.value_id is not None and record.io not in OUTPUT_IO:
                            self._stepped.add((side, record.step, record.value_id))
        return self._stepped

    def sources(self, row: Row, side: str, depth: int = 0) -> tuple[list[Row], list[str]] | None:
        """The matched rows whose tensor input ``row`` holds on ``side`` and the ops only that side
        ran on the way; ``None`` when unknown."""
        producer = self.producer(row, side)
        if producer is None:
            return None
        if producer.matched:
            return [producer], []
        if depth >= _MAX_TRACE:
            return None
        found, via = [], [producer.op]
        for other in self.calls_one_sided(producer, side):
            if other.io not in OUTPUT_IO and other.kind == "tensor":
                traced = self.sources(other, side, depth + 1)
                if traced is not None:
                    found += traced[0]
                    via += traced[1]
        return (found, via) if found else None

    def producer(self, row: Row, side: str) -> Row | None:
        """The output row whose tensor the input ``row`` holds on ``side`` (the first candidate
        producer), when it ran before ``row`` in the same step; ``None`` when unknown."""
        found = self.producers(row, side, first=True)
        return found[0] if found else None

    def producers(self, row: Row, side: str, first: bool = False) -> list[Row]:
        """The output rows that may have made the tensor the input ``row`` holds on ``side``, before it
        in the same step: one by value ids; with statistics alone, a value an op passes on unchanged (a
        ``clone``) has several makers (:func:`~torchdebug.compare._matching.candidate_producers`), the
        first made first.
        ``first``: the first candidate only (empty when it is not such a row)."""
        record = row.record_a if side == "a" else row.record_b
        made = self.made[side].get(id(record))
        if record is None or made is None:
            return []
        slots = self.slots[side].get(record.step, {})
        found = []
        for link in made[:1] if first else made:
            producer = slots.get(f"{link[0]}/{link[1]}")
            if producer is None:
                continue  # another step: no reliable link
            # else it must have run before: by the rows' order, or for a call only this side runs
            # (placed after its predecessor's partner), by this side's own order
            made_here = producer.record_a if side == "a" else producer.record_b
            if producer.order < row.order or not producer.matched and run_position(made_here) < run_position(record):
                found.append(producer)
        return found

    def calls_one_sided(self, row: Row, side: str) -> list[Row]:
        """The unmatched rows of the call of ``row``'s record on ``side`` (its other slots)."""
        record = row.record_a if side == "a" else row.record_b
        return self.one_sided.get((side, record.step, record.call_name), []) if record is not None else []

    def forward_origin(self, row: Row, side: str) -> str | None:
        """The blame that the forward call differentiated by ``row``'s backward call carries, when
        only ``side`` runs that forward call (the backward of a hook's op scales the gradient as the
        op scaled the value: the same difference, not a second one)."""
        record = row.record_a if side == "a" else row.record_b
        if record is None or not record.fwd:
            return None
        for other in self.one_sided.get((side, record.step, record.fwd), []):
            judged = self.carrying.get(other)
            if judged is not None and judged.origin is not None:
                return judged.origin
        return None

    def carried(self, sources: Sequence[Row]) -> tuple[str | None, str | None]:
        """What a row computed from ``sources`` carries: ``(origin, None)`` with the first blamed
        row among them (or the one they carry); else ``(None, constant)`` when the source with the
        largest error is or carries a constant made for the dtype; else ``(None, None)``."""
        for source in sources:
            judged = self.carrying.get(source)
            origin = judged.origin if judged is not None else None
            if origin is None and source.attribution == "blamed":
                origin = source.name
            if origin is not None:
                return origin, None
        largest = max(sources, key=lambda source: source.difference or 0.0, default=None)
        judged = self.carrying.get(largest) if largest is not None else None
        return None, judged.constant if judged is not None else None

    def record(self, row: Row, judgement: Judgement) -> None:
        """Keep ``row``'s judgement when it is or carries a blame or a dtype constant."""
        if judgement.origin is not None or judgement.constant is not None:
            self.carrying[row] = judgement

    def decision(self, sources: Sequence[Row]) -> Row | None:
        """The changed selection that one of ``sources`` is or was computed from (:attr:`follows`)."""
        follows = self.follows
        return next((follows[source] for source in sources if source in follows), None) if follows else None

    def counts(self, row: Row) -> bool:
        """Whether ``row``'s error counts as error seen upstream: not a constant made for the dtype
        (or what carries it), not a value that cannot be compared."""
        judged = self.carrying.get(row)
        return row.verdict != "incomparable" and (judged is None or judged.constant is None)
