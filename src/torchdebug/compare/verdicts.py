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
* a NaN/Inf where the other side has a finite value is blamed where it first appears (no input of
  the call has one) and inherited after;
* shapes that differ are errors; argument values that differ, and slots that could not be
  captured on a side (``record.capture_error``), are warnings;
* with replay (``own_err_a``/``own_err_b`` in an output row's metrics: its error against the op
  replayed in float64 on that side's own inputs), an output beyond tolerance whose own error on
  either side exceeds twice the rounding tolerance of the pair's less precise dtype is blamed,
  whatever its inputs carry: a healthy op stays within half of it.

The first divergence is the earliest blamed op row (op records before module records); the first
non-finite op is the earliest row whose NaN/Inf its inputs did not have.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from torchdebug.compare.metrics import REPLAY_METRICS
from torchdebug.compare.rows import Row
from torchdebug.compare.tolerances import lower_precision, rounding_tolerance
from torchdebug.records import MODULE_OP, call_name

__all__ = ["judge", "first_divergence", "first_nonfinite"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_OUTPUT_IO = ("output", "parameter_grad")


def _same_value(a: object, b: object) -> bool:
    """Equal argument values, ignoring memory addresses in object reprs."""
    if isinstance(a, str) and isinstance(b, str):
        return _ADDRESS.sub("", a) == _ADDRESS.sub("", b)
    return a == b


def _judge_value(row: Row) -> None:
    a = row.record_a.value if row.record_a else None
    b = row.record_b.value if row.record_b else None
    if not _same_value(a, b):
        row.verdict = "warning"
        row.message = f"argument value differs: {a!r} vs {b!r}"


_SINGULAR = {"sqrt", "rsqrt", "div", "reciprocal", "log", "log2", "log10", "log1p", "pow", "addcdiv", "atan2"}
"""Ops whose relative error is unbounded near zero: they may turn a tiny input error into any size."""


def _is_singular(op: str) -> bool:
    """``aten.sqrt.default``, ``aten.addcdiv_.default``, ``aten._foreach_div.List``, ``Tensor.log``."""
    parts = op.split(".")
    base = parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[-1]
    return base.removeprefix("_foreach_").rstrip("_") in _SINGULAR


def _spread(row: Row) -> float:
    """The largest element-wise relative error of a row (of min/max/mean/norm with statistics only)."""
    if "max_rel_err" in row.metrics:
        return row.metrics["max_rel_err"]
    return max((row.metrics.get(k, 0.0) for k in ("min_rel", "max_rel", "mean_rel", "norm_rel")), default=0.0)


def _fmt(value: float) -> str:
    return f"{value:.3g}"


_REPLAY_MARGIN = 2.0
"""How many rounding tolerances an op's own error must exceed to be blamed (a healthy op: ≤ 0.5)."""
_OWN_A, _OWN_B = REPLAY_METRICS


def _own_error(row: Row) -> str | None:
    """Why replay blames a replayed output row (its own error on the side that exceeds most), or ``None``."""
    own = [(row.metrics[key], side) for key, side in ((_OWN_A, "A"), (_OWN_B, "B")) if key in row.metrics]
    dtype = lower_precision(row.dtype_a, row.dtype_b)
    tolerance = rounding_tolerance(dtype)
    if tolerance is None:
        return None
    error, side = max(own)
    if error <= _REPLAY_MARGIN * tolerance:
        return None
    return (
        f"own error {error:.1e} vs fp64 replay on side {side} ({dtype} tolerance {tolerance:.1e}): this op makes the difference"
    )


def _judge_call(rows: list[Row], saved: list[Row], growth: float, upstream: float) -> float:
    """Judge the rows of one op call; ``saved`` are the rows of the forward call a backward call
    differentiates (its saved tensors), ``upstream`` the largest error seen before this call.
    Returns the largest error seen up to and including this call."""
    inputs = [r for r in rows if r.io not in _OUTPUT_IO and r.kind == "tensor" and r.matched]
    inputs += [r for r in saved if r.kind == "tensor" and r.matched]
    input_error = max((r.error or 0.0 for r in inputs), default=0.0)
    seen = upstream
    for row in rows:
        a, b = row.record_a, row.record_b
        if a is None or b is None:
            row.verdict = "unmatched"
            row.message = "only in A" if b is None else "only in B"
            continue
        if a.capture_error or b.capture_error:
            failed = [f"{side}: {r.capture_error}" for side, r in (("A", a), ("B", b)) if r.capture_error]
            row.verdict, row.message = "warning", "not captured on " + "; ".join(failed)
            continue
        if row.kind != "tensor":
            _judge_value(row)
            continue
        is_output = row.io in _OUTPUT_IO
        if row.shape_a != row.shape_b:
            row.verdict, row.attribution = "error", "blamed"
            row.message = f"shape differs: {row.shape_a} vs {row.shape_b}"
            seen = math.inf
            continue
        if row.metrics.get("nonfinite_mismatch"):
            explained = any(r.metrics.get("nonfinite_mismatch") for r in inputs) if is_output else upstream == math.inf
            row.verdict, row.attribution = ("warning", "inherited") if explained else ("error", "blamed")
            row.message = "NaN/Inf where the other side is finite" + (" (inputs had it)" if explained else "")
            seen = math.inf
            continue
        if row.error is None or row.tolerance is None:
            row.message = row.message or "no statistics to compare"
            continue
        seen = max(seen, row.error)
        if row.error <= row.tolerance:
            continue
        replayed = _own_error(row) if is_output and (_OWN_A in row.metrics or _OWN_B in row.metrics) else None
        if replayed is not None:
            row.verdict, row.attribution, row.message = "error", "blamed", replayed
            continue
        if is_output:
            explained = row.error <= growth * input_error + row.tolerance or (
                # relative errors add up through products and quotients
                _is_singular(row.op) and row.error <= sum(_spread(r) for r in inputs)
            )
            detail = f"error {_fmt(row.error)} > tolerance {_fmt(row.tolerance)}"
            detail += (
                f", explained by its inputs (error {_fmt(input_error)})"
                if explained
                else (f"; its inputs differ by only {_fmt(input_error)}: this op makes the difference")
            )
        else:
            explained = row.error <= growth * upstream
            detail = f"error {_fmt(row.error)} > tolerance {_fmt(row.tolerance)}"
            detail += "; upstream ops already differ" if explained else "; this input differs before any op did"
        if explained:
            row.verdict, row.attribution = "warning", "inherited"
        else:
            row.verdict, row.attribution = "error", "blamed"
        row.message = detail
    return seen


def judge(rows: Sequence[Row], *, growth: float = 16.0) -> None:
    """Set verdict, attribution and message of one rank's rows (sorted in execution order)."""
    calls: dict[tuple[int, str], list[Row]] = {}
    for row in rows:
        calls.setdefault((row.step, call_name(row.name)), []).append(row)
    upstream = 0.0
    for (step, _), call_rows in calls.items():
        first = call_rows[0].record_a or call_rows[0].record_b
        saved = calls.get((step, first.fwd), []) if first is not None and first.fwd else []
        upstream = _judge_call(call_rows, saved, growth, upstream)


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
