"""The hooks that feed the flight recorder's ring: what is watched, when, and under which name.

Module outputs (forward, training mode, outside compiled code), the gradients as each backward
through the model ends, the parameters after the optimizer step, and the model's calls for the
trainer callbacks. What is and is not watched, with compiled, sharded and loss-scaled models:
docs/monitor.md, "What is watched"; the methods below say how.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from torchdebug import stats_table
from torchdebug._torch.autograd import after_backward, current_autograd_node, tensor_version
from torchdebug._torch.dynamo import after_compiled_calls, compiled_autograd_enabled
from torchdebug._torch.forward_hooks import LastForwardHooks, own_forward_hooks
from torchdebug._torch.funcol import wait_before_read
from torchdebug._torch.nn import compiled_modules, is_compiled_wrapper, strip_wrappers, unwrap_compiled
from torchdebug._torch.pytree import tree_leaves
from torchdebug._torch.subclasses import describe, is_subclass
from torchdebug.capture.modules import PLAIN_TENSORS, ROOT_MODULE, ModuleTracker
from torchdebug.capture.recompute import RECOMPUTE
from torchdebug.monitor._native import ring_sums
from torchdebug.monitor._one_tensor import cpu_sums_one_into
from torchdebug.monitor._ring import Ring, Slot
from torchdebug.records import LOSS_OP, LOSS_SCALE_OP, MODULE_OP, NO_MODULE
from torchdebug.slots import dtype_name, output_slots
from torchdebug.stats import IDENTITY, cpu_sums_many_into

logger = logging.getLogger("torchdebug.monitor")

_RESOLVES_ON_THE_HOST = stats_table._resolves_now
"""What takes a CPU tensor's statistics now; where it is replaced (tests send CPU tensors the
device's way) the native path, which looks at the device itself, stands aside."""


ModelCallEnd = Callable[[nn.Module, tuple, dict[str, Any], Any], None]
"""``after(called, args, kwargs, output)``: a call of the model returned (see :meth:`Watcher.observe_model_calls`)."""


def plain(tensor: torch.Tensor) -> torch.Tensor | None:
    """The plain tensor holding ``tensor``'s elements (a subclass's local tensor, once a collective
    writing into it is waited for), or ``None``."""
    if not is_subclass(tensor):
        return tensor
    wait_before_read(tensor)
    return describe(tensor).local


def parameter_names(model: nn.Module) -> dict[int, tuple[str, str]]:
    """``id(parameter) -> (module path, leaf name)``, wrappers stripped (``<root>`` for the model's own)."""
    names: dict[int, tuple[str, str]] = {}
    for name, param in model.named_parameters():
        module, _, leaf = strip_wrappers(name).rpartition(".")
        names.setdefault(id(param), (module or ROOT_MODULE, leaf))
    return names


class Watcher:
    """Module, gradient and parameter hooks writing statistics of the current step (what: docs/monitor.md, "What is watched")."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        ring: Ring,
        stager: stats_table.StatsStager,
        after_each_backward: bool = True,
        loss_scale: Callable[[], torch.Tensor | None] | None = None,
    ) -> None:
        """``after_each_backward``: watch the gradients as each backward ends (see the module
        docstring); ``False`` under a loss scaler whose scale is unknown, as its gradients are
        scaled until it unscales them. ``loss_scale``: the scale the backward's gradients are made
        with, as a tensor, watched with them (see :mod:`~torchdebug.monitor._ring`)."""
        self.model, self.optimizer, self.ring, self.stager = model, optimizer, ring, stager
        self.after_each_backward, self.loss_scale = after_each_backward, loss_scale
        self._backward_queued = False
        """A watch of the gradients is queued to run when the running backward ends."""
        self._tracker = ModuleTracker(unwrap_compiled(model), outside_compiled=True)
        self._tracker.recorder = self
        self._names = parameter_names(model)
        self._modules = {id(module) for module in model.modules()}
        """The model's own modules (not the graph modules a compiled backend runs, nor a loss module of the loop's)."""
        self._calls: dict[str, int] = {}
        self._seen: dict[int, tuple[weakref.ref, int | None, int, _Seen | None]] = {}
        """Tensors reduced in this step, by ``id``: the tensor (weakly), its version then (``None``: an
        inference tensor, read again at each slot), the slot its sums go to and, while they are on their
        way, the slots waiting for them (``None``: in the ring)."""
        self._output_slots: dict[tuple[str, int], tuple[Slot, int]] = {}
        """``(module, call) -> (slot, index)`` of a module's output ``0``: a module's one tensor, found
        without the slot's full key (see :meth:`_add_output`)."""
        self._parameter_slots: dict[tuple[str, str], _ParameterSlots] = {}
        """``(phase, io) ->`` the slots :meth:`_add_parameters` last wrote, kept for the parameters it
        was last given."""
        self._open: list[tuple[str, bool]] = []
        """``(phase, after its own hooks)`` of each module call under way, innermost last: the
        second is true where the call's output is watched after the module's own forward hooks."""
        self._last_hooks = LastForwardHooks(self._returned_after_hooks)
        self._returning: list[tuple[nn.Module, str]] = []
        """Module calls whose forward returned, waiting for their own forward hooks to run, innermost last."""
        self._root = unwrap_compiled(model)
        self._childless = next(self._root.children(), None) is None
        self._call_observers: list[tuple[Callable[[nn.Module], None], ModelCallEnd]] = []
        self._root_call: tuple[nn.Module, tuple] | None = None
        """What the model's running call was made on, and its positional arguments."""
        self._suspended = False
        """Inside :meth:`suspended`."""
        self._undo: list[Callable[[], None]] = []
        self._optimizer_hooks: list[RemovableHandle] = []
        self._native = ring_sums()
        """The native module that takes a module's output or a list of parameters in one call
        (:mod:`~torchdebug.monitor._native`), or ``None``."""
        self.step = 0
        self.pending: dict[int, int] = {}
        """Rows added but not yet delivered, by step."""
        self.grads_taken = False
        """The gradients of :attr:`step` are watched already (:meth:`watch_gradients` ran)."""
        self.root_seen = False
        """The model's call returned outside compiled code (its own, or its compiled wrapper's) in :attr:`step`."""
        self.inside_seen = False
        """A module of the model below its root (of a model without any: the model, not through a
        compiled wrapper) returned outside compiled code in :attr:`step`."""
        self._parameter_hooked = False
        """A parameter's post-accumulate hook sets up the gradients' watch (see :meth:`_hook_a_parameter`)."""
        self._compiled_seen = False
        """A training step ran the model's modules inside compiled code (see :meth:`ran_compiled_code`)."""
        self._told_compiled = False
        self.active = False
        """Between :meth:`start` and :meth:`stop`: also the monitor's own calls (the loss, the
        gradients) are watched only then."""

    # -- lifetime -------------------------------------------------------------------------------
    def start(self) -> None:
        self.active = True
        self._tracker.start()
        compiled = [(path, module) for path, module in compiled_modules(self.model) if not is_compiled_wrapper(module)]
        self._undo = [after_compiled_calls(module, self._compiled_output(path or ROOT_MODULE)) for path, module in compiled]
        if self.optimizer is not None and not self._optimizer_hooks:
            self._optimizer_hooks = [
                self.optimizer.register_step_pre_hook(self._before_optimizer_step),
                self.optimizer.register_step_post_hook(self._after_optimizer_step),
            ]

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Watch nothing inside the block (a replay's calls are not the window's), every hook left in
        place: removing the global module hooks would change what compiled code was guarded on
        (their number), so the replay's run of it, as it ran, would compile it again."""
        active, self.active, self._suspended = self.active, False, True
        try:
            yield
        finally:
            self.active, self._suspended = active, False

    def stop(self, *, keep_hooks: bool = False) -> None:
        """Stop watching until :meth:`start`; ``keep_hooks``: the global module hooks stay
        registered, idle (see :meth:`ran_compiled_code`). The optimizer's step hooks stay, idle,
        until :meth:`close`: ``torch.compile(optimizer.step)`` traces them and guards on the ids
        they were registered under, so registered anew they would compile the step again."""
        self.active = False
        self._parameter_hooked = False
        self._tracker.stop(keep_hooks=keep_hooks)
        if not keep_hooks:
            self._last_hooks.remove()
        self._returning.clear()
        for undo in self._undo:
            undo()
        self._undo = []

    def close(self) -> None:
        """Stop watching, every hook removed."""
        self.stop()
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks = []

    @torch.compiler.disable  # inside torch.compile(optimizer.step): run as it is, not traced
    def _before_optimizer_step(self, *_: Any) -> None:
        if self.active:
            self.watch_gradients()

    @torch.compiler.disable
    def _after_optimizer_step(self, *_: Any) -> None:
        if self.active:
            self.watch_parameters()

    def next_step(self, step: int) -> None:
        if self.active and self.grads_taken and not self.inside_seen:  # a training step ran the model inside compiled code
            self._compiled_seen = True
            self._tell_compiled()
            if not self.root_seen and self.after_each_backward:
                self._hook_a_parameter()
        self.step = step
        self._calls.clear()
        self._seen.clear()
        self._returning.clear()  # a module's own hook that raised never let it return
        self.grads_taken = False
        self.root_seen = self.inside_seen = False
        self._backward_queued = False  # a backward that raised never ran its final callbacks

    def ran_compiled(self) -> bool:
        """Whether this step ran compiled code of the model: a compiled module of it, or none of its
        modules below the root outside compiled code (the model compiled whole, or a compiled
        function calling it). The same on every rank that runs the same code."""
        return not self.inside_seen or next(compiled_modules(self.model), None) is not None

    def ran_compiled_code(self) -> bool:
        """Whether a training step so far ran compiled code of the model (see :meth:`ran_compiled`).
        Dynamo then compiled the model's calls with the global module hooks registered, and guards
        on the ids they were registered under: hooks registered anew (a :meth:`start` after
        :meth:`stop`) compile that code again, every time, until Dynamo's recompile limit runs it
        eagerly, so a pause keeps them."""
        return self._compiled_seen or next(compiled_modules(self.model), None) is not None

    def observe_model_calls(self, before: Callable[[nn.Module], None], after: ModelCallEnd) -> Callable[[], None]:
        """Have ``before(called)`` run as each training-mode call of the model starts, and
        ``after(called, args, kwargs, output)`` as it returns, outside compiled code (no graph
        break, whether the model, a compiled wrapper of it or neither is called): ``called`` is
        what the call was made on, the model or the compiled wrapper standing for it, so calling
        it again runs what ran. Returns what stops it."""
        observer = (before, after)
        self._call_observers.append(observer)
        return lambda: self._call_observers.remove(observer) if observer in self._call_observers else None

    # -- module outputs (ModuleTracker's recorder interface) --------------------------------------
    def enter(self, module: nn.Module, name: str, args: tuple, phase: str, traced: bool) -> None:
        """A module call starts (the tracker's global hook). A module with forward hooks of its own
        (a user's, tensor parallelism's redistribution, FSDP2's post-forward), which run after the
        global ones, gets a hook placed last among them (:class:`LastForwardHooks`), so its output is
        watched once they ran: a NaN its hook writes is that module's, not the next one's."""
        if self._suspended:
            return
        after_hooks = False  # most modules: no forward hooks of their own
        if own_forward_hooks(module) and phase == "forward" and id(module) in self._modules:
            # a compiled wrapper's call stands for it: its hooks run inside the compiled call
            after_hooks = not self._tracker.runs_compiled(module) and self._last_hooks.place(module)
        self._open.append((phase, after_hooks))
        if module is self._root and self._childless and not self._tracker.runs_compiled(module):
            self.inside_seen = True  # nothing below the root: its own code runs outside compiled code
        if module is self._root and self._call_observers and phase == "forward" and module.training:
            called = self._tracker.called_as(module)
            self._root_call = (called, args)
            for before, _ in list(self._call_observers):
                before(called)

    def exit(self, module: nn.Module, name: str, kwargs: dict[str, Any], output: Any, traced: bool) -> None:
        if self._suspended:
            return
        phase, after_hooks = self._open.pop() if self._open else (RECOMPUTE, False)
        if phase != "forward":
            return
        if after_hooks:  # the module's own forward hooks run next, and may change what it returns
            self._returning.append((module, name))
        else:
            self._returned(module, name, kwargs, output)

    def _returned_after_hooks(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        """``module``'s own forward hooks ran: ``output`` is what its call returns."""
        if self._returning and self._returning[-1][0] is module:
            name = self._returning.pop()[1]
            if not self._suspended:
                self._returned(module, name, kwargs, output)

    def _returned(self, module: nn.Module, name: str, kwargs: dict[str, Any], output: Any) -> None:
        """A call of ``module`` in the forward returned ``output``, outside compiled code."""
        if id(module) in self._modules:
            self._watch_output(name, output)
        if module is self._root and self._root_call is not None:
            (called, args), self._root_call = self._root_call, None
            for _, after in list(self._call_observers):
                after(called, args, kwargs, output)

    def _compiled_output(self, name: str) -> Callable[[Any], None]:
        """What watches a compiled module's output from outside its compiled call (``module.compile()``'s
        call, wrapped by :func:`after_compiled_calls`): the hooks inside return while Dynamo traces."""

        def watch(output: Any) -> None:
            if current_autograd_node() is None:  # not activation checkpointing's recomputation
                self._watch_output(name, output)

        return watch

    def _watch_output(self, name: str, output: Any) -> None:
        """A module of the model returned ``output`` outside compiled code: watched in training mode;
        the model's own call (in any mode, under autograd) sets up the gradients' watch."""
        if self._suspended:
            return
        root = name == ROOT_MODULE
        if root:
            self.root_seen = True
        else:
            self.inside_seen = True
        if self.model.training:
            call = self._calls.get(name, 0)
            self._calls[name] = call + 1
            if output.__class__ not in PLAIN_TENSORS or not self._add_output(name, call, output):
                self._add([("forward", name, arg, call, "output", value) for arg, value in output_slots(output)])
        if root and self.after_each_backward and self.active and torch.is_grad_enabled():
            self._watch_gradients_after_backward(output)

    def _watch_gradients_after_backward(self, output: Any) -> None:
        """Have the backward through ``output`` (the model's) watch the gradients when it ends
        (:func:`after_backward`: after FSDP2's and DDP's own final callbacks have set them, before
        the loop clips them); the last micro-batch's watch holds every micro-batch's sum."""
        differentiable = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        if differentiable:
            torch.autograd.graph.register_multi_grad_hook(differentiable, self._backward_reached, mode="any")

    def _tell_compiled(self) -> None:
        """Say once that the model's modules ran inside compiled code, which the monitor does not watch."""
        if self._told_compiled or self._childless:
            return
        self._told_compiled = True
        logger.warning(
            "torchdebug monitor: the model's modules run inside compiled code (the model compiled whole, or a "
            "compiled function calling it), which the monitor does not look into: of the forward it watches only %s. "
            "Compile each block instead (block.compile()) to have each block's output watched; a replay runs the "
            "step eagerly, op by op, either way.",
            "the model's output and the loss" if self.root_seen else "the loss",
        )

    def _hook_a_parameter(self) -> None:
        """Have each backward that reaches the first parameter watch the gradients when it ends: the
        last step's backward did not come through the model's output, which a compiled function
        ran (``torch.compile`` of a function that calls the model; Dynamo traces the model's call).
        One hook, one call per backward. Not under compiled autograd, which would trace it into its
        graph and break it there; nor on a sharded parameter, whose gradient FSDP2 sets without
        accumulating (FSDP2's models show their output)."""
        first = next((p for p in self.parameters() if p.requires_grad and not is_subclass(p)), None)
        if self._parameter_hooked or first is None or compiled_autograd_enabled():
            return
        self._parameter_hooked = True
        self._undo.append(first.register_post_accumulate_grad_hook(self._backward_reached).remove)

    @torch.compiler.disable  # a backward run from a compiled function's frame: Dynamo must not trace the hook
    def _backward_reached(self, grad: Any) -> None:
        if not self._backward_queued:  # one watch per backward, however many outputs led to it
            self._backward_queued = True
            after_backward(self._backward_ended)

    @torch.compiler.disable
    def _backward_ended(self) -> None:
        self._backward_queued = False
        self.watch_gradients(again=True, scaled=True)

    def drop(self, traced: bool) -> None:
        if self._open and not self._suspended:
            self._open.pop()

    # -- gradients and parameters ---------------------------------------------------------------
    def watch_gradients(self, again: bool = False, scaled: bool = False) -> None:
        """The gradients of this step, once per step unless ``again`` (each backward's end: a later
        micro-batch's watch replaces an earlier one's, so the step keeps the accumulated sum);
        ``scaled``: as the backward left them, times the loss scale, which is watched with them."""
        if self.grads_taken and not again:
            return
        self.grads_taken = True
        params, grads = [], []
        for param in self.parameters():
            grad = param.grad
            if grad is not None:
                params.append(param)
                grads.append(grad)
        self._add_parameters("backward", "parameter_grad", params, grads)
        scale = self.loss_scale() if scaled and self.loss_scale is not None else None
        if scale is not None:
            self._add([("backward", NO_MODULE, "", 0, "output", scale)], op=LOSS_SCALE_OP)

    def watch_parameters(self) -> None:
        """The parameters as the optimizer step left them."""
        params = self.parameters()
        self._add_parameters("optimizer", "parameter", params, params)

    def watch_loss(self, loss: torch.Tensor) -> None:
        """The loss the loop passes in."""
        self._add([("forward", NO_MODULE, "", 0, "output", loss)], op=LOSS_OP)

    def parameters(self) -> list[torch.Tensor]:
        """The parameters watched: the optimizer's, else the model's."""
        if self.optimizer is not None:
            return [p for group in self.optimizer.param_groups for p in group["params"]]
        return list(self.model.parameters())

    def _name(self, param: torch.Tensor) -> tuple[str, str]:
        """``(module path, leaf name)`` of a parameter; one the model does not hold is named by its place in the optimizer."""
        return self._names.get(id(param)) or ("-", f"param{self.parameters().index(param)}")

    # -- into the ring ---------------------------------------------------------------------------
    def _add(self, slots: list[tuple[str, str, str, int, str, Any]], op: str = MODULE_OP) -> None:
        """Take the statistics of ``(phase, module, arg, call, io, value)`` slots of floating tensors
        into the current step: CPU tensors now, into the ring (in one native call); others through
        the stager (the stager's raw sums, ``StatsStager(finish=False)``). A tensor seen before in
        the step, unchanged (a module passing on its last child's output), is reduced once: its
        later slots get the first one's sums."""
        if not self.active:
            return
        items = []
        tensors, indices, numels, arrivals = [], [], [], []
        step, ring = self.step, self.ring
        for phase, module, arg, call, io, value in slots:
            if not isinstance(value, torch.Tensor) or value.is_meta:
                continue
            tensor = value if value.__class__ in PLAIN_TENSORS else plain(value)
            if tensor is None or not (tensor.is_floating_point() or tensor.is_complex()):
                continue
            index = ring.slot(phase, module, op, call, io, arg)
            _describe(ring.slots[index], value)
            if self._seen_before(tensor, index):
                continue
            seen = _Seen(ring, step, index)
            self._seen[id(tensor)] = (weakref.ref(tensor), tensor_version(tensor), index, seen)
            numel = tensor.numel()
            if numel == 0:
                seen.arrive(IDENTITY, 0)
            elif stats_table._resolves_now(tensor):
                tensors.append(tensor)
                indices.append(index)
                numels.append(numel)
                arrivals.append(seen)  # its sums are written below: its other slots wait for them
            else:
                items.append((tensor, self._sink(step, seen, numel)))
        # the addresses once every slot is in: a new slot may grow (move) the ring
        addresses = ring.addresses(step, indices, numels) if tensors else None
        if addresses is not None:
            cpu_sums_many_into(tensors, addresses)
        for seen in arrivals:
            seen.arrive()
        if items:
            self.pending[step] = self.pending.get(step, 0) + len(items)
            self.stager.add_all(items)

    def _seen_before(self, tensor: torch.Tensor, index: int) -> bool:
        """Whether ``tensor`` was reduced before in this step, unchanged since: slot ``index`` then gets
        (or waits for) the sums of the first slot that held it."""
        seen = self._seen.get(id(tensor))
        if seen is None or seen[0]() is not tensor or seen[1] is None or seen[1] != tensor_version(tensor):
            return False  # not seen, or an inference tensor: its writes leave no trace
        if seen[3] is None:  # its sums are in the ring
            self.ring.copy(self.step, seen[2], index)
        else:
            seen[3].add(index)
        return True

    def _add_output(self, name: str, call: int, tensor: torch.Tensor) -> bool:
        """:meth:`_add` of a module's one output, a plain tensor, where the CPU kernel takes it now (a
        floating CPU tensor, not empty), with less host work a tensor: its slot found by module and
        call, no list of slots, its sums written into the ring by one native call of its own (the
        code after the module's call may change it in place: it is read now); from the step after
        its slot was found, one call of the native module does all of it (``ring_sums.cpp``) where
        it takes the tensor. Returns whether it did; else :meth:`_add` takes it."""
        if not self.active:
            return True
        found = self._output_slots.get((name, call))
        native = self._native
        if found is not None and native is not None and stats_table._resolves_now is _RESOLVES_ON_THE_HOST:
            rows = self.ring.rows(self.step)  # one call does the rest (ring_sums.cpp), or nothing
            if rows is not None:  # the arguments one by one: a starred call builds a list and a tuple
                (slot, index), (sums_at, numel_at) = found, rows
                if native.output_sums(tensor, slot, index, sums_at, numel_at, self._seen):
                    return True
        if not stats_table._resolves_now(tensor) or not tensor.is_floating_point():
            return False
        numel = tensor.numel()
        if not numel:
            return False
        ring = self.ring
        if found is None:
            index = ring.slot("forward", name, MODULE_OP, call, "output", "0")
            found = self._output_slots[(name, call)] = (ring.slots[index], index)
        slot, index = found
        _describe(slot, tensor)
        key = id(tensor)
        if key in self._seen and self._seen_before(tensor, index):
            return True
        self._seen[key] = (weakref.ref(tensor), tensor_version(tensor), index, None)
        address = ring.address(self.step, index, numel)
        if address is not None:
            cpu_sums_one_into(tensor, address)
        return True

    def _add_parameters(self, phase: str, io: str, params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """:meth:`_add` of ``values``, the tensors of ``params`` (the parameters themselves or their
        gradients) in the slots ``(phase, <module>, <leaf>, 0, io)``: when every one is a plain
        floating CPU tensor (a model trained on the CPU), their sums are written into the ring by one
        native call, the slots those of the last call given the same parameters, and without the check for a
        tensor seen before in the step (it would give the same sums: the one reduction it saves is
        of a parameter a module returned, unchanged since). Else through :meth:`_add`."""
        if not self.active:
            return
        known = self._parameter_slots.get((phase, io))
        if known is None or not known.holds(params):
            known = self._parameter_slots[(phase, io)] = _ParameterSlots(self, phase, io, params)
        ring, resolves_now = self.ring, stats_table._resolves_now
        if self._native is not None and known.plain and resolves_now is _RESOLVES_ON_THE_HOST and isinstance(values, list):
            rows = ring.rows(self.step)
            if rows is not None and self._native.group_sums(values, known.slots, known.indices, *rows):
                return
        indices, tensors, numels, empty = [], [], [], []
        for value, slot, index in zip(values, known.slots, known.indices):
            if value.__class__ not in PLAIN_TENSORS or not resolves_now(value) or not value.is_floating_point():
                break
            _describe(slot, value)
            numel = value.numel()
            if numel:
                indices.append(index)
                tensors.append(value)
                numels.append(numel)
            else:
                empty.append(index)
        else:
            addresses = ring.addresses(self.step, indices, numels)
            if addresses is not None:
                cpu_sums_many_into(tensors, addresses)
            for index in empty:
                ring.put_sums(self.step, index, list(IDENTITY), 0)
            return
        self._add([(phase, *self._name(p), 0, io, value) for p, value in zip(params, values)])

    def _sink(self, step: int, seen: _Seen, numel: int) -> Callable[[list[float]], None]:
        """Where the stager delivers a device tensor's sums."""

        def sink(sums: list[float]) -> None:
            left = self.pending[step] - 1
            if left:
                self.pending[step] = left
            else:
                del self.pending[step]
            seen.arrive(sums, numel)

        return sink


class _ParameterSlots:
    """The slots of a list of parameters (or of their gradients), in its order, for
    :meth:`Watcher._add_parameters` to reuse while it is given the same parameters in the same order.
    A parameter the model does not hold is named by its place in the optimizer, which may change:
    a list with one is never reused."""

    __slots__ = ("params", "slots", "indices", "named", "plain")

    def __init__(self, watcher: Watcher, phase: str, io: str, params: list[torch.Tensor]) -> None:
        self.params = params
        self.indices = []
        for param in params:
            module, leaf = watcher._name(param)
            self.indices.append(watcher.ring.slot(phase, module, MODULE_OP, 0, io, leaf))
        self.slots = [watcher.ring.slots[index] for index in self.indices]
        self.named = all(id(param) in watcher._names for param in params)
        self.plain = all(param.__class__ in PLAIN_TENSORS for param in params)
        """No parameter is a subclass (FSDP2's are DTensors): the native module may be given the list."""

    def holds(self, params: list[torch.Tensor]) -> bool:
        """Whether ``params`` are the parameters these slots were found for, in the same order."""
        return self.named and len(params) == len(self.params) and all(map(operator.is_, params, self.params))


def _describe(slot: Slot, value: torch.Tensor) -> None:
    """Note the dtype and shape of the tensor ``slot`` holds now (rewritten only when they changed)."""
    dtype, shape = dtype_name(value.dtype), value.shape
    if slot.dtype is not dtype:
        slot.dtype = dtype
    if slot.shape != shape:
        slot.shape = tuple(shape)


class _Seen:
    """A tensor reduced in the current step whose sums are on their way (from the device's table, or
    the native call that ends :meth:`Watcher._add`): the slot they go to, and the other slots that
    hold it, which wait for them."""

    __slots__ = ("ring", "step", "first", "waiting")

    def __init__(self, ring: Ring, step: int, first: int) -> None:
        self.ring, self.step, self.first = ring, step, first
        self.waiting: list[int] | None = []
        """Slots waiting for the sums (``None`` once they are in the ring)."""

    def add(self, index: int) -> None:
        if self.waiting is None:
            self.ring.copy(self.step, self.first, index)
        else:
            self.waiting.append(index)

    def arrive(self, sums: list[float] | tuple[float, ...] | None = None, numel: int = 0) -> None:
        """The sums are in: ``sums`` of ``numel`` elements, or (``None``) written into the ring already."""
        if sums is not None:
            self.ring.put_sums(self.step, self.first, list(sums), numel)
        for index in self.waiting or ():
            self.ring.copy(self.step, self.first, index)
        self.waiting = None
