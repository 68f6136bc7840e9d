"""Where a NaN or an Inf comes from: the op call that *made* it, not every op that holds one.

Models hold infinities on purpose (a causal mask's ``masked_fill(mask, float("-inf"))``, which softmax
turns into zeros), so each call is judged by what its inputs and outputs hold (flags :data:`NAN`,
:data:`INF`, :data:`LIMIT`): an **origin** makes a non-finite value from inputs that did not hold it,
an **entry** is the first call whose outputs hold a NaN no earlier checked call made, every other call
is **given** it. One rule for eager ``overflow_check``, the compiled overflow scene, ``check``, ``show``
and ``report``; the rule in full, with examples: docs/numerics.md, "Where does the first NaN/Inf come from?".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torchdebug.records import LOSS_OP, LOSS_SCALE_OP, MODULE_OP, Record

__all__ = ["GIVEN_LIMITS", "INF", "LIMIT", "NAN", "Origin", "OriginTracker", "find_origin", "tensor_flags", "value_flags"]

NAN = 1
"""Holds a NaN."""
INF = 2
"""Holds +Inf or -Inf."""
LIMIT = 4
"""Holds a value at its dtype's largest finite magnitude (``torch.finfo(dtype).min`` or ``.max``)."""

_LIMITS: dict[str, float] = {}


def dtype_limit(dtype: str | torch.dtype | None) -> float:
    """``torch.finfo(dtype).max`` of a floating dtype (by name as records hold it, or as a dtype); inf otherwise."""
    name = dtype if isinstance(dtype, str) or dtype is None else str(dtype).removeprefix("torch.")
    limit = math.inf if name is None else _LIMITS.get(name)
    if limit is None:
        value = getattr(torch, name, None) if name else None
        limit = torch.finfo(value).max if isinstance(value, torch.dtype) and value.is_floating_point else math.inf
        _LIMITS[str(name)] = limit
    return limit


GIVEN_LIMITS = frozenset(
    dtype_limit(name)
    for name in (
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    )
    if getattr(torch, name, None) is not None
)
"""Magnitudes of numbers that count as a given limit (:func:`value_flags`): each floating dtype's ``finfo.max``."""


def tensor_flags(stats: Mapping[str, Any] | None, dtype: str | torch.dtype | None) -> int:
    """The flags of a tensor from its statistics (``torchdebug.stats`` keys); 0 without statistics."""
    if not stats:
        return 0
    flags = NAN if stats.get("nan") else 0
    if stats.get("posinf") or stats.get("neginf"):
        flags |= INF
    limit = dtype_limit(dtype)
    low, high = stats.get("min"), stats.get("max")
    if (high is not None and high >= limit) or (low is not None and low <= -limit):
        flags |= LIMIT
    return flags


def value_flags(value: Any) -> int:
    """The flags of a scalar argument (torch refuses to write a scalar that does not fit a tensor's
    dtype, so a written limit is always one of the ``finfo.max`` values). A scalar counts as a given
    infinity when it is ±Inf or equals the ``finfo(dtype).max`` of a floating dtype in magnitude
    (``torch.finfo(torch.float32).min``); one that merely makes the result overflow (``x * 1e5`` in
    float16) does not: that op is an origin."""
    if value.__class__ not in (float, int):  # bools, lists (sizes), strings, dtypes: no values written
        return 0
    if value != value:
        return NAN
    magnitude = abs(value)
    if magnitude == math.inf:
        return INF
    return LIMIT if magnitude in GIVEN_LIMITS else 0


ORIGIN, ENTRY, GIVEN = "origin", "entry", "given"


class OriginTracker:
    """Judges the op calls of one step in execution order (:meth:`judge`); start a new one per step."""

    __slots__ = ("nan_made", "held")

    def __init__(self) -> None:
        self.nan_made = False
        """A call judged earlier in the step had a NaN in its outputs."""
        self.held = False
        """A call judged earlier in the step had a NaN or an Inf in its outputs."""

    def judge(self, inputs: int, outputs: int, inputs_known: bool = True) -> str | None:
        """:data:`ORIGIN`, :data:`ENTRY`, :data:`GIVEN`, or ``None`` when the outputs are finite.

        ``inputs``/``outputs``: the flags of all inputs (tensors and scalars) and all outputs ORed;
        ``inputs_known=False`` (a dump without input records): a NaN is new when no earlier call
        made one, an Inf when no earlier call held a NaN or an Inf (a given ``-inf`` cannot be told
        from a made one then).
        """
        if not outputs & (NAN | INF):
            return None
        made_before, held_before = self.nan_made, self.held
        self.held = True
        if outputs & NAN:
            self.nan_made = True
        if not inputs_known:
            return ORIGIN if not (made_before if outputs & NAN else held_before) else GIVEN
        if outputs & NAN and not inputs & NAN:
            return ORIGIN
        if outputs & INF and not inputs & (NAN | INF | LIMIT):
            return ORIGIN
        if outputs & NAN and not made_before:
            return ENTRY
        return GIVEN


@dataclass(frozen=True, slots=True)
class Origin:
    """The first call of a dump that made a NaN/Inf (or through which a NaN entered the step)."""

    record: Record
    """Its first output slot holding a NaN/Inf (for an entry: its first input slot holding a NaN, a
    number's where no tensor held one)."""
    kind: str
    """:data:`ORIGIN` or :data:`ENTRY`."""
    inputs_known: bool = True

    def __str__(self) -> str:
        """``step 0: forward/h.0.mlp/aten.exp.default#0 (phase forward, module h.0.mlp) at t.py:12 in
        forward: made 0 NaN, 4 Inf in output.0``"""
        record = self.record
        stats = record.stats or {}
        nan, inf = int(stats.get("nan") or 0), int(stats.get("posinf") or 0) + int(stats.get("neginf") or 0)
        slot = f"{record.io}.{record.arg}" if record.arg else record.io
        where = describe_call(record.call_name, record.phase, record.module, record.fwd, record.source)
        if self.kind == ENTRY and record.kind == "value":
            what = f"a NaN given as {slot}, a number of the program's, not a tensor"
        elif self.kind == ENTRY:
            what = f"{nan} NaN already in {slot} (made by no checked op of the step: a parameter, batch or state)"
        else:
            what = f"made {nan} NaN, {inf} Inf in {slot}"
            if not self.inputs_known:
                what += " (inputs not recorded: a given -inf cannot be told from a made one)"
        return f"step {record.step}: {where}: {what}"


def describe_call(call: str, phase: str, module: str, fwd: str | None, source: str | None) -> str:
    """``call (phase P, module M)`` with the forward call and source line it came from."""
    where = f"{call} (phase {phase}, module {module})"
    if fwd:
        where += f", gradient of {fwd}"
    if source:
        where += f" from the forward line {source}" if phase == "backward" else f" at {source}"
    else:
        where += ", no source line"
    return where


class _Call:
    __slots__ = ("key", "inputs", "outputs", "inputs_known", "made", "entered")

    def __init__(self) -> None:
        self.key: tuple[int, bool, int, int] | None = None
        """``(step, is a module call, its sequence number (0 for a module call), position of its
        first output record)``: an op call is ordered by when it was dispatched, since a
        collective's outputs are written once its work completes, after ops that ran meanwhile (those
        of FSDP2's copy-out that read them); a module's outputs are written when it returns, so inner
        modules come before the modules that contain them."""
        self.inputs = self.outputs = 0
        self.inputs_known = False
        self.made: Record | None = None
        self.entered: Record | None = None


_INPUT_IO = ("input", "parameter")
_OUTPUT_IO = ("output", "parameter_grad")


_MODULE_LEVEL = (MODULE_OP, LOSS_OP, LOSS_SCALE_OP)
"""Ops of module-level records: a flight recorder's window holds the loss (and a loss scaler's scale)
beside the module outputs."""


def _calls(records: Iterable[Record]) -> list[_Call]:
    """The dump's calls that have outputs, with their flags, in execution order (op calls before
    module calls per step)."""
    calls: dict[tuple[int, str], _Call] = {}
    values: list[tuple[tuple[int, str], Record]] = []
    for position, record in enumerate(records):
        ident = (record.step, record.call_name)
        call = calls.get(ident)
        if call is None:
            call = calls[ident] = _Call()
        if record.io in _INPUT_IO:
            call.inputs_known = True
            if record.kind == "value":
                values.append((ident, record))
                continue
            flags = tensor_flags(record.stats, record.dtype)
            call.inputs |= flags
            if flags & NAN and call.entered is None:
                call.entered = record
        elif record.io in _OUTPUT_IO and record.kind == "tensor":
            if call.key is None:
                is_module = record.op in _MODULE_LEVEL
                call.key = (record.step, is_module, 0 if is_module else record.seq, position)
            flags = tensor_flags(record.stats, record.dtype)
            call.outputs |= flags
            if flags & (NAN | INF) and call.made is None:
                call.made = record
    for ident, record in values:  # a number given: a NaN one enters there, if no tensor brought one
        flags = value_flags(record.value)
        calls[ident].inputs |= flags
        if flags & NAN and calls[ident].entered is None:
            calls[ident].entered = record
    return sorted((call for call in calls.values() if call.key is not None), key=lambda call: call.key or ())


def find_origin(records: Iterable[Record]) -> Origin | None:
    """The first origin or entry of a rank's records (docs/numerics.md), by step then
    execution order; in a step with op records, module records are not judged."""
    step, tracker, ops_in_step = None, OriginTracker(), False
    for call in _calls(records):
        call_step, is_module = call.key[:2]
        if call_step != step:
            step, tracker, ops_in_step = call_step, OriginTracker(), False
        if is_module and ops_in_step:
            continue
        ops_in_step = ops_in_step or not is_module
        kind = tracker.judge(call.inputs, call.outputs, call.inputs_known)
        if kind == ORIGIN and call.made is not None:
            return Origin(call.made, ORIGIN, call.inputs_known)
        if kind == ENTRY:
            return Origin(call.entered or call.made, ENTRY)  # type: ignore[arg-type]
    return None
