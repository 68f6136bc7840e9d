"""What :class:`UnwrittenStorages` says of memory nothing has written yet, and when it stops."""

from __future__ import annotations

import gc

import torch

from torchdebug.capture.unwritten import UnwrittenStorages
from torchdebug.records import UNINITIALISED


def test_every_tensor_on_a_marked_storage_is_unwritten_until_the_holder_is_written():
    buffer = torch.zeros(8)
    for _ in range(3):
        buffer.add_(1)  # a buffer whose version is not 0, as FSDP2's are after their first steps
    unwritten = UnwrittenStorages()
    unwritten.add([buffer])
    # a tensor on the same storage with a version counter of its own: what an op's view output is
    # inside the dispatch, before autograd makes it share the buffer's
    alias = torch.empty(0).set_(buffer.untyped_storage(), 2, (2, 3))
    assert alias._version != buffer._version
    assert unwritten.why(buffer) == unwritten.why(buffer.view(2, 4)) == unwritten.why(alias) == UNINITIALISED
    assert unwritten.why(torch.zeros(8)) is None  # another storage
    buffer.view(2, 4)[0].fill_(2.0)  # a declared write through a view moves the buffer's version
    assert unwritten.why(alias) is None and not unwritten


def test_a_storage_stays_marked_across_a_resize_and_drops_out_when_written_or_freed():
    buffer = torch.zeros(8)
    unwritten = UnwrittenStorages()
    storage = buffer.untyped_storage()
    storage.resize_(0)  # FSDP2's reshard frees it, and the next unshard resizes it again
    unwritten.add([buffer])
    storage.resize_(8 * buffer.itemsize)
    assert unwritten.why(buffer.view(4, 2)) == UNINITIALISED
    unwritten.written(buffer.view(2, 4))  # an out= buffer, a collective's output
    assert unwritten.why(buffer) is None and not unwritten

    holder = torch.zeros(4)
    other = torch.empty(0).set_(holder.untyped_storage())  # the same memory, not a view keeping it alive
    unwritten.add([holder])
    assert unwritten.why(other) == UNINITIALISED
    del holder  # the tensor that marked it is gone: what is left of its storage is read again
    gc.collect()
    assert unwritten.why(other) is None and not unwritten
    unwritten.add([torch.zeros(2), torch.zeros(3)])
    unwritten.clear()
    assert not unwritten


def test_wrapper_subclasses_and_marked_storages_a_second_time_are_left_alone():
    buffer = torch.zeros(4)
    unwritten = UnwrittenStorages()
    unwritten.add([torch.nn.Parameter(torch.zeros(2))])  # not a plain tensor: no storage of its own to mark
    assert not unwritten
    unwritten.add([buffer])
    buffer.add_(1)
    unwritten.add([buffer.view(2, 2)])  # marked already: the first entry (and its version) stays
    assert unwritten.why(buffer) is None
