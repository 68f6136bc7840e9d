"""The verdict rules of a tolerance compare, in the order they are tried.

Each rule is a function ``rule(row, call) -> Judgement | None``: it judges the row (a
:class:`~torchdebug.compare._judgement.Judgement`) or passes it on to the next rule. :data:`RULES`
lists them in order with the slots each applies to (``input`` and ``output``: tensor slots;
``value``: argument values and other non-tensor slots); the first rule that answers decides.
``docs/compare.md`` lists the same rules, in the same order, with the first line of each
docstring (``tests/compare/test_verdict_rules.py`` checks it). A new rule is one function here, one
entry in :data:`RULES` and one unit test there.

The rows of a call are judged tensor inputs first, then argument values, then outputs, so the rules
of arguments and outputs read the verdicts of the call's inputs (:class:`Call`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal, NamedTuple

from torchdebug.compare._bounds import amplification, extremes_not_finite, is_singular, moves_values, own_error, spread
from torchdebug.compare._comparable import dtype_argument, dtype_constants
from torchdebug.compare._flow import OUTPUT_IO, Flow
from torchdebug.compare._judgement import Judgement
from torchdebug.compare._metrics import ELEMENTS_DIFFER, stats_metrics
from torchdebug.compare._rows import Row
from torchdebug.compare._shards import local_indices, one_shard
from torchdebug.compare._structure import _against, cause_in_block
from torchdebug.compare._tolerances import tolerance_for
from torchdebug.records import COLLECTIVES, UNREAD, Record

__all__ = [
    "Call",
    "Rule",
    "RULES",
    "ROUTING_CHANGED",
    "PLAIN_BEYOND_SKIPS",
    "PLAIN_PASS_SKIPS",
    "plainly_comparable",
    "slot_of",
    "within_tolerance",
]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_CARRIED = 2.0
"""How many times the error of the tensor its producer made an input may carry (plus the pair's
tolerance for a cast on the way): the same tensor cannot differ more unless an op changed it."""
_LISTED = 3
"""How many ops only one side runs a message names."""
_WALK = 8
"""How many ops only one side runs are walked back to find the one that changed a merged value."""
_SELECTIONS = frozenset(
    {
        *("topk", "sort", "argsort", "argmax", "argmin", "max", "min", "kthvalue", "mode", "median", "nanmedian"),
        *("nonzero", "nonzero_static", "argwhere", "searchsorted", "bucketize", "isin"),
        *("gt", "lt", "ge", "le", "eq", "ne", "greater", "less", "greater_equal", "less_equal", "equal", "not_equal"),
        *("unique", "_unique", "_unique2", "unique_dim", "unique_consecutive"),
    }
)
"""Ops that choose: their integer or bool results (indices, masks, counts) are decisions taken on
their inputs' values. ``max``/``min`` count with ``dim`` only, where they return indices."""
_INTEGRAL = ("int", "uint", "bool")
ROUTING_CHANGED = "the routing changed here"
"""How the message of a selection whose result differs on inputs that agree starts."""


class _Trace(NamedTuple):
    """Where an input's tensor came from on the sides it could be traced on."""

    made: list[list[Row]]
    """Per traced side, the matched rows it was made from."""
    sources: list[Row]
    """Those rows, both sides' together."""
    one_sided: list[str]
    """The ops only one side runs on the way, sorted."""
    unlike: list[Row]
    """The sources whose two values cannot be compared."""
    sided: int
    """On how many sides the way from the sources runs through ops only that side runs."""

    def listed(self) -> str:
        """The first :data:`_LISTED` ops only one side runs on the way, and how many more."""
        more = len(self.one_sided) - _LISTED
        return ", ".join(self.one_sided[:_LISTED]) + (f" and {more} more" if more > 0 else "")


@dataclass(slots=True)
class Call:
    """One op call being judged: what its rules read besides the row."""

    rows: Sequence[Row]
    inputs: list[Row]
    """Its matched tensor inputs and the rows of the forward call a backward call differentiates
    (its saved tensors); rows that stand for an input made differently replace it."""
    upstream: float
    """The largest error seen before this call."""
    flow: Flow
    growth: float
    rerun: bool
    """The calls that rerun could decide were rerun (else a row with saved tensors and no own
    error is left ``undecided``, for rerun to decide)."""
    constant: bool = False
    """The call has no tensor input: it makes its outputs from argument values alone."""
    forward: Sequence[Row] = ()
    """The rows of the forward call a backward call differentiates (also among :attr:`inputs` for op
    calls; module records of a backward have no link, so the forward call of the same module and
    call index)."""
    _traced: Row | None = None
    _trace: _Trace | None = None
    _input_error: float | None = None
    _selection: Row | None | Literal[False] = False
    """The changed selection of this call (``False``: not looked for yet)."""

    def trace(self, row: Row) -> _Trace | None:
        """Where ``row``'s tensor came from (``None`` when no side can be traced); the input rules
        ask in turn about one row, so the last answer is kept."""
        if row is not self._traced:
            traced = [found for side in ("a", "b") if (found := self.flow.sources(row, side)) is not None]
            sources = [source for made, _ in traced for source in made]
            self._traced, self._trace = row, None
            if traced:
                one_sided = sorted({op for _, via in traced for op in via})
                unlike = [source for source in sources if source.verdict == "incomparable"]
                sided = sum(1 for _, via in traced if via)
                self._trace = _Trace([made for made, _ in traced], sources, one_sided, unlike, sided)
        return self._trace

    def input_error(self) -> float:
        """The largest error among the call's tensor inputs."""
        if self._input_error is None:
            self._input_error = max((r.difference or 0.0 for r in self.inputs), default=0.0)
        return self._input_error

    def stand_in(self, row: Row, stand_ins: Sequence[Row]) -> None:
        """Judge the outputs against ``stand_ins`` instead of the input ``row``."""
        self.inputs = [r for r in self.inputs if r is not row] + list(stand_ins)
        self._input_error = None

    def incomparable_input(self) -> Row | None:
        """The first input whose two values cannot be compared."""
        return next((r for r in self.inputs if r.verdict == "incomparable"), None)

    def changed_selection(self) -> Row | None:
        """The first integer or bool output that differs of a selection (:data:`_SELECTIONS`) on
        matched tensor inputs, a floating one among them: the op chose differently."""
        if self._selection is not False:
            return self._selection
        selection = None
        if _selection(self.rows[0].op):
            inputs = [r for r in self.rows if r.kind == "tensor" and r.io not in OUTPUT_IO]
            floating = any(not _integral(r.dtype_a) and not _integral(r.dtype_b) for r in inputs)
            if inputs and floating and all(r.matched for r in inputs):
                outputs = (r for r in self.rows if r.kind == "tensor" and r.io in OUTPUT_IO and r.matched)
                selection = next((r for r in outputs if _integral(r.dtype_a) and _differs(r)), None)
        self._selection = selection
        return selection

    def changed_decision(self) -> Row | None:
        """The :meth:`changed_selection` of a call whose tensor inputs all pass, none computed from a
        selection that changed before: the op chose differently on inputs that agree (within
        tolerance, or by the round-off the runs' dtypes explain). Asked once the inputs are judged."""
        selection = self.changed_selection()
        if selection is None or self.flow.decision(self.inputs) is not None:
            return None
        inputs = (r for r in self.rows if r.kind == "tensor" and r.io not in OUTPUT_IO)
        return selection if all(r.verdict == "pass" for r in inputs) else None

    def follows(self, row: Row) -> Row | None:
        """The changed selection ``row``'s value was computed from (through the data flow, or as an
        output of its call), if any."""
        if row.kind != "tensor":
            return self.flow.decision(self.inputs)
        if row.io in OUTPUT_IO:
            return self.changed_selection() or self.flow.decision(self.inputs)
        trace = self.trace(row)
        return self.flow.decision(trace.sources) if trace is not None else None


def _fmt(value: float) -> str:
    return f"{value:.3g}"


@cache  # asked once per call judged, of a few dozen ops
def _selection(op: str) -> bool:
    """Whether ``op`` (``aten.topk.default``, ``Functional.argmax``, ``Tensor.__gt__``) chooses."""
    parts = op.split(".")
    return (parts[1] if len(parts) > 1 else parts[0]).strip("_") in _SELECTIONS


def _integral(dtype: str | None) -> bool:
    return (dtype or "").removeprefix("torch.").startswith(_INTEGRAL)


def _differs(row: Row) -> bool:
    """The two values differ: in shape, beyond tolerance, or in their NaN/Inf."""
    if row.shape_a != row.shape_b or row.metrics.get("nonfinite_mismatch"):
        return True
    return row.difference is not None and row.tolerance is not None and row.difference > row.tolerance


def _how_many_differ(row: Row) -> str:
    """How many elements of a changed selection differ: counted with tensors, bounded with statistics."""
    if row.shape_a != row.shape_b:
        return f"it selects {row.shape_a} where the other side selects {row.shape_b}"
    total = math.prod(row.shape_b or ())
    counted = row.metrics.get(ELEMENTS_DIFFER)
    if counted is not None:
        return f"{int(counted)} of {total} elements differ"
    a, b = row.record_a, row.record_b
    mean_a, mean_b = (a.stats or {}).get("mean") if a else None, (b.stats or {}).get("mean") if b else None
    least = 1
    if (row.dtype_b or "").endswith("bool") and isinstance(mean_a, (int, float)) and isinstance(mean_b, (int, float)):
        least = max(1, round(abs(mean_a - mean_b) * total))  # the number of True elements changed by that much
    seen = (
        f" (mean {mean_a:.4g} vs {mean_b:.4g})" if isinstance(mean_a, (int, float)) and isinstance(mean_b, (int, float)) else ""
    )
    return f'its statistics differ{seen}: at least {least} of {total} elements differ (a tensor dump, task="tensor", counts them)'


def _beyond(row: Row) -> tuple[float, float]:
    """A row judged beyond tolerance: its error and tolerance, both known by then."""
    assert row.difference is not None and row.tolerance is not None
    return row.difference, row.tolerance


def _detail(row: Row) -> str:
    error, tolerance = _beyond(row)
    return f"difference {_fmt(error)} > tolerance {_fmt(tolerance)}"


def _blamed(row: Row, message: str) -> Judgement:
    """The row makes the difference: its error counts upstream."""
    return Judgement("error", "blamed", message, origin=row.name, upstream=row.difference)


def _blamed_unmeasured(row: Row, message: str, error: float | None) -> Judgement:
    """The row makes a difference no finite error measures (a shape, a NaN), so every later error is
    upstream of it; ``error`` replaces the row's when given."""
    return Judgement("error", "blamed", message, difference=error, origin=row.name, upstream=math.inf)


def _inherited(row: Row, call: Call, sources: Sequence[Row], detail: str) -> Judgement:
    """An error ``sources`` explain: ``pass`` when they carry rounding drift only, ``warning`` when
    they carry the error of a blamed op (named in the message)."""
    origin, constant = call.flow.carried(sources)
    if origin:
        detail += f"; carries the difference blamed on {origin}"
    elif constant:
        detail += f"; carries the constant made for the dtype at {constant}"
    verdict = "warning" if origin else "pass"
    upstream = row.difference if constant is None else None
    return Judgement(verdict, "inherited", detail, None, origin, constant, upstream)  # by position: many rows


def _undecided(row: Row, call: Call, message: str) -> Judgement:
    """Beyond tolerance, and what the records hold cannot tell whether the op made the difference:
    never blamed, and what follows inherits only what its inputs carry."""
    origin, constant = call.flow.carried(call.inputs)
    upstream = row.difference if constant is None else None
    return Judgement("undecided", "undecided", message, origin=origin, constant=constant, upstream=upstream)


def _incomparable(row: Row, why: str) -> Judgement:
    """The two values cannot be compared (see :mod:`torchdebug.compare._comparable`)."""
    shapes = f" ({row.shape_a} vs {row.shape_b})" if row.shape_a != row.shape_b else ""
    return Judgement("incomparable", "", f"not comparable{shapes}: {why}")


def _dtype_constant(row: Row, what: str, why: str) -> Judgement:
    """A constant made for the dtype, which differs because the runs' dtypes do: it passes."""
    message = f"{_detail(row)}: {what} ({why}); it differs because the runs' dtypes differ, by design"
    return Judgement("pass", "dtype", message, constant=row.name)


def _same_value(a: object, b: object) -> bool:
    """Equal argument values, ignoring memory addresses in object reprs."""
    if isinstance(a, str) and isinstance(b, str):
        return a == b or _ADDRESS.sub("", a) == _ADDRESS.sub("", b)  # most are equal: no pattern to search
    return a == b


def _values(row: Row) -> tuple[object, object]:
    return (row.record_a.value if row.record_a else None), (row.record_b.value if row.record_b else None)


# --- every slot -----------------------------------------------------------------------------------


def unmatched(row: Row, call: Call) -> Judgement | None:
    """A slot on one side only is listed, never judged.

    Unless a later value blamed it already (:func:`changed_by_one_sided_op`: an op only one side
    runs changed a value; a compiled node filed inside an eager op that comes later is judged after
    the value it changed): that blame stands."""
    if row.record_a is not None and row.record_b is not None:
        return None
    kept = call.flow.carrying.get(row)
    if kept is not None and kept.attribution == "blamed":
        return kept
    if row.record_b is None:
        return Judgement("unmatched", "", "only in A")
    if row.record_a is None:
        return Judgement("unmatched", "", "only in B")
    return None


def not_captured(row: Row, call: Call) -> Judgement | None:
    """A slot that could not be captured on a side is a warning naming the side and why."""
    a, b = row.record_a, row.record_b
    if not (a and a.capture_error or b and b.capture_error):
        return None  # most slots: no list built
    failed = [f"{side}: {r.capture_error}" for side, r in (("A", a), ("B", b)) if r and r.capture_error]
    return Judgement("warning", "", "not captured on " + "; ".join(failed))


# --- tensor slots ---------------------------------------------------------------------------------


def one_piece(row: Row, call: Call) -> Judgement | None:
    """One piece of a split DTensor whose other pieces are not in the dump cannot be compared."""
    a, b = row.record_a, row.record_b
    if not (a and a.extra or b and b.extra):
        return None  # most slots: nothing in extra, so no piece (one_shard reads it there)
    piece = one_shard(row)
    return _incomparable(row, piece) if piece is not None else None


def _shape_reason(row: Row, call: Call) -> str | None:
    """Why ``row``'s shapes differ because the runs' inputs do (``None``: for another reason)."""
    if row.io in OUTPUT_IO:
        if any(r.verdict == "error" and r.shape_a != r.shape_b for r in call.inputs):
            return None  # an input of another shape for another reason (a wider layer): that is reported
        unlike = call.incomparable_input()
        if unlike is not None:
            return f"computed from values that cannot be compared ({unlike.name})"
    else:
        for side in ("a", "b"):
            found = call.flow.sources(row, side)
            unlike = next((r for r in found[0] if r.verdict == "incomparable"), None) if found else None
            if unlike is not None:
                return f"holds a value that cannot be compared ({unlike.name})"
    return call.flow.shapes.origin(row) or call.flow.shapes.follows_data(row)


def shape_follows_inputs(row: Row, call: Call) -> Judgement | None:
    """A shape that differs because the runs' inputs do (data, world size) cannot be compared."""
    if row.shape_a == row.shape_b:
        return None
    why = _shape_reason(row, call)
    return _incomparable(row, why) if why is not None else None


def decision_changed(row: Row, call: Call) -> Judgement | None:
    """A selection (topk, argmax, a mask) whose integer result differs on inputs that agree is blamed: the routing changed here.

    Its inputs pass (within tolerance, or by round-off the dtypes explain), so no input is the
    cause: the op chose differently (a near tie broken the other way in bf16); its other outputs that
    differ (``topk``'s values) follow from the choice. A selection that changed on inputs that differ
    is inherited from them, however small their difference. With statistics only,
    a selection whose changed elements keep its min, max, mean and norm (two tokens that swap
    experts) is not seen; tensors or checksums see it."""
    decision = call.changed_decision()
    selection = call.changed_selection() if decision is None else None
    if row is selection and call.incomparable_input() is None and call.flow.decision(call.inputs) is None:
        why = "a selection on inputs that differ chooses differently"  # however small the difference
        return _inherited(row, call, call.inputs, f"{_detail(row) if row.shape_a == row.shape_b else 'shape differs'}; {why}")
    if decision is None or not _differs(row):
        return None
    if row is not decision:  # topk's values, made with the changed indices
        message = (
            f"{_detail(row) if row.shape_a == row.shape_b else 'shape differs'}; follows the routing changed at {decision.name}"
        )
        return Judgement("warning", "inherited", message, origin=decision.name, upstream=math.inf)
    inputs = "its inputs agree (within tolerance, or by the round-off the runs' dtypes explain)"
    message = f"{ROUTING_CHANGED}: {_how_many_differ(row)}; {inputs}: this op chose differently"
    error = math.inf if row.shape_a != row.shape_b else None
    return Judgement("error", "blamed", message, difference=error, origin=row.name, upstream=math.inf)


def follows_changed_decision(row: Row, call: Call) -> Judgement | None:
    """A value that differs, computed from a changed selection, is inherited from it, whatever its shape.

    After the routing changed, other tokens reach other experts: shapes, values and the sizes passed
    to views differ by construction, and none of it is a second cause. A selection that changed
    because its inputs carry a blamed difference passes that blame on."""
    if not call.flow.follows:
        return None
    if row.kind == "tensor":
        if not _differs(row):
            return None
        what = f"shape {row.shape_a} vs {row.shape_b}" if row.shape_a != row.shape_b else "it differs"
        if row.shape_a == row.shape_b and row.difference is not None and row.tolerance is not None:
            what = _detail(row)
        selection = call.flow.decision(call.inputs) if row.io in OUTPUT_IO else call.follows(row)
    else:
        a, b = _values(row)
        if _same_value(a, b):
            return None
        what = f"argument value differs: {a!r} vs {b!r}"
        selection = call.follows(row)
    if selection is None:
        return None
    judged = call.flow.carrying.get(selection)
    origin = judged.origin if judged is not None and judged.origin is not None else selection.name
    carries = f", which carries the difference blamed on {origin}" if origin != selection.name else ""
    message = f"{what}; follows the routing changed at {selection.name}{carries}"
    return Judgement("warning", "inherited", message, origin=origin, upstream=math.inf)


def other_shape(row: Row, call: Call) -> Judgement | None:
    """Any other shape that differs is blamed, with an infinite error."""
    if row.shape_a == row.shape_b:
        return None
    return _blamed_unmeasured(row, f"shape differs: {row.shape_a} vs {row.shape_b}", math.inf)


def computed_from_incomparable(row: Row, call: Call) -> Judgement | None:
    """An output that differs, computed from inputs that cannot be compared, cannot be compared."""
    beyond = row.difference is not None and row.tolerance is not None and row.difference > row.tolerance
    if not (beyond or row.metrics.get("nonfinite_mismatch")):
        return None
    unlike = call.incomparable_input()
    return _incomparable(row, f"computed from values that cannot be compared ({unlike.name})") if unlike else None


def _nonfinite_inherited(row: Row, call: Call) -> bool:
    if row.io in OUTPUT_IO:
        return any(r.metrics.get("nonfinite_mismatch") for r in call.inputs)
    return call.upstream == math.inf


def nonfinite_inherited(row: Row, call: Call) -> Judgement | None:
    """A NaN/Inf where the other side is finite, which its inputs (or upstream) had, is inherited."""
    if not row.metrics.get("nonfinite_mismatch") or not _nonfinite_inherited(row, call):
        return None
    origin, constant = call.flow.carried(call.inputs)
    message = "NaN/Inf where the other side is finite (inputs had it)"
    return Judgement("warning", "inherited", message, origin=origin, constant=constant, upstream=math.inf)


def nonfinite_origin(row: Row, call: Call) -> Judgement | None:
    """A NaN/Inf where the other side is finite that no input had is blamed where it first appears."""
    if not row.metrics.get("nonfinite_mismatch"):
        return None
    no_number = math.inf if row.difference is None else None  # statistics without a finite number to compare
    return _blamed_unmeasured(row, "NaN/Inf where the other side is finite", no_number)


def no_statistics(row: Row, call: Call) -> Judgement | None:
    """A slot without an error to judge (no statistics on a side) passes and says so."""
    if row.difference is None or row.tolerance is None:
        sides = (("A", row.record_a), ("B", row.record_b))
        unread = "; ".join(f"{side}: {r.extra[UNREAD]}" for side, r in sides if r is not None and UNREAD in r.extra)
        return Judgement("pass", "", "no statistics to compare" + (f" (not read on {unread})" if unread else ""))
    return None


def within_tolerance(row: Row, call: Call) -> Judgement | None:
    """An error within the pair's tolerance (its less precise dtype's) passes."""
    error, tolerance = _beyond(row)
    return Judgement("pass", "", "", None, None, None, error) if error <= tolerance else None  # by position: most rows


PLAIN_PASS_SKIPS = (
    *("unmatched", "not_captured", "one_piece", "decision_changed", "follows_changed_decision", "shape_follows_inputs"),
    *("other_shape", "computed_from_incomparable", "nonfinite_inherited", "nonfinite_origin", "no_statistics"),
)
"""The rules before :func:`within_tolerance` that cannot answer for a :func:`plainly_comparable` slot
within its tolerance (``tests/compare/test_verdict_rules.py`` checks that they are all the tensor
rules before it)."""

PLAIN_BEYOND_SKIPS = (
    *("unmatched", "not_captured", "one_piece", "shape_follows_inputs", "other_shape", "nonfinite_inherited"),
    *("nonfinite_origin", "no_statistics", "within_tolerance", "replicate_partitioned", "sharded_embedding_indices"),
)
"""The tensor rules that cannot answer for a :func:`plainly_comparable` slot beyond its tolerance: each
first asks for what that rules out (a side missing or not captured, something in ``extra``, other
shapes, NaN/Inf on one side only, no difference) or for a difference within tolerance. The other
rules are tried in order (a test checks on such slots that these answer nothing)."""


def plainly_comparable(row: Row) -> bool:
    """Whether a tensor slot is judged without most rules: both sides captured, neither a DTensor
    piece (nothing in ``extra``), equal shapes, no NaN/Inf on one side only, a difference and a
    tolerance. Within its tolerance :func:`within_tolerance` judges it without the rules before it
    (:data:`PLAIN_PASS_SKIPS`); beyond it, the rules of :data:`PLAIN_BEYOND_SKIPS` are not tried.
    Most rows are such: judging one takes two calls instead of twelve."""
    a, b = row.record_a, row.record_b
    return (
        a is not None
        and b is not None
        and row.difference is not None
        and row.tolerance is not None
        and not (a.capture_error or b.capture_error or a.extra or b.extra)
        and row.shape_a == row.shape_b
        and not row.metrics.get("nonfinite_mismatch")
    )


def replicate_partitioned(row: Row, call: Call) -> Judgement | None:
    """A replicated DTensor against a plain value that is it divided by a mesh size passes.

    A DTensor op with a partial output (``RowwiseParallel``'s linear) splits a replicated input
    (its bias) so, inside the op where eager capture does not see it; a compiled graph computes on
    local tensors and shows that division (a ``div`` node feeding the linear)."""
    a, b = row.record_a, row.record_b
    if a is None or b is None or not (a.extra or b.extra):
        return None  # most rows: no DTensor on either side
    for whole, part in ((a, b), (b, a)):
        extra = whole.extra
        if not extra or extra.get("subclass") != "DTensor" or part.extra.get("subclass") or not whole.stats or not part.stats:
            continue
        placements, mesh = extra.get("placements") or (), extra.get("mesh") or ()
        if not placements or any(placement != "R" for placement in placements):
            continue
        for size in sorted({*mesh, math.prod(mesh)} - {0, 1}):
            split = {key: whole.stats[key] / size for key in ("min", "max", "mean", "norm") if whole.stats.get(key) is not None}
            error = stats_metrics(split, part.stats, numel=math.prod(part.shape or ()), atol=0.0).get("error")
            if error is not None and row.tolerance is not None and error <= row.tolerance:
                side = "B" if part is b else "A"
                message = (
                    f"{side} holds the replicated value divided by the mesh size {size}: a DTensor op with a partial "
                    "output splits a replicated input so, and a compiled graph shows that division"
                )
                return Judgement("pass", "", message, error, None, None, error)
    return None


def sharded_embedding_indices(row: Row, call: Call) -> Judgement | None:
    """The indices of a vocabulary-sharded DTensor embedding against plain ones cannot be compared.

    ``RowwiseParallel`` on an embedding makes the DTensor op shift the global indices to each
    rank's rows, where eager capture does not see it; a compiled graph computes on local tensors and
    holds the local indices (:func:`~torchdebug.compare._shards.local_indices`). The embedding's
    outputs, the same on both sides, are compared."""
    a, b = row.record_a, row.record_b
    if a is None or b is None or not (a.extra or b.extra):
        return None
    for whole, part in ((a, b), (b, a)):
        if local_indices(whole, part):
            side = "B" if part is b else "A"
            why = f"{side} holds the local indices of a vocabulary-sharded embedding, the other side the global ones"
            return _incomparable(row, why)
    return None


# --- outputs beyond tolerance ---------------------------------------------------------------------


def constant_from_arguments(row: Row, call: Call) -> Judgement | None:
    """An output made from argument values alone that differs only with the runs' dtypes passes (attribution dtype)."""
    if not call.constant:
        return None
    constants = dtype_constants(row) or _dtype_arguments(call.rows)
    return _dtype_constant(row, "a constant made from arguments alone", constants) if constants is not None else None


def _dtype_arguments(rows: Sequence[Row]) -> str | None:
    """What differs among a call's argument values, when some differ and all of those only with the
    runs' dtypes (``None`` otherwise)."""
    found = []
    for row in rows:
        if row.kind == "tensor" or row.io in OUTPUT_IO or row.record_a is None or row.record_b is None:
            continue
        a, b = row.record_a.value, row.record_b.value
        if not _same_value(a, b):
            why = dtype_argument(a, b)
            if why is None:
                return None
            found.append(why)
    return "; ".join(found) or None


def called_differently(row: Row, call: Call) -> Judgement | None:
    """A rerun output its inputs do not explain, in a call whose argument values differ, is blamed."""
    error, tolerance = _beyond(row)
    if error <= call.growth * call.input_error() + tolerance:
        return None
    changed = [r for r in call.rows if r.kind != "tensor" and r.io not in OUTPUT_IO and r.verdict == "warning"]
    own = own_error(row) if changed else None
    if own is None or own[0] == "blamed":
        return None
    return _blamed(row, f"{own[1]}, but its {changed[0].message}: the op was called differently")


def rerun_own_error(row: Row, call: Call) -> Judgement | None:
    """A rerun output is judged by its own error against float64: blamed, undecided or inherited."""
    own = own_error(row)
    if own is None:
        return None
    verdict, why = own
    if verdict == "blamed":
        return _blamed(row, why)
    if verdict == "undecided":
        return _undecided(row, call, f"{_detail(row)}; {why}")
    return _inherited(row, call, call.inputs, f"{_detail(row)}; {why}")


def _awaits_rerun(row: Row, call: Call) -> bool:
    """Both sides saved the tensors (rerun can measure the op's own error) and it was not rerun."""
    return "cosine" in row.metrics and not call.rerun


def _explained(row: Row, call: Call) -> Judgement:
    return _inherited(row, call, call.inputs, f"{_detail(row)}, explained by its inputs (difference {_fmt(call.input_error())})")


def explained_by_inputs(row: Row, call: Call) -> Judgement | None:
    """An output within growth times its inputs' error plus the tolerance is inherited."""
    error, tolerance = _beyond(row)
    if _awaits_rerun(row, call) or error > call.growth * call.input_error() + tolerance:
        return None
    return _explained(row, call)


def moves_its_input(row: Row, call: Call) -> Judgement | None:
    """An output of an op that only moves its input's elements (a view, a split), called alike, inherits its differing input's.

    Statistics of a part (one of a split's outputs, a slice) may differ more than those of the whole
    its input's difference is measured on, but such an op cannot change an element: where its input
    differs beyond tolerance, that is where the part's difference comes from. Its argument values
    must agree (a wrong offset is a difference of its own), and an input within rounding explains
    nothing (a summand against the whole it is part of moves through views unchanged)."""
    a, b = row.record_a, row.record_b
    if a is None or b is None or a.op != b.op or not moves_values(a.op):
        return None
    if not any(r.difference is not None and r.tolerance is not None and r.difference > r.tolerance for r in call.inputs):
        return None
    if any(r.verdict != "pass" for r in call.rows if r.kind != "tensor" and r.io not in OUTPUT_IO):
        return None
    detail = f"{_detail(row)}; {a.op} only moves the elements of its input, which differs by {_fmt(call.input_error())}"
    return _inherited(row, call, call.inputs, detail)


def singular_near_zero(row: Row, call: Call) -> Judgement | None:
    """An op singular near zero (sqrt, log, a division, a norm's rstd) within its inputs' summed relative spread is inherited."""
    if _awaits_rerun(row, call) or not is_singular(row.op, row.arg):
        return None
    error, _ = _beyond(row)
    return _explained(row, call) if error <= sum(spread(r) for r in call.inputs) else None


def _amplified(row: Row, call: Call, factor: float) -> Judgement:
    how = "it could not be rerun" if "cosine" in row.metrics else 'a tensor dump (task="tensor") would decide it'
    if math.isinf(factor) and extremes_not_finite(row.record_b):
        why = "its difference is measured against its finite extreme alone (its Inf or NaN elements hide its scale)"
    else:
        why = f"{row.op} may amplify that up to {_fmt(max(factor, call.growth))}x"
    return _undecided(
        row,
        call,
        f"{_detail(row)}; its inputs differ by {_fmt(call.input_error())} and {why}: statistics cannot tell whether it"
        f" made the difference; {how}",
    )


def awaits_rerun(row: Row, call: Call) -> Judgement | None:
    """An output with saved tensors that rerun has not decided yet is undecided."""
    return _amplified(row, call, amplification(row, call.inputs)) if _awaits_rerun(row, call) else None


def may_amplify(row: Row, call: Call) -> Judgement | None:
    """An output within what the op may amplify its inputs' error to (from statistics) is undecided."""
    error, tolerance = _beyond(row)
    input_error, factor = call.input_error(), amplification(row, call.inputs)
    return _amplified(row, call, factor) if input_error > 0 and error <= factor * input_error + tolerance else None


def made_here(row: Row, call: Call) -> Judgement | None:
    """Any other output beyond tolerance is blamed: this op makes the difference.

    Where none of the call's own floating tensor inputs has a partner in the other dump (an eager op
    outside the compiled graphs, or one whose compiled form holds its inputs inside, paired by the
    value it made: a masked fill's backward, whose gradient inductor reads in a ``where``, with only
    its mask compared), nothing says that they agree: within growth times the error seen upstream
    the output is inherited, as an input no captured op made is (:func:`upstream_differs`); else the
    difference is first seen here."""
    own = [r for r in call.rows if r.kind == "tensor" and r.io not in OUTPUT_IO]
    values = [r for r in own if not _integral(r.dtype_a or r.dtype_b)] or own  # a mask's or indices' agreement
    if values and not any(r.matched for r in values):  # says nothing of the values the output was made of
        unseen = f"{_detail(row)}; its inputs were not compared (none has a partner in the other dump)"
        error, _ = _beyond(row)
        if error <= call.growth * call.upstream:
            return _inherited(row, call, (), f"{unseen}; upstream ops already differ")
        return _blamed(row, f"{unseen}: the difference is first seen here")
    message = f"{_detail(row)}; its inputs differ by only {_fmt(call.input_error())}: this op makes the difference"
    return _blamed(row, message)


# --- inputs beyond tolerance ----------------------------------------------------------------------


def gradient_of_incomparable(row: Row, call: Call) -> Judgement | None:
    """A gradient a backward call reads for a forward value that cannot be compared cannot be compared.

    A micro-batch's loss against the whole batch's: ``(loss / 4).backward()`` starts from 0.25
    where the one batch starts from 1, and a gradient with respect to a value of another meaning
    is another quantity. The gradients summed over the micro-batches, which the optimizer reads,
    are judged again."""
    if row.phase != "backward" or row.kind != "tensor":
        return None
    unlike = next((r for r in call.forward if r.io in OUTPUT_IO and r.verdict == "incomparable"), None)
    if unlike is None:
        return None
    return _incomparable(row, f"a gradient with respect to a value that cannot be compared ({unlike.name})")


def constant_no_op_made(row: Row, call: Call) -> Judgement | None:
    """An input no captured op made that holds one dtype constant on each side (finfo.min) passes (attribution dtype)."""
    if call.trace(row) is not None:
        return None
    constants = dtype_constants(row)
    return _dtype_constant(row, "a constant no captured op made", constants) if constants is not None else None


def upstream_differs(row: Row, call: Call) -> Judgement | None:
    """An input no captured op made, within growth times the error seen upstream, is inherited."""
    error, _ = _beyond(row)
    if call.trace(row) is not None or error > call.growth * call.upstream:
        return None
    return _inherited(row, call, (), f"{_detail(row)}; upstream ops already differ")


def updated_unseen(row: Row, call: Call) -> Judgement | None:
    """A parameter or optimizer state whose last update only one dump records (not a graph dump's) is undecided.

    A graph dump does not record an optimizer step that runs outside its graphs, so nothing says
    whether the update made the difference: an optimizer that divides by a gradient's size (Adam's)
    turns round-off in a gradient that should be zero (a key bias's) into a step as large as its
    learning rate. An optimizer step compiled on the graph side is not told from that: a bug there
    shows as this verdict in the next step."""
    if row.step == 0 or call.trace(row) is not None or not call.flow.stepped_by_optimizer(row):
        return None
    before = row.step - 1
    seen = {side: call.flow.optimizer_stepped(side, before) for side in ("a", "b")}
    if seen["a"] == seen["b"]:
        return None
    blind, record = ("A", row.record_a) if not seen["a"] else ("B", row.record_b)
    if record is None or record.capture != "graph":
        return None
    return _undecided(
        row,
        call,
        f"{_detail(row)}; a parameter or optimizer state, updated in step {before} by an optimizer step that {blind}'s"
        " graph dump does not record: statistics cannot tell whether the update (an optimizer dividing by a"
        " gradient's size turns its round-off into a step of the learning rate's size) made the difference",
    )


def differs_before_any_op(row: Row, call: Call) -> Judgement | None:
    """Any other input no captured op made (a weight, the batch) is blamed: it differs before any op did.

    One the step's optimizer reads (a parameter, its state) says that the runs began the step apart."""
    if call.trace(row) is not None:
        return None
    message = f"{_detail(row)}; this input differs before any op did"
    if call.flow.stepped_by_optimizer(row):
        message += (
            f": a parameter or optimizer state (the step's optimizer reads it), so the runs began step {row.step} with other"
            " values: an earlier step, the initialisation or a loaded checkpoint made the difference"
        )
    return _blamed(row, message)


def _merged_side(row: Row, call: Call) -> str | None:
    """The side whose record of ``row`` is a sharded value merged from every rank's pieces (not a
    partial sum) and whose own way back reaches no value that cannot be compared: the ranks made it
    whole between them (a gradient reduce-scattered over the batch's shares)."""
    for side, record in (("a", row.record_a), ("b", row.record_b)):
        extra = record.extra if record is not None else None
        if extra and extra.get("merged_ranks") and not extra.get("partial"):
            traced = call.flow.sources(row, side)
            if traced is None or not any(source.verdict == "incomparable" for source in traced[0]):
                return side
    return None


def _scale(record: Record | None) -> float:
    """The largest magnitude a record's statistics show (0 without them)."""
    stats = (record.stats if record is not None else None) or {}
    return max(abs(stats.get("min") or 0.0), abs(stats.get("max") or 0.0))


def _cancelled(a: Record | None, b: Record | None, error: float, call: Call) -> bool:
    """Both values lie below their dtype's ``atol`` and within it of each other (``error``, measured on
    a scale of at least ``atol``, at most 1): a sum that cancels (a key bias's gradient, zero but for
    rounding) carries its summands' rounding, which another order of summing (over the ranks, then
    the batch) changes; ``torch.testing`` calls them close."""
    floor = tolerance_for(a.dtype if a else None, b.dtype if b else None, call.flow.tolerances).atol
    return max(_scale(a), _scale(b)) < floor and error <= 1.0


def _changed_by(row: Row, side: str, partner: Record, call: Call) -> tuple[Row, float, float] | None:
    """The op only ``side`` runs that changed the value ``row`` holds, with its output's error and
    tolerance against ``partner``: walking back from the op that made it through ops only that side
    runs, the first whose output differs from ``partner`` while a tensor input holds its value
    (within ``growth`` tolerances: the ranks summed it in another order)."""
    made = call.flow.producer(row, side)
    for _ in range(_WALK):
        if made is None or made.matched:
            return None
        leaving = _against(made, side, partner, call.flow)
        if leaving is None or leaving[0] <= leaving[1]:
            return None
        inputs = [r for r in call.flow.calls_one_sided(made, side) if r.io not in OUTPUT_IO and r.kind == "tensor"]
        for r in inputs:
            entering = _against(r, side, partner, call.flow)
            if entering is None:
                continue
            record, (error, tolerance) = (r.record_a if side == "a" else r.record_b), entering
            if error <= call.growth * tolerance or _cancelled(record, partner, error, call):
                return made, *leaving
        earlier = [producer for r in inputs if (producer := call.flow.producer(r, side)) is not None and not producer.matched]
        if len(earlier) != 1:
            return None
        made = earlier[0]
    return None


def holds_incomparable(row: Row, call: Call) -> Judgement | None:
    """An input both sides made from values that cannot be compared, through ops both run, cannot be compared."""
    trace = call.trace(row)
    if trace is None or not trace.unlike or trace.one_sided or _merged_side(row, call) is not None:
        return None  # (a value merged from the ranks' pieces was made by their collectives, which only that side runs)
    return _incomparable(row, f"holds a value that cannot be compared ({trace.unlike[0].name})")


def one_sided_from_incomparable(row: Row, call: Call) -> Judgement | None:
    """An input one side made from incomparable values through ops only it runs is inherited within growth tolerances.

    Micro-batch gradients summed by accumulation against one batch's are a quantity both runs should
    agree on, and so are a sharded run's gradients merged from every rank's pieces (FSDP2's, reduced
    over the ranks' shares of the batch by collectives only that side runs) against one process's:
    within ``growth`` tolerances (summing in another order), both below the dtype's ``atol`` (a sum
    that cancels), or ``growth`` times the error seen upstream it is inherited. Beyond, it is blamed;
    a merged value, on the op only its side runs that changed a value entering it in agreement (a
    gradient divided twice, weight decay on a parameter that takes none) when there is one."""
    trace = call.trace(row)
    if trace is None or not trace.unlike:
        return None
    error, tolerance = _beyond(row)
    merged = _merged_side(row, call)
    unlike = f"values that cannot be compared ({trace.unlike[0].name})"
    if merged is not None and not trace.one_sided:
        made = f"merged from every rank's pieces against a value made from {unlike}"
    else:
        made = f"made through {trace.listed()} that only one side runs from {unlike}"
    if error <= call.growth * tolerance:
        return _inherited(row, call, (), f"{_detail(row)}; {made}: within what summing in another order makes")
    if _cancelled(row.record_a, row.record_b, error, call):
        return _inherited(row, call, (), f"{_detail(row)}; {made}: both below the dtype's atol, a sum that cancels")
    if error <= call.growth * call.upstream:
        return _inherited(row, call, (), f"{_detail(row)}; {made}; upstream ops already differ")
    partner = row.record_b if merged == "a" else row.record_a
    cause = _changed_by(row, merged, partner, call) if merged is not None and partner is not None else None
    if cause is not None and partner is not None:  # found only with a partner
        return _blame_one_sided(row, merged, partner, cause, made, "the value entering it agrees")
    for side in ("a", "b"):
        partner = row.record_b if side == "a" else row.record_a
        gathered = _gathered_by(row, side, partner, call) if partner is not None else None
        if gathered is not None and partner is not None:  # found only with a partner
            whole = "it made the value whole from pieces that could not be judged one by one (the region before it)"
            return _blame_one_sided(row, side, partner, gathered, made, whole)
    return _blamed(
        row,
        f"{_detail(row)}; {made}, it differs where both runs should agree: the difference enters here "
        "(or in the region before it, which could not be judged)",
    )


def _gathered_by(row: Row, side: str, partner: Record, call: Call) -> tuple[Row, float, float] | None:
    """The collective only ``side`` runs that made the value ``row`` holds (its output's error and
    tolerance against ``partner``): the first place that side holds the whole value (a vocabulary-
    parallel embedding's all-reduce of the ranks' lookups), where a difference of the pieces shows."""
    made = call.flow.producer(row, side)
    if made is None or made.matched or not made.op.startswith(COLLECTIVES):
        return None
    found = _against(made, side, partner, call.flow)
    return (made, *found) if found is not None and found[0] > found[1] else None


def _blame_one_sided(
    row: Row, side: str | None, partner: Record, cause: tuple[Row, float, float], made: str, why: str
) -> Judgement:
    """``row`` inherits from ``cause``, an op only ``side`` runs that made the difference of the value it read
    (``why``), blamed with it."""
    op, error, tolerance = cause
    who, other = ("A", "B") if side == "a" else ("B", "A")
    why = (
        f"difference {_fmt(error)} > tolerance {_fmt(tolerance)} against {other}'s value at {partner.name}; "
        f"only {who} runs this op and {why}: this op makes the difference"
    )
    judged = _blamed(op, why)._replace(difference=error, upstream=error)
    message = f"{_detail(row)}; {made}; made by {op.op} that only {who} runs ({op.name}), which changed the value"
    return Judgement("warning", "inherited", message, origin=op.name, upstream=row.difference, blames=((op, judged),))


def made_differently(row: Row, call: Call) -> Judgement | None:
    """An input each side made from other matched rows, through ops only one side runs, passes; they stand for it.

    Those rows (both sides' together) take its place when the call's outputs are judged. The two
    records are different tensors, and their difference says nothing of either run. A bf16 Llama's
    RMSNorm casts its input to float32, so autograd sums the two float32 gradients first and adds
    the residual's after the cast back, while the float32 twin adds them in another order: the same
    call gets a different partial sum on each side."""
    trace = call.trace(row)
    if trace is None or not trace.one_sided or len(trace.made) != 2:
        return None
    made_a, made_b = trace.made
    if set(made_a) == set(made_b):
        return None
    error, _ = _beyond(row)
    names = [", ".join(sorted({r.name for r in made})) for made in (made_a, made_b)]
    message = (
        f"difference {_fmt(error)} between different tensors: A made this input from {names[0]}, B from "
        f"{names[1]} (through {', '.join(trace.one_sided)} that only one side runs); the call's outputs are judged against them"
    )
    stand_ins = tuple({id(r): r for r in (*made_a, *made_b)}.values())
    upstream = max((r.difference or 0.0 for r in stand_ins if call.flow.counts(r)), default=None)
    return Judgement("pass", "", message, upstream=upstream, stand_ins=stand_ins)


def carried_from_source(row: Row, call: Call) -> Judgement | None:
    """An input within twice its source's error plus the tolerance (a cast on the way) is inherited."""
    trace = call.trace(row)
    if trace is None:
        return None
    error, tolerance = _beyond(row)
    carried = max((source.difference or 0.0 for source in trace.sources), default=0.0)
    if error > _CARRIED * carried + tolerance:
        return None
    return _inherited(row, call, trace.sources, f"{_detail(row)}, as {trace.sources[0].name} (difference {_fmt(carried)})")


def split_differently(row: Row, call: Call) -> Judgement | None:
    """An input each side made through ops only it runs, in a call whose outputs agree, passes: one sum split otherwise.

    ``native_layer_norm_backward`` makes a layer norm's whole input gradient, which autograd adds to
    the residual's; a layer norm written by hand has autograd add its partial gradients one by one,
    the residual's among the first. The last ``add`` of each side makes the same value from two
    other pairs of tensors: their difference says nothing of either run, the outputs are judged."""
    trace = call.trace(row)
    if trace is None or trace.sided < 2:
        return None
    outputs = [r for r in call.rows if r.kind == "tensor" and r.io in OUTPUT_IO and r.matched]
    if not outputs or any(_differs(r) for r in outputs):
        return None
    error, _ = _beyond(row)
    message = (
        f"difference {_fmt(error)} between different tensors: each side made this input through ops only it runs "
        f"({trace.listed()}) and the call's outputs agree: the two runs split the same result differently"
    )
    return Judgement("pass", "", message)


def changed_by_one_sided_op(row: Row, call: Call) -> Judgement | None:
    """An input made through ops only one side runs from values that agree, beyond tolerance, blames the op that changed it.

    The ops only one side runs between two aligned values are a structure difference (a hook that
    scales an output, an extra add): the value entering them agrees, the value leaving them does
    not, so one of them made the difference. The earliest of them whose output already differs from
    this input's partner (:func:`~torchdebug.compare._structure.cause_in_block`) is blamed, with its
    module and source line; this input inherits from it."""
    trace = call.trace(row)
    if trace is None or not trace.one_sided:
        return None
    cause = cause_in_block(row, call.flow)
    if cause is None:
        return None
    made, side = cause.row, "A" if cause.row.record_a is not None else "B"
    other = "B" if side == "A" else "A"
    detail = f"difference {_fmt(cause.error)} > tolerance {_fmt(cause.tolerance)} against {other}'s value at {cause.partner}"
    forward = call.flow.forward_origin(made, side.lower())
    if forward is not None:  # the backward of a blamed one-sided op: the same difference
        why = f"{detail}; the backward of an op only {side} runs, which carries the difference blamed on {forward}"
        judged = Judgement("warning", "inherited", why, cause.error, forward, None, cause.error)
    else:
        carried = max((source.difference or 0.0 for source in trace.sources), default=0.0)
        error, tolerance = _beyond(row)
        factor = amplification(row, trace.sources)
        if carried > 0 and error <= factor * carried + tolerance:  # a sum of near-zero gradients in another order
            ops = ", ".join(trace.one_sided)
            return _undecided(
                row,
                call,
                f"{_detail(row)}; made through {ops} that only one side runs from values that differ by {_fmt(carried)}, "
                f"which they may amplify up to {_fmt(factor)}x: statistics cannot tell whether they made the difference",
            )
        why = f"{detail}; only {side} runs this op (a structure difference) and the value entering it agrees"
        why += f" (difference {_fmt(carried)})"
        judged = _blamed(made, f"{why}: this op makes the difference")._replace(difference=cause.error, upstream=cause.error)
    message = f"{_detail(row)}; made by {made.op} that only {side} runs ({made.name}), which changed the value"
    origin = forward or made.name
    return Judgement("warning", "inherited", message, origin=origin, upstream=row.difference, blames=((made, judged),))


def enters_here(row: Row, call: Call) -> Judgement | None:
    """Any other input beyond tolerance is blamed: the difference enters here (on the way from its source)."""
    trace = call.trace(row)
    assert trace is not None  # the rules above judged every input without one
    carried = max((source.difference or 0.0 for source in trace.sources), default=0.0)
    how = f", changed on the way by {', '.join(trace.one_sided)} that only one side runs" if trace.one_sided else ""
    made = f"the tensor {trace.sources[0].name} made differs by only {_fmt(carried)}{how}"
    return _blamed(row, f"{_detail(row)}; {made}: the difference enters here")


# --- argument values ------------------------------------------------------------------------------


def same_value(row: Row, call: Call) -> Judgement | None:
    """Argument values that are equal (object reprs ignoring memory addresses) pass."""
    return Judgement("pass") if _same_value(*_values(row)) else None


def dtype_argument_value(row: Row, call: Call) -> Judgement | None:
    """An argument of a call without tensor inputs that differs only with the runs' dtypes passes (attribution dtype)."""
    why = dtype_argument(*_values(row)) if call.constant else None
    if why is None:
        return None
    return Judgement("pass", "dtype", f"argument value differs because the runs' dtypes differ: {why}")


def other_value(row: Row, call: Call) -> Judgement | None:
    """Any other argument value that differs is a warning (incomparable in a call on values that cannot be compared)."""
    a, b = _values(row)
    message = f"argument value differs: {a!r} vs {b!r}"
    unlike = call.incomparable_input()
    if unlike is not None:  # a view's sizes, a loss divided by the number of micro-batches
        return _incomparable(row, f"{message}, in a call on values that cannot be compared ({unlike.name})")
    return Judgement("warning", "", message)


class Rule(NamedTuple):
    """One verdict rule and the slots it applies to."""

    judge: Callable[[Row, Call], Judgement | None]
    slots: frozenset[str]
    """Of ``input``, ``output`` (tensor slots) and ``value`` (non-tensor slots)."""

    @property
    def name(self) -> str:
        return self.judge.__name__

    @property
    def summary(self) -> str:
        """The first line of its docstring."""
        return (self.judge.__doc__ or "").strip().splitlines()[0]


_ANY = frozenset({"input", "output", "value"})
_TENSORS = frozenset({"input", "output"})
_INPUTS = frozenset({"input"})
_OUTPUTS = frozenset({"output"})
_VALUES = frozenset({"value"})

RULES: tuple[Rule, ...] = (
    Rule(unmatched, _ANY),
    Rule(not_captured, _ANY),
    Rule(one_piece, _TENSORS),
    Rule(decision_changed, _OUTPUTS),
    Rule(follows_changed_decision, _ANY),
    Rule(shape_follows_inputs, _TENSORS),
    Rule(other_shape, _TENSORS),
    Rule(computed_from_incomparable, _OUTPUTS),
    Rule(nonfinite_inherited, _TENSORS),
    Rule(nonfinite_origin, _TENSORS),
    Rule(no_statistics, _TENSORS),
    Rule(within_tolerance, _TENSORS),
    Rule(replicate_partitioned, _TENSORS),
    Rule(sharded_embedding_indices, _TENSORS),
    Rule(constant_from_arguments, _OUTPUTS),
    Rule(called_differently, _OUTPUTS),
    Rule(rerun_own_error, _OUTPUTS),
    Rule(explained_by_inputs, _OUTPUTS),
    Rule(moves_its_input, _OUTPUTS),
    Rule(singular_near_zero, _OUTPUTS),
    Rule(awaits_rerun, _OUTPUTS),
    Rule(may_amplify, _OUTPUTS),
    Rule(made_here, _OUTPUTS),
    Rule(gradient_of_incomparable, _INPUTS),
    Rule(constant_no_op_made, _INPUTS),
    Rule(upstream_differs, _INPUTS),
    Rule(updated_unseen, _INPUTS),
    Rule(differs_before_any_op, _INPUTS),
    Rule(holds_incomparable, _INPUTS),
    Rule(one_sided_from_incomparable, _INPUTS),
    Rule(made_differently, _INPUTS),
    Rule(carried_from_source, _INPUTS),
    Rule(split_differently, _INPUTS),
    Rule(changed_by_one_sided_op, _INPUTS),
    Rule(enters_here, _INPUTS),
    Rule(same_value, _VALUES),
    Rule(dtype_argument_value, _VALUES),
    Rule(other_value, _VALUES),
)
"""The rules in the order they are tried; the first that answers judges the row."""


def slot_of(row: Row) -> str:
    """Which rules apply to ``row``: ``value`` (non-tensor), ``output`` or ``input``."""
    if row.kind != "tensor":
        return "value"
    return "output" if row.io in OUTPUT_IO else "input"
