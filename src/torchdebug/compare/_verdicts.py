"""Verdicts and attribution: which rows differ, and which op each difference starts at.

:func:`judge` walks the calls in execution order and gives each row the
:class:`~torchdebug.compare._judgement.Judgement` of the first rule of
:data:`torchdebug.compare._rules.RULES` that applies: ``pass`` within the pair's tolerance, blamed
(``error``) where the op made the difference, inherited (``warning``) where its inputs explain it,
``incomparable`` where the values cannot be compared. The rules, in order: docs/compare.md,
"Verdict rules, in order". The first divergence is the earliest blamed op row (op records before
module records); the first non-finite op is the earliest row whose NaN/Inf its inputs did not have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from torchdebug.compare._flow import OUTPUT_IO, Flow
from torchdebug.compare._rows import Row
from torchdebug.compare._rules import PLAIN_BEYOND_SKIPS, RULES, Call, plainly_comparable, slot_of, within_tolerance
from torchdebug.compare._structure import StructureBlock, structure_blocks
from torchdebug.compare._tolerances import Tolerance
from torchdebug.compare._value_graph import Producers
from torchdebug.records import MODULE_OP, call_name

__all__ = ["judge", "first_divergence", "first_nonfinite"]

_BY_SLOT = {slot: tuple(rule.judge for rule in RULES if slot in rule.slots) for slot in ("input", "output", "value")}
"""The rules that apply to each kind of slot, in :data:`~torchdebug.compare._rules.RULES`' order."""
_PLAINLY_BEYOND = {
    is_output: tuple(rule.judge for rule in RULES if slot in rule.slots and rule.name not in PLAIN_BEYOND_SKIPS)
    for is_output, slot in ((False, "input"), (True, "output"))
}
"""The rules a plainly comparable tensor slot beyond its tolerance tries, by whether it is an output."""


def _judge_call(call: Call) -> float:
    """Judge the rows of one op call in order: tensor inputs, argument values, outputs (arguments and
    outputs read the inputs' verdicts). Returns the largest error seen up to and including this call."""
    seen = call.upstream
    selects = call.changed_selection() is not None  # from dtypes and differences: the same before and after judging
    for row in sorted(call.rows, key=lambda r: (r.io in OUTPUT_IO, r.kind != "tensor")):
        if row.kind == "tensor" and plainly_comparable(row):
            judgement = within_tolerance(row, call)  # beyond it, the rules that can answer such a slot
            if judgement is not None:  # most rows: a pass that carries, blames and stands in for nothing
                judgement.apply(row)
                if selects or call.flow.follows:
                    _follow_selection(row, call)
                upstream = judgement.upstream
                if upstream is not None and upstream > seen:
                    seen = upstream
                continue
            rules = _PLAINLY_BEYOND[row.io in OUTPUT_IO]
        else:
            judgement, rules = None, _BY_SLOT[slot_of(row)]
        if judgement is None:
            for rule in rules:
                judgement = rule(row, call)
                if judgement is not None:
                    break
            else:
                raise AssertionError(f"no verdict rule judged {row.name}")  # the last rule of each slot kind always answers
        judgement.apply(row)
        call.flow.record(row, judgement)
        for other, judged in judgement.blames:
            judged.apply(other)
            call.flow.record(other, judged)
        if selects or call.flow.follows:
            _follow_selection(row, call)
        upstream = judgement.upstream
        if upstream is not None and upstream > seen:
            seen = upstream
        if judgement.stand_ins:  # different tensors on the two sides: what they were made from counts
            call.stand_in(row, judgement.stand_ins)
    return seen


def _follow_selection(row: Row, call: Call) -> None:
    """Note the changed selection ``row`` was computed from, if any (what it makes follows it); asked
    where the call changed a selection or one changed before."""
    selection = call.follows(row)
    if selection is not None:
        call.flow.follows[row] = selection


def judge(
    rows: Sequence[Row],
    *,
    growth: float = 16.0,
    rerun: bool = False,
    split: Fraction | None = None,
    made: Producers | None = None,
    tolerances: Mapping[str, Tolerance] | None = None,
) -> list[StructureBlock]:
    """Set verdict, attribution and message of one rank's rows (sorted in execution order); judging
    again starts afresh. ``rerun``: the calls that rerun could decide were rerun, so a row
    with saved tensors and no own error is judged by statistics alone (else it is ``undecided``,
    for rerun to decide). ``split``: A's world size over B's, when they differ (each rank holds
    its share of the data). ``made``: the producers matching found for the rows' records (else
    traced again from the rows); ``tolerances``: the compare's per-dtype overrides. Returns the
    structure differences (:mod:`torchdebug.compare._structure`), each linked from its rows."""
    flow = Flow(rows, split, made, tolerances)
    calls: dict[tuple[int, str], list[Row]] = {}
    current: list[Row] = []
    step, name = None, ""
    for row in rows:
        cut = row.name.rfind("/")
        if cut != len(name) or row.step != step or not row.name.startswith(name):  # a call's rows mostly follow each other
            step, name = row.step, call_name(row.name)
            current = calls.setdefault((step, name), [])
        current.append(row)
    upstream = 0.0
    for (step, _), call_rows in calls.items():
        first = call_rows[0].record_a or call_rows[0].record_b
        saved = calls.get((step, first.fwd), []) if first is not None and first.fwd else []
        tensors = [r for r in call_rows if r.io not in OUTPUT_IO and r.kind == "tensor"]
        inputs = [r for r in tensors if r.matched] + [r for r in saved if r.kind == "tensor" and r.matched]
        constant = not tensors  # made from arguments alone
        forward = saved
        if first is not None and not first.fwd and first.op == MODULE_OP and first.phase == "backward":
            forward = calls.get((step, f"forward/{first.module}/{MODULE_OP}#{first.call}"), [])  # no link: same call index
        call = Call(call_rows, inputs, upstream, flow, growth, rerun, constant, forward)
        upstream = _judge_call(call)
    return structure_blocks(rows, flow)


def first_divergence(rows: Sequence[Row]) -> Row | None:
    """The earliest blamed row, preferring op records over module records."""
    blamed = [r for r in rows if r.attribution == "blamed"]
    ops = [r for r in blamed if r.op != MODULE_OP]
    return (ops or blamed or [None])[0]


def first_nonfinite(rows: Sequence[Row]) -> Row | None:
    """The earliest row holding a NaN/Inf its counterpart lacks, where its inputs had none."""
    for row in rows:
        if row.metrics.get("nonfinite_mismatch") and row.attribution == "blamed":
            return row
    return None
