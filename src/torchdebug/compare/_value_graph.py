"""The value graph of one dump: which earlier output made the value each input slot holds.

Exact where the dump records value ids (eager capture, ``torchdebug.capture.value_ids``, and graph
dumps, ``torchdebug.graph_dump._value_ids``: a dict lookup per input); elsewhere (older dumps,
msprobe dumps) inferred from dtype, shape and statistics (:func:`identity`), which cannot tell
identical tensors apart (two zero biases). Matching
aligns the two dumps' graphs (:mod:`torchdebug.compare._flow_alignment`, :mod:`torchdebug.compare._matching`);
the verdicts trace an input through ops only one side runs with it. :func:`held_values` says which
value each slot holds, looking through views and copies (the decomposed-group rule's values).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import NamedTuple

from torchdebug.records import MODULE_OP, PHASES, Record, call_name, split_call_name

__all__ = [
    "OUTPUTS",
    "Candidates",
    "Producers",
    "candidate_producers",
    "execution_order",
    "held_values",
    "identity",
    "producers",
    "run_position",
]

OUTPUTS = ("output", "parameter_grad")
"""The slots a call makes values in."""

_PHASE_ORDER = {phase: index for index, phase in enumerate(PHASES)}


def run_position(record: Record) -> tuple[int, int, int]:
    """Where a record's call ran on its side: step, phase and call order."""
    return record.step, _PHASE_ORDER.get(record.phase, len(PHASES)), record.seq


def execution_order(records: Sequence[Record]) -> list[int]:
    """Indices of ``records`` sorted by step, phase and call order (stable): :func:`run_position`'s
    keys, built inline (a call per record would cost five times the sort)."""
    phase_index, later = _PHASE_ORDER, len(PHASES)
    keys = [(r.step, phase_index.get(r.phase, later), r.seq) for r in records]
    return sorted(range(len(records)), key=keys.__getitem__)


def identity(record: Record, shape: Sequence[int] | None = None) -> tuple | None:
    """What makes two slots of one dump the same tensor, where the dump records no value ids: the
    saved tensor's key, else dtype, shape (``shape`` instead of the record's: a DTensor's local shape,
    which its statistics describe) and statistics."""
    if record.kind != "tensor":
        return None
    if record.tensor and record.tensor.get("key"):
        return ("key", record.tensor.get("file"), record.tensor["key"])
    if record.stats:
        return ("stats", record.dtype, tuple(record.shape or () if shape is None else shape), tuple(record.stats.values()))
    return None


_CASTS = {"aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.type_as.default"}
"""Ops that only change dtype: transparent when tracing where a tensor came from (autocast adds them)."""


_NEAREST = 2
"""How many of the latest earlier producers of a value, besides the first, an input's candidates keep.
Freshly initialised tensors share their statistics (zero biases and optimizer state, LayerNorm
weights of ones): a bound keeps a step's matching linear in its records however many there are."""


Candidates = dict[int, tuple[tuple[str, str], ...]]
"""Earlier ``(call name, output slot)`` that made the tensor of each input slot (by ``id``), first made first."""


def producers(records: Sequence[Record]) -> dict[int, tuple[str, str]]:
    """For input slots (by ``id``) of ``records`` in execution order: ``(call name, output slot)`` that
    produced the same tensor earlier, looking through casts (exact where the dump records value ids,
    :func:`candidate_producers`). Compare's matching and its verdicts (which trace an input through ops
    only one side runs) follow tensors with it."""
    return {key: found[0] for key, found in candidate_producers(records, nearest=0).items()}


class _Made:
    """The distinct producers of a value that more than one call made, in the order they first made it."""

    __slots__ = ("order", "seen")

    def __init__(self, first: tuple[str, str], second: tuple[str, str]) -> None:
        self.order = [first, second]
        self.seen = {first, second}

    def add(self, producer: tuple[str, str]) -> None:
        if producer not in self.seen:
            self.seen.add(producer)
            self.order.append(producer)

    def candidates(self, call: str, nearest: int) -> tuple[tuple[str, str], ...]:
        """The first producer other than ``call`` and up to ``nearest`` latest others, first made first.
        Only ``call``'s own outputs are skipped on the way, so the cost does not grow with the group."""
        order = self.order
        first = next((i for i, producer in enumerate(order) if producer[0] != call), None)
        if first is None:
            return ()
        latest: list[int] = []
        i = len(order) - 1
        while i > first and len(latest) < nearest:
            if order[i][0] != call:
                latest.append(i)
            i -= 1
        return (order[first], *(order[j] for j in reversed(latest)))


def candidate_producers(records: Sequence[Record], nearest: int = _NEAREST) -> Candidates:
    """Earlier ``(call name, output slot)`` that made the tensor an input slot (by ``id``) holds,
    first made first (:func:`producers` takes that one).

    A dump whose slots carry value ids (eager capture and graph dumps since they exist) gives one
    producer each, by a dict lookup (:func:`_recorded_producers`). Others (older dumps, msprobe dumps) are
    inferred from :func:`identity`, and with statistics identity is ambiguous: in a
    bf16 run AdamW's weight decay (``mul_`` by ``1 - lr * wd``) rounds back to the very weight the
    forward pass transposed, so both calls made the value the update reads. Of a group of calls that
    made one value (at the first step, every zero bias's optimizer state), the first and the
    ``nearest`` latest before the input are kept: the latest is where the input's own tensor came
    from unless a later call remade the value, the first is where it was first seen."""
    if any(record.value_id is not None for record in records):
        return _recorded_producers(records)
    made_by: dict[tuple, _Made | tuple[tuple[str, str]]] = {}  # a value's one maker, or its group of them
    found: Candidates = {}
    cast_sources: dict[str, tuple[str, str]] = {}
    names: dict[str, str] = {}  # one string per call name and slot name kept in ``found``
    for record in records:
        io = record.io
        if io == "input":
            value = identity(record)
            group = made_by.get(value) if value is not None else None
            if group is None:  # a value no earlier call made (a weight, the batch)
                continue
            call = call_name(record.name)
            if group.__class__ is tuple:  # one maker: its own candidates, unless it is this call
                made = () if group[0][0] == call else group
            else:
                made = group.candidates(call, nearest)
            if made:
                found[id(record)] = made
                if record.op in _CASTS:
                    cast_sources[call] = made[0]
        elif io in OUTPUTS:
            value = identity(record)
            if value is None:
                continue
            call, slot = split_call_name(record.name)
            producer = cast_sources.get(call) if record.op in _CASTS else None
            if producer is None:
                producer = (names.setdefault(call, call), names.setdefault(slot, slot))
            group = made_by.get(value)
            if group is None:
                made_by[value] = (producer,)  # most values have one maker: a group only for more
            elif group.__class__ is tuple:
                if group[0] != producer:
                    made_by[value] = _Made(group[0], producer)
            else:
                group.add(producer)
    return found


def _recorded_producers(records: Sequence[Record]) -> Candidates:
    """:func:`candidate_producers` by the value ids capture recorded (``torchdebug.capture.value_ids``).

    An input's producer is the first output slot that held its ``(value_id, version)``, or one that
    rewrote it in place without a new version (a c10d collective reads and writes its tensor). A
    tensor no recorded op made takes the first view of its memory at that version with its shape and
    statistics, when it is a view itself (taken outside capture: activation checkpointing's cached
    tensors), else the op that wrote its memory at that version (``(view_of or value_id, version)``:
    the op that made it, or an in-place op that wrote it through another view; views made of it
    write nothing).

    As with statistics, the first candidate is the op that made the value: where the producer only
    passed on the value of its first tensor input (a ``detach``, a ``clone``: the same dtype, shape
    and statistics, or fingerprint), the candidates are that value's maker, then the producer. Casts
    are looked through. A slot without an id (a non-tensor argument) has no producer. A module's
    output is recorded with the module call's place in the order, before the ops inside it: the op
    that made the value takes its place. An op activation checkpointing runs again in the backward
    makes its values as the forward call it repeats (``fwd``): a checkpointed run's backward reads
    them where a plain run's reads the forward's."""
    records = _recomputed_in_place(records)
    made: dict[tuple[int, int | None], tuple[str, str]] = {}
    by_module: set[tuple[int, int | None]] = set()  # values whose first holder so far is a module's output
    memory: dict[tuple[int, int | None], tuple[str, str]] = {}
    views: dict[tuple, tuple[tuple[str, str], Record]] = {}  # by memory and shape: the first view made there
    origin: dict[tuple[str, str], tuple[str, str]] = {}  # a producer that passed a value on: the value's maker
    found: Candidates = {}
    cast_sources: dict[str, tuple[str, str]] = {}
    names: dict[str, str] = {}  # one string per call name and slot name kept in ``found``
    reading, step, read, first_read = None, None, {}, None  # the call whose inputs were seen last, and:
    for record in records:
        value_id = record.value_id
        if value_id is None:
            continue
        io = record.io
        if io != "input" and io not in OUTPUTS:
            continue
        version, view_of, name = record.version, record.view_of, record.name
        key = (value_id, version)
        where = (value_id if view_of is None else view_of, version)
        cut = name.rfind("/")  # call_name and split_call_name, inline: once per record
        call = name[:cut] if cut >= 0 else name
        if io == "input":
            if call != reading or record.step != step:  # its step, what its inputs held, its first input
                reading, step, read, first_read = call, record.step, {}, record
            read[value_id] = version
            producer = made.get(key)
            if producer is None:  # a tensor no recorded op made: a view of its memory that holds its value, or the writer
                view = views.get((where, tuple(record.shape or ()))) if view_of is not None else None
                producer = view[0] if view is not None and _passed_on(view[1], record) else memory.get(where)
            if producer is not None and producer[0] != call:
                first = origin.get(producer)
                found[id(record)] = (producer,) if first is None else (first, producer)
                if record.op in _CASTS:
                    cast_sources[call] = producer
            continue
        slot = name[cut + 1 :] if cut >= 0 else name
        op = record.op
        producer = cast_sources.get(call) if op in _CASTS else None
        same_call = call == reading and record.step == step
        if producer is None:
            twin = record.fwd if record.phase == "recompute" else None  # the forward call it repeats
            producer = (names.setdefault(twin or call, twin or call), names.setdefault(slot, slot))
            source = first_read if same_call and op != MODULE_OP else None  # what a view or copy reads
            if source is not None and id(source) in found and _passed_on(source, record):
                origin[producer] = found[id(source)][0]
            else:  # the call of this name in another step may have passed its value on
                origin.pop(producer, None)
        if op == MODULE_OP:  # a module passes on what its ops made: it makes nothing itself
            if key not in made:
                made[key] = producer
                by_module.add(key)
            continue
        wrote = same_call and value_id in read  # in place (a view op's output is new)
        rewrote = wrote and read[value_id] == version
        if rewrote or key not in made or key in by_module:
            made[key] = producer
            by_module.discard(key)
        if (wrote or view_of is None) and (rewrote or where not in memory):
            memory[where] = producer
        if view_of is not None:
            views.setdefault((where, tuple(record.shape or ())), (producer, record))
    return found


def _recomputed_in_place(records: Sequence[Record]) -> Iterable[Record]:
    """``records`` (in execution order, where the ops activation checkpointing runs again come after
    the step's backward) with those ops moved where they ran, among the backward's (by ``seq``): the
    backward reads what they made."""
    recomputed = [record for record in records if record.phase == "recompute"]
    if not recomputed:
        return records
    others = (record for record in records if record.phase != "recompute")
    return heapq.merge(others, recomputed, key=attrgetter("step", "seq"))


_COPIES = {"aten.clone.default", "aten.lift_fresh_copy.default", "aten._to_copy.default", "aten.contiguous.default"}
"""Ops whose output is a new tensor holding their input's value when dtype, shape and statistics stay."""


def held_values(records: Sequence[Record]) -> dict[int, tuple[int, int, int | None]]:
    """The value each tensor slot (by ``id``) of ``records`` (in execution order) holds, by the value
    ids the dump records: ``(step, value_id, version)``, or the value a view or a copy passed on (a
    ``detach`` or an ``alias`` of a whole tensor, a ``clone``: the same dtype, shape and statistics as
    its call's input, or a view as its base; a transpose of a square matrix counts as holding its
    elements, which compare's metrics take in any order). An op the compiler erased passes on the
    value its input held, so both hold one value. A tensor no recorded op made and no view holds the
    value of the step's latest view with its dtype, shape, strides and statistics: FSDP's unsharded
    parameter, a tensor over the memory its all-gather's ``as_strided`` view names (a view no op made,
    the latest view of its memory: autograd unpacking a recomputed tensor). An op activation
    checkpointing runs again makes the values of the forward call it repeats (``fwd``). Slots without
    an id are left out."""
    passed: dict[tuple[int, int, int | None], tuple[int, int, int | None]] = {}  # a slot's value -> the value it holds
    first: dict[tuple[int, int, int | None], Record] = {}  # the first slot holding each (step, value_id, version)
    read: dict[tuple[int, str], Record] = {}  # (step, call) -> its first tensor input
    views: dict[tuple, Record] = {}  # the step's latest view made, by dtype, shape, strides and statistics
    outputs: dict[tuple[int, str], Record] = {}  # (step, name) -> the output slot of that name, not recomputed
    for record in _recomputed_in_place(records):  # among the backward's, which reads what they made
        value_id = record.value_id
        if value_id is None or record.kind != "tensor":
            continue
        step, view_of = record.step, record.view_of
        key = (step, value_id, record.version)
        if record.io == "input":
            read.setdefault((step, call_name(record.name)), record)
        else:
            if view_of is not None and record.stats:
                views[_layout(record)] = record
            if record.phase != "recompute":
                outputs.setdefault((step, record.name), record)
        if key in first:
            continue
        first[key] = record
        base = first.get((step, view_of, record.version)) if view_of is not None else None
        if record.io in OUTPUTS:  # the forward's slot a recomputation repeats, what a view or copy read, its base
            made = view_of is not None or record.op in _COPIES
            repeated = outputs.get((step, f"{record.fwd}/{record.name.rsplit('/', 1)[1]}")) if record.fwd else None
            found = (repeated, read.get((step, call_name(record.name))) if made else None, base)
        else:  # no recorded op made it: its base, else the latest view of its memory and layout (autograd
            # unpacking a recomputed tensor; FSDP's unsharded parameter, over its all-gather's view)
            view = views.get(_layout(record)) if record.stats else None
            found = (base, view if view is not None and view.view_of == view_of else None) if view_of is not None else (view,)
        for held in found:
            if held is not None and held.value_id is not None and _passed_on(held, record):
                value = (step, held.value_id, held.version)
                passed[key] = passed.get(value, value)
                break
    values: dict[int, tuple[int, int, int | None]] = {}
    for record in records:
        if record.value_id is not None and record.kind == "tensor":
            key = (record.step, record.value_id, record.version)
            values[id(record)] = passed.get(key, key)
    return values


def _layout(record: Record) -> tuple:
    """A tensor's dtype, shape, strides and statistics."""
    return record.step, record.dtype, tuple(record.shape or ()), tuple(record.stride or ()), tuple((record.stats or {}).values())


def _passed_on(read: Record, made: Record) -> bool:
    """Whether an output holds the value of an input of its call: the same dtype and shape, and the
    same statistics or fingerprint (the records of one tensor share their statistics' dict)."""
    if read.dtype != made.dtype or read.shape != made.shape:
        return False
    if read.stats is not None and (read.stats is made.stats or read.stats == made.stats):
        return True
    return read.checksum is not None and read.checksum == made.checksum


class Producers(NamedTuple):
    """The candidate producers (:func:`candidate_producers`) of both sides' input slots, each side's
    records taken in execution order: made once per rank, read by matching (to veto and guide
    pairings) and by verdicts (to trace an input to the tensor its producer made)."""

    a: Candidates
    b: Candidates

    @classmethod
    def of(cls, records_a: Sequence[Record], records_b: Sequence[Record]) -> Producers:
        return cls(*(candidate_producers([records[i] for i in execution_order(records)]) for records in (records_a, records_b)))
