"""Verdicts and attribution: which rows differ, and which op each difference starts at.

Per row, in execution order:

* ``pass`` when the scale-relative ``error`` is within the pair's dtype tolerance (the less
  precise side's), so a bf16 run is allowed bf16 rounding;
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
  (:mod:`torchdebug.compare.comparable`): a shape that differs because the runs' inputs do (a data
  input of another shape, data cut to other shapes, sizes that change as the data's do), and a value
  computed from such rows (a micro-batch's loss or weight gradient) that differs. A value that one
  side makes from incomparable rows through ops only it runs (micro-batch gradients summed by
  accumulation) can be compared again: it is judged, and blamed when it differs by more than
  ``growth`` tolerances (summing in another order); and a slot holding one piece of a split DTensor
  whose other pieces are not in the dump (:func:`~torchdebug.compare.shards.one_shard`);
* a value made from constants alone (a call without tensor inputs: ``scalar_tensor``, ``full``) or
  a constant no captured op made that differs only because the runs' dtypes do
  (``torch.finfo(dtype).min`` as an attention bias) passes with attribution ``dtype``; what is
  computed from it inherits that, and never counts as error seen upstream;
* other shapes that differ are errors (with an infinite ``error``: no number measures them); argument
  values that differ, and slots that could not be captured on a side (``record.capture_error``), are
  warnings (argument values of a constant that differ with the dtype pass);
* with replay (``own_err_a``/``own_err_b`` in an output row's metrics: its error against the op
  replayed in float64 on that side's own inputs; ``kernel_err_a``/``kernel_err_b``: that of the CPU
  kernel re-run on the same inputs in their dtypes), an output beyond tolerance whose own error on
  either side exceeds twice the rounding tolerance of the pair's less precise dtype and the kernel's
  error by one is blamed, whatever its inputs carry; one beyond one tolerance and the kernel's by
  half of one is ``undecided`` (bf16: a 1 % bug looks like a kernel rounding twice);
* an output of a division (``div``, Adam's ``addcdiv``) may amplify its inputs' error by the spread
  of its divisor's magnitudes (``max / min`` from its statistics), so a zero gradient's ``eps`` makes
  Adam's update ``undecided`` with statistics, never blamed.

The first divergence is the earliest blamed op row (op records before module records); the first
non-finite op is the earliest row whose NaN/Inf its inputs did not have.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

from torchdebug.compare.comparable import DataShapes, data_records, dtype_argument, dtype_constants
from torchdebug.compare.matching import execution_order, producers
from torchdebug.compare.rows import Row
from torchdebug.compare.shards import one_shard
from torchdebug.compare.tolerances import lower_precision, rounding_tolerance
from torchdebug.records import MODULE_OP, Record, call_name

__all__ = ["judge", "first_divergence", "first_nonfinite"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_OUTPUT_IO = ("output", "parameter_grad")


def _same_value(a: object, b: object) -> bool:
    """Equal argument values, ignoring memory addresses in object reprs."""
    if isinstance(a, str) and isinstance(b, str):
        return _ADDRESS.sub("", a) == _ADDRESS.sub("", b)
    return a == b


def _judge_value(row: Row, constant: bool) -> None:
    """An argument value: a warning when the two differ, unless ``constant`` (a call without tensor
    inputs) and they differ only with the runs' dtypes."""
    a = row.record_a.value if row.record_a else None
    b = row.record_b.value if row.record_b else None
    if _same_value(a, b):
        return
    why = dtype_argument(a, b) if constant else None
    if why is not None:
        row.verdict, row.attribution = "pass", "dtype"
        row.message = f"argument value differs because the runs' dtypes differ: {why}"
        return
    row.verdict = "warning"
    row.message = f"argument value differs: {a!r} vs {b!r}"


def _dtype_arguments(rows: Sequence[Row]) -> str | None:
    """What differs among a call's argument values, when some differ and all of those only with the
    runs' dtypes (``None`` otherwise)."""
    found = []
    for row in rows:
        if row.kind == "tensor" or row.io in _OUTPUT_IO or row.record_a is None or row.record_b is None:
            continue
        a, b = row.record_a.value, row.record_b.value
        if not _same_value(a, b):
            why = dtype_argument(a, b)
            if why is None:
                return None
            found.append(why)
    return "; ".join(found) or None


_SINGULAR = {"sqrt", "rsqrt", "div", "reciprocal", "log", "log2", "log10", "log1p", "pow", "addcdiv", "atan2"}
"""Ops whose relative error is unbounded near zero: they may turn a tiny input error into any size."""


def _is_singular(op: str) -> bool:
    """``aten.sqrt.default``, ``aten.addcdiv_.default``, ``aten._foreach_div.List``, ``Tensor.log``."""
    return _base_op(op) in _SINGULAR


def _spread(row: Row) -> float:
    """The largest element-wise relative error of a row (of min/max/mean/norm with statistics only)."""
    if "max_rel_err" in row.metrics:
        return row.metrics["max_rel_err"]
    return max((row.metrics.get(k, 0.0) for k in ("min_rel", "max_rel", "mean_rel", "norm_rel")), default=0.0)


def _fmt(value: float) -> str:
    return f"{value:.3g}"


_REPLAY_MARGIN = 2.0
"""How many rounding tolerances an op's own error must exceed to be blamed (a healthy op that rounds
once: ≤ 0.5), and how many it must exceed what the CPU kernel makes by."""
_OWN = {"A": ("own_err_a", "kernel_err_a"), "B": ("own_err_b", "kernel_err_b")}


def _scale(record: Record | None) -> float | None:
    """The largest magnitude of a slot, from its statistics (``None`` without them)."""
    stats = record.stats if record is not None else None
    if not stats:
        return None
    low, high = stats.get("min"), stats.get("max")
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
        return None
    scale = max(abs(low), abs(high))
    return scale if math.isfinite(scale) else None


def _own_error(row: Row) -> tuple[str, str] | None:
    """What replay says of an output row, per side from its own error ``own`` against the float64
    replay, the error ``kernel`` of the CPU kernel re-run on the same inputs (0 when it could not
    run) and the rounding tolerance ``t`` of the pair's less precise dtype:

    * ``("blamed", why)`` when ``own`` exceeds both twice ``t`` and ``kernel + t`` on a side: more
      than any healthy kernel of that dtype makes;
    * ``("undecided", why)`` when, short of that, it exceeds both ``t`` and ``kernel + t / 2``: a
      bug this small (bf16: about 1 %) cannot be told from a kernel that rounds more than the CPU's;
    * ``("inherited", why)`` when both sides were replayed within that: the op is healthy;
    * ``None`` when replay says nothing (not replayed, or on one side only and within bounds)."""
    dtype = lower_precision(row.dtype_a, row.dtype_b)
    verdicts = []
    for side, record in (("A", row.record_a), ("B", row.record_b)):
        own_key, kernel_key = _OWN[side]
        tolerance = rounding_tolerance(dtype, _scale(record))
        if own_key not in row.metrics or tolerance is None:
            continue
        own, kernel = row.metrics[own_key], row.metrics.get(kernel_key)
        excess = own - (kernel or 0.0)
        why = f"own error {own:.1e} vs fp64 replay on side {side}"
        why += f", the CPU's {dtype} kernel {kernel:.1e}" if kernel is not None else ""
        why += f" ({dtype} tolerance {tolerance:.1e})"
        if own > _REPLAY_MARGIN * tolerance and excess > tolerance:
            verdicts.append((2, own / tolerance, f"{why}: this op makes the difference"))
        elif own > tolerance and excess > tolerance / _REPLAY_MARGIN:
            verdicts.append(
                (1, own / tolerance, f"{why}: too close to {dtype} rounding to tell a bug from a kernel that rounds differently")
            )
        else:
            verdicts.append((0, own / tolerance, f"{why} is rounding"))
    if not verdicts:
        return None
    level, _, why = max(verdicts)
    if level == 0 and len(verdicts) < 2:
        return None
    return ("inherited", "undecided", "blamed")[level], why


_MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot"}
"""Ops whose output element sums products of inputs: their relative error may grow by the ratio
``‖A‖·‖B‖ / ‖A @ B‖`` (large when the products cancel)."""


def _base_op(op: str) -> str:
    """``aten.addcdiv_.default`` → ``addcdiv``, ``aten._foreach_div.List`` → ``div``, ``Tensor.log`` → ``log``."""
    parts = op.split(".")
    base = parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[-1]
    return base.removeprefix("_foreach_").rstrip("_")


def _amplification(output: Row, inputs: Sequence[Row]) -> float:
    """How much an op may amplify the scale-relative error of its inputs, from the statistics of the
    reference side: the inputs' scales over the output's (an output far smaller than what it is made
    of — a LayerNorm's mean, a softmax of large scores, a difference of close values — magnifies
    their error), and for matmuls the product of the two largest input norms over the output's.
    An upper estimate: a healthy op usually stays well within it."""
    out = output.record_b
    scale_out = _scale(out)
    if scale_out is None:
        return 1.0  # no statistics: no evidence of amplification
    if scale_out == 0.0:
        return math.inf
    scales = [_scale(r.record_b) or 0.0 for r in inputs]
    amplification = max(1.0, sum(scales) / scale_out)
    base = _base_op(output.op)
    if base in _MATMULS:
        norms = sorted(float(r.record_b.stats.get("norm") or 0.0) for r in inputs if r.record_b and r.record_b.stats)
        norm_out = float((out.stats or {}).get("norm") or 0.0)  # type: ignore[union-attr]
        if len(norms) >= 2 and norm_out > 0:
            amplification = max(amplification, norms[-1] * norms[-2] / norm_out)
    if base in _DIVISOR:
        for divisor in _divisors(output, inputs, _DIVISOR[base]):
            amplification = max(amplification, _range(divisor.record_b))
    return amplification


_DIVISOR = {"div": "1", "addcdiv": "2"}
"""Ops dividing by an input, and its position: ``div(a, b)``, ``addcdiv(x, a, b)`` (Adam's update)."""


def _divisors(output: Row, inputs: Sequence[Row], position: str) -> list[Row]:
    """The divisor rows of a call: the input at ``position``, or for ``_foreach_*`` ops the element
    of that list which ``output`` is the result of (``2.3`` for output ``0.3``)."""
    element = output.arg.split(".")[1:]
    return [r for r in inputs if r.arg.split(".")[0] == position and r.arg.split(".")[1:] == element]


def _range(record: Record | None) -> float:
    """How far apart the magnitudes of a divisor are, from its statistics: ``max|x| / min|x|`` when it
    keeps one sign (a quotient's relative error is the divisor's, magnified where it is small: Adam's
    update divides by ``sqrt(v) + eps``, ``eps`` where a gradient is zero), infinite when it crosses
    zero, 1 without statistics."""
    stats = record.stats if record is not None else None
    low, high = (stats or {}).get("min"), (stats or {}).get("max")
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)) or not math.isfinite(low + high):
        return 1.0
    if low <= 0.0 <= high:
        return math.inf
    return max(abs(low), abs(high)) / min(abs(low), abs(high))


_CARRIED = 2.0
"""How many times the error of the tensor its producer made an input may carry (plus the pair's
tolerance for a cast on the way): the same tensor cannot differ more unless an op changed it."""
_MAX_TRACE = 8
"""How many ops only one side runs are followed back from an input (a cast chain, a hook)."""


class _Flow:
    """Where each input slot's tensor came from on each side (``matching.producers``: the same saved
    tensor, or the same dtype, shape and statistics, looking through casts), traced through the calls
    only that side runs back to matched rows; and which blamed row each row inherits from."""

    def __init__(self, rows: Sequence[Row], split: Fraction | None = None) -> None:
        self.slots: dict[tuple[str, int, str], Row] = {}
        self.one_sided: dict[tuple[str, int, str], list[Row]] = {}
        records: dict[str, list[Record]] = {"a": [], "b": []}
        for row in rows:
            for side, record in (("a", row.record_a), ("b", row.record_b)):
                if record is None:
                    continue
                self.slots[(side, record.step, record.name)] = row
                records[side].append(record)
                if not row.matched:
                    self.one_sided.setdefault((side, record.step, record.call_name), []).append(row)
        self.producers: dict[int, tuple[str, str]] = {}
        reshaped = any(row.shape_a != row.shape_b and row.matched and row.kind == "tensor" for row in rows)
        data: dict[str, set[int]] = {"a": set(), "b": set()}
        parameters: set[int] = set()
        for side, side_records in records.items():
            ordered = [side_records[i] for i in execution_order(side_records)]
            made_by = producers(ordered)
            self.producers.update(made_by)
            if reshaped:  # which values are data matters only where shapes differ
                data[side], held = data_records(ordered, made_by)
                parameters |= held
        self.shapes = DataShapes(rows, data, self.producers, parameters, split)
        """Where shapes differ because the runs' inputs do."""
        self.origin: dict[int, str] = {}
        """``id(row)`` → the name of the blamed row whose error it carries."""
        self.constant: dict[int, str] = {}
        """``id(row)`` → the name of the constant made for the dtype whose difference it is or carries."""

    def sources(self, row: Row, side: str, depth: int = 0) -> tuple[list[Row], list[str]] | None:
        """The matched rows whose tensor input ``row`` holds on ``side`` and the ops only that side
        ran on the way; ``None`` when unknown."""
        record = row.record_a if side == "a" else row.record_b
        link = self.producers.get(id(record))
        if record is None or link is None:
            return None
        producer = self.slots.get((side, record.step, f"{link[0]}/{link[1]}"))
        if producer is None or producer.order >= row.order:
            return None  # a producer in another step, or not before this row: no reliable link
        if producer.matched:
            return [producer], []
        if depth >= _MAX_TRACE:
            return None
        found, via = [], [producer.op]
        for other in self.one_sided.get((side, record.step, link[0]), []):
            if other.io not in _OUTPUT_IO and other.kind == "tensor":
                traced = self.sources(other, side, depth + 1)
                if traced is not None:
                    found += traced[0]
                    via += traced[1]
        return (found, via) if found else None

    def inherit(self, row: Row, sources: Sequence[Row]) -> None:
        """Mark ``row`` as carrying the error of the first blamed row among ``sources`` (or theirs);
        else, when the source with the largest error is or carries a constant made for the dtype, that."""
        for source in sources:
            origin = self.origin.get(id(source)) or (source.name if source.attribution == "blamed" else None)
            if origin is not None:
                self.origin[id(row)] = origin
                return
        largest = max(sources, key=lambda source: source.error or 0.0, default=None)
        constant = self.constant.get(id(largest)) if largest is not None else None
        if constant is not None:
            self.constant[id(row)] = constant

    def counts(self, row: Row) -> bool:
        """Whether ``row``'s error counts as error seen upstream: not a constant made for the dtype
        (or what carries it), not a value that cannot be compared."""
        return row.verdict != "incomparable" and id(row) not in self.constant


def _inherited(row: Row, flow: _Flow, sources: Sequence[Row], detail: str) -> None:
    """An error its inputs explain: ``pass`` when they carry rounding drift only, ``warning`` when
    they carry the error of a blamed op (named in the message)."""
    flow.inherit(row, sources)
    origin = flow.origin.get(id(row))
    constant = flow.constant.get(id(row))
    row.attribution = "inherited"
    row.verdict = "warning" if origin else "pass"
    if origin:
        detail += f"; carries the error blamed on {origin}"
    elif constant:
        detail += f"; carries the constant made for the dtype at {constant}"
    row.message = detail


def _undecided(row: Row, flow: _Flow, sources: Sequence[Row], message: str) -> None:
    """Beyond tolerance, and what the records hold cannot tell whether the op made the difference:
    never blamed, and what follows inherits only what its inputs carry."""
    flow.inherit(row, sources)
    row.verdict = row.attribution = "undecided"
    row.message = message


def _blamed(row: Row, flow: _Flow, message: str) -> None:
    row.verdict, row.attribution, row.message = "error", "blamed", message
    flow.origin[id(row)] = row.name


def _incomparable(row: Row, why: str) -> None:
    """The two values cannot be compared (see :mod:`torchdebug.compare.comparable`)."""
    shapes = f" ({row.shape_a} vs {row.shape_b})" if row.shape_a != row.shape_b else ""
    row.verdict, row.attribution, row.message = "incomparable", "", f"not comparable{shapes}: {why}"


def _dtype_constant(row: Row, flow: _Flow, what: str, why: str) -> None:
    """A constant made for the dtype, which differs because the runs' dtypes do: it passes."""
    row.verdict, row.attribution = "pass", "dtype"
    row.message = (
        f"error {_fmt(row.error)} > tolerance {_fmt(row.tolerance)}: {what} ({why}); "  # type: ignore[arg-type]
        "it differs because the runs' dtypes differ, by design"
    )
    flow.constant[id(row)] = row.name


def _shape_reason(row: Row, inputs: Sequence[Row], flow: _Flow) -> str | None:
    """Why ``row``'s shapes differ because the runs' inputs do (``None``: for another reason)."""
    if row.io in _OUTPUT_IO:
        if any(r.verdict == "error" and r.shape_a != r.shape_b for r in inputs):
            return None  # an input of another shape for another reason (a wider layer): that is reported
        unlike = next((r for r in inputs if r.verdict == "incomparable"), None)
        if unlike is not None:
            return f"computed from values that cannot be compared ({unlike.name})"
    else:
        for side in ("a", "b"):
            found = flow.sources(row, side)
            unlike = next((r for r in found[0] if r.verdict == "incomparable"), None) if found else None
            if unlike is not None:
                return f"holds a value that cannot be compared ({unlike.name})"
    return flow.shapes.origin(row) or flow.shapes.follows_data(row)


def _judge_input(row: Row, flow: _Flow, growth: float, upstream: float) -> list[Row]:
    """An input beyond tolerance: against the tensor its producer made (traced through ops only one
    side runs), else against the largest error seen upstream. Returns the rows that stand for it
    when the call's outputs are judged: itself, or, when the two sides made it from different rows,
    those rows (see :func:`_made_differently`)."""
    detail = f"error {_fmt(row.error)} > tolerance {_fmt(row.tolerance)}"  # type: ignore[arg-type]
    traced = [found for side in ("a", "b") if (found := flow.sources(row, side)) is not None]
    if not traced:
        constants = dtype_constants(row)
        if constants is not None:
            _dtype_constant(row, flow, "a constant no captured op made", constants)
        elif row.error <= growth * upstream:  # type: ignore[operator]
            _inherited(row, flow, (), detail + "; upstream ops already differ")
        else:
            _blamed(row, flow, detail + "; this input differs before any op did")
        return [row]
    sources = [source for found, _ in traced for source in found]
    one_sided = sorted({op for _, via in traced for op in via})
    unlike = [source for source in sources if source.verdict == "incomparable"]
    if unlike:
        return _made_from_incomparable(row, traced, unlike, one_sided, growth, upstream, flow)
    if one_sided and len(traced) == 2 and {id(r) for r in traced[0][0]} != {id(r) for r in traced[1][0]}:
        return _made_differently(row, traced[0][0], traced[1][0], one_sided)
    carried = max((source.error or 0.0 for source in sources), default=0.0)
    if row.error <= _CARRIED * carried + row.tolerance:  # type: ignore[operator]
        _inherited(row, flow, sources, detail + f", as {sources[0].name} (error {_fmt(carried)})")
        return [row]
    how = f", changed on the way by {', '.join(one_sided)} that only one side runs" if one_sided else ""
    _blamed(
        row,
        flow,
        detail + f"; the tensor {sources[0].name} made differs by only {_fmt(carried)}{how}: the difference enters here",
    )
    return [row]


_LISTED = 3
"""How many ops only one side runs a message names."""


def _made_from_incomparable(
    row: Row,
    traced: Sequence[tuple[list[Row], list[str]]],
    unlike: Sequence[Row],
    one_sided: Sequence[str],
    growth: float,
    upstream: float,
    flow: _Flow,
) -> list[Row]:
    """An input beyond tolerance made from rows that cannot be compared. When the value reached it
    through ops both sides run, it cannot be compared either; when a side made it through ops only it
    runs (4 micro-batch gradients summed by accumulation against one batch's), it is a quantity both
    runs should agree on: within ``growth`` tolerances (summing in another order) it is inherited,
    beyond it blamed."""
    if not one_sided:  # both sides' value comes from such rows through ops both run
        _incomparable(row, f"holds a value that cannot be compared ({unlike[0].name})")
        return [row]
    detail = f"error {_fmt(row.error)} > tolerance {_fmt(row.tolerance)}"  # type: ignore[arg-type]
    ops = ", ".join(one_sided[:_LISTED]) + (f" and {len(one_sided) - _LISTED} more" if len(one_sided) > _LISTED else "")
    made = f"made through {ops} that only one side runs from values that cannot be compared ({unlike[0].name})"
    if row.error <= growth * row.tolerance:  # type: ignore[operator]
        _inherited(row, flow, (), f"{detail}; {made}: within what summing in another order makes")
    elif row.error <= growth * upstream:  # type: ignore[operator]
        _inherited(row, flow, (), f"{detail}; {made}; upstream ops already differ")
    else:
        _blamed(row, flow, f"{detail}; {made}, it differs where both runs should agree: the difference enters here")
    return [row]


def _made_differently(row: Row, made_a: Sequence[Row], made_b: Sequence[Row], one_sided: Sequence[str]) -> list[Row]:
    """An input slot that each side made from different matched rows, through ops only one side runs
    (``one_sided``): the two records are different tensors, and their difference says nothing of
    either run. A bf16 Llama's RMSNorm casts its input to float32, so autograd sums the two float32
    gradients first and adds the residual's after the cast back, while the float32 twin adds them
    in another order: the same call gets a different partial sum on each side. The slot passes; when the
    call's outputs are judged, the rows it was made from (both sides' together) take its place, so
    what the one-sided ops change shows where the call's output differs from them."""
    names = [", ".join(sorted({r.name for r in made})) for made in (made_a, made_b)]
    row.verdict, row.attribution = "pass", ""
    row.message = (
        f"error {_fmt(row.error)} between different tensors: A made this input from {names[0]}, B from "  # type: ignore[arg-type]
        f"{names[1]} (through {', '.join(one_sided)} that only one side runs); the call's outputs are judged against them"
    )
    return list({id(r): r for r in (*made_a, *made_b)}.values())


def _judge_output(row: Row, inputs: Sequence[Row], arguments: Sequence[Row], flow: _Flow, growth: float, replayed: bool) -> None:
    """An output beyond tolerance: replay first (an op exact on each side whose argument values differ
    is blamed); then whether its inputs' error, amplified by what the op may do, explains it (see the
    module docstring). ``arguments`` are the call's non-tensor input rows, judged already."""
    input_error = max((r.error or 0.0 for r in inputs), default=0.0)
    detail = f"error {_fmt(row.error)} > tolerance {_fmt(row.tolerance)}"  # type: ignore[arg-type]
    own = _own_error(row)
    if own is not None:
        verdict, why = own
        changed = [r for r in arguments if r.verdict == "warning"]
        if verdict != "blamed" and changed and row.error > growth * input_error + row.tolerance:  # type: ignore[operator]
            verdict, why = "blamed", f"{why}, but its {changed[0].message}: the op was called differently"
        if verdict == "blamed":
            _blamed(row, flow, why)
        elif verdict == "undecided":
            _undecided(row, flow, inputs, f"{detail}; {why}")
        else:
            _inherited(row, flow, inputs, f"{detail}; {why}")
        return
    tensors = "cosine" in row.metrics  # both sides saved it: replay can measure the op's own error
    explained = f", explained by its inputs (error {_fmt(input_error)})"
    amplified = row.error <= growth * input_error + row.tolerance or (  # type: ignore[operator]
        # relative errors add up through products and quotients
        _is_singular(row.op) and row.error <= sum(_spread(r) for r in inputs)  # type: ignore[operator]
    )
    if amplified and not (tensors and not replayed):
        _inherited(row, flow, inputs, detail + explained)
        return
    amplification = _amplification(row, inputs)
    if tensors and not replayed or (input_error > 0 and row.error <= amplification * input_error + row.tolerance):  # type: ignore[operator]
        how = "it could not be replayed" if tensors else 'a tensor dump (task="tensor") would decide it'
        _undecided(
            row,
            flow,
            inputs,
            f"{detail}; its inputs differ by {_fmt(input_error)} and {row.op} may amplify that up to "
            f"{_fmt(max(amplification, growth))}x: statistics cannot tell whether it made the difference; {how}",
        )
        return
    _blamed(row, flow, detail + f"; its inputs differ by only {_fmt(input_error)}: this op makes the difference")


def _judge_call(rows: list[Row], saved: list[Row], growth: float, upstream: float, flow: _Flow, replayed: bool) -> float:
    """Judge the rows of one op call; ``saved`` are the rows of the forward call a backward call
    differentiates (its saved tensors), ``upstream`` the largest error seen before this call.
    Returns the largest error seen up to and including this call."""
    inputs = [r for r in rows if r.io not in _OUTPUT_IO and r.kind == "tensor" and r.matched]
    inputs += [r for r in saved if r.kind == "tensor" and r.matched]
    constant = not any(r.io not in _OUTPUT_IO and r.kind == "tensor" for r in rows)  # made from arguments alone
    seen = upstream
    # tensor inputs, argument values, outputs: arguments and outputs look at the inputs' verdicts
    for row in sorted(rows, key=lambda r: (r.io in _OUTPUT_IO, r.kind != "tensor")):
        row.verdict, row.attribution, row.message = "pass", "", ""
        a, b = row.record_a, row.record_b
        if a is None or b is None:
            row.verdict = "unmatched"
            row.message = "only in A" if b is None else "only in B"
            continue
        if a.capture_error or b.capture_error:
            failed = [f"{side}: {r.capture_error}" for side, r in (("A", a), ("B", b)) if r.capture_error]
            row.verdict, row.message = "warning", "not captured on " + "; ".join(failed)
            continue
        if row.kind == "tensor" and (piece := one_shard(row)) is not None:
            _incomparable(row, piece)
            continue
        if row.kind != "tensor":
            _judge_value(row, constant)
            unlike = next((r for r in inputs if r.verdict == "incomparable"), None) if row.verdict == "warning" else None
            if unlike is not None:  # a view's sizes, a loss divided by the number of micro-batches
                _incomparable(row, f"{row.message}, in a call on values that cannot be compared ({unlike.name})")
            continue
        is_output = row.io in _OUTPUT_IO
        if row.shape_a != row.shape_b:
            why = _shape_reason(row, inputs, flow)
            if why is not None:
                _incomparable(row, why)
                continue
            row.error = math.inf  # no number measures it; the message says what differs
            _blamed(row, flow, f"shape differs: {row.shape_a} vs {row.shape_b}")
            seen = math.inf
            continue
        beyond = row.error is not None and row.tolerance is not None and row.error > row.tolerance
        if is_output and (beyond or row.metrics.get("nonfinite_mismatch")):
            unlike = next((r for r in inputs if r.verdict == "incomparable"), None)
            if unlike is not None:
                _incomparable(row, f"computed from values that cannot be compared ({unlike.name})")
                continue
        if row.metrics.get("nonfinite_mismatch"):
            explained = any(r.metrics.get("nonfinite_mismatch") for r in inputs) if is_output else upstream == math.inf
            message = "NaN/Inf where the other side is finite" + (" (inputs had it)" if explained else "")
            if explained:
                flow.inherit(row, inputs)
                row.verdict, row.attribution, row.message = "warning", "inherited", message
            else:
                if row.error is None:
                    row.error = math.inf  # statistics without a finite number to compare
                _blamed(row, flow, message)
            seen = math.inf
            continue
        if row.error is None or row.tolerance is None:
            row.message = "no statistics to compare"
            continue
        if row.error <= row.tolerance:
            seen = max(seen, row.error)
            continue
        if is_output:
            constants = (dtype_constants(row) or _dtype_arguments(rows)) if constant else None
            if constants is not None:
                _dtype_constant(row, flow, "a constant made from arguments alone", constants)
                continue
            arguments = [r for r in rows if r.kind != "tensor" and r.io not in _OUTPUT_IO]
            _judge_output(row, inputs, arguments, flow, growth, replayed)
            if flow.counts(row):
                seen = max(seen, row.error)
            continue
        stand_ins = _judge_input(row, flow, growth, upstream)
        seen = max([seen, *(r.error or 0.0 for r in stand_ins if flow.counts(r))])
        if stand_ins[0] is not row:  # different tensors on the two sides: what they were made from counts
            inputs = [r for r in inputs if r is not row] + stand_ins
    return seen


def judge(rows: Sequence[Row], *, growth: float = 16.0, replayed: bool = False, split: Fraction | None = None) -> None:
    """Set verdict, attribution and message of one rank's rows (sorted in execution order); judging
    again starts afresh. ``replayed``: the calls that replay could decide were replayed, so a row
    with saved tensors and no own error is judged by statistics alone (else it is ``undecided``,
    for replay to decide). ``split``: A's world size over B's, when they differ (each rank holds
    its share of the data)."""
    flow = _Flow(rows, split)
    calls: dict[tuple[int, str], list[Row]] = {}
    for row in rows:
        calls.setdefault((row.step, call_name(row.name)), []).append(row)
    upstream = 0.0
    for (step, _), call_rows in calls.items():
        first = call_rows[0].record_a or call_rows[0].record_b
        saved = calls.get((step, first.fwd), []) if first is not None and first.fwd else []
        upstream = _judge_call(call_rows, saved, growth, upstream, flow, replayed)


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
