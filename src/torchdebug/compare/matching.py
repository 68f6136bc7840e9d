"""Pair the records of two dumps: exact names first, then an order-preserving alignment.

1. Optionally rename side A with a mapping (module prefixes, op names) so renamed code still lines up.
2. Calls whose ``(step, call name)`` and tensor shapes are the same on both sides are paired, slot
   by slot (``exact``/``mapped``).
3. The calls left over are aligned inside each ``(step, phase, module)`` in execution order
   (``difflib``'s longest matching blocks), first by op and shapes, then by op alone, so ops inserted
   or removed on one side (the extra casts of an autocast run) or calls that swapped places (the
   order of gradient accumulation) do not shift everything after them. Slots of aligned calls are
   paired by ``io.arg`` (``aligned``).
4. Everything else is kept as ``only_a`` / ``only_b``: nothing is dropped silently.

Pairs come back in execution order (side A's, with B-only calls placed after the call that precedes
them on side B).
"""

from __future__ import annotations

import bisect
import difflib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchdebug.config import read_mapping_file
from torchdebug.records import PHASES, Record

__all__ = ["Pair", "NameMapping", "load_mapping", "match_records"]

_PHASE_ORDER = {phase: index for index, phase in enumerate(PHASES)}


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
        raise ValueError(f"{where}: expected keys 'modules' and/or 'ops', got {got}")
    for key in ("modules", "ops"):
        section = data.get(key) or {}
        if not isinstance(section, dict) or not all(isinstance(v, str) for v in section.values()):
            raise ValueError(f"{where}: '{key}' must map names to names, got {section!r}")
    return NameMapping(modules=dict(data.get("modules") or {}), ops=dict(data.get("ops") or {}))


@dataclass(slots=True)
class Pair:
    """Two records that compare with each other (either may be ``None``) and how they were paired."""

    a: Record | None
    b: Record | None
    how: str
    """``exact``, ``mapped``, ``aligned``, ``only_a`` or ``only_b``."""
    order: float = 0.0
    """Position in execution order (used to sort rows and find the *first* divergence)."""


def _rename(record: Record, mapping: NameMapping) -> str:
    """Side A's call name after the mapping's renames."""
    if not mapping:
        return record.call_name
    module = mapping.module(record.module)
    op = mapping.ops.get(record.op, record.op)
    return f"{record.phase}/{module}/{op}#{record.call}"


def _slot(record: Record) -> str:
    name = record.name
    return name[name.rfind("/") + 1 :]


def _calls(records: Sequence[Record]) -> dict[tuple[int, str], list[Record]]:
    """Records grouped by call, keyed by ``(step, call_name)``, in first-seen order."""
    calls: dict[tuple[int, str], list[Record]] = {}
    for record in records:
        calls.setdefault((record.step, record.call_name), []).append(record)
    return calls


def _signature(slots: list[Record]) -> tuple:
    """The shapes of a call's tensor slots: calls that swapped places (gradient accumulation
    order, say) keep their names but not their shapes."""
    return tuple((_slot(r), tuple(r.shape or ())) for r in slots if r.kind == "tensor")


def _pair_slots(slots_a: list[Record], slots_b: list[Record], how: str) -> list[Pair]:
    by_slot = {_slot(r): r for r in slots_b}
    pairs = []
    for record in slots_a:
        other = by_slot.pop(_slot(record), None)
        pairs.append(Pair(record, other, how if other else "only_a"))
    pairs.extend(Pair(None, r, "only_b") for r in by_slot.values())
    return pairs


def _align(calls_a: list[list[Record]], calls_b: list[list[Record]], token: Callable[[list[Record]], object]) -> list[tuple[int, int]]:
    """Index pairs of an order-preserving alignment of two call lists by ``token``."""
    matcher = difflib.SequenceMatcher(a=[token(c) for c in calls_a], b=[token(c) for c in calls_b], autojunk=False)
    return [(block.a + k, block.b + k) for block in matcher.get_matching_blocks() for k in range(block.size)]


def _swapped(
    calls_a: list[list[Record]], calls_b: list[list[Record]], token: Callable[[list[Record]], object],
    token_b: Callable[[list[Record]], object] | None = None,
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
    left_a: dict[tuple[int, str], list[Record]],
    left_b: dict[tuple[int, str], list[Record]],
    mapping: NameMapping,
    links: _Links,
) -> list[Pair]:
    """Pair leftover calls per ``(step, phase, module)``: by op and paired producers of their
    inputs, by op and shapes in order, by op and shapes in any order (calls that swapped places),
    then by op alone in order (shapes then differ)."""
    groups: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for slots in left_a.values():
        groups[(slots[0].step, slots[0].phase, mapping.module(slots[0].module))][0].append(slots)
    for slots in left_b.values():
        groups[(slots[0].step, slots[0].phase, slots[0].module)][1].append(slots)
    pairs: list[Pair] = []
    for calls_a, calls_b in groups.values():
        def by_op(call: list[Record]) -> object:
            return mapping.ops.get(call[0].op, call[0].op)

        def by_op_and_shapes(call: list[Record]) -> object:
            return by_op(call), _signature(call)

        for matched in (
            lambda: _swapped(calls_a, calls_b, links.token_a, links.token_b),
            lambda: _align(calls_a, calls_b, by_op_and_shapes),
            lambda: _swapped(calls_a, calls_b, by_op_and_shapes),
            lambda: _align(calls_a, calls_b, by_op),
        ):
            matched = matched()
            for i, j in matched:
                pairs.extend(_pair_slots(calls_a[i], calls_b[j], "aligned"))
                links.pair(calls_a[i], calls_b[j])
            done_a, done_b = {i for i, _ in matched}, {j for _, j in matched}
            calls_a = [c for i, c in enumerate(calls_a) if i not in done_a]
            calls_b = [c for j, c in enumerate(calls_b) if j not in done_b]
        pairs.extend(Pair(r, None, "only_a") for c in calls_a for r in c)
        pairs.extend(Pair(None, r, "only_b") for c in calls_b for r in c)
    return pairs


def _sort_key(record: Record) -> tuple:
    return (record.step, _PHASE_ORDER.get(record.phase, len(PHASES)), record.seq)


def _assign_order(pairs: list[Pair], records_b: Sequence[Record]) -> None:
    """Order pairs by side A's execution order; B-only rows follow their predecessor on side B."""
    position_b = {id(r): i for i, r in enumerate(sorted(records_b, key=_sort_key))}
    anchored = sorted((p for p in pairs if p.a is not None), key=lambda p: _sort_key(p.a))
    for index, pair in enumerate(anchored):
        pair.order = float(index)
    # map B positions of paired rows to their order, then slot B-only rows in between
    b_to_order = sorted((position_b[id(p.b)], p.order) for p in anchored if p.b is not None)
    positions = [pos for pos, _ in b_to_order]
    for pair in pairs:
        if pair.a is None and pair.b is not None:
            pos = position_b[id(pair.b)]
            index = bisect.bisect_left(positions, pos)
            before = b_to_order[index - 1][1] if index else -1.0
            pair.order = before + 0.5 + pos * 1e-9


def _identity(record: Record) -> tuple | None:
    """What makes two slots of one dump the same tensor: the saved tensor's key, else dtype, shape
    and statistics."""
    if record.kind != "tensor":
        return None
    if record.tensor and record.tensor.get("key"):
        return ("key", record.tensor.get("file"), record.tensor["key"])
    if record.stats:
        return ("stats", record.dtype, tuple(record.shape or ()), tuple(record.stats.values()))
    return None


_CASTS = {"aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.type_as.default"}
"""Ops that only change dtype: transparent when tracing where a tensor came from (autocast adds them)."""


def _producers(records: Sequence[Record]) -> dict[int, tuple[str, str]]:
    """For input slots (by ``id``): ``(call name, output slot)`` that produced the same tensor earlier,
    looking through casts."""
    made_by: dict[tuple, tuple[str, str]] = {}
    producers: dict[int, tuple[str, str]] = {}
    cast_sources: dict[str, tuple[str, str]] = {}
    for record in records:
        identity = _identity(record)
        if identity is None:
            continue
        if record.io == "input" and identity in made_by and made_by[identity][0] != record.call_name:
            producers[id(record)] = made_by[identity]
            if record.op in _CASTS:
                cast_sources[record.call_name] = made_by[identity]
        elif record.io in ("output", "parameter_grad"):
            source = cast_sources.get(record.call_name) if record.op in _CASTS else None
            made_by.setdefault(identity, source or (record.call_name, _slot(record)))
    return producers


class _Links:
    """Producer links of both sides and the calls paired so far, to veto and guide pairings.

    Calls whose name depends on execution order outside any module (the gradient accumulation of
    each parameter, say) can swap between runs; their inputs still come from paired producers.
    """

    def __init__(self, records_a: Sequence[Record], records_b: Sequence[Record]) -> None:
        self.producers_a, self.producers_b = _producers(records_a), _producers(records_b)
        self.partner: dict[str, str] = {}

    def pair(self, slots_a: list[Record], slots_b: list[Record]) -> None:
        self.partner[slots_a[0].call_name] = slots_b[0].call_name

    def _partner(self, producer: tuple[str, str] | None) -> tuple[str, str] | None:
        if producer is None or producer[0] not in self.partner:
            return None
        return self.partner[producer[0]], producer[1]

    def conflict(self, slots_a: list[Record], slots_b: list[Record]) -> bool:
        """Whether some input of the two calls comes from producers that are paired elsewhere."""
        by_slot = {_slot(r): r for r in slots_b}
        for record in slots_a:
            other = by_slot.get(_slot(record))
            expected = self._partner(self.producers_a.get(id(record)))
            actual = self.producers_b.get(id(other)) if other is not None else None
            if expected and actual and expected != actual:
                return True
        return False

    def token_a(self, slots: list[Record]) -> object:
        """The op and the B-side producers its inputs should have (``None``: nothing known)."""
        producers = tuple(self._partner(self.producers_a.get(id(r))) for r in slots)
        return (slots[0].op, producers) if any(producers) else None

    def token_b(self, slots: list[Record]) -> object:
        producers = tuple(self.producers_b.get(id(r)) for r in slots)
        return (slots[0].op, producers) if any(producers) else None


def match_records(
    records_a: Sequence[Record], records_b: Sequence[Record], mapping: NameMapping | None = None
) -> list[Pair]:
    """Pair two record lists (one rank each); see the module docstring for the rules."""
    mapping = mapping or NameMapping()
    calls_a, calls_b = _calls(records_a), _calls(records_b)
    links = _Links(records_a, records_b)
    pairs: list[Pair] = []
    left_a: dict[tuple[int, str], list[Record]] = {}
    for key, slots in calls_a.items():
        name = _rename(slots[0], mapping)
        other = calls_b.get((key[0], name))
        if other is not None and _signature(other) == _signature(slots) and not links.conflict(slots, other):
            pairs.extend(_pair_slots(slots, calls_b.pop((key[0], name)), "exact" if name == key[1] else "mapped"))
            links.pair(slots, other)
        else:
            left_a[key] = slots
    pairs.extend(_align_leftovers(left_a, calls_b, mapping, links))
    _assign_order(pairs, records_b)
    pairs.sort(key=lambda p: p.order)
    return pairs
