"""Structure differences: runs of ops that only one side executes, between aligned values.

Two runs can compute the same values with other ops (``scaled_dot_product_attention`` against a
hand-written attention) or run an op the other does not (a forward hook that scales an output).
Following the data flow, the calls only one side runs that feed each other form a *block*: it reads
aligned values (its ``entering`` rows) and makes values that aligned calls read (its ``leaving``
rows). Blocks of both sides whose values the same aligned call reads are one structure difference.

* A block whose leaving values agree with their partners leaves the values equal: it is listed and
  passes.
* When a leaving value differs beyond tolerance while the values entering the block agree, the
  block is the cause: :func:`cause_in_block` names the op in it that changed the value, which the
  verdict rules blame (``changed_by_one_sided_op`` in :mod:`torchdebug.compare._rules`).

:func:`structure_blocks` lists the blocks of one rank's judged rows and links each one-sided row to
its block (``Row.block``), so the result lists them (``CompareResult.structure_differences``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torchdebug.compare._flow import OUTPUT_IO, Flow
from torchdebug.compare._metrics import stats_metrics
from torchdebug.compare._rows import Row
from torchdebug.compare._tolerances import tolerance_for
from torchdebug.records import call_name

__all__ = ["BlockOp", "StructureBlock", "Cause", "cause_in_block", "structure_blocks"]

_MAX_WALK = 64
"""How many ops of a block are walked back from its leaving value to find the one that changed it."""
_ONE_SIDED = ("only_a", "only_b")
_NOT_ALIGNED = (*_ONE_SIDED, "inside")


@dataclass(frozen=True, slots=True)
class BlockOp:
    """One op call of a block: which side runs it, its call name, op, module and source line."""

    side: str
    """``A`` or ``B``."""
    call: str
    op: str
    module: str
    source: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"side": self.side, "call": self.call, "op": self.op, "module": self.module, "source": self.source}


@dataclass(slots=True, eq=False)
class StructureBlock:
    """A structure difference: ops only one side runs (or each side its own) between aligned values."""

    rank: int
    step: int
    phase: str
    ops: list[BlockOp] = field(default_factory=list)
    """In execution order, side A's first."""
    entering: list[str] = field(default_factory=list)
    """The aligned values it reads (their output rows' names)."""
    leaving: list[str] = field(default_factory=list)
    """The aligned input rows that read what it makes."""
    verdict: str = "unjudged"
    """``pass`` (its leaving values agree), ``error`` (it changed a value: see :attr:`cause`),
    ``warning`` (a leaving value carries a difference made before it), ``undecided`` (a leaving value
    differs by what it may amplify the differences entering it to: statistics cannot tell) or
    ``unjudged`` (no aligned call reads what it makes, or what it makes cannot be compared)."""
    cause: str | None = None
    """The row of the op in it that changed the value (blamed), when it is the cause."""

    @property
    def sides(self) -> str:
        """Which sides run its ops: ``A``, ``B`` or ``A+B``."""
        return "+".join(sorted({op.side for op in self.ops}))

    def describe(self) -> str:
        """One line: where, which side runs which ops, and what it does to the values."""
        by_side = []
        for side in ("A", "B"):
            ops = [op.op for op in self.ops if op.side == side]
            if ops:
                shown = ", ".join(ops[:4]) + (f" and {len(ops) - 4} more" if len(ops) > 4 else "")
                by_side.append(f"only {side} runs {shown}")
        modules = sorted({op.module for op in self.ops})
        where = f"rank {self.rank}, step {self.step}, {self.phase}, in {', '.join(modules[:3])}"
        outcome = {
            "pass": "leaves the values equal",
            "error": f"changes the value: {self.cause}",
            "warning": "a value leaving it carries a difference made before it",
            "undecided": "a value leaving it differs by what it may amplify the differences entering it to",
            "unjudged": "no aligned op reads what it makes, or what it makes cannot be compared",
        }[self.verdict]
        return f"{where}: {'; '.join(by_side)}; {outcome}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "step": self.step,
            "phase": self.phase,
            "sides": self.sides,
            "verdict": self.verdict,
            "cause": self.cause,
            "ops": [op.to_dict() for op in self.ops],
            "entering": self.entering,
            "leaving": self.leaving,
        }


class Cause(NamedTuple):
    """The op of a block that changed the value an aligned input reads."""

    row: Row
    """Its output row (unmatched: only one side runs it)."""
    error: float
    """That output against the partner of the value leaving the block."""
    tolerance: float
    partner: str
    """The other side's record of the value leaving the block."""


def _record(row: Row, side: str) -> Any:
    return row.record_a if side == "a" else row.record_b


def _against(row: Row, side: str, partner: Any, flow: Flow) -> tuple[float, float] | None:
    """The error and tolerance of the one-sided output ``row`` (on ``side``) against ``partner``,
    the other side's value it should equal; ``None`` when they cannot be compared (other element
    counts, no statistics)."""
    record = _record(row, side)
    if record is None or math.prod(record.shape or ()) != math.prod(partner.shape or ()):
        return None
    a, b = (record, partner) if side == "a" else (partner, record)
    tolerance = tolerance_for(a.dtype, b.dtype, flow.tolerances)
    error = stats_metrics(a.stats, b.stats, numel=math.prod(b.shape or ()), atol=tolerance.atol).get("error")
    return (error, tolerance.rtol) if error is not None else None


def cause_in_block(row: Row, flow: Flow) -> Cause | None:
    """The op only one side runs that changed the value the aligned input ``row`` holds.

    Walks back from the op that made ``row``'s value on the side that runs ops the other does not,
    while the op's single input from the block still differs from the value's partner (the other
    side's record of ``row``): the earliest such op changed the value; the ops after it pass the
    change on (views, casts) and an op with several inputs from the block is where the walk stops.
    ``None`` when no side made ``row``'s value with an op only it runs."""
    for side in ("a", "b"):
        made = flow.producer(row, side)
        if made is None or made.matched:
            continue
        partner = row.record_b if side == "a" else row.record_a
        found = _against(made, side, partner, flow)
        if found is None:
            assert row.difference is not None and row.tolerance is not None
            found = (row.difference, row.tolerance)  # the same tensor as ``row``'s: its difference
        cause = Cause(made, found[0], found[1], partner.name)
        for _ in range(_MAX_WALK):
            inner = [
                producer
                for other in flow.calls_one_sided(cause.row, side)
                if other.io not in OUTPUT_IO
                and other.kind == "tensor"
                and (producer := flow.producer(other, side)) is not None
                and not producer.matched
            ]
            if len(inner) != 1:
                break
            earlier = _against(inner[0], side, partner, flow)
            if earlier is None or earlier[0] <= earlier[1]:
                break
            cause = Cause(inner[0], earlier[0], earlier[1], partner.name)
        return cause
    return None


class _Blocks:
    """Union-find over the one-sided calls of a rank, keyed ``(side, step, call name)``."""

    def __init__(self) -> None:
        self.parent: dict[tuple, tuple] = {}

    def find(self, key: tuple) -> tuple:
        parent = self.parent
        root = parent.setdefault(key, key)
        while parent[root] != root:
            root = parent[root]
        while key != root:  # every call on the way points at the root from now on
            parent[key], key = root, parent[key]
        return root

    def union(self, one: tuple, other: tuple) -> None:
        root, other_root = self.find(one), self.find(other)
        if root != other_root:
            self.parent[other_root] = root


def structure_blocks(rows: Sequence[Row], flow: Flow) -> list[StructureBlock]:
    """The structure differences of one rank's judged rows, in execution order; each one-sided row
    gets its block (``Row.block``). Linear in the rows."""
    calls = _Blocks()
    key_of: dict[int, tuple] = {}
    one_sided: list[Row] = []
    last: dict[str, tuple[tuple, tuple] | None] = {"a": None, "b": None}
    """Per side, the one-sided call seen last and its step, phase and module, until an aligned call runs."""
    seen_since = False  # a one-sided call since an aligned one ran: ``last`` to clear
    for row in rows:
        if row.match not in _ONE_SIDED:
            if seen_since and row.record_a is not None and row.record_b is not None:
                last, seen_since = {"a": None, "b": None}, False
        else:
            side = "a" if row.record_a is not None else "b"
            key = key_of[id(row)] = (side, row.step, _record(row, side).call_name)
            one_sided.append(row)
            calls.find(key)
            where = (row.step, row.phase, row.module)
            before = last[side]
            if before is not None and before[1] == where and before[0] != key:
                calls.union(before[0], key)  # one run of calls in a module (a clone a view then reads)
            last[side], seen_since = (key, where), True
    if not key_of:
        return []
    entering: dict[tuple, list[Row]] = {}
    for row in one_sided:
        if row.kind != "tensor" or row.io in OUTPUT_IO:
            continue
        key = key_of[id(row)]
        for index, made in enumerate(flow.producers(row, key[0])):
            if made.phase != row.phase:
                continue  # a backward reading what the forward saved: each phase's ops are their own blocks
            made_key = key_of.get(id(made))
            if made_key is not None:
                calls.union(key, made_key)  # two one-sided calls: one reads what the other made
            elif index == 0:
                entering.setdefault(key, []).append(made)
    leaving = _leaving(rows, flow, key_of)
    first_leaving: dict[int, tuple] = {}
    for key, read in leaving.items():  # both sides' blocks whose values one aligned call reads are one
        for row in read:
            other = first_leaving.setdefault(id(row), key)
            if other != key:
                calls.union(other, key)
    blocks: dict[tuple, StructureBlock] = {}
    seen_calls: set[tuple] = set()
    for row in one_sided:
        key = key_of[id(row)]
        root = calls.find(key)
        block = blocks.get(root)
        if block is None:
            block = blocks[root] = StructureBlock(row.rank, row.step, row.phase)
        row.block = block
        if key not in seen_calls:
            seen_calls.add(key)
            block.ops.append(BlockOp(key[0].upper(), key[2], row.op, row.module, row.source))
    read_by: dict[tuple, tuple[dict[str, None], list[Row]]] = {}
    for key, read in entering.items():
        found = read_by.setdefault(calls.find(key), ({}, []))
        found[0].update(dict.fromkeys(r.name for r in read))
    for key, read in leaving.items():
        read_by.setdefault(calls.find(key), ({}, []))[1].extend(read)
    for root, block in blocks.items():
        names, read = read_by.get(root, ({}, []))
        block.entering = list(names)
        block.leaving = list(dict.fromkeys(r.name for r in read))
        block.ops.sort(key=lambda op: op.side)  # stable: execution order on each side
        _judge_block(block, read, flow)
    return list(blocks.values())


def _leaving(rows: Sequence[Row], flow: Flow, key_of: dict[int, tuple]) -> dict[tuple, list[Row]]:
    """The aligned input rows that read a value a one-sided call made (its key in ``key_of``), by
    that call, in row order. An input's producers are looked up only when one of its candidate
    producers' calls has the name of a one-sided call of its side: most inputs need not be."""
    aligned = [row for row in rows if row.kind == "tensor" and row.io not in OUTPUT_IO and row.match not in _NOT_ALIGNED]
    leaving: dict[tuple, list[Row]] = {}
    for side in ("a", "b"):  # a call's key names its side: each list gets rows of one side, in row order
        names = {call for key_side, _, call in key_of.values() if key_side == side}
        links_of = flow.made[side]
        for row in aligned if names else ():
            links = links_of.get(id(row.record_a if side == "a" else row.record_b))
            if links is None or not any(link[0] in names for link in links):
                continue
            for made in flow.producers(row, side):
                made_key = key_of.get(id(made)) if made.phase == row.phase else None  # phases: blocks of their own
                if made_key is not None:  # a later maker too: an op that passes a value on (a clone)
                    leaving.setdefault(made_key, []).append(row)
    return leaving


_BLOCK_VERDICTS = {"pass": "pass", "undecided": "undecided", "incomparable": "unjudged"}
"""A block's verdict from that of a row reading its value (any other: ``warning``)."""
_WORSE = {"unjudged": 0, "pass": 1, "warning": 2, "undecided": 3, "error": 4}


def _judge_block(block: StructureBlock, leaving: Sequence[Row], flow: Flow) -> None:
    """A block's verdict from the rows that read its values, the worst of: ``error`` when one of them
    blames an op of it (its origin is one of the block's rows), ``undecided`` when one is,
    ``warning`` when one carries another difference, ``pass``, ``unjudged`` (none, or incomparable)."""
    ops = {op.call for op in block.ops}
    for row in leaving:
        judged = flow.carrying.get(row)
        origin = judged.origin if judged is not None else None
        caused = origin is not None and call_name(origin) in ops
        verdict = "error" if caused else _BLOCK_VERDICTS.get(row.verdict, "warning")
        if caused and block.cause is None:
            block.cause = origin
        if _WORSE[verdict] > _WORSE[block.verdict]:
            block.verdict = verdict
