"""How much error an op may make or pass on, from the records: what the verdict rules measure against.

* :func:`own_error`: what rerun says of an output (its own error against the op re-run in float64
  on that side's inputs, against what the CPU kernel makes of them);
* :func:`amplification`: how much an op may amplify its inputs' scale-relative error, estimated
  from the reference side's statistics;
* :func:`is_singular` and :func:`spread`: ops whose relative error is unbounded near zero, and the
  element-wise relative error of a row that such an op inherits;
* :func:`moves_values`: ops that only move their input's elements, which can make no error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchdebug.compare._rows import Row
from torchdebug.compare._tolerances import lower_precision, rounding_tolerance
from torchdebug.records import Record

__all__ = ["own_error", "amplification", "is_singular", "spread", "moves_values", "extremes_not_finite"]

_SINGULAR = {"sqrt", "rsqrt", "div", "reciprocal", "log", "log2", "log10", "log1p", "pow", "addcdiv", "atan2"}
"""Ops whose relative error is unbounded near zero: they may turn a tiny input error into any size."""


_NORM_RSTD = {"native_layer_norm": "2", "native_group_norm": "2", "native_batch_norm": "2", "_native_batch_norm_legit": "2"}
"""Norms that return their ``rsqrt(var + eps)`` (saved for the backward), and its output position."""


def is_singular(op: str, output: str | None = None) -> bool:
    """``aten.sqrt.default``, ``aten.addcdiv_.default``, ``aten._foreach_div.List``, ``Tensor.log``;
    and a norm's saved ``rstd``, ``output`` ``2`` of ``aten.native_layer_norm.default``: the
    reciprocal square root of each row's variance, which a row of nearly equal elements makes."""
    base = _base_op(op)
    return base in _SINGULAR or (output is not None and _NORM_RSTD.get(base) == output)


_MOVES = frozenset(
    {
        *("view", "_unsafe_view", "_reshape_alias", "reshape", "view_as", "alias", "detach", "clone", "contiguous"),
        *("t", "transpose", "swapaxes", "swapdims", "permute", "movedim", "numpy_T", "expand", "expand_as", "repeat"),
        *("squeeze", "unsqueeze", "flatten", "unflatten", "split", "split_with_sizes", "tensor_split", "chunk"),
        *("unbind", "narrow", "slice", "select", "diagonal", "as_strided", "unfold"),
    }
)
"""Ops whose output holds elements of their one tensor input, unchanged: views, copies, splits."""


def moves_values(op: str) -> bool:
    """``aten.split.Tensor``, ``aten.transpose_.default``, ``Tensor.view``: an op that only moves its
    input's elements (each output element is one of them), so it makes no error of its own; the
    statistics of a part (a split, a slice) may still differ more than those of the whole."""
    return _base_op(op) in _MOVES


def spread(row: Row) -> float:
    """The largest element-wise relative error of a row (of min/max/mean/norm with statistics only)."""
    if "max_rel_err" in row.metrics:
        return row.metrics["max_rel_err"]
    return max((row.metrics.get(k, 0.0) for k in ("min_rel", "max_rel", "mean_rel", "norm_rel")), default=0.0)


_RERUN_MARGIN = 2.0
"""How many rounding tolerances an op's own error must exceed to be blamed (a healthy op that rounds
once: ≤ 0.5), and how many it must exceed what the CPU kernel makes by."""
_OWN = {"A": ("own_err_a", "kernel_err_a"), "B": ("own_err_b", "kernel_err_b")}


def extremes_not_finite(record: Record | None) -> bool:
    """Statistics whose min or max is ±Inf or NaN (a masked score's ``-inf``): the scale a difference
    is measured against is then its finite extreme's alone, which may be far smaller than its values'."""
    stats = record.stats if record is not None else None
    extremes = [stats.get(key) for key in ("min", "max")] if stats else []
    return any(isinstance(value, float) and not math.isfinite(value) for value in extremes)


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


def own_error(row: Row) -> tuple[str, str] | None:
    """What rerun says of an output row, per side from its own error ``own`` against the float64
    rerun, the error ``kernel`` of the CPU kernel re-run on the same inputs (0 when it could not
    run) and the rounding tolerance ``t`` of the pair's less precise dtype:

    * ``("blamed", why)`` when ``own`` exceeds both twice ``t`` and ``kernel + t`` on a side: more
      than any healthy kernel of that dtype makes;
    * ``("undecided", why)`` when, short of that, it exceeds both ``t`` and ``kernel + t / 2``: a
      bug this small (bf16: about 1 %) cannot be told from a kernel that rounds more than the CPU's;
    * ``("inherited", why)`` when both sides were rerun within that: the op is healthy;
    * ``None`` when rerun says nothing (not rerun, or on one side only and within bounds)."""
    dtype = lower_precision(row.dtype_a, row.dtype_b)
    verdicts = []
    for side, record in (("A", row.record_a), ("B", row.record_b)):
        own_key, kernel_key = _OWN[side]
        if own_key not in row.metrics:
            continue  # not rerun on this side (every row of a statistics compare)
        tolerance = rounding_tolerance(dtype, _scale(record))
        if tolerance is None:
            continue
        own, kernel = row.metrics[own_key], row.metrics.get(kernel_key)
        excess = own - (kernel or 0.0)
        why = f"own error {own:.1e} vs fp64 rerun on side {side}"
        why += f", the CPU's {dtype} kernel {kernel:.1e}" if kernel is not None else ""
        why += f" ({dtype} tolerance {tolerance:.1e})"
        if own > _RERUN_MARGIN * tolerance and excess > tolerance:
            verdicts.append((2, own / tolerance, f"{why}: this op makes the difference"))
        elif own > tolerance and excess > tolerance / _RERUN_MARGIN:
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


def amplification(output: Row, inputs: Sequence[Row]) -> float:
    """How much an op may amplify the scale-relative error of its inputs, from the statistics of the
    reference side: the inputs' scales over the output's (an output far smaller than what it is made
    of — a LayerNorm's mean, a softmax of large scores, a difference of close values — magnifies
    their error), and for matmuls the product of the two largest input norms over the output's.
    An upper estimate: a healthy op usually stays well within it."""
    out = output.record_b
    scale_out = _scale(out)
    if out is None or scale_out is None:
        # a scale its Inf or NaN elements hide (a masked score): measured against the finite extreme
        # alone, its difference may be any multiple of its inputs'; without statistics, no evidence
        return math.inf if extremes_not_finite(out) else 1.0
    if scale_out == 0.0:
        return math.inf
    scales = [_scale(r.record_b) or 0.0 for r in inputs]
    amplified = max(1.0, sum(scales) / scale_out)
    base = _base_op(output.op)
    if base in _MATMULS:
        norms = sorted(float(r.record_b.stats.get("norm") or 0.0) for r in inputs if r.record_b and r.record_b.stats)
        norm_out = float((out.stats or {}).get("norm") or 0.0)
        if len(norms) >= 2 and norm_out > 0:
            amplified = max(amplified, norms[-1] * norms[-2] / norm_out)
    if base in _DIVISOR:
        for divisor in _divisors(output, inputs, _DIVISOR[base]):
            amplified = max(amplified, _range(divisor.record_b))
    return amplified


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
