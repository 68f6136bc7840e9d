"""Eager op capture: a ``TorchDispatchMode`` that records every aten op call.

Capturing at the dispatcher sees every op, however it was called (``torch.relu``, ``x.relu()``,
``F.linear``), with no list of functions to patch; ``ignore_compile_internals`` leaves compiled
functions compiled. :class:`OpCapture` gives each call its phase, module and source line (a backward
op its forward's, by autograd sequence number) and hands it to the session; recomputation,
collectives and the overflow check are rooms of their own (``recompute.py``, ``collectives.py``,
``overflow_check.py``). Step by step: docs/architecture.md, "Eager capture, step by step".
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, NamedTuple

import torch
from torch.autograd.function import BackwardCFunction
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from torchdebug._torch.autograd import current_autograd_node, next_sequence_nr, node_sequence_nr, tensor_version
from torchdebug._torch.checkpoint import BOOKKEEPING_OPS, RecomputeDetector, bookkeeping
from torchdebug._torch.dispatch import TorchDispatchMode, moves_versions, op_schema
from torchdebug._torch.frames import in_compiled_code
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
from torchdebug.capture.recompute import RECOMPUTE, ForwardCall, RebuiltTensors, RecomputePairing
from torchdebug.capture.session import PLAIN_TENSORS, CaptureSession
from torchdebug.capture.stacks import StackRecorder
from torchdebug.records import NO_MODULE, UNINITIALISED, allocates, make_call_name
from torchdebug.slots import Slot, iter_slots, written_slot

_CLONE = "aten.clone.default"
_VALUE_PRESERVING = frozenset({_CLONE, "aten.contiguous.default"})
"""Ops whose output is a copy of their first input (statistics reused; the copy is saved anew)."""


_STRIDED = torch.strided
"""Layouts are singletons: compared by identity on the hot path."""


COPY_IN = "fsdp.all_gather_copy_in.default"
"""FSDP2's copy-in: where its unshard hands out buffers that hold no value yet (``_torch.fsdp.unshard_buffers``)."""
_OVERWRITTEN = {"aten.copy_.default": "self", COPY_IN: "all_gather_output"}
"""Arguments these ops write without reading (besides ``out=`` buffers and the c10d collectives'
``output*`` tensors): ``copy_``'s destination, FSDP2's all-gather buffer (its schema does not even
mark it written). Their values before the op are none of the run's: garbage from ``torch.empty``."""

_PARTLY_WRITTEN = {COPY_IN: "1"}
"""Outputs (by index) that hold a buffer the op writes only part of: FSDP2's copy-in writes this
rank's shards into the all-gather's buffer, and the all-gather the rest."""

_UNDECLARED_WRITES = {
    f"aten.{name}.default": ((3, "running_mean"), (4, "running_var"))
    for name in ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm")
}
"""Arguments ops write that their schema does not mark written: BatchNorm's kernels update the
running statistics in place when ``training`` (argument 5) is true, and torch moves no version for
it. ``native/observer.cpp`` holds the same list (``undeclared_writes``)."""
_TRAINING = (5, "training")

_WORKSPACES = {
    "aten.mkldnn_rnn_layer.default": "3",
    "aten._cudnn_rnn.default": "3",
    "aten.miopen_rnn.default": "3",
    "aten.cudnn_batch_norm.default": "3",
}
"""Outputs (by index) that are a kernel's workspace for its backward (an RNN's reserve, cuDNN
BatchNorm's): scratch laid out by the library, partly never written, so two identical runs hold
other bytes there. Uninitialised, as an allocation's output: not read, nor where the backward reads it."""

_SKIPPED_NAMESPACES = frozenset({"profiler"})
"""``profiler._record_function_*``: bookkeeping of ``record_function`` blocks, no tensor data."""

_WAIT = "_c10d_functional.wait_tensor.default"
_NOT_FUNCTIONAL_COLLECTIVES = frozenset({_WAIT, "_c10d_functional._wrap_tensor_autograd.default"})
"""``_c10d_functional`` ops that start no collective: the wait, and the ``AsyncCollectiveTensor`` wrapping."""


class OpInfo(NamedTuple):
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
    makes_views: bool
    """Its outputs are views of its first argument (an alias, not a write, in its returns' schema):
    they share its version counter once the op returns (``value_ids.py``)."""
    value_preserving: bool
    detach: bool
    """``aten.detach``: autograd makes one when it unpacks a saved tensor."""
    bookkeeping: bool
    """An op activation checkpointing also runs for its own bookkeeping in the forward."""
    written: frozenset[str]
    """Top-level argument keys (position ``"0"`` and name ``"self"``) the op writes into (its schema's
    and ``_UNDECLARED_WRITES``)."""
    written_if: tuple[int, str] | None
    """The bool argument (position, name) without which the op writes nothing (BatchNorm's ``training``)."""
    unmoved: bool
    """Torch moves no version for what the op writes (``_torch.dispatch.moves_versions``), so
    ``CaptureSession.wrote`` counts the write."""
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


def op_info(func: Any) -> OpInfo:
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
    ) | {key for index, argument in _UNDECLARED_WRITES.get(name, ()) for key in (str(index), argument)}
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
    if name in _WORKSPACES:
        made[_WORKSPACES[name]] = UNINITIALISED
    return OpInfo(
        func,
        name,
        namespace in _SKIPPED_NAMESPACES,
        schema.is_mutable,
        namespace == "c10d" or functional,
        functional,
        name == _WAIT,
        first is not None and not first.is_write,
        any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns),
        name in _VALUE_PRESERVING,
        name == "aten.detach.default",
        name in BOOKKEEPING_OPS,
        written,
        _TRAINING if name in _UNDECLARED_WRITES else None,
        bool(written) and not moves_versions(func),
        overwritten,
        made,
        name == COPY_IN,
        namespace in ("c10d", "fsdp") or functional,
    )


def _wrapper(tensor: torch.Tensor) -> bool:
    """A wrapper subclass (DTensor, ...): its storage is not its elements'."""
    return tensor.__class__ is not torch.Tensor and is_subclass(tensor)


def _wrapped(values: Iterable[Any]) -> list[torch.Tensor]:
    """The instances of tensor subclasses among ``values`` (an ``AsyncCollectiveTensor``, a DTensor):
    the only ones that may hold a collective's result not yet waited for."""
    return [value for value in values if value.__class__ not in PLAIN_TENSORS and isinstance(value, torch.Tensor)]


_VALUE = operator.itemgetter(1)
"""A slot's value."""


def _argument(key: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The argument at ``key``: a position (``"0"``) or a name."""
    return (args[int(key)] if int(key) < len(args) else None) if key.isdigit() else kwargs.get(key)


def _written(info: OpInfo, args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a call writes: its written arguments, each tensor of a list (none where the
    flag it writes under is off: BatchNorm in eval)."""
    if info.written_if is not None:
        index, name = info.written_if
        if not (kwargs[name] if name in kwargs else _argument(str(index), args, kwargs)):
            return []
    found: dict[int, torch.Tensor] = {}
    for key in info.written:
        value = _argument(key, args, kwargs)
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(tensor, torch.Tensor):
                found[id(tensor)] = tensor
    return list(found.values())


def _makes_node(args: tuple) -> bool:
    """Whether a call with ``args`` made an autograd node: grad mode is on and a tensor argument (or one
    in a list of them) needs a gradient."""
    if not torch.is_grad_enabled():
        return False
    tensors = (item for arg in args for item in (arg if isinstance(arg, (list, tuple)) else (arg,)))
    return any(isinstance(tensor, torch.Tensor) and tensor.requires_grad for tensor in tensors)


def _versions(tensors: list[torch.Tensor]) -> list[int | None]:
    return [tensor_version(tensor) for tensor in tensors]


_CallNames = tuple[str, str, str, int, int, bool, "str | None", "str | None", "str | None"]
"""What every record of a selected call shares: ``(phase, module, op, call, seq, save_tensors,
stack, source, fwd)`` (see :meth:`CaptureSession.add_call`)."""


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
        self._ops: dict[int, OpInfo] = {}
        """Keyed by ``id(overload)``: an overload's ``__hash__`` is a Python call."""
        self._calls: dict[tuple[str, str, str], int] = {}
        self._log: list[ForwardCall] = []
        """The step's forward calls, in order (recomputed ops are paired with them)."""
        self._forward: dict[int, ForwardCall] = {}
        """Forward calls keyed by the autograd sequence number of the node they made."""
        self._made_none: set[int] = set()
        """Numbers in ``_forward`` held by a call under no_grad, which made no node: the last node made
        before it (a reentrant checkpoint's region's first op names its node so), until the call that
        made it claims it (a saved-tensors pack hook's op runs, under no_grad, before its op is seen)."""
        self._displaced: dict[int, ForwardCall] = {}
        """The calls under no_grad that a later call took a number from (``_made_none``): that later
        call made no node if the node is a custom ``autograd.Function``'s, which no aten op makes
        (a compiled graph's, whose ops run under no_grad, then ``ones_like`` seeds the backward)."""
        self._recomputing = RecomputeDetector()
        self._recompute_pairing = RecomputePairing()
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
        self._made_none.clear()
        self._displaced.clear()
        self._recompute_pairing.reset()
        self._rebuilt.clear()
        self.range.reset()
        if self.stack_range is not None:
            self.stack_range.reset()

    def _optimizer_enter(self, optimizer: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        """An optimizer step starts: phase ``optimizer`` until it ends. A closure given to
        ``optimizer.step(closure)`` (LBFGS; Lightning's automatic optimisation runs every training
        step that way) computes the loss and its gradients, so it is wrapped to run outside the
        phase: its ops are named as in a loop that runs them before the step."""
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
    def _alias_source(info: OpInfo, args: tuple, out: Any) -> tuple[torch.Tensor, bool, bool] | None:
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

    # -- the hot path: one method per step, in the order a native path takes them --------------
    def on_op(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Capture one op call, in named steps that a native path mirrors one for one.

        What the op is (its :class:`OpInfo`, made once per overload); whether it is captured at all
        (:meth:`_passes_through`); its phase (:meth:`_phase`) and module (:meth:`_module`); its call
        index and name (:meth:`_count`); whether the filters select it (:meth:`_selected`); its stack
        (:meth:`_stack`); the forward call it leaves for the backward ops that differentiate it
        (:meth:`_remember`); the collectives that completed before it (:meth:`_complete_collectives`);
        then its run, with records (:meth:`_record`) or without (:meth:`_run_unselected`).
        """
        info = self._ops.get(id(func))
        if info is None:
            info = self._ops[id(func)] = op_info(func)
        if self._passes_through(info):
            return func(*args, **kwargs)
        node = current_autograd_node()
        phase, rebuilt = self._phase(info, node, args)
        phase, module, fwd, captured, paired = self._module(info, node, phase, rebuilt)
        call, call_name = self._count(phase, module, info.name)
        selected = self._selected(phase, call_name)
        captured, stack_id, source = self._stack(phase, call_name, selected, captured)
        self._remember(info, phase, module, call_name, captured, paired, args)
        self._complete_collectives()
        rebuilds = phase == RECOMPUTE and info.detach and rebuilt is None
        if not selected:
            return self._run_unselected(func, args, kwargs, info, module, rebuilds)
        names = (
            phase,
            module,
            info.name,
            call,
            self.session.next_seq(),
            self.session.want_tensors and self.session.wants_tensor(call_name),
            stack_id,
            source,
            fwd,
        )
        reads = self.session.reuses_captures or self._overflow is not None  # (a structure dump reads nothing)
        self.session.in_compiled_code = reads and in_compiled_code(node)
        return self._record(func, args, kwargs, info, names, rebuilds)

    def _passes_through(self, info: OpInfo) -> bool:
        """Whether the op runs uncaptured: ``record_function``'s bookkeeping, the session's own ops (from
        a module or gradient hook: ``busy``), and in an overflow check collectives, waits and every op
        once it found what it looks for. FSDP2's copy-in first marks the buffers its unshard fills as
        holding no value: they were freed at reshard and handed out again."""
        if info.skipped or self.session.busy:
            return True
        if info.unshards:
            self.session.unwritten.add(unshard_buffers(sys._getframe(2)))  # the dispatch's frame, as on_op's caller
        return self._overflow is not None and (self._overflow.done or info.collective or info.waits)

    def _phase(self, info: OpInfo, node: Any, args: tuple) -> tuple[str, str | None]:
        """``(phase, rebuilt)``. Outside the autograd engine (``node is None``): ``optimizer`` in an
        optimizer step, ``forward`` else, ``recompute`` for activation checkpointing's own bookkeeping
        ops (detaching what it keeps). Inside it: ``recompute`` for a ``detach`` that unpacks a tensor
        a checkpoint rebuilt or kept (``rebuilt``: the module that made it) and for the ops a
        checkpoint runs again, ``backward`` else."""
        if node is None:
            if self._in_optimizer:
                return "optimizer", None
            return (RECOMPUTE if info.bookkeeping and bookkeeping() else "forward"), None
        if info.detach and (rebuilt := self._rebuilt.module_of(args[0] if args else None)) is not None:
            return RECOMPUTE, rebuilt
        return ("backward" if not self._recomputing(node, info.detach) else RECOMPUTE), None

    def _module(
        self, info: OpInfo, node: Any, phase: str, rebuilt: str | None
    ) -> tuple[str, str, str | None, Any, ForwardCall | None]:
        """``(phase, module, fwd, captured, paired)``: the module the call is named after, and what it
        inherits from the forward call it differentiates or repeats (``fwd``: that call's name,
        ``captured``: its stack, ``paired``: the forward call a recomputed op repeats).

        An optimizer op has no module; a backward op takes the module of the forward op whose autograd
        node it runs (an ``AccumulateGrad`` node's, the parameter's path); a recomputed op its own, or
        that of the forward call it repeats when one is found; a collective or copy of an FSDP2
        parameter group the group's module and the pass it runs for (which sets the phase)."""
        fwd = captured = paired = None
        if phase == "optimizer":
            module = NO_MODULE
        elif phase == "backward":
            number = node_sequence_nr(node)
            forward_info = self._forward.get(number)
            if number in self._displaced and isinstance(node, BackwardCFunction):  # no aten op made it
                forward_info = self._displaced[number]
            if forward_info is not None:
                module, fwd, captured, _, _ = forward_info
            else:  # gradient accumulation into a parameter is named after the parameter
                variable = getattr(node, "variable", None)
                path = self.tracker.parameter_path(variable) if variable is not None else None
                module = path or NO_MODULE
        elif rebuilt is not None:
            module = rebuilt
        else:  # forward, or recompute: checkpointing's bookkeeping (no node) or a replayed op
            module = self.tracker.current()
            if node is not None and not info.detach:  # detaches are checkpoint's own (see RebuiltTensors)
                paired = self._recompute_pairing.pair(node, info.name, module, self._log, self._forward)
            if paired is not None:
                module, fwd = paired[0], paired[1]
        if info.grouped and (owner := collective_owner(self.tracker.name_of)) is not None:
            phase = owner[0] or phase  # an FSDP2 group's collective or copy: its module, in the pass it runs for
            module, fwd, captured = owner[1], None, None
        return phase, module, fwd, captured, paired

    def _count(self, phase: str, module: str, op: str) -> tuple[int, str]:
        """``(call, call name)``: the call's index among this step's calls of ``op`` in ``module`` and
        ``phase``, and its name."""
        key = (phase, module, op)
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        return call, make_call_name(phase, module, op, call)

    def _selected(self, phase: str, call_name: str) -> bool:
        """Whether the call is recorded: its phase (``data_mode``), the ``range`` of calls (a gate that
        every call of a selected phase moves, in order) and the ``list`` of name patterns."""
        return phase in self.phases and self.range.check(call_name) and (not self._any_names or self.names(call_name))

    def _stack(self, phase: str, call_name: str, selected: bool, captured: Any) -> tuple[Any, str | None, str | None]:
        """``(captured, stack id, source line)``. A call outside the backward takes its stack when
        stacks are wanted for it (``stack``) and it is recorded or a backward op may inherit it; a
        backward op has its forward op's (``captured``). A recorded call's stack is handed to the
        session once per run of calls that share it."""
        want_stack = self._stack_all or (self.stack_range is not None and self.stack_range.check(call_name))
        if phase != "backward" and want_stack and (selected or self._backward_wanted):
            captured = self.stacks.capture()
        if captured is None or not want_stack:
            return captured, None, None
        stack_id, frames, source = captured
        if selected and stack_id != self._stack_added:
            self.session.add_stack(stack_id, frames)
            self._stack_added = stack_id
        return captured, stack_id, source

    def _remember(
        self, info: OpInfo, phase: str, module: str, call_name: str, captured: Any, paired: ForwardCall | None, args: tuple
    ) -> None:
        """Log a forward call under the sequence number of the autograd node it made (the one just
        before the next), for the backward ops that run that node and the recomputed ops that repeat
        it; a recomputed call too, for a reentrant checkpoint backwards through the nodes made there.
        An in-place op whose autograd kernel saved ``self.clone()`` made its node before the clone
        made one, and the clone came first: the op's node is the one before the clone's. A call under
        no_grad holds the last node's number only until that node's own call comes (``_made_none``)."""
        if phase == "forward":
            entry = (module, call_name, captured, info.name, len(self._log))
            self._log.append(entry)
            number = next_sequence_nr() - 1
            if number in self._made_none and _makes_node(args):  # the node's own op: it takes its number
                self._made_none.discard(number)
                self._displaced[number] = self._forward.pop(number)
            held = self._forward.setdefault(number, entry)
            if held is entry and not torch.is_grad_enabled():
                self._made_none.add(number)
            elif held is not entry and info.mutable and held[3] == _CLONE and held is self._log[-2]:
                self._forward.setdefault(number - 1, entry)
        elif phase == RECOMPUTE and not info.detach:
            self._forward.setdefault(next_sequence_nr() - 1, paired or (module, call_name, captured, info.name, None))

    def _complete_collectives(self) -> None:
        """Record the outputs of the collectives whose work completed, and the slots that waited for
        the storages functional collectives wrote into."""
        if self._collectives:
            self._collectives.capture_completed()
        if self._functional:
            self._functional.capture_completed()

    def _run_unselected(self, func: Any, args: tuple, kwargs: dict[str, Any], info: OpInfo, module: str, rebuilds: bool) -> Any:
        """Run a call that is not recorded, keeping what later calls need: the tensors a checkpoint
        rebuilt, the storages functional collectives write into and those a wait completed."""
        written = _written(info, args, kwargs) if info.written else None
        versions = _versions(written) if written else None
        out = func(*args, **kwargs)
        if written:
            self.session.wrote(written, versions, info.unmoved)
        if rebuilds:
            self._rebuilt.add(out, module)
        if info.functional:
            self._functional.writes(split_result(info.name, args, out)[1])
        elif info.waits and self._functional:
            self._functional.complete(out)
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict[str, Any], info: OpInfo, names: _CallNames, rebuilds: bool) -> Any:
        """Run a selected call and record its inputs (before it runs: an in-place op changes them)
        and outputs. Inputs that a functional collective still writes into are waited for as their
        own dispatch would; slots on storage a collective still writes into, and a collective's
        outputs, are recorded once its work completes; a wait's argument once it returns. In an
        overflow check, :class:`OverflowWatch` runs the call and records it only if it overflows."""
        if self._async_class is None:
            self._async_class = async_tensor_class()
        inputs = list(iter_slots(args, kwargs)) if self._inputs or self._async_class is not None else []
        if self._async_class is not None:
            self._await_collectives(info, inputs)
        if self._overflow is not None:
            phase, module, op, call, seq, save, stack, source, fwd = names
            common = dict(
                phase=phase, module=module, op=op, call=call, seq=seq, save_tensors=save, stack=stack, source=source, fwd=fwd
            )
            return self._overflow.run(func, args, kwargs, info, common, inputs=self._inputs)
        if info.waits:
            out = func(*args, **kwargs)
            self._functional.complete(out)
        if self._inputs:
            self._add(inputs, "input", False, info.unread_inputs, names)
        elif info.mutable and self._outputs:  # its outputs that existed before are the tensors it wrote
            self.session.values.see(map(_VALUE, iter_slots(args, kwargs)))
        written = _written(info, args, kwargs) if info.written else None
        versions = _versions(written) if written else None
        if not info.waits:
            out = func(*args, **kwargs)
        if written:
            self.session.wrote(written, versions, info.unmoved)
        if rebuilds:
            self._rebuilt.add(out, names[1])
        if info.collective:
            self._record_collective(func, args, kwargs, info, names, out)
            return out
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        if self._async_class is not None:  # a view of an unwaited AsyncCollectiveTensor, or a new one
            self._functional.writes(
                inner_tensor(waiting) for value in _wrapped(outputs) for waiting in unwaited(value, self._async_class)
            )
        if self.session.reuses_captures and (alias := self._alias_source(info, args, out)) is not None:
            self.session.share_alias(out, *alias)
        if self._outputs:
            if info.makes_views and args and isinstance(args[0], torch.Tensor):
                self.session.values.views(outputs, args[0])
            if out is None and written:  # an in-place op that returns nothing (``_foreach_mul_``): what it wrote, it made
                made = [slot for slot in inputs or iter_slots(args, kwargs) if written_slot(*slot, info.written)]
                self._add(made, "output", True, info.unread_outputs, names, bumps=not info.unmoved)
            else:
                self._add(iter_slots(outputs), "output", info.mutable, info.unread_outputs, names)
        return out

    def _await_collectives(self, info: OpInfo, slots: list[Slot]) -> None:
        """Before a call reads an ``AsyncCollectiveTensor`` not yet waited for (itself or inside a
        DTensor): wait for it as its own dispatch is about to, or, for a view (which it lets run
        unwaited), hold the slots on its storage back until the collective completes."""
        found = [waiting for value in _wrapped(map(_VALUE, slots)) for waiting in unwaited(value, self._async_class)]
        if not found:
            return
        if info.view:
            self._functional.writes(map(inner_tensor, found))
            return
        for waiting in found:
            waits_before(waiting)
            if self._functional:
                self._functional.complete(inner_tensor(waiting))

    def _record_collective(
        self, func: Any, args: tuple, kwargs: dict[str, Any], info: OpInfo, names: _CallNames, out: Any
    ) -> None:
        """A collective's outputs hold other ranks' values once its work completes: recorded then (a
        functional collective's, once a wait completes the storages it writes into). A c10d
        collective writes them without moving their versions: at its completion what was taken of
        them, and of every tensor on their memory, is taken again (``CaptureSession.wrote``)."""
        works, outputs = split_result(info.name, args, out)
        if info.functional:
            self._functional.writes(outputs)
            if self._outputs:
                capture = partial(self._add_now, "output", True, info.unread_outputs, names, bumps=False)
                capture(self._functional.hold(iter_slots(outputs), capture))
            return

        def completed(slots: Iterator[Slot]) -> None:
            written = [value for _, value in iter_slots(outputs) if isinstance(value, torch.Tensor)]
            self.session.wrote(written, _versions(written), False)
            if self._outputs:
                self._add_now("output", True, info.unread_outputs, names, slots, bumps=False)

        self._collectives.add(works, waited_by_caller(func, args, kwargs), outputs, completed)

    def _add(
        self, slots: Iterable[Slot], io: str, mutated: bool, unread: dict[str, str], names: _CallNames, bumps: bool | None = None
    ) -> None:
        """Record one side of a call; slots on a storage a functional collective still writes into
        are recorded once it completes."""
        if self._functional:
            slots = self._functional.hold(slots, partial(self._add_now, io, mutated, unread, names, bumps=bumps))
        self._add_now(io, mutated, unread, names, slots, bumps)

    def _add_now(
        self, io: str, mutated: bool, unread: dict[str, str], names: _CallNames, slots: Iterable[Slot], bumps: bool | None = None
    ) -> None:
        """Hand one side of a call to the session (its slots last: what a held capture is called with;
        ``bumps``: see :meth:`CaptureSession.add_call`)."""
        phase, module, op, call, seq, save, stack, source, fwd = names
        self.session.add_call(
            slots,
            phase=phase,
            module=module,
            op=op,
            call=call,
            seq=seq,
            io=io,
            save_tensors=save,
            mutated=mutated,
            stack=stack,
            source=source,
            fwd=fwd,
            unread=unread,
            bumps=bumps,
        )
