"""Which tensor each slot holds: the ids that make a dump's data flow exact.

Every tensor slot a session records carries ``value_id``, ``version`` and ``view_of`` (defined in
docs/format.md), so that compare finds the op that made an input by a dict lookup instead of guessing
it from dtype, shape and statistics (two zero biases look alike; a cast changes all three). A view
gets an id of its own (the three chunks of a ``split`` share their base and its version, and each is
read by other ops); a tensor subclass is one tensor here (torch moves the wrapper's version on an
in-place op, not its local shard's).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch

from torchdebug._torch.autograd import tensor_version, view_base
from torchdebug.records import MODULE_OP, Record

__all__ = ["ValueIds"]


class ValueIds:
    """The value ids of one rank's tensors: three dict lookups and one version read per slot.

    Three dicts keyed by ``id(tensor)``: the weak reference that says the entry is still that tensor's
    (the one object per tensor the garbage collector walks, which a capture of statistics made
    already), its value id, and for views only ``(view_of, version floor)``: the floor is a view op's
    output's version until the op returns and torch shares its base's counter with it. Keys are
    reused once a tensor is freed (so are torch's storage and ``TensorImpl`` addresses), hence the
    weak reference; freed tensors' entries are dropped at each step, and within a step whenever the
    entries have doubled since the last drop (memory within twice the live tensors', amortised
    constant cost per tensor)."""

    __slots__ = ("_refs", "_ids", "_views", "_unmoved", "_next", "_limit")

    _FLOOR = 4096
    """Entries below which no drop happens within a step."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}
        self._ids: dict[int, int] = {}
        self._views: dict[int, tuple[int, int]] = {}
        self._unmoved: dict[int, int] = {}
        """Writes torch did not count in a tensor's version (``wrote``), added to it."""
        self._next = 0
        self._limit = self._FLOOR

    def mark(self, record: Record, tensor: torch.Tensor, bumps: bool) -> None:
        """Set ``record``'s ``value_id``, ``version`` and ``view_of`` for ``tensor``. ``bumps``: the
        slot is an output of an op that writes its arguments and whose written arguments' versions
        torch moves as it returns (a mutable schema): a tensor that existed before the call is one it
        wrote (a new one is an output it made)."""
        made = record.io == "output" and record.op != MODULE_OP  # an op's new output: no base yet
        record.value_id, record.version, record.view_of = self._identity(tensor, bumps, made)

    def identity(self, tensor: torch.Tensor) -> tuple[int, int | None, int | None]:
        """``(value_id, version, view_of)`` of ``tensor`` now, as an input slot's record gets them
        (:meth:`mark`): what a copy of it taken now stands for (the overflow check's copies of what a
        call writes, taken before the call)."""
        return self._identity(tensor, False, False)

    def _identity(self, tensor: torch.Tensor, bumps: bool, made: bool) -> tuple[int, int | None, int | None]:
        key = id(tensor)
        ref = self._refs.get(key)
        if ref is not None and ref() is tensor:
            value_id = self._ids[key]
        elif made:
            value_id = self._next
            self._next = value_id + 1
            self._refs[key] = weakref.ref(tensor)
            self._ids[key] = value_id
            self._views.pop(key, None)
            self._unmoved.pop(key, None)
            bumps = False
            if len(self._refs) > self._limit:
                self.prune()
        else:
            value_id = self._add(tensor)
            bumps = False
        view = self._views.get(key) if self._views else None
        version = tensor_version(tensor)  # None: an inference tensor, which keeps no version
        if version is not None:
            if bumps:
                version += 1
            if self._unmoved:
                version += self._unmoved.get(key, 0)
            if view is not None and version < view[1]:
                version = view[1]
        return value_id, version, None if view is None else view[0]

    def see(self, tensors: Iterable[Any]) -> None:
        """Give ids to the tensors among ``tensors`` not seen yet (an in-place op's arguments when
        inputs are not recorded: its outputs are then known as the tensors it wrote)."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                self._id(tensor)

    def wrote(self, tensor: torch.Tensor) -> None:
        """``tensor`` was written in place and torch did not move its version (``CaptureSession.wrote``):
        its records' versions count the write."""
        self._id(tensor)
        self._unmoved[id(tensor)] = self._unmoved.get(id(tensor), 0) + 1

    def views(self, outputs: Iterable[Any], source: torch.Tensor) -> None:
        """Register the new tensors among ``outputs`` (a view op's, made from ``source``) as views of
        ``source``'s memory, at ``source``'s version."""
        root = self._root(source)
        floor = tensor_version(source) or 0
        refs = self._refs
        for tensor in outputs:
            if isinstance(tensor, torch.Tensor) and ((ref := refs.get(id(tensor))) is None or ref() is not tensor):
                refs[id(tensor)] = weakref.ref(tensor)  # (``lift_fresh`` returns its argument: known, kept)
                self._ids[id(tensor)] = self._next
                self._next += 1
                self._views[id(tensor)] = (root, floor)
                self._unmoved.pop(id(tensor), None)
        if len(refs) > self._limit:
            self.prune()

    def prune(self) -> None:
        """Drop the entries of freed tensors (ids stay unique for the run: they are never reused)."""
        self._refs = {key: ref for key, ref in self._refs.items() if ref() is not None}
        self._ids = {key: self._ids[key] for key in self._refs}
        self._views = {key: view for key, view in self._views.items() if key in self._refs}
        self._unmoved = {key: count for key, count in self._unmoved.items() if key in self._refs}
        self._limit = max(self._FLOOR, 2 * len(self._refs))

    def _id(self, tensor: torch.Tensor) -> int:
        ref = self._refs.get(id(tensor))
        return self._ids[id(tensor)] if ref is not None and ref() is tensor else self._add(tensor)

    def _root(self, tensor: torch.Tensor) -> int:
        """The value id of the tensor that owns ``tensor``'s memory."""
        value_id = self._id(tensor)
        view = self._views.get(id(tensor))
        return value_id if view is None else view[0]

    def _add(self, tensor: torch.Tensor) -> int:
        """The value id of a tensor first seen (not as an op's output): a view made outside capture
        names its base's memory."""
        base = view_base(tensor)
        key = id(tensor)
        self._views.pop(key, None)
        self._unmoved.pop(key, None)
        if base is not None:
            self._views[key] = (self._root(base), 0)
        value_id = self._next
        self._next = value_id + 1
        self._refs[key] = weakref.ref(tensor)
        self._ids[key] = value_id
        if len(self._refs) > self._limit:
            self.prune()
        return value_id
