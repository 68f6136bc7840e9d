"""Pair the records of two dumps, call by call: by data flow where both carry value ids, eager or
compiled (:mod:`~torchdebug.compare._flow_alignment`'s walk), else by names; what is left is aligned inside
each ``(step, phase, module)`` in execution order (:func:`_align_leftovers`); pairs of dumps without
ids are checked again by values and producers (:func:`_repair_by_values`, :func:`_repair`);
everything else is kept as ``only_a`` / ``only_b``, nothing dropped. A mapping renames side A first;
a side captured in compiled graphs pairs by index or order, and the slots of the ops the compiler
decomposed are paired last, at their groups' boundaries (:mod:`~torchdebug.compare._boundaries`).
The rules, in order: docs/compare.md, "Matching". Pairs come back in execution order (side A's,
with B-only calls placed after the call that precedes them on side B).
"""

from __future__ import annotations

import difflib
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

import numpy as np

from torchdebug.compare._boundaries import align_boundaries
from torchdebug.compare._flow_alignment import align_by_flow, aligned_op, dtype_kind, output_values
from torchdebug.compare._value_graph import OUTPUTS, Candidates, Producers, execution_order, run_position
from torchdebug.config import read_mapping_file
from torchdebug.errors import ConfigError
from torchdebug.records import Record, make_call_name, split_call_name

__all__ = ["Pair", "NameMapping", "load_mapping", "match_records"]


@dataclass(frozen=True, slots=True)
class NameMapping:
    """Renames applied to side A before matching: module path prefixes and op names."""

    modules: dict[str, str] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)

    def module(self, module: str) -> str:
        """The module path with the longest matching prefix replaced."""
        for old in sorted(self.modules, key=len, reverse=True):
            if module == old or module.startswith(old + "."):
                return self.modules[old] + module[len(old) :]
        return module

    def __bool__(self) -> bool:
        return bool(self.modules or self.ops)


def load_mapping(source: str | Path | Mapping[str, object] | None) -> NameMapping:
    """Read a mapping file (JSON, or YAML with pyyaml) or dict: ``{"modules": {...}, "ops": {...}}``."""
    if source is None:
        return NameMapping()
    if isinstance(source, NameMapping):
        return source
    if isinstance(source, Mapping):
        data = dict(source)
        where = "mapping"
    else:
        where = str(source)
        data = read_mapping_file(source, "mapping")
    if not isinstance(data, dict) or set(data) - {"modules", "ops"}:
        got = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{where}: expected keys 'modules' and/or 'ops', got {got}")
    sections: dict[str, dict[str, str]] = {}
    for key in ("modules", "ops"):
        section = data.get(key) or {}
        if not isinstance(section, dict) or not all(isinstance(v, str) for v in section.values()):
            raise ConfigError(f"{where}: '{key}' must map names to names, got {section!r}")
        sections[key] = dict(section)
    return NameMapping(modules=sections["modules"], ops=sections["ops"])


@dataclass(slots=True)
class Pair:
    """Two records that compare with each other (either may be ``None``) and how they were paired."""

    a: Record | None
    b: Record | None
    how: str
    """``exact``, ``mapped``, ``aligned``, ``only_a`` or ``only_b``; against a compiled side also
    ``value``, ``group`` or ``inside`` (:func:`torchdebug.compare._boundaries.align_boundaries`)."""
    order: float = 0.0
    """Position in execution order (used to sort rows and find the *first* divergence)."""
    inside: str | None = None
    """For ``inside``: the call of B (a decomposed eager op) whose compiled group holds this slot of A."""


def _paired_shape(record: Record) -> tuple[int, ...]:
    """The shape calls are paired by: a DTensor record's local shape, the shape of the shard its
    statistics describe and the shape a compiled graph's record of it has (a graph computes on the
    shards); the global shape would pair a sharded ``mm`` with another ``mm`` that happens to have
    it (a linear's two backward ``mm``). Merged shards (``_shards.py``) have no local shape left."""
    return tuple(record.extra.get("local_shape") or record.shape or ())


@dataclass(slots=True, eq=False)
class _Call:
    """The records of one op or module call, with their slot names (``output.0``) cut once."""

    name: str
    """The call name as the dump wrote it (before any mapping)."""
    first: Record
    """Its first record (step, phase, module, op and place in the order: read for every rule)."""
    records: list[Record] = field(default_factory=list)
    slots: list[str] = field(default_factory=list)

    def by_slot(self) -> dict[str, Record]:
        """Records by slot name (a repeated slot keeps its last record)."""
        return dict(zip(self.slots, self.records))

    def signature(self) -> tuple:
        """The shapes of the tensor slots: calls that swapped places (gradient accumulation order,
        say) keep their names but not their shapes. Made when asked, not kept: a step's calls
        all hold theirs while they are paired."""
        return tuple((slot, _paired_shape(r)) for slot, r in zip(self.slots, self.records) if r.kind == "tensor")


@dataclass(slots=True, eq=False)
class _Match:
    """Two calls paired and how: ``exact``, ``mapped`` or ``aligned``."""

    call_a: _Call
    call_b: _Call
    how: str
    settled: int | None = None
    """``_Links.changes`` when the pairing was checked and every producer it consulted was paired:
    the check holds until a pairing is forgotten or replaced."""


def _rename(call: _Call, mapping: NameMapping) -> str:
    """Side A's call name after the mapping's renames."""
    if not mapping:
        return call.name
    record = call.first
    module = mapping.module(record.module)
    op = mapping.ops.get(record.op, record.op)
    return make_call_name(record.phase, module, op, record.call)


def _calls(records: Sequence[Record], slot_names: dict[str, str]) -> dict[tuple[int, str], _Call]:
    """Records grouped by call, keyed by ``(step, call name)``, in first-seen order; ``slot_names``
    keeps one string per slot name (``output.0``: a handful, not one per record)."""
    calls: dict[tuple[int, str], _Call] = {}
    name: str | None = None  # the call being read: its name, step, records and slot names
    step: int | None = None
    held: list[Record] = []
    slots: list[str] = []
    for record in records:
        full = record.name
        cut = full.rfind("/")
        if name is None or cut != len(name) or record.step != step or not full.startswith(name):
            name = split_call_name(full)[0]  # a call's slots come one after another: a new call
            step = record.step
            call = calls.get((step, name))
            if call is None:
                call = calls[(step, name)] = _Call(name, record)
            held, slots = call.records, call.slots
        slot = full[cut + 1 :]  # split_call_name's slot (the whole name where it has no "/")
        held.append(record)
        slots.append(slot_names.setdefault(slot, slot))
    return calls


def _pair_slots(call_a: _Call, call_b: _Call, how: str) -> list[Pair]:
    """The slots of two paired calls, by slot name; a slot holding a tensor on one side only (a
    compiled backward handed an attention mask that eager autograd passes as ``None``) is listed on
    each side, not compared as a shape."""
    by_slot = call_b.by_slot()
    pairs = []
    for slot, record in zip(call_a.slots, call_a.records):
        other = by_slot.get(slot)
        if other is not None and (other.kind == "tensor") == (record.kind == "tensor"):
            del by_slot[slot]
            pairs.append(Pair(record, other, how))
        else:
            pairs.append(Pair(record, None, "only_a"))
    pairs.extend(Pair(None, r, "only_b") for r in by_slot.values())
    return pairs


def _align(calls_a: list[_Call], calls_b: list[_Call], token: Callable[[_Call], object]) -> list[tuple[int, int]]:
    """Index pairs of an order-preserving alignment of two call lists by ``token``."""
    matcher = difflib.SequenceMatcher(a=[token(c) for c in calls_a], b=[token(c) for c in calls_b], autojunk=False)
    return [(block.a + k, block.b + k) for block in matcher.get_matching_blocks() for k in range(block.size)]


def _swapped(
    calls_a: list[_Call],
    calls_b: list[_Call],
    token: Callable[[_Call], object],
    token_b: Callable[[_Call], object] | None = None,
) -> list[tuple[int, int]]:
    """Index pairs of calls with equal tokens in any order (each used once, earliest first); a
    ``None`` token never matches."""
    free: dict[object, list[int]] = defaultdict(list)
    for j, call in enumerate(calls_b):
        free[(token_b or token)(call)].append(j)
    free.pop(None, None)
    matched = []
    for i, call in enumerate(calls_a):
        candidates = free.get(token(call))
        if candidates:
            matched.append((i, candidates.pop(0)))
    return matched


def _align_leftovers(
    left_a: Iterable[_Call], left_b: Iterable[_Call], mapping: NameMapping, links: _Links, compiled: bool
) -> tuple[list[_Match], list[_Call], list[_Call]]:
    """Pair leftover calls per ``(step, phase, module)``, an op taken as the op it stands for
    (``aligned_op``: ``add_`` as ``add``, as the flow walk takes it): by op and paired producers of their
    inputs, by op and shapes in order, by op and shapes in any order (calls that swapped places),
    then by op alone in order (shapes then differ). With ``compiled``, order pairs calls of an op
    only where both sides have as many of them left: a decomposition's extra ``mul`` nodes would
    otherwise take the place of the eager ``mul`` calls (:mod:`torchdebug.compare._boundaries` pairs
    what is left by value); every step pairs only calls whose slots hold the same dtypes (a
    compiled node of another dtype holds another value: the int64 ``mul`` inside a decomposed float
    ``arange`` reads what the ``arange``'s int64 ``iota`` made, not the eager float ``mul`` of its
    result), and the last step only calls whose outputs have the same shapes. Returns the matches
    and the calls of each side left unpaired."""
    groups: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for call in left_a:
        groups[_group(call, mapping)][0].append(call)
    for call in left_b:
        groups[_group(call, NameMapping())][1].append(call)
    matches: list[_Match] = []
    unpaired_a: list[_Call] = []
    unpaired_b: list[_Call] = []

    def by_op(call: _Call) -> object:
        return aligned_op(mapping.ops.get(call.first.op, call.first.op))

    def by_op_and_shapes(call: _Call) -> object:
        if compiled:  # a node of another dtype holds another value (an int64 ``iota`` is no float ``arange``)
            return by_op(call), call.signature(), _dtypes(call)
        return by_op(call), call.signature()

    def by_producers_a(call: _Call) -> object:
        token = links.token_a(call)
        return (token, _dtypes(call)) if compiled and token is not None else token

    def by_producers_b(call: _Call) -> object:
        token = links.token_b(call)
        return (token, _dtypes(call)) if compiled and token is not None else token

    def by_op_shapes_and_values(call: _Call) -> object:
        """The op, its slots' shapes and its outputs' values to three digits (``None`` without them)."""
        values = output_values(call)
        return (by_op(call), call.signature(), values) if values else None

    def by_op_and_outputs(call: _Call) -> object:
        """The op, its slots' dtypes and its outputs' shapes (its inputs may be other views)."""
        slots = [(slot, r) for slot, r in zip(call.slots, call.records) if r.kind == "tensor"]
        shape = {slot: _paired_shape(r) if r.io in OUTPUTS else () for slot, r in slots}
        return by_op(call), tuple(sorted((slot, r.dtype or "", shape[slot]) for slot, r in slots))

    def in_order(align: Callable[[list[_Call], list[_Call]], list[tuple[int, int]]]) -> Callable[..., list[tuple[int, int]]]:
        if not compiled:
            return align

        def even(calls_a: list[_Call], calls_b: list[_Call]) -> list[tuple[int, int]]:
            count_a, count_b = Counter(map(by_op, calls_a)), Counter(map(by_op, calls_b))
            index_a = [i for i, c in enumerate(calls_a) if count_a[by_op(c)] == count_b[by_op(c)]]
            index_b = [j for j, c in enumerate(calls_b) if count_a[by_op(c)] == count_b[by_op(c)]]
            found = align([calls_a[i] for i in index_a], [calls_b[j] for j in index_b])
            return [(index_a[i], index_b[j]) for i, j in found]

        return even

    def vetoed(call_a: _Call, call_b: _Call) -> bool:
        """Inputs from producers paired with other calls; eager against eager, also different values
        made by different ops each side alone runs (:meth:`_Links.unrelated`)."""
        return links.conflict(call_a, call_b) or not compiled and links.unrelated(call_a, call_b)

    def supported(align: Callable[[list[_Call], list[_Call]], list[tuple[int, int]]]) -> Callable[..., list[tuple[int, int]]]:
        """``align`` less the pairs of calls whose shapes differ and whose inputs no data flow
        pairs (:meth:`_Links.unsupported`): op alone says nothing of such calls (the ``detach`` of
        sdpa's output is not the ``detach`` of a hand-written attention's softmax)."""

        def checked(calls_a: list[_Call], calls_b: list[_Call]) -> list[tuple[int, int]]:
            found = align(calls_a, calls_b)
            return [
                (i, j)
                for i, j in found
                if calls_a[i].signature() == calls_b[j].signature() or not links.unsupported(calls_a[i], calls_b[j])
            ]

        return checked

    strategies = (  # each runs on the calls the ones before it left unpaired
        lambda a, b: _swapped(a, b, by_producers_a, by_producers_b),
        # eager against eager, calls whose values agree are the same value whatever their order: a
        # module written with other ops (a hand-written attention's backward against sdpa's) runs
        # the transposes of the same gradients in another order than the names' indices say
        (lambda a, b: []) if compiled else lambda a, b: _swapped(a, b, by_op_shapes_and_values),
        in_order(lambda a, b: _align(a, b, by_op_and_shapes)),
        in_order(lambda a, b: _swapped(a, b, by_op_and_shapes)),
        # compiled: a node of another dtype or output shape is another value (a softmax's float ``sub``
        # is not the eager integer ``sub`` of relative positions); eager against eager, an autocast
        # run's dtypes and another batch's shapes differ
        in_order(lambda a, b: _align(a, b, by_op_and_outputs)) if compiled else supported(lambda a, b: _align(a, b, by_op)),
    )
    for calls_a, calls_b in groups.values():
        for strategy in strategies:
            matched = [(i, j) for i, j in strategy(calls_a, calls_b) if not vetoed(calls_a[i], calls_b[j])]
            for i, j in matched:
                matches.append(_Match(calls_a[i], calls_b[j], "aligned"))
                links.pair(calls_a[i], calls_b[j])
            done_a, done_b = {i for i, _ in matched}, {j for _, j in matched}
            calls_a = [c for i, c in enumerate(calls_a) if i not in done_a]
            calls_b = [c for j, c in enumerate(calls_b) if j not in done_b]
        unpaired_a.extend(calls_a)
        unpaired_b.extend(calls_b)
    return matches, unpaired_a, unpaired_b


_FAR = 0.1
"""How far apart, relative to their scale, the statistics of two outputs are when they hold different
values: round-off amplified by a sum of near-zero gradients stays well below it, another tensor does not."""


def _far_apart(call_a: _Call, call_b: _Call) -> bool:
    """Whether an output tensor slot of the two calls has min, max or norm apart by more than
    :data:`_FAR` of its scale (B's largest magnitude; the norm: B's norm)."""
    by_slot = call_b.by_slot()
    for slot, record in zip(call_a.slots, call_a.records):
        other = by_slot.get(slot)
        if record.io not in OUTPUTS or record.kind != "tensor" or other is None:
            continue
        a, b = record.stats or {}, other.stats or {}
        values = [(a.get(key), b.get(key)) for key in ("min", "max", "norm")]
        finite = [
            (x, y) for x, y in values if isinstance(x, float) and isinstance(y, float) and math.isfinite(x) and math.isfinite(y)
        ]
        if len(finite) < len(values):
            continue
        (min_a, min_b), (max_a, max_b), (norm_a, norm_b) = finite
        scale = max(abs(min_b), abs(max_b))
        if max(abs(min_a - min_b), abs(max_a - max_b)) > _FAR * scale or abs(norm_a - norm_b) > _FAR * norm_b:
            return True
    return False


def _dtypes(call: _Call) -> tuple:
    """The dtypes of a call's tensor slots, by slot."""
    return tuple(sorted((slot, r.dtype or "") for slot, r in zip(call.slots, call.records) if r.kind == "tensor"))


def _other_values(call_a: _Call, call_b: _Call) -> bool:
    """Whether two calls of one name hold values of different kinds in a slot (integers against
    floating point: a compiled stand-in named after an eager op whose value it does not hold)."""
    kinds_b = {slot: dtype_kind(r.dtype) for slot, r in zip(call_b.slots, call_b.records) if r.kind == "tensor"}
    for slot, record in zip(call_a.slots, call_a.records):
        if record.kind == "tensor" and slot in kinds_b and dtype_kind(record.dtype) != kinds_b[slot]:
            return True
    return False


def _assign_order(pairs: list[Pair], records_b: Sequence[Record]) -> None:
    """Order pairs by side A's execution order; B-only rows follow their predecessor on side B
    (placed by array, in one pass: a compare orders hundreds of thousands of pairs)."""
    position_b = {id(records_b[i]): position for position, i in enumerate(execution_order(records_b))}
    held = [(p, p.a) for p in pairs if p.a is not None]
    paired_positions: list[int] = []  # the B positions of the pairs in order, and their orders
    paired_orders: list[int] = []
    for index, pair in enumerate([held[i][0] for i in execution_order([a for _, a in held])]):
        pair.order = float(index)
        if pair.b is not None:
            paired_positions.append(position_b[id(pair.b)])
            paired_orders.append(index)
    only_b = [pair for pair in pairs if pair.a is None and pair.b is not None]
    if not only_b:
        return
    by_position = np.lexsort((paired_orders, paired_positions))  # by B position, then by order
    positions = np.asarray(paired_positions, dtype=np.int64)[by_position]
    orders = np.append(np.asarray(paired_orders, dtype=np.float64)[by_position], -1.0)  # [-1]: none before
    where = np.asarray([position_b[id(pair.b)] for pair in only_b], dtype=np.int64)
    before = orders[np.searchsorted(positions, where, side="left") - 1]
    for pair, order in zip(only_b, (before + 0.5 + where * 1e-9).tolist()):
        pair.order = order


class _Links:
    """Producer links of both sides and the calls paired so far, to veto and guide pairings.

    Calls whose name depends on execution order outside any module (the gradient accumulation of
    each parameter, say) can swap between runs; their inputs still come from paired producers.
    """

    def __init__(self, made: Producers, mapping: NameMapping) -> None:
        self.made_a, self.made_b = made
        self.mapping = mapping
        self.partner: dict[str, str] = {}
        self.paired_b: set[str] = set()
        self.changes = 0
        """How many pairings were forgotten or replaced (only those can turn a settled check)."""

    def pair(self, call_a: _Call, call_b: _Call) -> None:
        known = self.partner.get(call_a.name)
        if known is not None and known != call_b.name:  # another step's calls of the same names
            self.changes += 1
        self.partner[call_a.name] = call_b.name
        self.paired_b.add(call_b.name)

    def unpair(self, call_a: _Call, call_b: _Call) -> None:
        """Forget a pairing (names are shared by the steps: another step's pairing of the same calls
        may have gone first)."""
        if self.partner.get(call_a.name) == call_b.name:
            del self.partner[call_a.name]
            self.paired_b.discard(call_b.name)
            self.changes += 1

    def _partner(self, producer: tuple[str, str] | None) -> tuple[str, str] | None:
        if producer is None or producer[0] not in self.partner:
            return None
        return self.partner[producer[0]], producer[1]

    def conflict(self, call_a: _Call, call_b: _Call) -> bool:
        """Whether some input of the two calls comes from producers that are paired with other calls:
        none of the paired calls that made it on side B is the partner of one that made it on side A.
        A producer only one side runs (a hook, autograd summing gradients in another order) is none."""
        return self.check(call_a, call_b) is True

    def check(self, call_a: _Call, call_b: _Call) -> bool | None:
        """:meth:`conflict`, told apart further: ``True`` a conflict; ``False`` none, and every
        producer it consulted is paired already, so no later pairing can make one (until a pairing
        is forgotten or replaced: :attr:`changes`); ``None`` none for now."""
        by_slot = None
        settled = True
        partner, paired_b, made_a, made_b = self.partner, self.paired_b, self.made_a, self.made_b
        for slot, record in zip(call_a.slots, call_a.records):
            made = made_a.get(id(record))
            if made is None:
                continue
            expected = [(partner[call], out) for call, out in made if call in partner]  # a few at most
            settled = settled and len(expected) == len(made)
            if by_slot is None:
                by_slot = call_b.by_slot()
            other = by_slot.get(slot)
            made = made_b.get(id(other)) if other is not None else None
            if made is None:
                continue
            actual = [producer for producer in made if producer[0] in paired_b]
            settled = settled and len(actual) == len(made)
            if expected and actual and not any(producer in expected for producer in actual):
                return True
        return False if settled else None

    def unrelated_makers(self, call_a: _Call, call_b: _Call) -> bool:
        """Whether a tensor input of the two calls was first made, on each side, by another op that
        side alone runs so far."""
        return self._unpaired_producers(call_a, call_b, differ_only=True)

    def unrelated(self, call_a: _Call, call_b: _Call) -> bool:
        """Whether the two calls hold different values (:func:`_far_apart`) made from inputs that
        each side made with an op only it runs, another op on each side: the ``detach`` of sdpa's
        output and the ``detach`` of a hand-written softmax share a name and, when the sequence is
        as long as a head is wide, a shape. Where the values agree (the output of either attention
        transposed) they stay paired: the values of two implementations meet there."""
        return self.unrelated_makers(call_a, call_b) and _far_apart(call_a, call_b)

    def _unpaired_producers(self, call_a: _Call, call_b: _Call, differ_only: bool) -> bool:
        """Whether some tensor input of the two calls comes from producers the pairs so far do not
        relate. Every candidate producer counts (a transpose's output has its input's statistics, so
        either may have made the value): a slot is related when a candidate of each side are paired
        with each other, or are the same op and not both paired already (they may pair later). With
        ``differ_only``, only the first makers count, and only where neither is paired."""
        by_slot = None
        partner, paired_b, mapping = self.partner, self.paired_b, self.mapping
        for slot, record in zip(call_a.slots, call_a.records):
            made_a = self.made_a.get(id(record))
            if made_a is None:
                continue
            if by_slot is None:
                by_slot = call_b.by_slot()
            other = by_slot.get(slot)
            made_b = self.made_b.get(id(other)) if other is not None else None
            if made_b is None:
                continue
            if differ_only:  # the first makers only: a value passed on (a detach) has its maker's twin
                made_a, made_b = made_a[:1], made_b[:1]
                if made_a[0][0] in partner or made_b[0][0] in paired_b:
                    continue
            related = False
            for a, _ in made_a:
                op_a = mapping.ops.get(_op_of(a), _op_of(a))
                for b, _ in made_b:
                    if partner.get(a) == b or op_a == _op_of(b) and not (a in partner and b in paired_b):
                        related = True
            if not related:
                return True
        return False

    def unsupported(self, call_a: _Call, call_b: _Call) -> bool:
        """Whether some tensor input of the two calls comes from producers the pairs so far do not
        relate: paired on one side only, or on neither side and of different ops (a value each side
        made with ops the other does not run). Stricter than :meth:`conflict`, for calls nothing
        else relates (their shapes differ)."""
        return self._unpaired_producers(call_a, call_b, differ_only=False)

    def token_a(self, call: _Call) -> object:
        """The op and the B-side producers its inputs should have (``None``: nothing known)."""
        producers = tuple(self._partner(self.made_a.get(id(r), (None,))[0]) for r in call.records)
        return (aligned_op(call.first.op), producers) if any(producers) else None

    def token_b(self, call: _Call) -> object:
        producers = tuple(self.made_b.get(id(r), (None,))[0] for r in call.records)
        return (aligned_op(call.first.op), producers) if any(producers) else None


def _op_of(name: str) -> str:
    """The op of a call name (``forward/layers.0/aten.mm.default#2``: ``aten.mm.default``)."""
    return name[name.rfind("/") + 1 : name.rfind("#")]


def _counted(call: _Call, mapping: NameMapping) -> tuple[str, str, str]:
    """What a call's index counts: its phase, module and op (after the mapping's renames)."""
    first = call.first
    return first.phase, mapping.module(first.module), mapping.ops.get(first.op, first.op)


def _uneven(calls_a: dict[tuple[int, str], _Call], calls_b: dict[tuple[int, str], _Call], mapping: NameMapping) -> set[tuple]:
    """``(step, phase, module, op)`` of which the two sides have different numbers of calls: there a
    call index says nothing (a decomposition added ``mul`` nodes before the one named like eager's)."""
    count_a = Counter((step, _counted(call, mapping)) for (step, _), call in calls_a.items())
    count_b = Counter((step, _counted(call, NameMapping())) for (step, _), call in calls_b.items())
    return {key for key in count_a.keys() | count_b.keys() if count_a[key] != count_b[key]}


def match_records(
    records_a: Sequence[Record],
    records_b: Sequence[Record],
    mapping: NameMapping | None = None,
    *,
    compiled: bool = False,
    made: Producers | None = None,
) -> list[Pair]:
    """Pair two record lists (one rank each); see the module docstring for the rules. ``compiled``: a
    side was captured in compiled graphs, whose decompositions add calls (see :func:`_align_leftovers`).
    ``made``: the two sides' :class:`Producers`, when the caller keeps them for verdicts."""
    made = made or Producers.of(records_a, records_b)
    by_id = _carry_value_ids(records_a) and _carry_value_ids(records_b)
    pairs = _pair_calls(records_a, records_b, mapping or NameMapping(), compiled, made, by_id)
    _assign_order(pairs, records_b)  # the calls are gone by now, so they and the order's index never coexist
    pairs.sort(key=attrgetter("order"))
    return align_boundaries(pairs, made.a, by_id) if compiled else pairs


def _pair_calls(
    records_a: Sequence[Record], records_b: Sequence[Record], mapping: NameMapping, compiled: bool, made: Producers, by_id: bool
) -> list[Pair]:
    """The pairs of :func:`match_records`, in no order yet."""
    slot_names: dict[str, str] = {}
    calls_a, calls_b = _calls(records_a, slot_names), _calls(records_b, slot_names)
    links = _Links(made, mapping)

    def rename(call: _Call) -> str:
        return _rename(call, mapping)

    def op_a(call: _Call) -> str:
        return mapping.ops.get(call.first.op, call.first.op)

    if by_id:
        named = _names_say_something(calls_a, calls_b, mapping) if compiled else None
        flowing, left_a = align_by_flow(_in_order(list(calls_a.values())), calls_b, links, rename, op_a, named)
        # what the walk leaves (calls whose inputs come from one-sided ops, of other names and shapes:
        # a sharded rank's backward against one process's) is aligned inside each module, in order
        aligned, left_a, left_b = _align_leftovers(left_a, calls_b.values(), mapping, links, compiled)
        matches = [_Match(a, b, how) for a, b, how in flowing] + aligned
    else:
        matches, left_a = _pair_by_name(calls_a, calls_b, mapping, links, compiled)
        aligned, left_a, left_b = _align_leftovers(left_a, calls_b.values(), mapping, links, compiled)
        matches = matches + aligned
        if not compiled:
            _repair_by_values(matches, left_a, left_b, mapping, links)
        matches = _repair(matches, left_a, left_b, mapping, links, compiled)
    _repair_inserted(matches, left_a, left_b, mapping, links)
    pairs = [pair for match in matches for pair in _pair_slots(match.call_a, match.call_b, match.how)]
    pairs.extend(Pair(r, None, "only_a") for call in left_a for r in call.records)
    pairs.extend(Pair(None, r, "only_b") for call in left_b for r in call.records)
    return pairs


def _carry_value_ids(records: Sequence[Record]) -> bool:
    """Whether a dump's slots carry value ids (eager capture and graph dumps since they exist)."""
    return any(record.value_id is not None for record in records)


def _names_say_something(
    calls_a: dict[tuple[int, str], _Call], calls_b: dict[tuple[int, str], _Call], mapping: NameMapping
) -> Callable[[_Call, _Call], bool]:
    """Against a compiled side, whether two namesakes may be paired by their name: only where both
    sides have as many calls of their op in that step, phase and module (a decomposition's extra
    ``mul`` nodes shift the indices after them) and where their slots hold values of the same kind
    (a compiled stand-in named after an eager op whose value it does not hold)."""
    uneven = _uneven(calls_a, calls_b, mapping)

    def named(call_a: _Call, call_b: _Call) -> bool:
        return (call_b.first.step, _counted(call_b, NameMapping())) not in uneven and not _other_values(call_a, call_b)

    return named


def _pair_by_name(
    calls_a: dict[tuple[int, str], _Call],
    calls_b: dict[tuple[int, str], _Call],
    mapping: NameMapping,
    links: _Links,
    compiled: bool,
) -> tuple[list[_Match], list[_Call]]:
    """Calls of the same ``(step, call name)`` and shapes, unless their inputs come from producers
    paired with other calls (dumps without value ids, and compiled ones); paired calls of B leave
    ``calls_b``. Returns the matches and A's calls left over."""
    uneven = _uneven(calls_a, calls_b, mapping) if compiled else set()
    matches: list[_Match] = []
    left_a: list[_Call] = []
    for key, call in calls_a.items():
        name = _rename(call, mapping)
        other = calls_b.get((key[0], name))
        found = links.check(call, other) if other is not None and other.signature() == call.signature() else True
        if other is None or found is True or compiled and _other_values(call, other):
            left_a.append(call)  # nor are its consumers paired through it
        elif not uneven or (key[0], _counted(other, NameMapping())) not in uneven:
            settled = links.changes if found is False else None
            matches.append(_Match(call, calls_b.pop((key[0], name)), "exact" if name == key[1] else "mapped", settled))
            links.pair(call, other)
        else:
            left_a.append(call)
    return matches, left_a


_REPAIR_ROUNDS = 3
"""How many times pairs are checked again against every partner known: each round frees the pairs
whose inputs turned out to come from other calls and pairs them anew (a pair freed in one round can
make its consumers' pairs wrong in the next). Bounded, so matching stays linear in the records; the
attention transposes of the GPT tests settle in the first round."""


def _repair(
    matches: list[_Match], left_a: list[_Call], left_b: list[_Call], mapping: NameMapping, links: _Links, compiled: bool
) -> list[_Match]:
    """Matches checked again once every call has its partner. A call is paired by name before the
    producers of its inputs are (a compiled graph's forward has fewer ``_unsafe_view`` nodes than
    eager, so they are aligned later): aot's backward graph runs the transposes of saved attention
    tensors first, and the eager ``transpose#2`` has the compiled ``transpose#2`` as its namesake but
    ``transpose#1`` as its data. Pairs whose inputs now come from producers paired with other calls are
    freed and aligned again with the calls still unpaired in their ``(step, phase, module)``;
    ``left_a`` and ``left_b`` are updated in place."""
    for _ in range(_REPAIR_ROUNDS):
        wrong = [
            match
            for match in matches
            if match.settled != links.changes
            and (links.conflict(match.call_a, match.call_b) or not compiled and links.unrelated(match.call_a, match.call_b))
        ]
        if not wrong:
            break
        for match in wrong:
            links.unpair(match.call_a, match.call_b)
        freed = {id(match) for match in wrong}
        matches = [match for match in matches if id(match) not in freed]
        groups = {_group(match.call_a, mapping) for match in wrong}
        retry_a = [match.call_a for match in wrong] + [c for c in left_a if _group(c, mapping) in groups]
        retry_b = [match.call_b for match in wrong] + [c for c in left_b if _group(c, NameMapping()) in groups]
        again, still_a, still_b = _align_leftovers(_in_order(retry_a), _in_order(retry_b), mapping, links, compiled)
        matches.extend(again)
        retried_a, retried_b = {id(c) for c in retry_a}, {id(c) for c in retry_b}
        left_a[:] = [c for c in left_a if id(c) not in retried_a] + still_a
        left_b[:] = [c for c in left_b if id(c) not in retried_b] + still_b
    return matches


def _repair_by_values(
    matches: list[_Match], left_a: list[_Call], left_b: list[_Call], mapping: NameMapping, links: _Links
) -> None:
    """Eager against eager: a pair whose values differ and whose inputs come from ops each side alone
    runs (:meth:`_Links.unrelated_makers`) is paired again with a call left over on the other
    side in its ``(step, phase, module)`` that holds the same value (op, shapes and
    :func:`output_values`), when there is one. Autograd adds a hand-written layer norm's partial
    gradients one by one, ``add#0`` to ``add#3``, where ``native_layer_norm_backward`` makes the
    whole one: the ``add#0`` that sums it with the residual's gradient has B's ``add#3`` as its value.
    ``matches``, ``left_a`` and ``left_b`` are updated in place; one pass, linear in the calls."""

    def token(call: _Call, renamed: NameMapping) -> tuple | None:
        values = output_values(call)
        if not values:
            return None
        op = call.first.op
        return (*_group(call, renamed), renamed.ops.get(op, op), call.signature(), values)

    def index(calls: list[_Call], renamed: NameMapping) -> dict[tuple, list[_Call]]:
        found: dict[tuple, list[_Call]] = defaultdict(list)
        for call in calls:
            key = token(call, renamed)
            if key is not None:
                found[key].append(call)
        return found

    free_a, free_b = index(left_a, mapping), index(left_b, NameMapping())
    if not free_a and not free_b:
        return
    taken: set[int] = set()
    for position, match in enumerate(matches):
        if match.how == "mapped" or not links.unrelated_makers(match.call_a, match.call_b):
            continue
        value_a, value_b = token(match.call_a, mapping), token(match.call_b, NameMapping())
        if value_a is None or value_b is None or value_a[3:] == value_b[3:]:
            continue
        other_b, other_a = free_b.get(value_a), free_a.get(value_b)
        if other_b:  # A's value is held by a call of B left over: they pair, B's old call is left over
            call_b = other_b.pop(0)
            links.unpair(match.call_a, match.call_b)
            left_b.append(match.call_b)
            taken.add(id(call_b))
            matches[position] = _Match(match.call_a, call_b, "aligned")
            links.pair(match.call_a, call_b)
        elif other_a:
            call_a = other_a.pop(0)
            links.unpair(match.call_a, match.call_b)
            left_a.append(match.call_a)
            taken.add(id(call_a))
            matches[position] = _Match(call_a, match.call_b, "aligned")
            links.pair(call_a, match.call_b)
    if taken:
        left_a[:] = [call for call in left_a if id(call) not in taken]
        left_b[:] = [call for call in left_b if id(call) not in taken]


def _repair_inserted(
    matches: list[_Match], left_a: list[_Call], left_b: list[_Call], mapping: NameMapping, links: _Links
) -> None:
    """A call one side inserted before a call of the same op: calls of one op on the same value pair
    whatever their scalar arguments, so eager's ``mul(h, 0.1)`` was paired with the planted
    ``mul(h, 1.05)`` before it, and A's own ``mul(·, 0.1)`` was left over. A pair whose scalar
    arguments differ takes instead the left-over call of its group and op, with the other side's
    arguments, that reads the paired call's output; the paired call is left over, a one-sided op
    judged as one. Either side may have inserted it. ``matches``, ``left_a`` and ``left_b`` are
    updated in place; one pass, linear in the calls."""
    if not left_a and not left_b:
        return
    free_a, free_b = _by_arguments(left_a, mapping), _by_arguments(left_b, NameMapping())
    taken: set[int] = set()

    def follower(free: dict[tuple, list[_Call]], key: tuple, paired: _Call, made: Candidates) -> _Call | None:
        """The left-over call at ``key`` that reads ``paired``'s output (none taken already)."""
        return next((c for c in free.get(key, ()) if id(c) not in taken and _reads(c, paired, made)), None)

    places_a, places_b = {key[:2] for key in free_a}, {key[:2] for key in free_b}  # (group, op) with calls left over
    for position, match in enumerate(matches):
        call_a, call_b = match.call_a, match.call_b
        op_a, op_b = _op(call_a, mapping), _op(call_b, NameMapping())
        place_a, place_b = (_group(call_a, mapping), op_a), (_group(call_b, NameMapping()), op_b)
        if op_a != op_b or (place_a not in places_a and place_b not in places_b):
            continue  # the arguments are read only where a call of the op is left over (a pass over every pair)
        args_a, args_b = _arguments(call_a), _arguments(call_b)
        if args_a == args_b:
            continue
        after_a = follower(free_a, (*place_a, args_b), call_a, links.made_a)
        after_b = None if after_a is not None else follower(free_b, (*place_b, args_a), call_b, links.made_b)
        if after_a is None and after_b is None:
            continue
        links.unpair(call_a, call_b)
        if after_a is not None:  # A inserted call_a: its follower holds B's arguments
            taken.add(id(after_a))
            left_a.append(call_a)
            matches[position] = _Match(after_a, call_b, "aligned")
        elif after_b is not None:
            taken.add(id(after_b))
            left_b.append(call_b)
            matches[position] = _Match(call_a, after_b, "aligned")
        links.pair(matches[position].call_a, matches[position].call_b)
    if taken:
        left_a[:] = [call for call in left_a if id(call) not in taken]
        left_b[:] = [call for call in left_b if id(call) not in taken]


def _arguments(call: _Call) -> tuple:
    """A call's scalar (non-tensor) input arguments, by slot."""
    return tuple(
        (slot, json.dumps(r.value, sort_keys=True, default=str))
        for slot, r in zip(call.slots, call.records)
        if r.kind == "value" and r.io == "input"
    )


def _op(call: _Call, mapping: NameMapping) -> str:
    """A call's op, after the mapping's renames."""
    op = call.first.op
    return mapping.ops.get(op, op)


def _by_arguments(calls: list[_Call], mapping: NameMapping) -> dict[tuple, list[_Call]]:
    """Calls by group, op and scalar arguments."""
    found: dict[tuple, list[_Call]] = defaultdict(list)
    for call in calls:
        found[(_group(call, mapping), _op(call, mapping), _arguments(call))].append(call)
    return found


def _reads(call: _Call, maker: _Call, made: Candidates) -> bool:
    """Whether a tensor input of ``call`` holds a value ``maker`` made."""
    return any(producer[0] == maker.name for r in call.records if r.io == "input" for producer in made.get(id(r), ()))


def _group(call: _Call, mapping: NameMapping) -> tuple[int, str, str]:
    """The ``(step, phase, module)`` whose leftover calls are aligned together."""
    first = call.first
    return first.step, first.phase, mapping.module(first.module)


def _in_order(calls: list[_Call]) -> list[_Call]:
    """Calls in the order they ran (their first record's position)."""
    return sorted(calls, key=lambda call: run_position(call.first))
