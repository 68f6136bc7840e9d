"""The native observer's rows (``torchdebug.native.observer``) as :class:`~torchdebug.records.Record`\\ s
named as eager capture (``eager.py``) names them.

    capture = NativeStepCapture(observer, model)
    capture.start()
    loss = model(x).sum(); loss.backward(); optimizer.step()
    capture.stop()
    records = capture.records()       # forward/fc1/aten.addmm.default#0/output.0, ...

While it runs, the observer's module context holds what eager capture asks Python for per op: the
path of the innermost running module (kept by :class:`~torchdebug.capture.modules.ModuleTracker`'s
global hooks), ``optimizer`` between an optimizer's step pre- and post-hooks (a closure given to the
step runs outside it), and a parameter's path while its ``AccumulateGrad`` node runs (a tensor hook
before it, a post-accumulate-grad hook after it). At conversion, rows take the names eager capture
gives: phase ``backward`` for rows the engine ran, ``optimizer`` or ``forward`` by context; a
backward row the module of the forward row that made its autograd node (equal sequence numbers),
a gradient accumulation the parameter's path; the call index per (phase, module, op) in row order;
slots named from the op's schema as ``iter_slots`` names a dispatch mode's arguments (``input.0``,
``input.1.2`` for a list element, ``input.out`` for a keyword-only argument, ``output.0``).

Each tensor slot gets ``value_id`` and ``version``. Ids come from ``TensorImpl`` addresses and the
memory they show (:class:`_ValueIds`): as in eager capture, an op's output is a new value unless the
op writes its arguments and returns one of them; a saved output autograd unpacks is the output it
saved, as it is once the mode's own ``detach`` is taken away.

Not mirrored yet: statistics, stacks and source lines, filters, ``view_of``, ``recompute``
(activation checkpointing), ops a module's own forward hooks run (eager capture names them after
that module), FSDP2's collectives, non-tensor arguments (eager capture records them as
``kind="value"``), and the ops a dispatch mode itself changes (``docs/architecture.md``: the native
observer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from torchdebug._torch.dispatch import op_schema
from torchdebug.capture.modules import ModuleTracker
from torchdebug.native.observer import PLAIN, NativeObserver, ObservedOps
from torchdebug.records import NO_MODULE, Record, make_call_name, make_name
from torchdebug.slots import dtype_name

__all__ = ["NativeStepCapture", "OpSlotNames"]

_OUTSIDE, _OPTIMIZER = -1, -2
"""Module contexts that name no path: outside every module, inside an optimizer step."""

_IO = ("input", "output")


@dataclass(frozen=True, slots=True)
class OpSlotNames:
    """How a dispatch mode's ``iter_slots`` names an op's tensor slots, from its schema."""

    inputs: tuple[str, ...]
    """By schema position: ``"0"``, ``"1"``, ..., the name of a keyword-only argument."""
    list_result: bool
    """The op returns one list (``split``): a dispatch mode sees a list, its elements are ``0``, ``1``."""
    mutable: bool
    """The op writes into one of its arguments (in-place or ``out=``)."""

    @classmethod
    def of(cls, op_name: str) -> OpSlotNames:
        """The slot names of ``aten.mm.default`` (any namespace ``torch.ops`` knows)."""
        namespace, _, rest = op_name.partition(".")
        name, _, overload = rest.rpartition(".")
        schema = op_schema(getattr(getattr(getattr(torch.ops, namespace), name), overload))
        inputs = tuple(argument.name if argument.kwarg_only else str(index) for index, argument in enumerate(schema.arguments))
        returns = schema.returns
        list_result = len(returns) == 1 and isinstance(returns[0].type, torch.ListType)
        return cls(inputs, list_result, schema.is_mutable)

    def slot(self, io: int, arg: int, element: int) -> str:
        """The ``arg`` of a slot: ``io`` 0 input, 1 output; ``element`` -1 outside lists."""
        if io == 0:
            top = self.inputs[arg]
        elif self.list_result:
            return str(element)
        else:
            top = str(arg)
        return top if element < 0 else f"{top}.{element}"


class NativeStepCapture:
    """One step's ops, seen by the native observer and named as eager capture names them."""

    def __init__(self, observer: NativeObserver, model: nn.Module, *, step: int = 0, rank: int = 0) -> None:
        self.observer = observer
        self.model = model
        self.step = step
        self.rank = rank
        self.tracker = ModuleTracker(model)
        self.tracker.recorder = self
        self._paths: list[str] = []
        self._context_of: dict[str, int] = {}
        self._parameter_contexts: set[int] = set()
        self._context = _OUTSIDE
        self._before_accumulation = _OUTSIDE
        """The context a gradient accumulation's hooks restore."""
        self._before_optimizer = _OUTSIDE
        self._in_optimizer = 0
        self._handles: list[Any] = []
        self._dtype_names = {code: dtype_name(dtype) for code, dtype in observer.dtypes.items()}
        """By ``c10::ScalarType`` code: ``float32``."""
        self._slot_names: dict[int, OpSlotNames] = {}
        """By op name id (``ObservedOps.names``)."""

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> None:
        """Track modules, optimizer steps and gradient accumulations, and start the observer."""
        self._handles = [
            register_optimizer_step_pre_hook(self._optimizer_enter),
            register_optimizer_step_post_hook(self._optimizer_exit),
        ]
        for parameter in self.model.parameters():
            path = self.tracker.parameter_path(parameter)
            if parameter.requires_grad and path is not None:
                context = self._intern(path)
                self._parameter_contexts.add(context)
                self._handles.append(parameter.register_hook(self._accumulation_starts(context)))
                self._handles.append(parameter.register_post_accumulate_grad_hook(self._accumulation_ends))
        self.tracker.start()
        self._set_context(_OUTSIDE)
        self.observer.start()

    def stop(self) -> None:
        self.observer.stop()
        self.tracker.stop()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._in_optimizer = 0

    # -- module context ------------------------------------------------------------------------
    def _intern(self, path: str) -> int:
        context = self._context_of.get(path)
        if context is None:
            context = self._context_of[path] = len(self._paths)
            self._paths.append(path)
        return context

    def _set_context(self, context: int) -> None:
        self._context = context
        self.observer.set_module(context)

    def enter(self, module: nn.Module, name: str, args: tuple, phase: str) -> None:
        """The tracker entered ``module`` (its path ``name``)."""
        self._set_context(self._intern(name))

    def exit(self, module: nn.Module, name: str, kwargs: dict[str, Any], output: Any) -> None:
        """The tracker left ``module``: the context is the enclosing module's."""
        self.drop()

    def drop(self) -> None:
        current = self.tracker.current()
        self._set_context(_OUTSIDE if current == NO_MODULE else self._intern(current))

    def _accumulation_starts(self, context: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self._before_accumulation = self._context
            self._set_context(context)

        return hook

    def _accumulation_ends(self, parameter: torch.Tensor) -> None:
        self._set_context(self._before_accumulation)

    def _optimizer_enter(self, optimizer: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        if not self._in_optimizer:
            self._before_optimizer = self._context
        self._in_optimizer += 1
        self._set_context(_OPTIMIZER)
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._outside_optimizer(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer itself
            return (args[0], self._outside_optimizer(args[1]), *args[2:]), kwargs
        return None

    def _outside_optimizer(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure``, run in the context the optimizer step was called in (its forward is a forward)."""

        def run() -> Any:
            self._set_context(self._before_optimizer)
            try:
                return closure()
            finally:
                self._set_context(_OPTIMIZER)

        return run

    def _optimizer_exit(self, *_: Any) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)
        if not self._in_optimizer:
            self._set_context(self._before_optimizer)

    # -- conversion ----------------------------------------------------------------------------
    def records(self) -> list[Record]:
        """Drain the observer and name its rows (see the module docstring)."""
        return self.convert(self.observer.drain())

    def convert(self, ops: ObservedOps) -> list[Record]:
        """The tensor records of drained rows, in row order (inputs, then outputs, of each op)."""
        names, paths, parameter_contexts = ops.names, self._paths, self._parameter_contexts
        calls: dict[tuple[str, str, str], int] = {}
        made_by: dict[int, tuple[str, str]] = {}
        """Forward rows by the sequence number of the node they made: (module, call name)."""
        heads: list[tuple[str, str, str, int, str | None, OpSlotNames]] = []
        for op_id, seq, backward, context in zip(ops.op, ops.seq, ops.backward, ops.module):
            op = names[op_id]
            fwd = None
            if backward:
                phase = "backward"
                found = made_by.get(seq) if seq >= 0 else None
                if found is not None:
                    module, fwd = found
                else:  # a gradient accumulation is named after the parameter
                    module = paths[context] if context in parameter_contexts else NO_MODULE
            elif context == _OPTIMIZER:
                phase, module = "optimizer", NO_MODULE
            else:
                phase, module = "forward", paths[context] if context >= 0 else NO_MODULE
            key = (phase, module, op)
            call = calls.get(key, 0)
            calls[key] = call + 1
            if phase == "forward" and seq >= 0:
                made_by[seq] = (module, make_call_name(phase, module, op, call))
            slot_names = self._slot_names.get(op_id)
            if slot_names is None:
                slot_names = self._slot_names[op_id] = OpSlotNames.of(op)
            heads.append((phase, module, op, call, fwd, slot_names))
        return self._slot_records(ops, heads)

    def _slot_records(self, ops: ObservedOps, heads: list) -> list[Record]:
        records = []
        shapes = ops.slot_shapes()
        dtypes = self._dtype_names
        values = _ValueIds()
        step, rank, first_row = self.step, self.rank, ops.first_row
        columns = zip(ops.slot_row, ops.slot_io, ops.slot_arg, ops.slot_element, ops.slot_dtype, ops.slot_flag)
        for slot, (row, io_code, arg_index, element, dtype, flag) in enumerate(columns):
            row -= first_row
            phase, module, op, call, fwd, slot_names = heads[row]
            shape = shapes[slot]
            memory = (ops.slot_storage[slot], ops.slot_offset[slot], shape, dtype)
            value_id = values.of(row, io_code, slot_names.mutable, ops.slot_value[slot], memory)
            io, arg = _IO[io_code], slot_names.slot(io_code, arg_index, element)
            record = Record(make_name(phase, module, op, call, io, arg), step, rank, phase, module, op, call, row, io, arg)
            record.dtype = dtypes[dtype]
            record.shape = list(shape) if flag == PLAIN else None
            record.fwd = fwd
            version = ops.slot_version[slot]
            record.value_id, record.version = value_id, version if version >= 0 else None
            records.append(record)
        return records


class _ValueIds:
    """Value ids from ``TensorImpl`` addresses, which are reused once a tensor is freed: a tensor is
    the one last seen at its address while its memory (storage, offset, shape, dtype) is the same.
    An input first seen over the memory a value was made in is that value (autograd unpacks a saved
    output as a new ``TensorImpl``: a dispatch mode sees it through a ``detach``); an output is a new
    value, unless the op writes its arguments and returns one."""

    def __init__(self) -> None:
        self._at: dict[int, tuple[int, tuple]] = {}
        """By address: the value id and memory of the tensor last seen there."""
        self._made_in: dict[tuple, int] = {}
        """By memory: the value first made in it (views and in-place outputs make none)."""
        self._fresh = count()
        self._row = -1
        self._inputs: dict[int, int] = {}
        self._input_storages: set[int] = set()

    def of(self, row: int, io: int, mutable: bool, address: int, memory: tuple) -> int:
        """The value id of a slot of ``row`` (slots in row order, each row's inputs first)."""
        if row != self._row:
            self._row, self._inputs, self._input_storages = row, {}, set()
        known = self._at.get(address)
        if io == 0:
            if known is not None and known[1] == memory:
                value_id = known[0]
            else:
                value_id = self._made_in.get(memory)
                if value_id is None:
                    value_id = self._made_in[memory] = next(self._fresh)
            self._inputs[address] = value_id
            self._input_storages.add(memory[0])
        elif mutable and address in self._inputs:  # the argument the op wrote
            value_id = self._inputs[address]
        else:
            value_id = next(self._fresh)
            if memory[0] not in self._input_storages:  # fresh memory, not a view of an input
                self._made_in[memory] = value_id
            else:
                self._made_in.setdefault(memory, value_id)
        self._at[address] = (value_id, memory)
        return value_id
