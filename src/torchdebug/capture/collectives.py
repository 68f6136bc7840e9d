"""Collectives (``c10d`` ops) complete after they are dispatched: capture their outputs then.

A collective's inputs are captured when it is dispatched, its outputs once its work has completed
(:class:`PendingCollectives`); a functional collective's outputs, and every slot reading them, once
they are waited for (:class:`PendingFunctional`); an FSDP2 group's collectives belong to the group's
module (:func:`collective_owner`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchdebug._torch.dispatch import op_schema
from torchdebug._torch.fsdp import issuing_group
from torchdebug._torch.funcol import pending_works, wait_tensor
from torchdebug._torch.subclasses import describe, is_subclass
from torchdebug.slots import Slot, iter_slots

Work = dist.Work if dist.is_available() else None

_RECEIVE_INTO_ARGUMENT = frozenset({"c10d.recv_.default", "c10d.recv_any_source_.default"})


def _as_work(value: Any) -> Any:
    """The ``Work`` boxed in a c10d op's result, or ``None`` for other values."""
    if isinstance(value, torch.ScriptObject):
        try:
            return Work.unbox(value)
        except RuntimeError:  # a boxed object of another class
            return None
    return None


def split_result(op: str, args: tuple, result: Any) -> tuple[list[Any], list[Any]]:
    """``(works, outputs)`` of a c10d op's result."""
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    works = [work for work in map(_as_work, items) if work is not None]
    outputs = [item for item in items if not isinstance(item, torch.ScriptObject)]
    if op in _RECEIVE_INTO_ARGUMENT and args:
        outputs = [args[0]]
    return works, outputs


DISTRIBUTED_DIR = os.path.dirname(dist.__file__) + os.sep
"""Where torch.distributed's Python code lives: ops run under it are its own (a wait's copies)."""


def _inside_torch_distributed(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(DISTRIBUTED_DIR):
            return True
        frame = frame.f_back
    return False


def collective_owner(name_of: Callable[[nn.Module], str]) -> tuple[str | None, str] | None:
    """``(phase, module path)`` of the collective (or FSDP2 copy-in or copy-out) being dispatched
    when an FSDP2 parameter group issues it: an all-gather belongs to the module whose parameters it
    gathers, a reduce-scatter to the module whose gradients it reduces, in the pass the group runs
    it for (``forward`` or ``backward``, prefetches included; ``None`` when the group is idle: the
    caller's phase holds). ``name_of`` names a module (the module tracker's); a group of several
    modules (``fully_shard([a, b])``) is named ``a+b``. ``None`` for other collectives."""
    found = issuing_group(sys._getframe(1))
    if found is None:
        return None
    modules, phase = found
    return phase, "+".join(map(name_of, modules))


def waited_by_caller(func: Any, args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether the ``torch.distributed`` wrapper waits for this op right after dispatching it
    (``async_op=False``): then it is complete by the time any later op is dispatched. Gloo's
    ``reduce_scatter`` work never reports itself completed, so this is checked first."""
    for index, argument in enumerate(op_schema(func).arguments):
        if argument.name == "async_op":
            value = kwargs.get("async_op", args[index] if index < len(args) else argument.default_value)
            return value is False
    return False


def completed(work: Any, outputs: list[Any]) -> bool:
    """Whether a collective's ``work`` has completed, its ``outputs`` final. A work whose future
    completed counts where the outputs are on the host: gloo marks its future completed before the
    work itself, and what waited on the future (DDP's reducer, viewing its buckets at the backward's
    end) runs ops on the final values meanwhile. A device's future (NCCL's, completed once the
    collective is queued) says nothing of the values: only the work does (native/c10d_work.cpp's
    rule, by the future's devices)."""
    if work.is_completed():
        return True
    if not all(tensor.device.type == "cpu" for tensor in _tensors(outputs)):
        return False
    try:
        return work.get_future().done()
    except RuntimeError:  # a work with no future
        return False


def _tensors(values: Iterable[Any]) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


class PendingCollectives:
    """Collectives whose outputs wait for their work to complete.

    ``dist.all_reduce(x)`` dispatches ``c10d.allreduce_``, which only *starts* the work; the reduced
    values exist once the returned ``Work`` completes (the wrapper waits for it, or the user does
    with ``async_op=True``). So outputs are captured the first time torchdebug looks after the work
    has completed: before the next op is captured, or when capture stops (which waits for
    collectives still in flight). Outputs are the tensors the op returns, or its first argument for
    ``recv``."""

    def __init__(self) -> None:
        self._pending: list[tuple[list[Any], bool, list[Any], Callable[[Iterator[Slot]], None]]] = []

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, works: list[Any], waited: bool, outputs: list[Any], capture_outputs: Callable[[Iterator[Slot]], None]) -> None:
        """Capture ``outputs`` with ``capture_outputs(slots)`` once the works are complete
        (``waited``: the caller waits for them before dispatching anything else)."""
        if not works:
            capture_outputs(iter_slots(outputs))
        else:
            self._pending.append((works, waited, outputs, capture_outputs))

    def capture_completed(self) -> None:
        """Capture the outputs of every collective whose work has completed.

        Does nothing while torch.distributed itself is running ops (gloo finishes some
        collectives inside ``wait()`` with ``split``/``copy_``): the values are not final yet.
        """
        if _inside_torch_distributed(sys._getframe(1)):
            return
        still = []
        pending, self._pending = self._pending, []
        for entry in pending:
            works, waited, outputs, capture_outputs = entry
            if waited or all(completed(work, outputs) for work in works):
                capture_outputs(iter_slots(outputs))
            else:
                still.append(entry)
        self._pending = still + self._pending

    def finish(self) -> None:
        """Wait for the collectives still in flight (capture is stopping) and capture them.

        Every rank issued them, so they complete; for NCCL, ``wait`` orders the current stream
        after the collective, so the statistics taken next see the final values.
        """
        pending, self._pending = self._pending, []  # wait() may dispatch ops that look at the list
        for works, _, outputs, capture_outputs in pending:
            for work in works:
                if not work.is_completed():  # gloo hangs in a second wait of a send/recv
                    work.wait()
            capture_outputs(iter_slots(outputs))


def _storage_key(tensor: torch.Tensor) -> int | None:
    """The address of a plain tensor's storage (``None`` for an empty one: nothing to wait for)."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage of its own
        return None
    return storage.data_ptr() if storage.nbytes() else None


class PendingFunctional:
    """Storages that functional collectives are still writing into, and the slots held back until
    they are final (keyed by storage: a view or a wrapper of a collective's output waits with it).

    Functional collectives (``_c10d_functional.all_reduce``, ..., what DTensor and tensor parallelism
    issue) return no ``Work``: their outputs are final once ``_c10d_functional.wait_tensor`` ran on a
    tensor of the same storage (an ``AsyncCollectiveTensor`` runs it before the first op that is not
    a view reads it). Held slots are released at the ``wait_tensor`` call, a wait torchdebug makes for
    an op about to wait anyway, the moment no functional collective's work is left uncollected, or
    capture stopping (which waits for the rest)."""

    def __init__(self) -> None:
        self._written: dict[int, torch.Tensor] = {}
        """Storage address -> a tensor of that storage (to wait on when capture stops)."""
        self._held: list[tuple[set[int], list[Slot], Callable[[Iterable[Slot]], None]]] = []

    def __bool__(self) -> bool:
        return bool(self._written)

    def writes(self, tensors: Iterable[Any]) -> None:
        """Note the storages of ``tensors`` (plain tensors) as written until a wait completes them."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and (key := _storage_key(tensor)) is not None:
                self._written.setdefault(key, tensor)

    def _written_into(self, value: Any) -> set[int]:
        if not isinstance(value, torch.Tensor):
            return set()
        plain = [inner for _, inner in describe(value).inner] if is_subclass(value) else [value]
        return {key for tensor in plain if (key := _storage_key(tensor)) in self._written}

    def hold(self, slots: Iterable[Slot], capture: Callable[[Iterable[Slot]], None]) -> list[Slot]:
        """The slots that can be read now; the others are handed to ``capture`` once every storage
        they read is final."""
        ready, held, keys = [], [], set()
        for slot in slots:
            found = self._written_into(slot[1])
            if found:
                held.append(slot)
                keys |= found
            else:
                ready.append(slot)
        if held:
            self._held.append((keys, held, capture))
        return ready

    def complete(self, tensor: torch.Tensor) -> None:
        """``tensor``'s storage is final (a wait ran on it): capture the slots that waited for it."""
        key = _storage_key(tensor)
        if key is not None and self._written.pop(key, None) is not None:
            self._capture_ready()

    def capture_completed(self) -> None:
        """Capture everything held once no functional collective's work is left uncollected."""
        if pending_works() == 0:
            self._written.clear()
            self._capture_ready()

    def finish(self) -> None:
        """Wait for the storages still being written (capture is stopping) and capture the rest."""
        written, self._written = self._written, {}
        for tensor in written.values():
            wait_tensor(tensor)
        self._capture_ready()

    def _capture_ready(self) -> None:
        held, self._held = self._held, []
        for entry in held:
            keys, slots, capture = entry
            if keys.isdisjoint(self._written):
                capture(slots)
            else:
                self._held.append(entry)
