"""Pair the calls of two dumps that carry value ids by their data flow, in one walk of side A.

Each dump is a graph of values: an input slot holds the value one output slot made (its producer,
``torchdebug.compare._value_graph``: exact by value id) or a value no op made (a
parameter, the step's input). A's calls are visited in execution order; by then the producers of a
call's inputs have been visited, so they are paired or left for later. A call whose inputs all come
from paired producers and known values is paired with B's unpaired call of the same op, step and
phase whose inputs come from their partners, slot by slot (one dict lookup): ops inserted on one
side, independent ops that swapped places and two tensors of equal values (two zero biases) do not
move the pairs, whatever the names' call indices say. Of several such calls of B, the namesake, then
one of the same shapes, then one holding the same values is taken.

The anchors, where the flow says nothing yet, are paired by name (``{phase}/{module}/{op}#{call}``
and the same shapes), as before value ids: module calls (their inputs and outputs), the first calls
to read a parameter or the step's input (the value each reads is then known to be its partner's) and
calls reading a value only one side made (the flow resumes at their outputs) — unless their inputs
come from producers paired with other calls. What neither pairs is left to the alignment inside each
module (``_matching``'s leftovers) and then listed as one-sided.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Protocol

from torchdebug.compare._value_graph import OUTPUTS
from torchdebug.records import MODULE_OP, Record

__all__ = ["align_by_flow", "dtype_kind", "output_values"]

_VALUE_DIGITS = 3
"""Significant digits of the statistics that :func:`output_values` keeps: round-off of another
order of operations stays below them, different values do not."""


class _Links(Protocol):
    """What the walk asks of matching's producer links (``_matching._Links``): where each side's
    values came from, the pairs so far, the veto, and a new pair to learn."""

    made_a: Mapping[int, tuple]
    made_b: Mapping[int, tuple]
    partner: Mapping[str, str]

    def check(self, call_a: _FlowCall, call_b: _FlowCall) -> bool | None: ...

    def pair(self, call_a: _FlowCall, call_b: _FlowCall) -> None: ...


class _FlowCall(Protocol):
    """What the walk reads of a call: its name, its records with their slot names, its shapes."""

    name: str
    records: list[Record]
    slots: list[str]

    @property
    def first(self) -> Record: ...

    def signature(self) -> tuple: ...


def dtype_kind(dtype: str | None) -> str:
    """``float``, ``complex``, ``bool`` or ``int`` (an unknown dtype: ``""``, as any)."""
    if not dtype:
        return ""
    if dtype.startswith(("float", "bfloat")):
        return "float"
    if dtype.startswith("complex"):
        return "complex"
    return "bool" if dtype == "bool" else "int"


def output_values(call: _FlowCall) -> tuple:
    """The min, max and norm of a call's floating output tensors to :data:`_VALUE_DIGITS` significant
    digits (empty when an output has none): two calls that made the same value share them."""
    found = []
    for slot, record in zip(call.slots, call.records):
        if record.io not in OUTPUTS or record.kind != "tensor":
            continue
        stats = record.stats or {}
        values = tuple(stats.get(key) for key in ("min", "max", "norm"))
        if dtype_kind(record.dtype) != "float" or not all(isinstance(value, float) for value in values):
            return ()
        found.append((slot, *(float(f"{value:.{_VALUE_DIGITS}g}") for value in values)))
    return tuple(found)


def _inputs(call: _FlowCall, made: Mapping[int, tuple]) -> list[tuple[str, tuple]]:
    """A call's tensor input slots with where their values came from: the earlier op's ``(call name,
    output slot)`` (the value's maker where an op passed it on, a ``detach``: such an op on one side is
    looked through), or, for a value no op made (a parameter, the step's input), ``(None, (value_id,
    version))``."""
    found = []
    for slot, record in zip(call.slots, call.records):
        if record.io == "input":
            producers = made.get(id(record))
            if producers:
                found.append((slot, producers[0]))
            elif record.value_id is not None:
                found.append((slot, (None, (record.value_id, record.version))))
    return found


def _flow_key(call: _FlowCall, op: str, inputs: Iterable[tuple[str, tuple[str, str]]]) -> tuple:
    first = call.first
    return first.step, first.phase, op, tuple(inputs)


def _chosen(call: _FlowCall, name: str, candidates: list[_FlowCall], taken: set[int]) -> _FlowCall | None:
    """Of B's calls with the data flow of ``call``, the namesake, else the first of its shapes, else the
    first holding its values (``None``: none of them agrees on more than the flow)."""
    free = candidates[:] = [other for other in candidates if id(other) not in taken]  # each taken call skipped once
    if not free:
        return None
    step = call.first.step
    for other in free:
        if other.name == name and other.first.step == step:
            return other
    signature = call.signature()
    for other in free:
        if other.signature() == signature:
            return other
    values = output_values(call)
    if values:
        for other in free:
            if output_values(other) == values:
                return other
    return None


def align_by_flow(
    calls_a: Iterable[_FlowCall],
    calls_b: MutableMapping[tuple[int, str], _FlowCall],
    links: _Links,
    rename: Callable[[_FlowCall], str],
    op_a: Callable[[_FlowCall], str],
) -> tuple[list[tuple[_FlowCall, _FlowCall, str]], list[_FlowCall]]:
    """Pair ``calls_a`` (in execution order) with ``calls_b`` (by ``(step, call name)``) by data flow,
    else by name at the anchors (module docstring); ``links`` learns each pairing as it is made.
    Returns the pairs with how they were paired (``exact`` or ``mapped`` where the names agree after
    ``rename``, else ``aligned``) and A's calls left unpaired; paired calls leave ``calls_b``.
    ``op_a``: A's op after the mapping's renames. One dict lookup per call: linear in the records."""
    by_flow: dict[tuple, list[_FlowCall]] = {}
    for call in calls_b.values():
        inputs = _inputs(call, links.made_b)
        if inputs and call.first.op != MODULE_OP:
            by_flow.setdefault(_flow_key(call, call.first.op, inputs), []).append(call)
    taken: set[int] = set()
    pairs: list[tuple[_FlowCall, _FlowCall, str]] = []
    left_a: list[_FlowCall] = []
    partner = links.partner
    leaves: dict[tuple, tuple] = {}  # A's values no op made: B's twin, learnt where a pair reads both
    for call in calls_a:
        name = rename(call)
        step = call.first.step
        other = None
        inputs = _inputs(call, links.made_a)
        if inputs and call.first.op != MODULE_OP:
            expected = [(slot, _partner(producer, partner, leaves)) for slot, producer in inputs]
            if all(found is not None for _, found in expected):
                other = _chosen(call, name, by_flow.get(_flow_key(call, op_a(call), expected), []), taken)
        if other is None:  # an anchor: by name, unless the flow says otherwise
            namesake = calls_b.get((step, name))
            if namesake is not None and namesake.signature() == call.signature() and links.check(call, namesake) is not True:
                other = namesake
        if other is None:
            left_a.append(call)
            continue
        taken.add(id(other))
        del calls_b[(other.first.step, other.name)]
        links.pair(call, other)  # type: ignore[arg-type]
        _learn_leaves(inputs, _inputs(other, links.made_b), leaves)
        how = "aligned" if other.name != name or other.first.step != step else "exact" if name == call.name else "mapped"
        pairs.append((call, other, how))
    return pairs, left_a


def _partner(producer: tuple, partner: Mapping[str, str], leaves: Mapping[tuple, tuple]) -> tuple | None:
    """B's twin of where an input of A came from (``None``: not known yet)."""
    call, slot = producer
    if call is None:
        return leaves.get(slot)
    found = partner.get(call)
    return None if found is None else (found, slot)


def _learn_leaves(inputs_a: list[tuple[str, tuple]], inputs_b: list[tuple[str, tuple]], leaves: dict[tuple, tuple]) -> None:
    """Pair the values no op made that two paired calls read in one slot (the first pair to read one
    decides): later calls reading them are paired by flow."""
    from_b = dict(inputs_b)
    for slot, (call, value) in inputs_a:
        other = from_b.get(slot)
        if call is None and other is not None and other[0] is None:
            leaves.setdefault(value, other)
