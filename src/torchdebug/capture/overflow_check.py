"""Eager overflow check (``task="overflow_check"``): record only the op calls whose outputs hold NaN or Inf.

Every selected op call (forward, backward and optimizer) has each floating output reduced on its
own device to one float64 sum (:func:`torchdebug.stats.finite_sum`), staged in the session's device
table (:class:`torchdebug.stats_table.StatsStager`) like statistics are. A call *overflows* when one sum
is not finite; as in ptdbg, only overflowing calls are recorded, with statistics and their input
and output tensors saved, and recording stops after ``overflow_nums`` of them in the run (then ops
run unchecked). Inputs are the values the call saw: an in-place op's written inputs are copied
before it runs. Collectives (``c10d`` ops) are not checked: their outputs are complete only once
their work is waited for.

**On the CPU** the sum is read at once: a call is recorded right after it runs, and nothing is held.

**On an accelerator** reading the sum would synchronise with the device at every op, so the
decision waits for the session's next flush. Until then a checked call is *pending*: it holds
references to its input and output tensors. Before an in-place op writes into memory a pending
call holds (same storage), the held tensor is copied (copy on write), so what is recorded is what
the call saw. Pending calls are bounded: when more than :data:`WINDOW_CALLS` calls or
:data:`WINDOW_BYTES` bytes of held tensors are pending, the session flushes, one synchronisation per
window rather than per op; ``stop`` and ``step`` flush the rest. The trade-off: held tensors stay
alive until their window resolves (up to about :data:`WINDOW_BYTES` of extra device memory, plus
the copies made on write), and overflowing calls beyond ``overflow_nums`` in the last window were
checked though not recorded.

The first overflow of a run is logged with its call name, phase, module and source line (for a
backward op: the forward line that created it, see ``capture/eager.py``). From a dump,
:func:`first_overflow` finds it again (``torchdebug show`` and ``torchdebug check``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from functools import partial
from typing import Any

import torch

from torchdebug.capture.session import CaptureSession
from torchdebug.records import MODULE_OP, Record, make_name
from torchdebug.slots import Slot, iter_slots

logger = logging.getLogger("torchdebug.capture.overflow_check")

WINDOW_CALLS = 1024
"""Pending calls at most before a flush resolves them (accelerators only)."""

WINDOW_BYTES = 1 << 30
"""Bytes of tensors held by pending calls at most before a flush resolves them (accelerators only)."""

_StorageKey = tuple[torch.device, int]


def _storage_key(tensor: torch.Tensor) -> _StorageKey | None:
    try:
        return tensor.device, tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no plain storage (sparse, some subclasses)
        return None


def _checked(value: Any) -> bool:
    """Whether an output can hold NaN or Inf and has data to read."""
    return (
        isinstance(value, torch.Tensor)
        and (value.is_floating_point() or value.is_complex())
        and value.layout == torch.strided
        and not value.is_meta
        and value.numel() > 0
    )


class _Call:
    """A checked op call waiting for its flags (on an accelerator, until the next flush)."""

    __slots__ = ("common", "inputs", "outputs", "mutable", "waiting", "overflowed", "done", "nbytes")

    def __init__(self, common: dict[str, Any], inputs: list[Slot], outputs: list[Slot], mutable: bool) -> None:
        self.common, self.inputs, self.outputs, self.mutable = common, inputs, outputs, mutable
        self.waiting = 0
        self.overflowed = False
        self.done = False
        self.nbytes = 0


class OverflowWatch:
    """Checks op calls for NaN/Inf outputs and records the overflowing ones into a session."""

    def __init__(self, session: CaptureSession, limit: int) -> None:
        self.session = session
        self.limit = limit
        """``overflow_nums``: calls to record in the run, -1 for all."""
        self.found = 0
        self._pending: deque[_Call] = deque()
        self._held: dict[_StorageKey, list[tuple[_Call, list[Slot], int]]] = {}
        self._held_bytes = 0

    @property
    def done(self) -> bool:
        """``overflow_nums`` calls are recorded: stop checking."""
        return self.limit != -1 and self.found >= self.limit

    def run(
        self, func: Any, args: tuple, kwargs: dict[str, Any], written: frozenset[str], common: dict[str, Any], *, inputs: bool
    ) -> Any:
        """Run one op call, check its outputs and record it if they overflow (now or at a flush).

        ``written``: top-level argument keys (``"0"``, ``"out"``) the op writes into;
        ``inputs``: whether input slots are recorded (``data_mode``).
        """
        slots = list(iter_slots(args, kwargs)) if inputs or written else []
        if written:
            self._copy_before_write(slots, written)
            slots = [
                (arg, value.clone() if isinstance(value, torch.Tensor) and arg.split(".", 1)[0] in written else value)
                for arg, value in slots
            ]
        out = func(*args, **kwargs)
        outputs = list(iter_slots(out if isinstance(out, (tuple, list)) else (out,)))
        flagged = [value for _, value in outputs if _checked(value)]
        if not flagged:
            return out
        call = _Call(common, slots if inputs else [], outputs, bool(written))
        call.waiting = len(flagged)
        self._pending.append(call)
        for tensor in flagged:
            self.session.stage_overflow_flag(tensor, partial(self._flag, call))
        if not call.done:  # an accelerator: hold the call's tensors until a flush reads its flags
            self._hold(call)
            if len(self._pending) > WINDOW_CALLS or self._held_bytes > WINDOW_BYTES:
                self.session.flush()
        return out

    # -- pending calls -------------------------------------------------------------------------
    def _hold(self, call: _Call) -> None:
        for side in (call.inputs, call.outputs):
            for index, (_, value) in enumerate(side):
                if isinstance(value, torch.Tensor):
                    key = _storage_key(value)
                    if key is not None:
                        self._held.setdefault(key, []).append((call, side, index))
                    call.nbytes += value.numel() * value.element_size()
        self._held_bytes += call.nbytes

    def _copy_before_write(self, slots: Iterable[Slot], written: frozenset[str]) -> None:
        """Copy the tensors pending calls hold in memory this op is about to write."""
        if not self._held:
            return
        for arg, value in slots:
            if isinstance(value, torch.Tensor) and arg.split(".", 1)[0] in written:
                for call, side, index in self._held.pop(_storage_key(value), ()):
                    if not call.done:
                        name, held = side[index]
                        side[index] = (name, held.clone())

    def _flag(self, call: _Call, overflowed: bool) -> None:
        call.overflowed = call.overflowed or overflowed
        call.waiting -= 1
        while self._pending and self._pending[0].waiting == 0:
            ready = self._pending.popleft()
            ready.done = True
            self._held_bytes -= ready.nbytes
            if ready.overflowed and not self.done:
                self._record(ready)
        if not self._pending:
            self._held.clear()

    def _record(self, call: _Call) -> None:
        self.found += 1
        common = {**call.common, "save_tensors": True}
        if call.inputs:
            self.session.add_call(iter(call.inputs), io="input", **common)
        self.session.add_call(iter(call.outputs), io="output", mutated=call.mutable, **common)
        c = call.common
        name = make_name(c["phase"], c["module"], c["op"], c["call"], "output", "").removesuffix("/output")
        log = logger.warning if self.found == 1 else logger.info
        log(
            "%s NaN/Inf of the run, step %d: %s",
            "first" if self.found == 1 else f"#{self.found}",
            self.session.step,
            _where(name, c["phase"], c["module"], c["fwd"], c["source"]),
        )


def _where(call: str, phase: str, module: str, fwd: str | None, source: str | None) -> str:
    where = f"{call} (phase {phase}, module {module})"
    if fwd:
        where += f", gradient of {fwd}"
    if source:
        where += f" from the forward line {source}" if phase == "backward" else f" at {source}"
    else:
        where += ", no source line"
    return where


def _counts(record: Record) -> tuple[int, int]:
    stats = record.stats or {}
    return int(stats.get("nan") or 0), int(stats.get("posinf") or 0) + int(stats.get("neginf") or 0)


def first_overflow(records: Iterable[Record]) -> Record | None:
    """The earliest output slot (by step, then execution order; op records before module records)
    whose statistics count a NaN or an Inf, in any dump with statistics."""
    best: tuple[int, int, int] | None = None
    found = None
    for record in records:
        if record.io in ("output", "parameter_grad") and any(_counts(record)):
            key = (record.step, record.op == MODULE_OP, record.seq)
            if best is None or key < best:
                best, found = key, record
    return found


def describe_overflow(record: Record) -> str:
    """``step 0: backward/fc/aten.mm.default#0 (phase backward, module fc), gradient of ... from the
    forward line t.py:12 in forward: 0 NaN, 4 Inf in output.0``"""
    nan, inf = _counts(record)
    where = _where(record.call_name, record.phase, record.module, record.fwd, record.source)
    slot = f"{record.io}.{record.arg}" if record.arg else record.io
    return f"step {record.step}: {where}: {nan} NaN, {inf} Inf in {slot}"
