"""Values one compiled graph hands the next: a graph input that is the very tensor an earlier graph
of the step returned (or read) holds that value's id, so the data flow goes on across a graph break
and between per-block graphs (docs/graph_dump.md, "Records and names").

The backend wraps each compiled AOT graph (``torchdebug._torch.compiled_graphs``). Before a run the
capture looks up the tensors at the graph's inputs by identity (no reference kept: inductor frees
its inputs as the graph goes); once the run ended it holds the tensors the graph returned and the
inputs it read that no graph had handed over, weakly, with the ids their values have in the dump
(a view also by where its elements are, for the tensor AOT autograd makes again over them). No
device read, no pass over memory. The held tensors are let go when a step begins: a value flows
within its step.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from torchdebug._torch.autograd import tensor_version
from torchdebug.graph_dump._value_ids import Local, SlotValue

Absolute = tuple[int, int, int | None]
"""A value as the dump names it: ``(value_id, version, view_of)``."""

Arrived = tuple[dict[int, Absolute], list[tuple[int, "weakref.ref[torch.Tensor]", SlotValue]]]
"""What arrived at a run's inputs: the values handed over, by local index; every tensor (weakly),
with its local index and its value as the run leaves it."""


class RunValues:
    """How the local value ids of one graph run (``graph_dump._value_ids``) become the dump's."""

    __slots__ = ("base", "forward", "received")

    def __init__(self, base: int, received: dict[int, Absolute], forward: RunValues | None = None) -> None:
        self.base = base
        """The id of the graph's first local value in this run."""
        self.received = received
        """Local index of an input -> the value an earlier graph of the step handed over in it."""
        self.forward = forward
        """For a backward run: the forward run's (the values it saved; ``None``: none known)."""

    def absolute(self, value: SlotValue) -> Absolute | None:
        """``value`` as the dump names it (``None`` for a saved value of an unknown forward run)."""
        own = self._named(value.value_id)
        if own is None:
            return None
        value_id, received = own
        if value.view_of is None:
            version = value.version if received is None else value.version + received[1]
            return value_id, version, None if received is None else received[2]
        memory = self._named(value.view_of)
        if memory is None:
            return value_id, value.version, None
        memory_id, memory_received = memory
        if memory_received is None:
            return value_id, value.version, memory_id
        # versions go on from the value handed over, a view of a view names the first memory
        view_of = memory_id if memory_received[2] is None else memory_received[2]
        return value_id, value.version + memory_received[1], view_of

    def _named(self, local: Local) -> tuple[int, Absolute | None] | None:
        """A local id as the dump's, with the value handed over in it (``None``: not handed over)."""
        index, saved = local
        owner = self.forward if saved else self
        if owner is None:
            return None
        received = owner.received.get(index) if owner.received else None
        return (index + owner.base if received is None else received[0]), received


class Handover:
    """The tensors the step's graphs returned, held weakly by identity, with the values they hold."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[weakref.ref[torch.Tensor], int, Absolute]] = {}
        self._views: dict[_Place, tuple[weakref.ref[Any], int, Absolute]] = {}
        """The views among them by where their elements are, held by their memory (its storage):
        AOT autograd hands a graph's view of an intermediate on as another tensor object, made
        again over the same elements outside the graph."""

    def received(self, inputs: tuple[tuple[int, int, SlotValue], ...], args: Sequence[Any]) -> Arrived:
        """What arrives at a run's ``inputs`` (``GraphPlan.inputs``) among its ``args``, looked up
        before the run (inductor frees its inputs as it goes): the values earlier graphs of the
        step handed over, by local index (an in-place write since, by eager code between the
        graphs, moves the version on), and every tensor, weakly, for :meth:`hold` (those not handed
        over, or all of them when the run begins a step)."""
        held = self._held
        found: dict[int, Absolute] = {}
        tensors: list[tuple[int, weakref.ref[torch.Tensor], SlotValue]] = []
        for position, local, leaving in inputs:
            tensor = args[position] if position < len(args) else None
            if not isinstance(tensor, torch.Tensor):
                continue
            entry = held.get(id(tensor))
            if entry is None or entry[0]() is not tensor:
                entry = self._view_at(tensor) if self._views else None
            if entry is not None:
                value_id, version, view_of = entry[2]
                found[local] = (value_id, version + _version(tensor) - entry[1], view_of)
            tensors.append((local, weakref.ref(tensor), leaving))
        return found, tensors

    def _view_at(self, tensor: torch.Tensor) -> tuple[weakref.ref[Any], int, Absolute] | None:
        """The held view whose elements ``tensor`` holds: the same memory, still alive, at the same
        place (offset, sizes, strides, dtype)."""
        place = _place(tensor)
        entry = None if place is None else self._views.get(place)
        return entry if entry is not None and entry[0]() is tensor.untyped_storage() else None

    def hold(self, tensors: Iterable[tuple[Any, SlotValue]], values: RunValues) -> None:
        """Hold each tensor a run read or returned with its value (local to the run, ``values``)."""
        held = self._held
        for tensor, local in tensors:
            value = values.absolute(local)
            if isinstance(tensor, torch.Tensor) and value is not None:
                identity, version = id(tensor), _version(tensor)
                held[identity] = (weakref.ref(tensor, functools.partial(_let_go, held, identity)), version, value)
                place = _place(tensor) if local.view_of is not None else None
                if place is not None:
                    memory = weakref.ref(tensor.untyped_storage(), functools.partial(_let_go, self._views, place))
                    self._views[place] = (memory, version, value)

    def clear(self) -> None:
        """A step began: values of the last step flow no further."""
        self._held.clear()
        self._views.clear()


_Place = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype]
"""Where a tensor's elements are: its storage (``id``), offset, sizes, strides and dtype."""


def _place(tensor: torch.Tensor) -> _Place | None:
    """Where ``tensor``'s elements are (``None``: a tensor without a storage of its own to name)."""
    if tensor.layout != torch.strided or type(tensor) is not torch.Tensor:
        return None
    return id(tensor.untyped_storage()), int(tensor.storage_offset()), tuple(tensor.shape), tensor.stride(), tensor.dtype


def _version(tensor: torch.Tensor) -> int:
    """``tensor``'s in-place version; 0 for an inference tensor, which keeps none (a compiled model
    run under ``torch.inference_mode``)."""
    version = tensor_version(tensor)
    return 0 if version is None else version


def _let_go(held: dict[Any, Any], key: Any, _: Any) -> None:
    """A held tensor (or memory) died: its address may hold another one next."""
    held.pop(key, None)
