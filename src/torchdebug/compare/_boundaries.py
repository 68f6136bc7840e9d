"""Align what one side decomposed: eager ops against the groups of compiled nodes that stand for them.

A compiled graph holds the decomposed form of many eager ops (``native_layer_norm`` becomes
``var_mean``, ``sub``, ``rsqrt``, ``mul``, ``add``; a ``detach`` or ``view`` disappears), so
call-level matching leaves both the eager op and its nodes unpaired. What the two sides share is the
group's **boundary**: the values that enter it and leave it. The alignment's last rule
(:func:`align_boundaries`, applied by ``_matching.match_records`` against a compiled side) pairs
the slots the calls' pairing left over by value, by data flow and at the group's boundary; a slot's
value is told by the value ids both dumps record (:func:`_values_by_id`), else by dtype, shape and
statistics (:func:`~torchdebug.compare._value_graph.identity`: older and msprobe dumps).
These rows carry B's names (the eager op's call), so a decomposed op is judged as one call: its
outputs against its inputs. Slots of A left over in a module where a decomposed eager op was aligned
are the group's inner values (``how="inside"``, with the eager call in ``inside``): listed, not
compared.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from torchdebug.compare._metrics import stats_metrics
from torchdebug.compare._shards import local_indices
from torchdebug.compare._tolerances import tolerance_for
from torchdebug.compare._value_graph import execution_order, held_values, identity
from torchdebug.records import NO_MODULE, Record

__all__ = ["align_boundaries"]

_OUTPUTS = ("output", "parameter_grad")
_ROOT = "<root>"  # the module path of the model itself in both captures' names


class _SlotPair(Protocol):
    """What the rule reads and rewrites of matching's slot pairs (``_matching.Pair``)."""

    a: Record | None
    b: Record | None
    how: str
    inside: str | None


_P = TypeVar("_P", bound=_SlotPair)


def _module(record: Record) -> str:
    """The module of a slot, ops outside every module counted as the root module's: a compiled graph
    traced from a function the model's forward calls after a graph break (the loss of a Hugging
    Face model) knows no module, where eager capture saw the root module's forward."""
    return _ROOT if record.module == NO_MODULE else record.module


def _region(record: Record) -> tuple[int, str, str]:
    return record.step, record.phase, _module(record)


def _values_by_statistics(record: Record) -> tuple[tuple, ...]:
    """The value a slot holds within its step (values of other steps are other values), told by
    dtype, shape and statistics: for dumps without value ids."""
    value = identity(record)
    return () if value is None else ((record.step, value),)


def _values_by_id(pairs: Sequence[_SlotPair]) -> Callable[[Record], tuple[tuple, ...]]:
    """What a slot holds, told by the value ids both dumps record: the tensor (its ``(value_id,
    version)``), then the value (the one a view or a copy passed on,
    :func:`~torchdebug.compare._value_graph.held_values`; each side's slots in execution order)."""
    keys: dict[int, tuple[tuple, ...]] = {}  # by the record's id, made once: the rule asks again each round
    for side in ("a", "b"):
        records = [record for p in pairs if (record := getattr(p, side)) is not None]
        values = held_values([records[i] for i in execution_order(records)])
        for record in records:
            value = values.get(id(record))
            if value is not None:
                keys[id(record)] = ((record.step, "tensor", record.value_id, record.version), (*value, "value"))
    return lambda record: keys.get(id(record), ())


def _direction(record: Record) -> bool:
    return record.io in _OUTPUTS


def _place(record: Record) -> tuple:
    """What a slot is paired at a group boundary by: region, direction, dtype and shape."""
    return (*_region(record), _direction(record), record.dtype, tuple(record.shape or ()))


class _Aligner:
    """The pairs of one rank, with the slots each side still has unpaired, indexed by value."""

    def __init__(self, pairs: list[_SlotPair], by_id: bool, made_a: Mapping[int, tuple] | None = None) -> None:
        self.pairs, self.by_id, self.made_a = pairs, by_id, made_a or {}
        self.values = _values_by_id(pairs) if by_id else _values_by_statistics
        self.partner_b: dict[tuple, tuple] = {}  # B's tensor or value -> A's
        self._one_sided_a: dict[tuple[int, str], list[Record]] | None = None  # A's calls only A runs: their inputs
        self._outputs_b: dict[tuple[int, str], list[Record]] = defaultdict(list)  # B's output slots by call
        for pair in pairs:
            if pair.b is not None and _direction(pair.b):
                self._outputs_b[(pair.b.step, pair.b.call_name)].append(pair.b)
        self._outputs_a: dict[tuple[int, str, str], tuple[_SlotPair, Record]] | None = None  # both made when first asked
        for pair in pairs:
            if pair.a is not None and pair.b is not None:
                self._link(pair.a, pair.b)

    def _link(self, a: Record, b: Record) -> None:
        if (a.extra or b.extra) and (local_indices(a, b) or local_indices(b, a)):
            return  # one slot, not one value: what made either side's is not the other's
        for value_a, value_b in zip(self.values(a), self.values(b)):
            self.partner_b.setdefault(value_b, value_a)

    def _left(self, side: str) -> list[tuple[_SlotPair, Record]]:
        """The pairs holding a tensor slot of ``side`` only, with that slot."""
        how = "only_a" if side == "a" else "only_b"
        return [(p, record) for p in self.pairs if p.how == how and (record := getattr(p, side)).kind == "tensor"]

    def _join(self, holder: _SlotPair, a: Record, left_b: _SlotPair, b: Record, how: str) -> None:
        """Give the B-only pair (holding ``b``) the slot ``a`` that ``holder`` has (dropping ``holder``
        when it was A-only: a slot paired already stays in its pair too, holding a value an erased
        eager op passed on)."""
        left_b.a, left_b.how = a, how
        if holder.how == "only_a":
            holder.how = ""  # dropped by align_boundaries()
        self._link(a, b)

    def by_value(self) -> int:
        """Pair left-over slots holding partner values (1. in the module docstring; where, see
        :func:`_nearness`)."""
        holders: dict[tuple, list[tuple[_SlotPair, Record]]] = defaultdict(list)
        for pair in self.pairs:
            if (a := pair.a) is not None and pair.how:
                for value in self.values(a):
                    holders[value].append((pair, a))
        joined, free = 0, None
        for left_b, b in self._left("b"):
            ranked = []  # the nearest; the tensor's partner before the value's; unpaired; in the same direction
            for level, value_b in enumerate(self.values(b)):
                for holder, a in holders.get(self.partner_b.get(value_b, ()), ()):
                    nearness = _nearness(a, b)
                    if holder.how and nearness is not None:
                        ranked.append(((nearness, level, holder.how != "only_a", _direction(a) != _direction(b)), holder, a))
            if not ranked:
                continue
            (nearness, *_), nearest, a = min(ranked, key=lambda found: found[0])
            compiled_a = self.by_id and a.capture == "graph" and b.capture != "graph"  # A's own ops: compiled nodes
            if nearness == 0 and compiled_a and not _direction(b) and b.phase != "backward" and nearest.how == "only_a":
                free = self._free() if free is None else free
                partners = {self.partner_b[v] for v in self.values(b) if v in self.partner_b}
                changed = self._changed_on_the_way(b, free, partners, apart=True)
                if changed is not None:  # A's group reads the value through a line of user code only A runs
                    nearest, a = changed
            elif nearness == _ACROSS_MODULES and self.by_id:
                free = self._free() if free is None else free
                if self._at_boundary(b, free) is not None:
                    continue  # its own group's slot, at the boundary (2.): by id, an op one side runs
                    # between the group and the next paired op (an add of zeros) makes that slot another value
                changed = (
                    self._changed_on_the_way(b, free, {self.partner_b[v] for v in self.values(b) if v in self.partner_b})
                    if compiled_a
                    else None
                )
                if changed is not None:  # A's group reads the value through ops only A runs
                    nearest, a = changed
            if compiled_a and _direction(b) and not _constant(b) and not _agree(a, b):
                before = self._nearer_before(a, b)
                if before is not None:  # ops only A runs changed the value after A's group made it
                    nearest, a = before
            self._join(nearest, a, left_b, b, "value")
            joined += 1
        return joined

    def by_boundary(self) -> int:
        """Pair left-over slots of B with A's of the same region, direction, dtype and shape (2.)."""
        free = self._free()
        joined = 0
        for left_b, b in self._left("b"):
            found = self._at_boundary(b, free)
            if found is not None:
                self._join(found[0], found[1], left_b, b, "group")
                joined += 1
        return joined

    def _free(self) -> dict[tuple, list[tuple[_SlotPair, Record]]]:
        """A's unpaired tensor slots by place (:func:`_place`)."""
        free: dict[tuple, list[tuple[_SlotPair, Record]]] = defaultdict(list)
        for pair, a in self._left("a"):
            free[_place(a)].append((pair, a))
        return free

    def _changed_on_the_way(
        self,
        b: Record,
        free: Mapping[tuple, list[tuple[_SlotPair, Record]]],
        partners: set[tuple],
        apart: bool = False,
    ) -> tuple[_SlotPair, Record] | None:
        """The unpaired slot of A at ``b``'s place (its module: the slot a group of A's reads where
        the eager op reads ``b``) whose value ops only A runs made from the partner of ``b``'s value
        (``partners``), within :data:`_ON_THE_WAY` such ops: a scale only the compiled side applies
        before a decomposed norm. The norm's input is then that value, so the ops are judged as a
        structure difference, not the norm.

        ``apart``, in ``b``'s own module and in the forward (whose values flow in the order of the
        source; in the backward a line's nodes hand theirs to the line before): only a slot whose
        value an op of another source line than its reader's made (a decomposed op's nodes read each
        other's values, all of its line: a LayerNorm's centred input is no input of the norm; a
        scale on the line before a masked fill, which inductor reads inside its ``where``, is),
        whose statistics compare with ``b``'s (not the masked scores a softmax's nodes read) and
        agree with no output of ``b``'s call (not a decomposed GELU's output that a scale after it
        reads); the nearest to ``b`` of those."""
        candidates = [(pair, a) for pair, a in free.get(_place(b), ()) if pair.how == "only_a"]
        if not candidates or not partners:
            return None
        self._index_one_sided()
        if not apart:
            return next(((pair, a) for pair, a in candidates if self._made_from(a, partners)), None)
        found = [
            (distance, pair, a)
            for pair, a in candidates
            if self._made_on_another_line(a)
            and (distance := _distance(a, b)) < math.inf
            and not any(_agree(a, made) for made in self._outputs_b.get((b.step, b.call_name), ()))
            and self._made_from(a, partners)
        ]
        return min(found, key=lambda candidate: candidate[0])[1:] if found else None

    def _made_from(self, a: Record, partners: set[tuple]) -> bool:
        """Whether ops only A runs made the value of A's slot ``a`` from one of ``partners``, within
        :data:`_ON_THE_WAY` of them."""
        assert self._one_sided_a is not None
        frontier, seen = [a], set()
        for _ in range(_ON_THE_WAY):
            reads = []
            for record in frontier:
                made = self.made_a.get(id(record))
                key = (record.step, made[0][0]) if made else None
                if key is None or key in seen or key not in self._one_sided_a:
                    continue
                seen.add(key)
                reads += self._one_sided_a[key]
            if any(value in partners for read in reads for value in self.values(read)):
                return True
            frontier = reads
            if not frontier:
                break
        return False

    def _made_on_another_line(self, a: Record) -> bool:
        """Whether the op that made the value of A's input slot ``a`` sits on another source line than
        the op reading it (both known)."""
        assert self._outputs_a is not None
        made = self.made_a.get(id(a))
        found = self._outputs_a.get((a.step, *made[0])) if made else None
        return found is not None and a.source is not None and found[1].source is not None and found[1].source != a.source

    def _nearer_before(self, a: Record, b: Record) -> tuple[_SlotPair, Record] | None:
        """The unpaired output slot of A at ``b``'s place whose value is nearest ``b``'s, nearer than
        ``a``'s, made before ``a``'s value on the way through ops only A runs (within
        :data:`_ON_THE_WAY`): a scale only the compiled side applies right after a decomposed GELU,
        in its module. The GELU's output is the value its nodes made (equal to eager's, or as near
        as what differs upstream leaves it, a later step of a run the scale changed), and the
        scale, which moved it, is judged as a structure difference, not the GELU."""
        self._index_one_sided()
        assert self._one_sided_a is not None and self._outputs_a is not None
        nearest, distance = None, _distance(a, b)
        frontier, seen = [a], set()
        for _ in range(_ON_THE_WAY):
            reads = []
            for record in frontier:
                key = (record.step, record.call_name)
                if key not in seen and key in self._one_sided_a:
                    seen.add(key)
                    reads += self._one_sided_a[key]
            for read in reads:
                made = self.made_a.get(id(read))
                found = self._outputs_a.get((read.step, *made[0])) if made else None
                if found is not None and found[0].how == "only_a" and _place(found[1]) == _place(b):
                    apart = _distance(found[1], b)
                    if apart < distance:
                        nearest, distance = found, apart
            frontier = reads
            if not frontier:
                break
        return nearest

    def _index_one_sided(self) -> None:
        """A's calls only A runs, with their input slots; A's output slots by call and slot (once)."""
        if self._one_sided_a is not None:
            return
        self._one_sided_a, self._outputs_a = defaultdict(list), {}
        for pair in self.pairs:
            a = pair.a
            if a is None or a.kind != "tensor":
                continue
            if a.io == "input" and pair.how == "only_a":
                self._one_sided_a[(a.step, a.call_name)].append(a)
            elif a.io in _OUTPUTS:
                self._outputs_a[(a.step, a.call_name, a.name[len(a.call_name) + 1 :])] = (pair, a)

    @staticmethod
    def _at_boundary(b: Record, free: Mapping[tuple, list[tuple[_SlotPair, Record]]]) -> tuple[_SlotPair, Record] | None:
        """The unpaired slot of A at ``b``'s place whose statistics are closest, when they agree."""
        candidates = [(_distance(a, b), pair, a) for pair, a in free.get(_place(b), ()) if pair.how == "only_a"]
        if not candidates:
            return None
        _, pair, a = min(candidates, key=lambda found: found[0])
        return (pair, a) if _agree(a, b) else None

    def mark_inside(self, decomposed: set[str], made_a: Mapping[int, tuple]) -> None:
        """A-only slots in a module where a decomposed eager call was aligned: inside the one of its
        decomposed calls whose aligned outputs their values flow into through A-only calls, else the
        first aligned at or after them in A's order (else the last one). ``made_a``: the producers
        of A's input slots (``_value_graph.Producers``)."""
        consumers: dict[tuple[int, str], set[str]] = defaultdict(set)  # A's (step, call) -> calls reading it
        read = {id(p.a): p.a for p in self.pairs if p.a is not None and id(p.a) in made_a}
        for slot, record in read.items():
            consumers[(record.step, made_a[slot][0][0])].add(record.call_name)
        owner: dict[tuple[int, str], str] = {}  # A's (step, call) -> the decomposed eager call it computes
        boundaries: dict[tuple, list[tuple[int, str]]] = defaultdict(list)
        for pair in self.pairs:
            a, b = pair.a, pair.b  # both set in a "value" or "group" pair
            if pair.how in ("value", "group") and a is not None and b is not None and b.call_name in decomposed:
                boundaries[_region(b)].append((a.seq, b.call_name))
                if _direction(b) and _direction(a):
                    owner.setdefault((a.step, a.call_name), b.call_name)
        left = [(p, a) for p in self.pairs if p.how == "only_a" and (a := p.a) is not None]
        for _, a in sorted(left, key=lambda found: -found[1].seq):  # consumers first
            key = (a.step, a.call_name)
            if key not in owner:
                owners = [owner[(key[0], c)] for c in sorted(consumers.get(key, ())) if (key[0], c) in owner]
                if owners:
                    owner[key] = owners[0]
        for found in boundaries.values():
            found.sort()
        for pair, a in left:
            aligned = boundaries.get(_region(a))
            if aligned:
                pair.how = "inside"
                flows_into = owner.get((a.step, a.call_name))
                if any(name == flows_into for _, name in aligned):
                    pair.inside = flows_into
                else:
                    pair.inside = next((name for seq, name in aligned if seq >= a.seq), aligned[-1][1])


_ACROSS_MODULES = 2
"""The nearness (:func:`_nearness`) of a slot of A in another module than B's."""

_ON_THE_WAY = 8
"""How many ops only A runs :meth:`_Aligner._changed_on_the_way` looks through, at most."""


def _nearness(a: Record, b: Record) -> int | None:
    """How near a slot of A holding the partner value of B's slot is to it: 0 in the same phase and
    module, 1 in the same module (a backward op reading what its forward saved, which the compiled
    forward graph holds), 2 in the same phase (a value passed on across modules); a constant value
    (zeros, a scalar: many unrelated tensors share its statistics) only in the same module."""
    same_phase, same_module = a.phase == b.phase, _module(a) == _module(b)
    if same_module and (same_phase or (b.phase, a.phase) == ("backward", "forward")):
        return 0 if same_phase else 1
    return _ACROSS_MODULES if same_phase and not _constant(b) else None


def _constant(record: Record) -> bool:
    """A value whose statistics many unrelated tensors share (all elements equal: zeros, a scalar)."""
    stats = record.stats or {}
    return stats.get("min") == stats.get("max")


def _distance(a: Record, b: Record, atol: float = 0.0) -> float:
    """How far apart two slots' statistics are: scale-relative, on the scale floor ``atol`` (infinite
    without statistics, and where one side holds NaN/Inf the other does not: a masked ``-inf`` is not
    the finite scores it was written into). Candidates are ranked without a floor, which would make
    all small values equal."""
    metrics = stats_metrics(a.stats, b.stats, numel=math.prod(b.shape or ()), atol=atol)
    error = metrics.get("error")
    if error is None or math.isnan(error) or metrics.get("nonfinite_mismatch"):
        return math.inf
    return error


def _agree(a: Record, b: Record) -> bool:
    """Whether two slots' statistics agree within the pair's tolerance, as their row would judge them."""
    tolerance = tolerance_for(a.dtype, b.dtype)
    return _distance(a, b, tolerance.atol) <= tolerance.rtol


def align_boundaries(pairs: list[_P], made_a: Mapping[int, tuple], by_id: bool) -> list[_P]:
    """``pairs`` with left-over slots paired by value (``how="value"``), at group boundaries
    (``"group"``) and marked ``"inside"`` (the module docstring), inside the eager calls that
    call-level matching left unpaired (:func:`_unpaired_calls`). ``made_a``: the producers of A's
    input slots (``_value_graph.Producers``). Two ways, each run again on what the other found:

    1. **Data flow.** A paired slot says that a value of A is a value of B; every other slot of B
       holding that value (by value ids the same tensor, else the value a view or copy passed on;
       without ids the same saved tensor, or the same dtype, shape and statistics: the output of
       the op that made it, a ``detach`` of it) is paired with a slot of A holding the partner
       value: the nearest, the same tensor's partner before the value's, an unpaired one first. This
       pairs the outputs of a decomposed op with the node
       whose value the next matched op reads, its inputs with the values the group's nodes read, and
       the slots of ops the compiler erased (``detach``, ``alias``, ``clone``) with the value they
       pass on.

    2. **Group boundary.** A slot of B still unpaired (the mean and ``rstd`` a LayerNorm saves for
       its backward, the weight gradient of a decomposed backward) is paired with the unpaired slot
       of A in the same step, phase and module, with the same direction, dtype and shape whose
       statistics are closest, when they agree within the pair's tolerance. Nothing ties the two
       values but their place and their agreement, so such a row says that the value exists on both
       sides, and passes: a value the compiled graph holds differently, or never materialises
       (GELU's backward holds several tensors of one shape, 5e-3 apart at the closest), stays
       unmatched instead of being paired with another value (a false error). Differences show where
       the data flow pairs values (1.).
    """
    decomposed = _unpaired_calls(pairs)
    aligner = _Aligner(list(pairs), by_id, made_a)
    while aligner.by_value() + aligner.by_boundary():
        pass
    aligner.mark_inside(decomposed, made_a)
    return [p for p in pairs if p.how]


def _unpaired_calls(pairs: Sequence[_SlotPair]) -> set[str]:
    """Call names of B with no slot paired."""
    paired = {p.b.call_name for p in pairs if p.b is not None and p.a is not None}
    return {p.b.call_name for p in pairs if p.b is not None and p.a is None} - paired
