"""Module attribution and module-level records, through global nn.Module hooks.

:class:`ModuleTracker` keeps the stack of running modules, so each op gets the path of the innermost
one; :class:`ModuleRecorder` writes module-level records (``level="module"`` or ``"mix"``). Levels:
docs/capture.md.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Protocol

import torch
from torch import nn
from torch.fx import GraphModule

from torchdebug._torch.autograd import current_autograd_node
from torchdebug._torch.checkpoint import RecomputeDetector
from torchdebug._torch.funcol import wait_before_read
from torchdebug._torch.global_hooks import GlobalForwardHooks, in_call_of
from torchdebug._torch.nn import strip_wrappers
from torchdebug.capture.recompute import RECOMPUTE
from torchdebug.capture.session import PLAIN_TENSORS, CaptureSession
from torchdebug.records import MODULE_OP, NO_MODULE, make_call_name
from torchdebug.slots import Slot, iter_slots, output_slots

ROOT_MODULE = "<root>"
"""Module path of the model itself."""


class CallObserver(Protocol):
    """What :class:`ModuleTracker` tells of each module call (:class:`ModuleRecorder`, the flight
    recorder's watcher): it starts (phase ``forward`` or ``recompute``), it returned, or it raised;
    ``traced``: Dynamo traces the call (the hooks asked ``torch.compiler.is_compiling()`` once)."""

    def enter(self, module: nn.Module, name: str, args: tuple, phase: str, traced: bool) -> None: ...
    def exit(self, module: nn.Module, name: str, kwargs: dict[str, Any], output: Any, traced: bool) -> None: ...
    def drop(self, traced: bool) -> None: ...


class CallObservers:
    """Several observers of each module call, told in their order (level ``mix`` on the native path:
    the op rows' module context, then the module records)."""

    def __init__(self, *observers: CallObserver) -> None:
        self.observers = observers

    def enter(self, module: nn.Module, name: str, args: tuple, phase: str, traced: bool) -> None:
        for observer in self.observers:
            observer.enter(module, name, args, phase, traced)

    def exit(self, module: nn.Module, name: str, kwargs: dict[str, Any], output: Any, traced: bool) -> None:
        for observer in self.observers:
            observer.exit(module, name, kwargs, output, traced)

    def drop(self, traced: bool) -> None:
        for observer in self.observers:
            observer.drop(traced)


class ModuleTracker:
    """The path of the innermost running module, maintained by global forward hooks.

    Paths are relative to the model given to the debugger (its own path is ``<root>``). Without a
    model, the first top-level module called is taken as the model; other top-level modules (a loss
    module, say) are named by their class. Module wrappers (``checkpoint_wrapper``, FSDP1,
    ``torch.compile``) are not modules of their own: their calls are skipped and their attribute
    names never appear in paths. Calls that activation checkpointing runs again are phase
    ``recompute``."""

    def __init__(self, model: nn.Module | None = None, *, outside_compiled: bool = False, hook_ops: bool = False) -> None:
        """``outside_compiled``: module calls inside compiled code are not tracked (see
        :class:`~torchdebug._torch.global_hooks.GlobalForwardHooks`). ``hook_ops``: :meth:`current` names the
        module whose own forward hooks are running (op capture asks it for every op)."""
        self._outside_compiled = outside_compiled
        self._hook_ops = hook_ops
        self._names: dict[int, str] = {}
        self._params: dict[int, tuple[str, nn.Parameter]] = {}
        self._model_adopted = model is not None
        self._inner: set[int] = set()
        """The ids of the model's modules below its root (given or adopted)."""
        if model is not None:
            self._adopt(model, "")
        self.inner_entered = False
        """Since :meth:`start`, a call of one of the model's modules below its root started outside
        compiled code (not while Dynamo traced it)."""
        self.entered = False
        """Since :meth:`start`, a call of any module but a graph module started outside compiled
        code (a backend may run its compiled graph as a module call: that is compiled code)."""
        self._stack: list[str] = []
        self._own_hooks: list[tuple[weakref.ref, str, int]] = []
        """Modules with forward hooks of their own that returned (their own hooks run after the
        global ones, this tracker's), innermost last: the module, its path and the stack's depth
        then. Ops those hooks run (tensor parallelism's redistribution of a layer's output) are the
        module's, as a compiled graph files them. No frame is held: it holds the module's output."""
        self._hooks: GlobalForwardHooks | None = None
        self._recomputing = RecomputeDetector()
        self.recorder: CallObserver | None = None

    def _adopt(self, root: nn.Module, prefix: str) -> None:
        for name, module in root.named_modules(remove_duplicate=False):
            if name and not prefix:
                self._inner.add(id(module))
            name = strip_wrappers(name)
            path = f"{prefix}.{name}" if prefix and name else (name or prefix or ROOT_MODULE)
            self._names.setdefault(id(module), path)
        for name, param in root.named_parameters():
            name = strip_wrappers(name)
            self._params.setdefault(id(param), (f"{prefix}.{name}" if prefix else name, param))

    def parameter_path(self, tensor: torch.Tensor) -> str | None:
        """The path of a parameter of a tracked module (``layers.0.fc.weight``), else ``None``."""
        found = self._params.get(id(tensor))
        return found[0] if found is not None and found[1] is tensor else None

    def name_of(self, module: nn.Module) -> str:
        """The path of ``module``: its place in the model, else (a module called inside one but not
        of it: a compiled graph's, which blocks sharing one graph all call) its class under the
        module calling it now."""
        name = self._names.get(id(module))
        if name is None:
            if self._stack:
                return f"{self._stack[-1]}.{type(module).__name__}"
            if not self._model_adopted:
                self._model_adopted = True
                self._adopt(module, "")
            else:
                self._adopt(module, type(module).__name__)
            name = self._names[id(module)]
        return name

    def called_as(self, module: nn.Module) -> nn.Module:
        """What the running call of ``module`` was made on: its compiled wrapper, when one stands for
        it (``outside_compiled``), else ``module``."""
        return self._hooks.called_as(module) if self._hooks is not None else module

    def runs_compiled(self, module: nn.Module) -> bool:
        """Whether the running call of ``module`` is its compiled wrapper's (``outside_compiled``):
        ``module``'s own code runs inside the compiled code."""
        return self._hooks is not None and self._hooks.stands_in(module)

    @property
    def depth(self) -> int:
        """How many module calls are running (1 inside a top-level module's call)."""
        return len(self._stack)

    def current(self) -> str:
        if self._own_hooks and (name := self._running_hooks()) is not None:
            return name
        return self._stack[-1] if self._stack else NO_MODULE

    def _running_hooks(self) -> str | None:
        """The path of the module whose own forward hooks run the op being dispatched, if any
        (entries whose hooks are done are dropped)."""
        depth = len(self._stack)
        while self._own_hooks and self._own_hooks[-1][2] >= depth:  # an op at its depth or above
            module, name, hooked_at = self._own_hooks[-1]
            if hooked_at == depth and (hooked := module()) is not None and in_call_of(hooked, sys._getframe(2)):
                return name
            self._own_hooks.pop()  # its hooks are done
        return None

    def hooks_done(self, module: nn.Module) -> None:
        """``module``'s own forward hooks have run (a hook registered after them says so): ops are
        the enclosing module's again, with no frame to check (the native path's module context)."""
        if self._own_hooks and self._own_hooks[-1][0]() is module:
            self._own_hooks.pop()

    def start(self) -> None:
        self.inner_entered = self.entered = False
        if self._hooks is None:
            self._hooks = GlobalForwardHooks(self._enter, self._exit, self._raised, outside_compiled=self._outside_compiled)
        else:
            self._hooks.resume()

    def stop(self, *, keep_hooks: bool = False) -> None:
        """Stop tracking. ``keep_hooks``: the global hooks stay registered, idle, until the next
        :meth:`start` or a stop without it, so that compiled code traced through them is not
        compiled again (see :class:`~torchdebug._torch.global_hooks.GlobalForwardHooks`)."""
        if self._hooks is not None and keep_hooks:
            self._hooks.pause()
        elif self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        self._stack.clear()
        self._own_hooks.clear()
        self._recomputing.reset()

    def _enter(self, module: nn.Module, args: tuple, traced: bool) -> None:
        if not self.inner_entered and not traced:  # traced: it runs compiled
            self.entered = self.entered or not isinstance(module, GraphModule)  # a compiled graph's own call
            self.inner_entered = id(module) in self._inner
        name = self._names.get(id(module)) or self.name_of(module)  # a module seen before: no call
        self._stack.append(name)
        if self.recorder is not None:
            node = None if traced else current_autograd_node()  # traced: no op of a graph
            recomputed = node is not None and self._recomputing(node, False)
            self.recorder.enter(module, name, args, RECOMPUTE if recomputed else "forward", traced)

    def _exit(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any, traced: bool) -> None:
        if self._stack:
            name = self._stack.pop()
            if self._hook_ops:
                depth = len(self._stack)
                while self._own_hooks and self._own_hooks[-1][2] > depth:  # inside this call: done
                    self._own_hooks.pop()
                if module._forward_hooks:
                    self._own_hooks.append((weakref.ref(module), name, depth))
            if self.recorder is not None:
                self.recorder.exit(module, name, kwargs, output, traced)

    def _raised(self, module: nn.Module, traced: bool) -> None:
        """The forward of ``module`` raised (checkpoint's early stop does, on purpose)."""
        if self._stack:
            self._stack.pop()
            if self.recorder is not None:
                self.recorder.drop(traced)


class ModuleRecorder:
    """Module-level records: each module call's inputs (positional ones when the call starts,
    keyword ones when it ends), outputs and own parameters in the forward, the gradients of its
    outputs and inputs in the backward (tensor hooks: an input shared by several modules gets its
    total gradient) and each parameter's gradient once accumulated. A recomputed call records in
    phase ``recompute``, counted apart; the gradient hooks are those set in the forward (with a
    reentrant checkpoint, whose forward runs under ``no_grad``, the modules inside its regions get no
    gradient records). A value a functional collective is still writing (an
    ``AsyncCollectiveTensor``) is waited for before it is recorded, as the op that reads it next
    would."""

    def __init__(self, session: CaptureSession, phases: frozenset[str], ios: frozenset[str], model: nn.Module | None) -> None:
        self.session = session
        self.phases = phases
        self.ios = ios
        self.model = model
        self._calls: dict[tuple[str, str], int] = {}
        self._open: list[tuple[str, int, int]] = []
        """``(phase, call, seq)`` of each module call under way, innermost last."""
        self._handles: list[Any] = []
        self.active = False

    def start(self) -> None:
        self.active = True
        if self.model is not None and "backward" in self.phases:
            for name, param in self.model.named_parameters():
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(self._grad_hook(strip_wrappers(name))))

    def stop(self) -> None:
        self.active = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._open.clear()

    def next_step(self) -> None:
        self._calls.clear()

    def _next_call(self, phase: str, name: str) -> int:
        call = self._calls.get((phase, name), 0)
        self._calls[(phase, name)] = call + 1
        return call

    def _next_seq(self) -> int:
        """The ``seq`` of a module call starting now, or of a gradient record: the session's next."""
        return self.session.next_seq()

    def _add(self, slots: Any, *, phase: str, name: str, call: int, seq: int, io: str) -> None:
        slots = list(slots)
        for _, value in slots:  # a collective's result handed out unwaited is read once it is in
            if value.__class__ not in PLAIN_TENSORS and isinstance(value, torch.Tensor):
                wait_before_read(value)
        self._record(slots, phase=phase, name=name, call=call, seq=seq, io=io)

    def _record(self, slots: list[Slot], *, phase: str, name: str, call: int, seq: int, io: str) -> None:
        """One side of a module call's records (the native path records them in the op rows' order instead)."""
        save = self.session.wants_tensor(make_call_name(phase, name, MODULE_OP, call))
        self.session.add_call(iter(slots), phase=phase, module=name, op=MODULE_OP, call=call, seq=seq, io=io, save_tensors=save)

    def enter(self, module: nn.Module, name: str, args: tuple, phase: str, traced: bool) -> None:
        """A call of ``module`` starts, in phase ``forward`` or ``recompute``."""
        call = self._next_call(phase, name)
        seq = self._next_seq()
        self._open.append((phase, call, seq))
        if "forward" in self.phases and "input" in self.ios:
            self._add(iter_slots(args), phase=phase, name=name, call=call, seq=seq, io="input")
        if phase == "forward" and "backward" in self.phases and "output" in self.ios and torch.is_grad_enabled():
            for arg, value in iter_slots(args):
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    value.register_hook(self._tensor_grad_hook(name, call, "output", arg))

    def exit(self, module: nn.Module, name: str, kwargs: dict[str, Any], output: Any, traced: bool) -> None:
        if not self._open:
            return
        phase, call, seq = self._open.pop()
        if "forward" in self.phases:
            if kwargs and "input" in self.ios:
                self._add(iter_slots((), kwargs), phase=phase, name=name, call=call, seq=seq, io="input")
            if "output" in self.ios:
                self._add(output_slots(output), phase=phase, name=name, call=call, seq=seq, io="output")
            params = [(n, p) for n, p in module.named_parameters(recurse=False)]
            if params:
                self._add(iter(params), phase=phase, name=name, call=call, seq=seq, io="parameter")
        if phase == "forward" and "backward" in self.phases and torch.is_grad_enabled():
            for arg, value in output_slots(output):
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    value.register_hook(self._tensor_grad_hook(name, call, "input", arg))

    def drop(self, traced: bool) -> None:
        """The innermost module call under way raised: it has no outputs to record."""
        if self._open:
            self._open.pop()

    def _tensor_grad_hook(self, name: str, call: int, io: str, arg: str) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if io in self.ios and self.active:
                seq = self._next_seq()
                self._add(iter([(arg, grad)]), phase="backward", name=name, call=call, seq=seq, io=io)

        return hook

    def _grad_hook(self, param_name: str) -> Any:
        module, _, leaf = param_name.rpartition(".")
        module = module or ROOT_MODULE

        def hook(param: torch.Tensor) -> None:
            call = self._next_call("parameter_grad", param_name)
            seq = self._next_seq()
            self._add(iter([(leaf, param.grad)]), phase="backward", name=module, call=call, seq=seq, io="parameter_grad")

        return hook
