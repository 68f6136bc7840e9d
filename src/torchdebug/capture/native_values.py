"""What the native path's slots hold, from the addresses the observer records: value ids
(:class:`NativeValueIds`, as ``value_ids.py``'s ``ValueIds`` gives them to eager capture's slots) and
memory that holds no value of the run yet (:class:`NativeUnwritten`, as ``unwritten.py``'s
``UnwrittenStorages`` follows it). Eager capture keys tensors by object; here a ``TensorImpl`` or
``StorageImpl`` address stands for one, checked against the memory it shows (addresses are reused
once a tensor is freed)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count

from torchdebug.capture.eager import OpInfo
from torchdebug.records import UNINITIALISED

__all__ = ["NativeUnwritten", "NativeValueIds"]


class NativeUnwritten(dict[int, bool]):
    """Storages (``StorageImpl`` addresses) of allocations that nothing has written since, as
    :class:`~torchdebug.capture.unwritten.UnwrittenStorages` follows them for eager capture: a slot
    on one holds no value of the run (``uninitialised``); an argument an op overwrites without
    reading it is ``overwritten``."""

    def why(self, io: int, info: OpInfo, arg: str, storage: int, numel: int) -> str | None:
        """Why a slot is described and not read, or ``None``; and what it tells of its storage."""
        unread = info.unread_outputs if io else info.unread_inputs
        why = unread.get(arg.partition(".")[0], unread.get("*")) if unread else None
        if why is None and self:
            if io and info.mutable:  # an in-place op's written argument holds values from now on
                self.pop(storage, None)
            elif storage in self:
                why = UNINITIALISED
        if not (why and numel):
            if io and not info.mutable and not info.makes_views:  # fresh memory: an address reused
                self.pop(storage, None)
            return None
        if why == UNINITIALISED and io:
            self[storage] = True
        elif why != UNINITIALISED:  # the op writes it
            self.pop(storage, None)
        return why


class NativeValueIds:
    """Value ids from ``TensorImpl`` addresses, which are reused once a tensor is freed: a tensor is
    the one last seen at its address while its memory (storage, offset, shape, dtype) is the same.
    A backward op's input first seen over the memory a value was made in is that value (autograd
    unpacks a saved output as a new ``TensorImpl``: a dispatch mode sees it through a ``detach``);
    another input first seen is a new value (made by an op no dispatch mode sees); an output is a new
    value, unless it is one of the op's arguments (an in-place op's, ``lift_fresh``'s)."""

    def __init__(self) -> None:
        self._at: dict[int, tuple[int, tuple]] = {}
        """By address: the value id and memory of the tensor last seen there."""
        self._made_in: dict[tuple, int] = {}
        """By memory: the value first made in it (views and in-place outputs make none)."""
        self._fresh = count()
        self.view_of: dict[int, int] = {}
        """By value id, for a view: the value id of the tensor whose memory it shares (the first one)."""
        self._row = -1
        self._inputs: dict[int, int] = {}
        self._input_storages: set[int] = set()

    def next_step(self) -> None:
        """Forget the memory values were made in: another step's tensors fill it."""
        self._made_in.clear()
        self._row = -1

    def freed(self, addresses: Iterable[int]) -> None:
        """The tensors last seen at ``addresses`` were freed (``ObservedOps.freed``): a tensor seen
        there from now on is another one."""
        for address in addresses:
            self._at.pop(address, None)

    def forget(self, address: int, memory: tuple) -> None:
        """A tensor not recorded was made at ``address`` in ``memory``: what was seen at either is gone."""
        self._at.pop(address, None)
        self._made_in.pop(memory, None)

    def made_view(self, value_id: int, source: int) -> None:
        """``value_id`` is a view op's output made from the value ``source`` (``ValueIds.views``)."""
        self.view_of[value_id] = self.view_of.get(source, source)

    def _base_id(self, base: int, storage: int) -> int:
        """The value id of the tensor at ``base`` whose memory a view first seen shares: the one seen
        there on that storage, or a new one (a tensor made outside capture, as ``ValueIds._add`` names it)."""
        known = self._at.get(base)
        if known is not None and known[1][0] == storage:
            return self.view_of.get(known[0], known[0])
        value_id = next(self._fresh)
        self._at[base] = (value_id, (storage, None, None, None))  # its offset, shape and dtype unseen
        return value_id

    def of(self, row: int, io: int, address: int, memory: tuple, backward: bool = False, base: int = 0) -> int:
        """The value id of a slot of ``row`` (absolute: rows of every drain; slots in row order, each
        row's inputs first); ``backward``: a backward op's, which may read a saved tensor unpacked;
        ``base``: the slot's view base (an input first seen that is a view names its memory's owner)."""
        if row != self._row:
            self._row, self._inputs, self._input_storages = row, {}, set()
        known = self._at.get(address)
        if io == 0:
            if known is not None and (known[1] == memory or (known[1][1] is None and known[1][0] == memory[0])):
                value_id = known[0]
            else:
                value_id = self._made_in.get(memory) if backward else None
                if value_id is None:
                    value_id = self._made_in[memory] = next(self._fresh)
                    if base:
                        self.view_of[value_id] = self._base_id(base, memory[0])
            self._inputs[address] = value_id
            self._input_storages.add(memory[0])
        elif address in self._inputs:  # an argument the op returns (it wrote it, or lift_fresh)
            value_id = self._inputs[address]
        else:
            value_id = next(self._fresh)
            if memory[0] not in self._input_storages:  # fresh memory, not a view of an input
                self._made_in[memory] = value_id
            else:
                self._made_in.setdefault(memory, value_id)
        self._at[address] = (value_id, memory)
        return value_id
