"""Pair the calls of two dumps that carry value ids by their data flow: one walk of side A is the
whole alignment.

Each dump is a graph of values: an input slot holds the value one output slot made (its producer,
``torchdebug.compare._value_graph``: exact by value id) or a value no op made (a parameter, the
step's input). A's calls are visited in execution order; by then the producers of a call's inputs
have been visited, so they are paired or one-sided. Each call tries :data:`RULES` in order, and
the first that names a call of B pairs it: by data flow (B's call reading the partners of A's
inputs), a module call by name, an anchor by name (the first reader of a parameter or the step's
input, a reader of a value only one side made), a namesake of other shapes whose inputs come from
the same sources (another batch or width), B's call reading the partners of the inputs whose makers
are known where the others are values no op made (a compiled graph's input that eager code made),
and B's call holding the same values in the module (where two implementations meet after one-sided
ops). What no rule pairs is one-sided. A few dict lookups per call: linear in the records. Eager
and graph dumps carry value ids; dumps without them (older dumps, msprobe dumps) are aligned by
``_matching``'s names and heuristics instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Generic, Protocol, TypeVar

from torchdebug.compare._value_graph import OUTPUTS
from torchdebug.records import MODULE_OP, Record

__all__ = ["align_by_flow", "dtype_kind", "output_values", "aligned_op"]

_VALUE_DIGITS = 3
"""Significant digits of the statistics that :func:`output_values` keeps: round-off of another
order of operations stays below them, different values do not."""


class _FlowCall(Protocol):
    """What the walk reads of a call: its name, its records with their slot names, its shapes."""

    name: str
    records: list[Record]
    slots: list[str]

    @property
    def first(self) -> Record: ...

    def signature(self) -> tuple: ...


_C = TypeVar("_C", bound=_FlowCall)
"""The caller's call type (``_matching._Call``): the walk hands back the calls it was given."""
_C_contra = TypeVar("_C_contra", bound=_FlowCall, contravariant=True)


class _Links(Protocol[_C_contra]):
    """What the walk asks of matching's producer links (``_matching._Links``): where each side's
    values came from, the pairs so far, the veto, and a new pair to learn."""

    @property
    def made_a(self) -> Mapping[int, tuple]: ...

    @property
    def made_b(self) -> Mapping[int, tuple]: ...

    @property
    def partner(self) -> Mapping[str, str]: ...

    @property
    def paired_b(self) -> set[str]: ...

    def check(self, call_a: _C_contra, call_b: _C_contra) -> bool | None: ...

    def unrelated_makers(self, call_a: _C_contra, call_b: _C_contra) -> bool: ...

    def unrelated(self, call_a: _C_contra, call_b: _C_contra) -> bool: ...

    def pair(self, call_a: _C_contra, call_b: _C_contra) -> None: ...


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


def _both_inputs(call: _FlowCall, made: Mapping[int, tuple]) -> list[list[tuple[str, tuple]]]:
    """A call's tensor input slots with where their values came from: the earlier op's ``(call name,
    output slot)``, the value's maker where an op passed it on (a ``detach``: such an op on one side
    is looked through), or, for a value no op made (a parameter, the step's input), ``(None,
    (value_id, version))``; where an op passed a value on, a second list names that op instead: a
    value passed on by one side only (B divides its loss's gradient by one micro-batch, A by four)
    is read from the op both run. One pass over the call's slots, once per call."""
    first: list[tuple[str, tuple]] = []
    direct: list[tuple[str, tuple]] = []
    passed_on = False
    for slot, record in zip(call.slots, call.records):
        if record.io == "input":
            producers = made.get(id(record))
            if producers:
                first.append((slot, producers[0]))
                direct.append((slot, producers[-1]))
                passed_on = passed_on or producers[0] != producers[-1]
            elif record.value_id is not None:
                leaf = (slot, (None, (record.value_id, record.version)))
                first.append(leaf)
                direct.append(leaf)
    return [first, direct] if passed_on else [first]


_ALIGNED_AS = {
    "aten._reshape_alias.default": "aten.view.default",
    "aten._index_put_impl_.default": "aten.index_put.default",
}
"""Ops torch runs for others where the two runs differ in how they call them (a dispatch mode makes
``reshape`` take ``view`` and indexing's backward ``index_put``; docs/compare.md, "Matching")."""


@functools.cache
def aligned_op(op: str) -> str:
    """The op a call is aligned as (docs/compare.md, "Matching"): an in-place op as its out-of-place
    form (``add_`` as ``add``), and :data:`_ALIGNED_AS`."""
    if op in _ALIGNED_AS:
        return _ALIGNED_AS[op]
    namespace, _, rest = op.partition(".")
    name, dot, overload = rest.partition(".")
    if name.endswith("_") and not name.endswith("__") and not name.startswith("_"):
        return f"{namespace}.{name[:-1]}{dot}{overload}"
    return op


def _flow_key(call: _FlowCall, op: str, inputs: Iterable[tuple[str, tuple | None]]) -> tuple:
    first = call.first
    return first.step, first.phase, aligned_op(op), tuple(inputs)


def _group(name: str, step: int) -> tuple[int, str]:
    """The step, phase and module of a call name (``forward/layers.0/aten.mm.default#2``)."""
    return step, name[: name.rfind("/")]


class _Walk(Generic[_C]):
    """The state of one walk: B's calls not yet paired (by name, by data flow, by value), the pairs
    so far and the values no op made whose twins pairs revealed. Each rule below reads it."""

    def __init__(
        self,
        named_a: list[tuple[_C, str]],
        calls_b: MutableMapping[tuple[int, str], _C],
        links: _Links[_C],
        op_a: Callable[[_C], str],
        named: Callable[[_C, _C], bool] | None = None,
    ) -> None:
        self.named_a, self.calls_b, self.links, self.op_a = named_a, calls_b, links, op_a  # A's calls with renamed names
        self.named = named
        """Whether two namesakes may be paired by name (``None``: always; against a compiled side,
        not where a decomposition shifted the call indices)."""
        self.by_flow: dict[tuple, list[_C]] = {}
        self.inputs_b: dict[int, list[tuple[str, tuple]]] = {}
        """B's calls' inputs by the makers of their values (by ``id``), read by the rules and the pairs."""
        for call in calls_b.values():
            reads = _both_inputs(call, links.made_b)
            self.inputs_b[id(call)] = reads[0]
            op = call.first.op
            if op == MODULE_OP:
                continue
            keys = {_flow_key(call, op, inputs) for inputs in reads if inputs}
            for key in keys:
                self.by_flow.setdefault(key, []).append(call)
        self.readers: dict[tuple, list[_C]] | None = None  # made when a rule first asks: B's calls by one input
        self.by_value: _ByValue[_C] | None = None  # made when a rule first asks
        self.taken: set[int] = set()
        self.leaves: dict[tuple, tuple] = {}  # A's values no op made: B's twin, learnt where a pair reads both
        self.pending_a = {(call.first.step, name) for call, name in named_a}  # A's calls not visited yet
        self.by_value_a: _ByValue[tuple[int, str]] | None = None

    def namesake(self, call: _C, name: str, inputs: list[tuple[str, tuple]]) -> _C | None:
        """B's unpaired call of A's (renamed) name in its step, unless its inputs come from producers
        paired with other calls or it reads a value A makes later (:meth:`reads_later`)."""
        other = self.calls_b.get((call.first.step, name))
        if other is None or one_is_a_no_op(call, other) or self.links.check(call, other) is True:
            return None
        if self.named is not None and not self.named(call, other):
            return None
        return None if self.reads_later(other, inputs) else other

    def reads_later(self, other: _C, inputs: list[tuple[str, tuple]]) -> bool:
        """Whether B's call reads, where A's call reads a value of known twin, a value whose maker's
        namesake A has not run yet: A's call ran before that value existed, so it is not B's call (the
        gradients of three projections summed in another order: A's ``add`` of q's and k's is not B's
        ``add`` of v's and k's)."""
        expected = dict(inputs)
        for slot, producer in self.inputs_b[id(other)]:
            mine = expected.get(slot)
            if mine is None or mine[0] is None or producer[0] is None:
                continue
            if _partner(mine, self.links.partner, self.leaves) != producer and (other.first.step, producer[0]) in self.pending_a:
                return True
        return False

    def reading(self, call: _C, slot: str, producer: tuple) -> list[_C]:
        """B's unpaired calls of A's op, step and phase that read ``producer`` (B's) in ``slot``."""
        if self.readers is None:  # once, over B's calls unpaired so far: linear in them
            self.readers = {}
            for other in self.calls_b.values():
                if other.first.op != MODULE_OP:
                    for read in self.inputs_b[id(other)]:
                        self.readers.setdefault(_flow_key(other, other.first.op, (read,)), []).append(other)
        found = self.readers.get(_flow_key(call, self.op_a(call), ((slot, producer),)), [])
        return [other for other in found if id(other) not in self.taken]

    def holding_values(self, call: _C, name: str) -> _C | None:
        """B's first unpaired call in A's ``(step, phase, module)`` with A's op, shapes and
        :func:`output_values` (``None``: A's call has no such values, or B no such call)."""
        values = output_values(call)
        if not values:
            return None
        if self.by_value is None:  # once, over B's calls unpaired so far: linear in them
            self.by_value = _ByValue((_place(other, other.name, other.first.op), other, other) for other in self.calls_b.values())
        candidates = self.by_value.get(_place(call, name, self.op_a(call)), call.signature(), values)
        while candidates and id(candidates[0]) in self.taken:
            candidates.pop(0)
        return candidates[0] if candidates else None

    def held_later(self, other: _C) -> bool:
        """Whether a call of A not visited yet holds the values of B's call (its op, shapes and
        :func:`output_values` in its module): B's call is left for it."""
        values = output_values(other)
        if not values:
            return False
        if self.by_value_a is None:  # once, over A's calls: linear in them
            self.by_value_a = _ByValue(
                (_place(call, name, self.op_a(call)), call, (call.first.step, name)) for call, name in self.named_a
            )
        held = self.by_value_a.get(_place(other, other.name, other.first.op), other.signature(), values)
        return any(found in self.pending_a for found in held)


def _place(call: _FlowCall, name: str, op: str) -> tuple:
    """A call's step, phase, module and op (:func:`aligned_op`): where :class:`_ByValue` looks for calls holding its values."""
    return (*_group(name, call.first.step), aligned_op(op))


_T = TypeVar("_T")


class _ByValue(Generic[_T]):
    """Calls by :func:`_place`, then by shapes and :func:`output_values`: the values (statistics
    rounded to significant digits, the costly part) of the calls of one op in one module are made
    when a call there is first looked up, not for every call."""

    def __init__(self, entries: Iterable[tuple[tuple, _FlowCall, _T]]) -> None:
        self.by_place: dict[tuple, list[tuple[_FlowCall, _T]]] = {}
        for place, call, item in entries:
            self.by_place.setdefault(place, []).append((call, item))
        self.by_value: dict[tuple, dict[tuple, list[_T]]] = {}

    def get(self, place: tuple, signature: tuple, values: tuple) -> list[_T]:
        """The items of the calls at ``place`` with these shapes and values, in the order given (the
        list itself: a caller may drop those it has used)."""
        held = self.by_value.get(place)
        if held is None:
            held = self.by_value[place] = {}
            for call, item in self.by_place.pop(place, ()):
                found = output_values(call)
                if found:
                    held.setdefault((call.signature(), found), []).append(item)
        return held.get((signature, values), [])


def by_data_flow(walk: _Walk[_C], call: _C, name: str, reads: list[list[tuple[str, tuple]]]) -> _C | None:
    """Every case where the producers of a call's inputs are paired already: B's call of the same op,
    step and phase reading their partners slot by slot (a dict lookup), whatever its name, index or
    shapes (an inserted op, independent ops reordered, two zero biases, another batch); the makers of
    values passed on first, then the ops that passed them on (:func:`_both_inputs`)."""
    if not reads[0] or call.first.op == MODULE_OP:
        return None
    for read in reads:
        expected = [(slot, _partner(producer, walk.links.partner, walk.leaves)) for slot, producer in read]
        if all(found is not None for _, found in expected):
            found = _chosen(call, name, walk.by_flow.get(_flow_key(call, walk.op_a(call), expected), []), walk.taken)
            if found is not None:
                return found
    return None


def module_by_name(walk: _Walk[_C], call: _C, name: str, reads: list[list[tuple[str, tuple]]]) -> _C | None:
    """A module call, an anchor where identity is certain: its namesake whatever its shapes (another
    batch, micro-batches, another width), so its inputs and outputs are judged or called incomparable
    as values, never left one-sided."""
    return walk.namesake(call, name, reads[0]) if call.first.op == MODULE_OP else None


def by_name_at_an_anchor(walk: _Walk[_C], call: _C, name: str, reads: list[list[tuple[str, tuple]]]) -> _C | None:
    """An op whose inputs' producers are not paired (the first reader of a parameter or the step's
    input, a reader of a value only one side made): its namesake with the same shapes, unless the two
    read different values that each side made with ops only it runs. There values decide: B's call
    holding A's value in the module is taken, and B's call is left for a later call of A that holds
    its value (autograd adds a hand-written layer norm's partial gradients one by one, ``add#0`` to
    ``add#3``, where ``native_layer_norm_backward`` makes the whole one: B's ``add#0``, summing it with
    the residual's gradient, holds the value of the hand-written ``add#3``, not of its ``add#0``);
    else names pair them unless their values are far apart (the ``detach`` of sdpa's output is not
    the ``detach`` of a hand-written softmax)."""
    other = walk.namesake(call, name, reads[0])
    if other is None or other.signature() != call.signature():
        return None
    if not walk.links.unrelated_makers(call, other):
        return other
    if output_values(other) != output_values(call):
        holder = walk.holding_values(call, name)
        if holder is not None or walk.held_later(other):
            return holder
    return None if walk.links.unrelated(call, other) else other


def by_provenance(walk: _Walk[_C], call: _C, name: str, reads: list[list[tuple[str, tuple]]]) -> _C | None:
    """An op of other shapes (another batch, micro-batches, a layer of another width): its namesake
    when each of its inputs comes from the same kind of source on both sides: from partners, or from
    values no op made (the step's input, a parameter) whose twin is that value or not known yet. Its
    values are then judged (or called incomparable) as values, not left one-sided."""
    inputs = reads[0]
    other = walk.namesake(call, name, inputs)
    if other is None or call.first.op == MODULE_OP:
        return None
    theirs = dict(walk.inputs_b[id(other)])
    if len(theirs) != len(inputs):
        return None
    for slot, producer in inputs:
        found = theirs.get(slot)
        if found is None or (producer[0] is None) != (found[0] is None):
            return None
        expected = _partner(producer, walk.links.partner, walk.leaves)
        if expected != found and (producer[0] is not None or expected is not None):
            return None
    return other


def by_known_inputs(walk: _Walk[_C], call: _C, name: str, reads: list[list[tuple[str, tuple]]]) -> _C | None:
    """An op reading both values of known partners and values no op made on its side whose twins are
    not known (a compiled graph's input that eager code made outside it: autograd summing the
    gradients of a compiled block's outputs that alias its input, eager code between two graphs):
    B's call of the same op, step and phase reading the partners in the same slots, and in the
    others values that no call paired so far made; of several, as :func:`by_data_flow` chooses."""
    if call.first.op == MODULE_OP:
        return None
    known, unknown = [], []
    for slot, producer in reads[0]:
        expected = _partner(producer, walk.links.partner, walk.leaves)
        if expected is not None:
            known.append((slot, expected))
        elif producer[0] is None:
            unknown.append(slot)
        else:
            return None  # made by a call of A not paired: no partner to read
    if not known or not unknown:
        return None
    candidates = []
    for reader in walk.reading(call, *known[0]):
        theirs = dict(walk.inputs_b[id(reader)])
        if (
            len(theirs) == len(reads[0])
            and all(theirs.get(slot) == expected for slot, expected in known)
            and all(slot in theirs and theirs[slot][0] not in walk.links.paired_b for slot in unknown)
        ):
            candidates.append(reader)
    other = _chosen(call, name, candidates, walk.taken)
    return None if other is None or walk.links.check(call, other) is True else other


def by_values(walk: _Walk[_C], call: _C, name: str, reads: list[list[tuple[str, tuple]]]) -> _C | None:
    """Where two implementations meet after ops only one side runs (sdpa against a hand-written
    attention: the heads transposed back), nothing relates the calls but their values: B's call in
    A's module with A's op, shapes and output values, unless their inputs come from producers paired
    with other calls (gradients summed in another order: A's ``add`` of q's and k's sum with v's has
    the value of B's ``add`` of v's and k's sum with q's, not its inputs). The flow resumes at its
    outputs."""
    if call.first.op == MODULE_OP:
        return None
    other = walk.holding_values(call, name)
    return None if other is None or walk.links.check(call, other) is True else other


RULES = (by_data_flow, module_by_name, by_name_at_an_anchor, by_provenance, by_known_inputs, by_values)
"""The walk's rules, in the order each call of A tries them; the first that names a call of B pairs it.
Each reads the call's inputs as :func:`_both_inputs` lists them, made once per call."""


def _global_shapes(call: _FlowCall) -> tuple:
    """The shapes of a call's tensor slots as the whole tensors have them (a DTensor's global shape)."""
    return tuple(tuple(record.shape or ()) for record in call.records if record.kind == "tensor")


_NO_OP_VIEWS = frozenset(("aten.view.default", "aten._unsafe_view.default", "aten.alias.default", "aten.detach.default"))
"""Ops that make a view or alias of their input: with the input's shape, they hold its value as it is."""


def _no_op(call: _FlowCall) -> bool:
    """Whether a call is a view of its input with the input's shape (:data:`_NO_OP_VIEWS`)."""
    if call.first.op not in _NO_OP_VIEWS:
        return False
    shapes = {tuple(record.shape or ()) for record in call.records if record.kind == "tensor"}
    return len(shapes) == 1


def one_is_a_no_op(call_a: _FlowCall, call_b: _FlowCall) -> bool:
    """The rule for a view that only one side takes of a value, with its shape (``DTensor.from_local``'s
    ``view`` of a local tensor, named like the layer's own reshaping ``view`` that one process runs
    alone): two calls of other global shapes of which one is such a no-op (:func:`_no_op`) and the
    other is not are never paired. The no-op is one-sided and its readers are paired through it (the
    value graph names the value's maker as their producer)."""
    return _no_op(call_a) != _no_op(call_b) and _global_shapes(call_a) != _global_shapes(call_b)


def _chosen(call: _C, name: str, candidates: list[_C], taken: set[int]) -> _C | None:
    """Of B's calls with the data flow of ``call``, the namesake, else the first of its shapes, else the
    first holding its values (``None``: none of them agrees on more than the flow); never one that
    :func:`one_is_a_no_op` tells apart."""
    candidates[:] = [other for other in candidates if id(other) not in taken]  # each taken call skipped once
    free = [other for other in candidates if not one_is_a_no_op(call, other)]
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
    calls_a: Iterable[_C],
    calls_b: MutableMapping[tuple[int, str], _C],
    links: _Links[_C],
    rename: Callable[[_C], str],
    op_a: Callable[[_C], str],
    named: Callable[[_C, _C], bool] | None = None,
) -> tuple[list[tuple[_C, _C, str]], list[_C]]:
    """Pair ``calls_a`` (in execution order) with ``calls_b`` (by ``(step, call name)``) by the first of
    :data:`RULES` that names a partner (module docstring); ``links`` learns each pairing as it is made.
    Returns the pairs with how they were paired (``exact`` or ``mapped`` where the names agree after
    ``rename``, else ``aligned``) and A's calls left unpaired (one-sided); paired calls leave
    ``calls_b``. ``op_a``: A's op after the mapping's renames; ``named``: whether two namesakes may be
    paired by name (against a compiled side). A few dict lookups per call: linear in the records."""
    walk = _Walk([(call, rename(call)) for call in calls_a], calls_b, links, op_a, named)
    pairs: list[tuple[_C, _C, str]] = []
    left_a: list[_C] = []
    for call, name in walk.named_a:
        walk.pending_a.discard((call.first.step, name))
        reads = _both_inputs(call, links.made_a)
        other = None
        for rule in RULES:
            other = rule(walk, call, name, reads)
            if other is not None:
                break
        if other is None:
            left_a.append(call)
            continue
        walk.taken.add(id(other))
        del calls_b[(other.first.step, other.name)]
        links.pair(call, other)
        _learn_leaves(reads[0], walk.inputs_b[id(other)], walk.leaves)
        step = call.first.step
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
