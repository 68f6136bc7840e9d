"""Verdicts and attribution: which rows differ, and which op each difference starts at.

Per row, in execution order:

* ``pass`` when the scale-relative ``error`` is within the pair's dtype tolerance (the less
  precise side's), so a bf16 run is allowed bf16 rounding (with a noise dump, the row's tolerance
  measured from the reference run instead: :mod:`torchdebug.compare._calibration`);
* otherwise the row is **blamed** (``error``) only when its op made the difference: an output whose
  error exceeds ``growth × (largest error among the call's tensor inputs) + tolerance`` (and, for
  ops singular near zero such as ``sqrt``, ``log`` or a division, which blow up the error of
  near-zero elements, the sum of the inputs' largest element-wise relative errors: that error is
  inherited, not made), or an input whose error is more
  than ``growth`` times anything seen upstream (a weight or batch that is already different). The
  inputs of a backward call include the rows of the forward call it differentiates (``fwd``): its
  saved tensors. Rows whose inputs explain their error are **inherited** (``warning``);
* an input slot each side made from different matched rows through ops only one side runs (partial
  sums of gradients added in another order) holds different tensors: it passes, and those rows
  stand for it when the call's outputs are judged;
* a NaN/Inf where the other side has a finite value is blamed where it first appears (no input of
  the call has one) and inherited after;
* rows whose two values cannot be compared are ``incomparable``, never errors
  (:mod:`torchdebug.compare._comparable`): a shape that differs because the runs' inputs do (a data
  input of another shape, data cut to other shapes, sizes that change as the data's do), and a value
  computed from such rows (a micro-batch's loss or weight gradient) that differs. A value that one
  side makes from incomparable rows through ops only it runs (micro-batch gradients summed by
  accumulation) can be compared again: it is judged, and blamed when it differs by more than
  ``growth`` tolerances (summing in another order); and a slot holding one piece of a split DTensor
  whose other pieces are not in the dump (:func:`~torchdebug.compare._shards.one_shard`);
* a value made from constants alone (a call without tensor inputs: ``scalar_tensor``, ``full``) or
  a constant no captured op made that differs only because the runs' dtypes do
  (``torch.finfo(dtype).min`` as an attention bias) passes with attribution ``dtype``; what is
  computed from it inherits that, and never counts as error seen upstream;
* other shapes that differ are errors (with an infinite ``error``: no number measures them); argument
  values that differ, and slots that could not be captured on a side (``record.capture_error``), are
  warnings (argument values of a constant that differ with the dtype pass);
* with rerun (``own_err_a``/``own_err_b`` in an output row's metrics: its error against the op
  rerun in float64 on that side's own inputs; ``kernel_err_a``/``kernel_err_b``: that of the CPU
  kernel re-run on the same inputs in their dtypes), an output beyond tolerance whose own error on
  either side exceeds twice the rounding tolerance of the pair's less precise dtype and the kernel's
  error by one is blamed, whatever its inputs carry; one beyond one tolerance and the kernel's by
  half of one is ``undecided`` (bf16: a 1 % bug looks like a kernel rounding twice);
* an output of a division (``div``, Adam's ``addcdiv``) may amplify its inputs' error by the spread
  of its divisor's magnitudes (``max / min`` from its statistics), so a zero gradient's ``eps`` makes
  Adam's update ``undecided`` with statistics, never blamed.

Each of these is one rule of :data:`torchdebug.compare._rules.RULES`, tried in order; :func:`judge`
walks the calls in execution order, asks each row's rules for a
:class:`~torchdebug.compare._judgement.Judgement` and applies it. The first divergence is the
earliest blamed op row (op records before module records); the first non-finite op is the earliest
row whose NaN/Inf its inputs did not have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from torchdebug.compare._flow import OUTPUT_IO, Flow
from torchdebug.compare._rows import Row
from torchdebug.compare._rules import RULES, Call, slot_of
from torchdebug.compare._structure import StructureBlock, structure_blocks
from torchdebug.compare._tolerances import Tolerance
from torchdebug.compare._value_graph import Producers
from torchdebug.records import MODULE_OP, call_name

__all__ = ["judge", "first_divergence", "first_nonfinite"]

_BY_SLOT = {slot: tuple(rule.judge for rule in RULES if slot in rule.slots) for slot in ("input", "output", "value")}
"""The rules that apply to each kind of slot, in :data:`~torchdebug.compare._rules.RULES`' order."""


def _judge_call(call: Call) -> float:
    """Judge the rows of one op call in order: tensor inputs, argument values, outputs (arguments and
    outputs read the inputs' verdicts). Returns the largest error seen up to and including this call."""
    seen = call.upstream
    for row in sorted(call.rows, key=lambda r: (r.io in OUTPUT_IO, r.kind != "tensor")):
        for rule in _BY_SLOT[slot_of(row)]:
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
        if call.flow.follows or call.changed_selection() is not None:  # what a changed selection makes follows it
            selection = call.follows(row)
            if selection is not None:
                call.flow.follows[row] = selection
        if judgement.upstream is not None and judgement.upstream > seen:
            seen = judgement.upstream
        if judgement.stand_ins:  # different tensors on the two sides: what they were made from counts
            call.stand_in(row, judgement.stand_ins)
    return seen


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
