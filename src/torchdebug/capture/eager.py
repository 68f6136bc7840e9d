"""Eager op capture: a ``TorchDispatchMode`` that records every aten op call.

Capturing at the dispatcher sees every op, however it was called (``torch.relu``, ``x.relu()``,
``from torch import relu``, ``F.linear``), with no list of functions to patch. The mode sets
``ignore_compile_internals``: compiled functions called while it is active stay compiled and are
not recompiled.

Phases: an op runs in ``backward`` when the autograd engine is executing a node
(see ``torchdebug._torch.autograd``), in ``optimizer`` between an optimizer's step pre- and
post-hooks, else in ``forward``. A closure given to ``optimizer.step(closure)`` (LBFGS; Lightning's
automatic optimisation runs every training step that way) computes the loss and its gradients: the
pre-hook wraps it so that its ops are forward and backward ops, named as in a loop that runs them
before the step. A backward op is attributed to the module, source line and call of the forward op
that created its autograd node, found through the node's sequence number. Ops of ``AccumulateGrad``
nodes take the parameter's path (``layers.0.fc.weight``) as module, so their names do not depend on
the order in which gradients arrive. Ops that activation checkpointing runs again inside the
backward are phase ``recompute``, named after their own module and source line and counted apart,
so the backward's call numbers are those of a run without checkpointing (``recompute.py``).
Collectives (``c10d`` and ``_c10d_functional`` ops) record their outputs once their work completes,
and no slot reads a tensor a functional collective is still writing into (an ``AsyncCollectiveTensor``
included) before it completes (``collectives.py``); FSDP2's collectives are named after the module
whose parameters they gather or whose gradients they reduce.
With ``task="overflow_check"`` every selected call is checked for the NaN/Inf it makes and only
those calls are recorded (``overflow_check.py``, ``nonfinite.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from torchdebug._torch.autograd import current_autograd_node, next_sequence_nr, node_sequence_nr
from torchdebug._torch.checkpoint import BOOKKEEPING_OPS, RecomputeDetector, bookkeeping
from torchdebug._torch.dispatch import TorchDispatchMode, op_schema
from torchdebug._torch.fsdp import unshard_buffers
from torchdebug._torch.funcol import async_tensor_class, inner_tensor, unwaited, waits_before
from torchdebug._torch.subclasses import is_subclass
from torchdebug.capture.collectives import (
    PendingCollectives,
    PendingFunctional,
    collective_owner,
    split_result,
    waited_by_caller,
)
from torchdebug.capture.filters import NameMatcher, RangeGate
from torchdebug.capture.modules import ModuleTracker
from torchdebug.capture.overflow_check import OverflowWatch
from torchdebug.capture.recompute import RECOMPUTE, ForwardCall, RebuiltTensors, Replay
from torchdebug.capture.session import CaptureSession
from torchdebug.capture.stacks import StackRecorder
from torchdebug.records import NO_MODULE, UNINITIALISED, allocates, make_call_name
from torchdebug.slots import Slot, iter_slots

_VALUE_PRESERVING = frozenset({"aten.clone.default", "aten.contiguous.default"})
"""Ops whose output is a copy of their first input (statistics reused; the copy is saved anew)."""


_STRIDED = torch.strided
"""Layouts are singletons: compared by identity on the hot path."""


_COPY_IN = "fsdp.all_gather_copy_in.default"
_OVERWRITTEN = {"aten.copy_.default": "self", _COPY_IN: "all_gather_output"}
"""Arguments these ops write without reading (besides ``out=`` buffers and the c10d collectives'
``output*`` tensors): ``copy_``'s destination, FSDP2's all-gather buffer (its schema does not even
mark it written). Their values before the op are none of the run's: garbage from ``torch.empty``."""

_PARTLY_WRITTEN = {_COPY_IN: "1"}
"""Outputs (by index) that hold a buffer the op writes only part of: FSDP2's copy-in writes this
rank's shards into the all-gather's buffer, and the all-gather the rest."""

_SKIPPED_NAMESPACES = frozenset({"profiler"})
"""``profiler._record_function_*``: bookkeeping of ``record_function`` blocks, no tensor data."""

_WAIT = "_c10d_functional.wait_tensor.default"
_NOT_FUNCTIONAL_COLLECTIVES = frozenset({_WAIT, "_c10d_functional._wrap_tensor_autograd.default"})
"""``_c10d_functional`` ops that start no collective: the wait, and the ``AsyncCollectiveTensor`` wrapping."""


class _OpInfo(NamedTuple):
    """What the hot path needs to know of an op overload, looked up once per overload."""

    overload: Any
    """The op overload itself, held so that its ``id`` (the key it is looked up by) stays its own."""
    name: str
    """``aten.mm.default``."""
    skipped: bool
    mutable: bool
    """The op writes into one of its arguments (in-place or ``out=`` ops)."""
    collective: bool
    """A ``c10d`` or ``_c10d_functional`` collective: outputs are recorded once its work completes."""
    functional: bool
    """A ``_c10d_functional`` collective: its outputs are final after a ``wait_tensor`` on them."""
    waits: bool
    """``_c10d_functional.wait_tensor``: its argument is final once it returns."""
    view: bool
    """The first argument is aliased, not written (what ``AsyncCollectiveTensor`` lets run unwaited)."""
    value_preserving: bool
    detach: bool
    """``aten.detach``: autograd makes one when it unpacks a saved tensor."""
    bookkeeping: bool
    """An op activation checkpointing also runs for its own bookkeeping in the forward."""
    written: frozenset[str]
    """Top-level argument keys (position ``"0"`` and name ``"self"``) the op writes into."""
    unread_inputs: dict[str, str]
    """Top-level argument keys of the arguments it writes without reading, and why (``overwritten``):
    described, not read (``CaptureSession.add_call``'s ``unread``)."""
    unread_outputs: dict[str, str]
    """Output keys (``"*"``: all) holding values it did not make: an allocation's (``uninitialised``),
    a buffer it writes only part of (``partly written``)."""
    unshards: bool
    """FSDP2's copy-in: its parameter group is unsharding into buffers that hold no value yet."""
    grouped: bool
    """A collective or one of FSDP2's own ops (namespace ``fsdp``: its copy-in and copy-out): run by
    an FSDP2 parameter group, it belongs to the group's module and pass (``collective_owner``); the
    group's hooks may run on a wrapper (``checkpoint_wrapper``) before the module tracker enters
    the module it wraps."""


def _op_info(func: Any) -> _OpInfo:
    name = str(func)
    namespace = func.namespace
    schema = op_schema(func)
    functional = namespace == "_c10d_functional" and name not in _NOT_FUNCTIONAL_COLLECTIVES
    first = schema.arguments[0].alias_info if schema.arguments else None
    written = frozenset(
        key
        for index, argument in enumerate(schema.arguments)
        if argument.alias_info is not None and argument.alias_info.is_write
        for key in (str(index), argument.name)
    )
    overwritten = {
        key: "overwritten"
        for index, argument in enumerate(schema.arguments)
        if (argument.name == "out" and argument.alias_info is not None and argument.alias_info.is_write)
        or (namespace == "c10d" and argument.name.startswith("output"))
        or _OVERWRITTEN.get(name) == argument.name
        for key in (str(index), argument.name)
    }
    made = {"*": UNINITIALISED} if allocates(name) else {}
    if name in _PARTLY_WRITTEN:
        made[_PARTLY_WRITTEN[name]] = "partly written"
    return _OpInfo(
        func,
        name,
        namespace in _SKIPPED_NAMESPACES,
        schema.is_mutable,
        namespace == "c10d" or functional,
        functional,
        name == _WAIT,
        first is not None and not first.is_write,
        name in _VALUE_PRESERVING,
        name == "aten.detach.default",
        name in BOOKKEEPING_OPS,
        written,
        overwritten,
        made,
        name == _COPY_IN,
        namespace in ("c10d", "fsdp") or functional,
    )


def _wrapper(tensor: torch.Tensor) -> bool:
    """A wrapper subclass (DTensor, ...): its storage is not its elements'."""
    return tensor.__class__ is not torch.Tensor and is_subclass(tensor)


class _DumpMode(TorchDispatchMode):
    def __init__(self, capture: OpCapture) -> None:
        super().__init__()
        self._capture = capture

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return self._capture.on_op(func, args, kwargs or {})


class OpCapture:
    """Records the aten ops of one step into a :class:`CaptureSession`."""

    def __init__(
        self,
        session: CaptureSession,
        tracker: ModuleTracker,
        *,
        phases: frozenset[str],
        ios: frozenset[str],
        names: list[str],
        call_range: list[str],
        stack: str | list[str],
    ) -> None:
        self.session = session
        self.tracker = tracker
        self.phases = phases | {RECOMPUTE} if "forward" in phases else phases
        """Recomputed ops are forward ops: recorded when the forward is."""
        self._backward_wanted = "backward" in phases
        self.ios = ios
        self._inputs = "input" in ios
        self._outputs = "output" in ios
        self.names = NameMatcher(names)
        self._any_names = bool(names)
        self.range = RangeGate(call_range)
        self._stack_all = stack == "all"
        self.stack_range = RangeGate(stack) if isinstance(stack, list) else None
        self.stacks = StackRecorder()
        self._stack_added: str | None = None
        """The id of the stack last handed to the session: ops of one line share it, and the session
        keeps each id once anyway."""
        self._ops: dict[int, _OpInfo] = {}
        """Keyed by ``id(overload)``: an overload's ``__hash__`` is a Python call."""
        self._calls: dict[tuple[str, str, str], int] = {}
        self._log: list[ForwardCall] = []
        """The step's forward calls, in order (recomputed ops are paired with them)."""
        self._forward: dict[int, ForwardCall] = {}
        """Forward calls keyed by the autograd sequence number of the node they made."""
        self._recomputing = RecomputeDetector()
        self._replay = Replay()
        self._rebuilt = RebuiltTensors()
        self._in_optimizer = 0
        self._collectives = PendingCollectives()
        self._functional = PendingFunctional()
        self._async_class: type | None = None
        """``AsyncCollectiveTensor``, once something imported functional collectives."""
        self._overflow = OverflowWatch(session, session.overflow_nums) if session.overflow_nums is not None else None
        self._mode: _DumpMode | None = None
        self._handles: list[Any] = []

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> None:
        self._handles = [
            register_optimizer_step_pre_hook(self._optimizer_enter),
            register_optimizer_step_post_hook(self._optimizer_exit),
        ]
        self._mode = _DumpMode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        self._collectives.finish()
        self.stacks.clear()
        self._recomputing.reset()
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        self._functional.finish()  # its waits are torchdebug's own: not recorded
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._in_optimizer = 0

    def next_step(self) -> None:
        self._calls.clear()
        self._log.clear()
        self._forward.clear()
        self._replay.reset()
        self._rebuilt.clear()
        self.range.reset()
        if self.stack_range is not None:
            self.stack_range.reset()

    def _optimizer_enter(self, optimizer: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        self._in_optimizer += 1
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._outside_optimizer(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer itself
            return (args[0], self._outside_optimizer(args[1]), *args[2:]), kwargs
        return None

    def _outside_optimizer(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure``, run with the optimizer phase suspended (its forward is a forward)."""

        def run() -> Any:
            depth, self._in_optimizer = self._in_optimizer, 0
            try:
                return closure()
            finally:
                self._in_optimizer = depth

        return run

    def _optimizer_exit(self, *_: Any) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)

    @staticmethod
    def _alias_source(info: _OpInfo, args: tuple, out: Any) -> tuple[torch.Tensor, bool, bool] | None:
        """``(input, same_elements, shares_memory)`` when ``out`` shares the memory of the first
        input (a view) or holds exactly its elements (a clone); ``None`` otherwise."""
        if info.mutable or not (isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor)):
            return None
        source = args[0]
        if out.layout is not _STRIDED or source.layout is not _STRIDED or _wrapper(out) or _wrapper(source):
            return None
        if info.value_preserving:
            return (source, True, False) if out.numel() == source.numel() and out.dtype is source.dtype else None
        if out.device != source.device or out.untyped_storage().data_ptr() != source.untyped_storage().data_ptr():
            return None
        return source, out.numel() == source.numel() and out.dtype is source.dtype, True

    # -- the hot path --------------------------------------------------------------------------
    def on_op(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        info = self._ops.get(id(func))
        if info is None:
            info = self._ops[id(func)] = _op_info(func)
        if info.skipped or self.session.busy:  # busy: the session's own ops, from a module or gradient hook
            return func(*args, **kwargs)
        if info.unshards:  # the buffers this unshard fills were freed at reshard and handed out again
            self.session.unwritten.add(unshard_buffers(sys._getframe(1)))
        if self._overflow is not None and (self._overflow.done or info.collective or info.waits):
            return func(*args, **kwargs)
        op = info.name
        fwd = None
        captured = None
        paired = None
        rebuilt = None
        node = current_autograd_node()
        if node is None:
            if self._in_optimizer:
                phase = "optimizer"
                module = NO_MODULE
            else:  # activation checkpointing's own ops (detaching what it keeps) are not the model's
                phase = RECOMPUTE if info.bookkeeping and bookkeeping() else "forward"
                module = self.tracker.current()
        elif info.detach and (rebuilt := self._rebuilt.module_of(args[0] if args else None)) is not None:
            phase = RECOMPUTE  # autograd unpacks a tensor the checkpoint rebuilt or kept
            module = rebuilt
        elif not self._recomputing(node, info.detach):
            phase = "backward"
            forward_info = self._forward.get(node_sequence_nr(node))
            if forward_info is not None:
                module, fwd, captured, _, _ = forward_info
            else:  # gradient accumulation into a parameter is named after the parameter
                variable = getattr(node, "variable", None)
                path = self.tracker.parameter_path(variable) if variable is not None else None
                module = path or NO_MODULE
        else:
            phase = RECOMPUTE
            module = self.tracker.current()
            if not info.detach:  # detaches are checkpoint's own (see RebuiltTensors)
                paired = self._replay.pair(node, op, module, self._log, self._forward)
            if paired is not None:
                module, fwd = paired[0], paired[1]
        if info.grouped and (owner := collective_owner(self.tracker.name_of)) is not None:
            phase = owner[0] or phase  # an FSDP2 group's collective or copy: its module, in the pass it runs for
            module, fwd, captured = owner[1], None, None
        rebuilds = phase == RECOMPUTE and info.detach and rebuilt is None
        key = (phase, module, op)
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        call_name = make_call_name(phase, module, op, call)

        selected = phase in self.phases and self.range.check(call_name) and (not self._any_names or self.names(call_name))
        want_stack = self._stack_all or (self.stack_range is not None and self.stack_range.check(call_name))
        if phase != "backward" and want_stack and (selected or self._backward_wanted):
            captured = self.stacks.capture()
        # The node this op creates (if any) took the sequence number just before the next one.
        if phase == "forward":
            entry = (module, call_name, captured, op, len(self._log))
            self._log.append(entry)
            self._forward.setdefault(next_sequence_nr() - 1, entry)
        elif phase == RECOMPUTE and not info.detach:  # a reentrant checkpoint backwards through the nodes made here
            self._forward.setdefault(next_sequence_nr() - 1, paired or (module, call_name, captured, op, None))
        stack_id = source = None
        if captured is not None and want_stack:
            stack_id, frames, source = captured
            if selected and stack_id != self._stack_added:
                self.session.add_stack(stack_id, frames)
                self._stack_added = stack_id

        if self._collectives:
            self._collectives.capture_completed()
        if self._functional:
            self._functional.capture_completed()
        if not selected:
            out = func(*args, **kwargs)
            if rebuilds:
                self._rebuilt.add(out, module)
            if info.functional:
                self._functional.writes(split_result(op, args, out)[1])
            elif info.waits and self._functional:
                self._functional.complete(out)
            return out
        session = self.session
        seq = session.next_seq()
        save = session.wants_tensor(call_name)
        if self._async_class is None:
            self._async_class = async_tensor_class()
        if self._overflow is not None or info.collective or self._async_class is not None:
            common = dict(
                phase=phase, module=module, op=op, call=call, seq=seq, save_tensors=save, stack=stack_id, source=source, fwd=fwd
            )
            return self._run_watched(func, args, kwargs, info, common, rebuilds)
        # The common case (no collective ever): keywords spelt out (no dict built and unpacked per call).
        if self._inputs:
            session.add_call(
                iter_slots(args, kwargs),
                phase=phase,
                module=module,
                op=op,
                call=call,
                seq=seq,
                io="input",
                save_tensors=save,
                stack=stack_id,
                source=source,
                fwd=fwd,
                unread=info.unread_inputs,
            )
        out = func(*args, **kwargs)
        if rebuilds:
            self._rebuilt.add(out, module)
        alias = self._alias_source(info, args, out)
        if alias is not None:
            session.share_alias(out, *alias)
        if self._outputs:
            session.add_call(
                iter_slots(out if isinstance(out, (tuple, list)) else (out,)),
                phase=phase,
                module=module,
                op=op,
                call=call,
                seq=seq,
                io="output",
                save_tensors=save,
                mutated=info.mutable,
                stack=stack_id,
                source=source,
                fwd=fwd,
                unread=info.unread_outputs,
            )
        return out

    def _await_collectives(self, info: _OpInfo, args: tuple, kwargs: dict[str, Any]) -> None:
        """Before a call reads an ``AsyncCollectiveTensor`` not yet waited for (itself or inside a
        DTensor): wait for it as its own dispatch is about to, or, for a view (which it lets run
        unwaited), hold the slots on its storage back until the collective completes."""
        found = [
            waiting
            for _, value in iter_slots(args, kwargs)
            if value.__class__ is not torch.Tensor and isinstance(value, torch.Tensor)
            for waiting in unwaited(value, self._async_class)
        ]
        if info.view:
            self._functional.writes(map(inner_tensor, found))
            return
        for waiting in found:
            waits_before(waiting)
            if self._functional:
                self._functional.complete(inner_tensor(waiting))

    def _run_watched(
        self, func: Any, args: tuple, kwargs: dict[str, Any], info: _OpInfo, common: dict[str, Any], rebuilds: bool
    ) -> Any:
        """Run a selected call of an overflow check, of a collective (whose outputs wait for its work),
        or any call once functional collectives are in use: slots on the storage of one in flight
        wait for it, a wait's argument is read once it returns."""
        if self._async_class is not None:
            self._await_collectives(info, args, kwargs)
        if self._overflow is not None:
            return self._overflow.run(func, args, kwargs, info, common, inputs=self._inputs)
        session = self.session
        if info.waits:
            out = func(*args, **kwargs)
            self._functional.complete(out)
        if self._inputs:
            self._add(iter_slots(args, kwargs), common, io="input", unread=info.unread_inputs)
        if not info.waits:
            out = func(*args, **kwargs)
        if rebuilds:
            self._rebuilt.add(out, common["module"])
        if info.collective:
            works, outputs = split_result(info.name, args, out)
            if info.functional:
                self._functional.writes(outputs)
            if self._outputs:
                capture = partial(session.add_call, io="output", mutated=True, unread=info.unread_outputs, **common)
                if info.functional:
                    capture(self._functional.hold(iter_slots(outputs), capture))
                else:
                    self._collectives.add(works, waited_by_caller(func, args, kwargs), outputs, capture)
            return out
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        if self._async_class is not None:  # a view of an unwaited AsyncCollectiveTensor, or a new one
            self._functional.writes(
                inner_tensor(waiting)
                for value in outputs
                if isinstance(value, torch.Tensor) and value.__class__ is not torch.Tensor
                for waiting in unwaited(value, self._async_class)
            )
        alias = self._alias_source(info, args, out)
        if alias is not None:
            session.share_alias(out, *alias)
        if self._outputs:
            self._add(iter_slots(outputs), common, io="output", mutated=info.mutable, unread=info.unread_outputs)
        return out

    def _add(self, slots: Iterator[Slot], common: dict[str, Any], **side: Any) -> None:
        """Record one side of a call; slots on a storage a functional collective still writes into
        are recorded once it completes."""
        capture = partial(self.session.add_call, **side, **common)
        capture(self._functional.hold(slots, capture) if self._functional else slots)
