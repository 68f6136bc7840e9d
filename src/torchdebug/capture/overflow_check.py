"""Eager overflow check (``task="overflow_check"``): record only the op calls that make a NaN or an Inf.

As in ptdbg, only the calls that make a NaN/Inf (*origins*) or pass on one no checked op made
(*entries*, judged by :mod:`torchdebug.nonfinite`) are recorded, with their tensors, up to
``overflow_nums`` a run. Guide: docs/capture.md; how calls are judged without a host
synchronisation per op: :class:`OverflowWatch`.
"""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Iterable
from functools import partial
from typing import Any, Protocol

import torch

from torchdebug._torch.autograd import tensor_version
from torchdebug._torch.subclasses import describe as describe_subclass
from torchdebug._torch.subclasses import is_subclass
from torchdebug.capture.session import CaptureSession
from torchdebug.nonfinite import (
    ENTRY,
    ORIGIN,
    OriginTracker,
    describe_call,
    tensor_flags,
    value_flags,
)
from torchdebug.records import make_name
from torchdebug.slots import Slot, iter_slots, written_slot
from torchdebug.stats import has_statistics

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


def _plain(value: Any) -> Any:
    """The plain tensor a wrapper subclass's elements are read from (a DTensor's local shard; ``None``
    for one without such a tensor); anything else as it is."""
    if value.__class__ is not torch.Tensor and isinstance(value, torch.Tensor) and is_subclass(value):
        return describe_subclass(value).local
    return value


def _checked(value: Any) -> bool:
    """Whether a plain tensor can hold NaN or Inf and has data to read (packed fp4 pairs are bits
    torch reduces nothing of: ``stats.has_statistics``)."""
    return (
        isinstance(value, torch.Tensor)
        and (value.is_floating_point() or value.is_complex())
        and value.layout == torch.strided
        and not value.is_meta
        and value.numel() > 0
        and has_statistics(value.dtype)
    )


class _Flags:
    """The :mod:`torchdebug.nonfinite` flags of one tensor at one version, once its statistics
    arrived (``flags is None`` until then), with the calls waiting for them."""

    __slots__ = ("ref", "version", "dtype", "flags", "waiting")

    def __init__(self, tensor: torch.Tensor, version: int | None) -> None:
        self.ref = weakref.ref(tensor)
        self.version = version
        self.dtype = tensor.dtype
        self.flags: int | None = None
        self.waiting: list[tuple[_Call, bool]] = []

    def deliver(self, stats: dict[str, Any]) -> None:
        self.flags = tensor_flags(stats, self.dtype)
        waiting, self.waiting = self.waiting, []
        for call, output in waiting:
            call.add(self.flags, output)


class _Call:
    """A checked op call waiting for its flags (on an accelerator, until the next flush)."""

    __slots__ = (
        "common",
        "step",
        "inputs",
        "outputs",
        "mutable",
        "info",
        "identities",
        "waiting",
        "flags_in",
        "flags_out",
        "done",
        "nbytes",
    )

    def __init__(
        self,
        common: dict[str, Any],
        step: int,
        inputs: list[Slot],
        outputs: list[Slot],
        mutable: bool,
        info: OpFacts,
        identities: dict[int, tuple[int, int | None, int | None]],
    ) -> None:
        self.common, self.step, self.inputs, self.outputs, self.mutable = common, step, inputs, outputs, mutable
        self.info = info  # its unread slots: described, not read, when it is recorded
        self.identities = identities  # of the copies among its inputs: the written tensors' before the call
        self.waiting = 0
        self.flags_in = self.flags_out = 0
        self.done = False
        self.nbytes = 0

    def add(self, flags: int, output: bool) -> None:
        if output:
            self.flags_out |= flags
        else:
            self.flags_in |= flags
        self.waiting -= 1


class OpFacts(Protocol):
    """What :meth:`OverflowWatch.run` reads of an op (the eager capture's ``OpInfo`` has it)."""

    @property
    def written(self) -> frozenset[str]: ...

    @property
    def unread_inputs(self) -> dict[str, str]: ...

    @property
    def unread_outputs(self) -> dict[str, str]: ...

    @property
    def unmoved(self) -> bool: ...


class OverflowWatch:
    """Checks op calls for the NaN/Inf they make and records those calls into a session.

    Every selected op call (forward, backward and optimizer) has the statistics of its floating
    inputs and outputs taken on their own device (the session's device table, as for
    ``task="statistics"``; a tensor already judged at its current version is not read again).
    Inputs are the values the call saw: an in-place op's written inputs are copied before it runs.
    Collectives (``c10d`` ops) are not checked: their outputs are complete only once waited for.
    Ops that write an infinity they were given (a ``-inf`` attention mask) or pass one on are neither
    origins nor entries. After ``overflow_nums`` recorded calls, ops run unchecked.

    On the CPU the statistics are read at once: a call is judged right after it runs, nothing held.
    On an accelerator reading them would synchronise at every op, so judgement waits for the
    session's next flush, in execution order. Until then a checked call is *pending* and holds its
    tensors; before an in-place op writes into memory a pending call holds (same storage), the held
    tensor is copied (copy on write). Pending calls are bounded: beyond :data:`WINDOW_CALLS` calls or
    :data:`WINDOW_BYTES` bytes held, the session flushes (one synchronisation per window, not per
    op); ``stop`` and ``step`` flush the rest. The cost: held tensors live until their window
    resolves, and origins beyond ``overflow_nums`` in the last window were checked though not
    recorded. The run's first origin is logged with its call name, phase, module and source line.
    """

    def __init__(self, session: CaptureSession, limit: int) -> None:
        self.session = session
        self.limit = limit
        """``overflow_nums``: calls to record in the run, -1 for all."""
        self.found = 0
        self._pending: deque[_Call] = deque()
        self._held: dict[_StorageKey, list[tuple[_Call, list[Slot], int]]] = {}
        self._held_bytes = 0
        self._flags: dict[int, _Flags] = {}
        """Tensors judged in this step, by ``id``: an earlier op's output read again is not reduced again."""
        self._new: list[tuple[torch.Tensor, Any]] = []
        self._step = session.step
        self._tracker = OriginTracker()
        self._tracker_step = session.step

    @property
    def done(self) -> bool:
        """``overflow_nums`` calls are recorded: stop checking."""
        return self.limit != -1 and self.found >= self.limit

    def run(self, func: Any, args: tuple, kwargs: dict[str, Any], info: OpFacts, common: dict[str, Any], *, inputs: bool) -> Any:
        """Run one op call, judge it and record it if it makes a NaN/Inf (now or at a flush).

        ``info``: the eager capture's facts of the op: ``written``, the top-level argument keys
        (``"0"``, ``"out"``) it writes into; ``unread_inputs`` and ``unread_outputs``, the slots
        holding no value of the run (an allocation's garbage, a buffer before it is written), which
        are not judged, nor are views of such memory that nothing has written yet (the session's
        ``unwritten``); ``inputs``: whether input slots are recorded (``data_mode``).
        """
        unwritten = self.session.unwritten
        if "*" in info.unread_outputs:  # an allocation makes no value: its garbage NaN is no overflow
            out = func(*args, **kwargs)
            unwritten.add(value for _, value in iter_slots(out if isinstance(out, (tuple, list)) else (out,)))
            return out
        if self.session.step != self._step:
            self._step = self.session.step
            self._flags.clear()
        written, unread = info.written, info.unread_inputs
        slots = list(iter_slots(args, kwargs))
        before = []
        for arg, value in slots:
            if not _checked(plain := _plain(value)):
                continue
            if unread and arg.partition(".")[0] in unread:
                unwritten.written(plain)  # the op writes it: it holds values from now on
            elif not (unwritten and unwritten.why(plain)):  # a view of a buffer nothing wrote yet holds none
                # (a subclass's plain tensor is judged afresh: its handlers write it below autograd, moving no version)
                before.append(self._flags_of(plain, fresh=plain is not value))
        self._stage_new()  # before the op: an in-place op changes its inputs
        identities: dict[int, tuple[int, int | None, int | None]] = {}
        if written:  # inputs as they were: copies, which stand for the written tensors before the call
            self._copy_before_write(slots, written)
            targets = [value for arg, value in slots if written_slot(arg, value, written)]
            versions = [tensor_version(value) for value in targets]
            slots = [(arg, self._copy(value, identities) if written_slot(arg, value, written) else value) for arg, value in slots]
        out = func(*args, **kwargs)
        if written:  # a write torch does not count (a _foreach_ op's under a mode) counts in the records' versions
            self.session.wrote(targets, versions, info.unmoved)
        if out is None and written:  # an in-place op that returns nothing (``_foreach_mul_``): what it wrote, it made
            outputs = [(arg, value) for arg, value in iter_slots(args, kwargs) if written_slot(arg, value, written)]
        else:
            outputs = list(iter_slots(out if isinstance(out, (tuple, list)) else (out,)))
        if written and unwritten:  # an in-place op's written argument holds values from now on
            for _, value in outputs:
                if isinstance(value, torch.Tensor):
                    unwritten.written(value)
        checked = [
            plain
            for arg, value in outputs
            if _checked(plain := _plain(value)) and arg not in info.unread_outputs and not (unwritten and unwritten.why(plain))
        ]
        if not checked:
            return out
        call = _Call(common, self._step, slots if inputs else [], outputs, bool(written), info, identities)
        for _, value in slots:
            if not isinstance(value, torch.Tensor):
                call.flags_in |= value_flags(value)
        after = [self._flags_of(value, fresh=True, mutated=bool(written)) for value in checked]
        self._stage_new()
        self._pending.append(call)
        for side, output in ((before, False), (after, True)):
            for flags in side:
                call.waiting += 1
                if flags.flags is None:
                    flags.waiting.append((call, output))
                else:
                    call.add(flags.flags, output)
        if call.waiting:  # an accelerator: hold the call's tensors until a flush reads its flags
            self._hold(call)
            if len(self._pending) > WINDOW_CALLS or self._held_bytes > WINDOW_BYTES:
                self.session.flush()
        self._judge_ready()
        return out

    # -- flags ---------------------------------------------------------------------------------
    def _flags_of(self, tensor: torch.Tensor, *, fresh: bool, mutated: bool = False) -> _Flags:
        """The flags of ``tensor`` as it is now: reused when it was judged at this version (not for
        ``fresh`` outputs), else staged with the next :meth:`_stage_new`."""
        # After an in-place op returns, autograd bumps the version once more (as in the session).
        version = tensor_version(tensor)
        version = None if version is None else version + (1 if mutated else 0)
        compiled = self.session.in_compiled_code  # (inductor's kernels write there unseen)
        known = None if fresh or compiled or version is None else self._flags.get(id(tensor))
        if known is not None and known.ref() is tensor and known.version == version:
            return known
        flags = _Flags(tensor, version)
        if version is not None and not compiled:  # an inference tensor is judged at each op: its writes leave no trace
            self._flags[id(tensor)] = flags
        self._new.append((tensor, partial(self._deliver, flags)))
        return flags

    def _copy(self, tensor: torch.Tensor, identities: dict[int, tuple[int, int | None, int | None]]) -> torch.Tensor:
        """A copy of ``tensor`` (a call is about to write it), whose records are ``tensor``'s as it is now."""
        copy = tensor.clone()
        identities[id(copy)] = self.session.values.identity(tensor)
        return copy

    def _stage_new(self) -> None:
        new, self._new = self._new, []
        self.session.stage_stats(new)

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
            if written_slot(arg, value, written):
                for call, side, index in self._held.pop(_storage_key(value), ()):
                    if not call.done:
                        name, held = side[index]
                        side[index] = (name, held.clone())

    def _deliver(self, flags: _Flags, stats: dict[str, Any]) -> None:
        flags.deliver(stats)
        self._judge_ready()

    def _judge_ready(self) -> None:
        """Judge the calls whose flags arrived, in execution order (on an accelerator the session's
        flush delivers them)."""
        while self._pending and self._pending[0].waiting == 0:
            call = self._pending.popleft()
            call.done = True
            self._held_bytes -= call.nbytes
            if call.step != self._tracker_step:
                self._tracker, self._tracker_step = OriginTracker(), call.step
            kind = self._tracker.judge(call.flags_in, call.flags_out)
            if kind in (ORIGIN, ENTRY) and not self.done:
                self._record(call, kind)
        if not self._pending:
            self._held.clear()

    def _record(self, call: _Call, kind: str) -> None:
        self.found += 1
        common = {**call.common, "save_tensors": True}
        if call.inputs:
            unread = call.info.unread_inputs
            self.session.add_call(iter(call.inputs), io="input", unread=unread, identities=call.identities, **common)
        bumps = call.mutable and not call.info.unmoved  # (an unmoved write is counted by ``CaptureSession.wrote``)
        self.session.add_call(
            iter(call.outputs), io="output", mutated=call.mutable, unread=call.info.unread_outputs, bumps=bumps, **common
        )
        c = call.common
        name = make_name(c["phase"], c["module"], c["op"], c["call"], "output", "").removesuffix("/output")
        log_found(self.found, call.step, describe_call(name, c["phase"], c["module"], c["fwd"], c["source"]), kind)


def log_found(found: int, step: int, call: str, kind: str) -> None:
    """Log the ``found``-th call of the run that made a NaN/Inf (``kind`` :data:`~torchdebug.nonfinite.ORIGIN`)
    or passed one on (an entry), ``call`` as ``nonfinite.describe_call`` says it: the first as a warning."""
    log = logger.warning if found == 1 else logger.info
    what = "made a NaN/Inf" if kind == ORIGIN else "passes on a NaN no checked op of the step made"
    log("%s NaN/Inf of the run, step %d: %s %s", "first" if found == 1 else f"#{found}", step, call, what)
