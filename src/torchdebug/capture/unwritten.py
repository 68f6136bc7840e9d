"""Memory that holds no value of the run yet: an allocation, or a buffer FSDP2 hands out again.

``torch.empty`` returns whatever the memory held before, NaN included after a NaN step freed it.
FSDP2 frees each parameter's all-gather buffers at reshard and resizes their storage again in the
next unshard, where it views them as ``out=`` buffers before its copy-out fills them; no captured op
shows that resize, so the unshard's copy-in marks them (``_torch.fsdp.unshard_buffers``). Reading
such memory records garbage: two identical runs then differ, and a NaN search names a view of a
fresh buffer as where the NaN entered.

:class:`UnwrittenStorages` follows those storages through a step: a tensor on one (the buffer or
any view of it) holds no value until an op writes it: an in-place op (whose written output shows
it, and which moves the version counter the views share with the buffer), or an op that writes it
without declaring it (a collective's output, an ``out=`` buffer, FSDP2's
copy-out; the eager capture's ``unread_inputs``). Storages are keyed by their ``StorageImpl``, which
a resize keeps, not by their address, which it changes and an allocator reuses.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator

import torch

from torchdebug._torch.autograd import tensor_version
from torchdebug.records import UNINITIALISED

__all__ = ["UnwrittenStorages", "markable", "storage_id"]


def storage_id(tensor: torch.Tensor) -> int | None:
    """The identity of a plain tensor's ``StorageImpl`` (``None`` when it has no storage of its own)."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def markable(tensors: Iterable[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor, int]]:
    """``(storage id, tensor, version)`` of the ``tensors`` whose storage can be marked as holding no
    value: plain tensors with a storage of their own, not inference tensors (their writes leave no trace)."""
    for tensor in tensors:
        if tensor.__class__ is torch.Tensor and (key := storage_id(tensor)) is not None:
            version = tensor_version(tensor)
            if version is not None:
                yield key, tensor, version


class UnwrittenStorages(dict[int, tuple[weakref.ref, int]]):
    """Storages nothing has written since they were handed out (keyed by ``StorageImpl``), each
    with the tensor that marked it (held weakly: once it is gone, what is left of the storage is
    read again) and its version. A ``dict``, so that the check capture makes per slot (is any
    storage marked?) is its C-level truth test, not a Python call: most steps mark none."""

    def add(self, tensors: Iterable[torch.Tensor]) -> None:
        """Mark the storages of ``tensors`` (plain tensors: an allocation's outputs, FSDP2's buffers)
        as holding no value; a storage marked already keeps its first entry while that holds (its
        tensor alive, unwritten): a stale one (an allocation's output freed unread, whose memory the
        allocator hands out again) would pass the new mark for a write."""
        for key, tensor, version in markable(tensors):
            entry = self.get(key)
            holder = entry[0]() if entry is not None else None
            if holder is None or tensor_version(holder) != entry[1]:
                self[key] = (weakref.ref(tensor), version)

    def why(self, tensor: torch.Tensor) -> str | None:
        """``uninitialised`` when ``tensor`` lies on a marked storage that nothing has written since;
        ``None`` otherwise (an entry found written or freed is dropped)."""
        key = storage_id(tensor) if tensor.__class__ is torch.Tensor else None
        entry = self.get(key) if key is not None else None
        if entry is None:
            return None
        holder = entry[0]()
        # The holder's version, not the tensor's: a view met inside the dispatch (an op's output)
        # has no shared version counter yet; autograd gives it one once the op returns.
        if holder is not None and tensor_version(holder) == entry[1]:
            return UNINITIALISED
        del self[key]
        return None

    def written(self, tensor: torch.Tensor) -> None:
        """``tensor`` is being written without a declared write (an ``out=`` buffer, a collective's
        output): its storage holds values from now on."""
        if self and tensor.__class__ is torch.Tensor and (key := storage_id(tensor)) is not None:
            self.pop(key, None)
