"""Functional collectives (``_c10d_functional.*``, what DTensor and tensor parallelism issue) and the
``AsyncCollectiveTensor`` that wraps their results until they are waited for.

``_c10d_functional.all_reduce(x, ...)`` returns a tensor that the process group is still writing
into: its values are final once ``_c10d_functional.wait_tensor`` ran on it (or on a tensor of the
same storage: the work registry is keyed by storage). Python's wrappers
(``torch.distributed._functional_collectives``) hand it out as an ``AsyncCollectiveTensor`` whose
``__torch_dispatch__`` waits (``trigger_wait``) before any op that is not a view reads it.

Read here: ``AsyncCollectiveTensor`` and its ``elem`` and ``completed`` attributes, its
``trigger_wait()``, and ``torch._C._distributed_c10d._get_work_registry_size``; unchanged from
torch 2.11 through 2.14.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from torchdebug._torch import require

require("functional collectives")

__all__ = ["async_tensor_class", "inner_tensor", "pending_works", "unwaited", "wait_before_read", "wait_tensor", "waits_before"]

_MODULE = "torch.distributed._functional_collectives"
"""Looked up, never imported: a process that did not import it holds no ``AsyncCollectiveTensor``."""


def async_tensor_class() -> type | None:
    """``AsyncCollectiveTensor``, or ``None`` while nothing imported functional collectives."""
    module = sys.modules.get(_MODULE)
    return None if module is None else module.AsyncCollectiveTensor


def unwaited(tensor: torch.Tensor, async_class: type) -> list[Any]:
    """The ``AsyncCollectiveTensor`` instances not yet waited for in ``tensor``: itself, or inner
    tensors of a wrapper subclass (a DTensor whose local shard is one), found through
    ``__tensor_flatten__``."""
    if isinstance(tensor, async_class):
        return [] if tensor.completed else [tensor]
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return []
    found = []
    for name in flatten()[0]:
        inner = getattr(tensor, name)
        if isinstance(inner, torch.Tensor) and inner.__class__ is not torch.Tensor:
            found += unwaited(inner, async_class)
    return found


def inner_tensor(async_tensor: Any) -> torch.Tensor:
    """The plain tensor an ``AsyncCollectiveTensor`` wraps (the collective's output, or a view of it)."""
    return async_tensor.elem


def waits_before(async_tensor: Any) -> None:
    """Wait for an ``AsyncCollectiveTensor`` as its own dispatch does before an op reads it (it
    then does not wait again)."""
    async_tensor.trigger_wait()


def wait_before_read(tensor: torch.Tensor) -> None:
    """Wait for the ``AsyncCollectiveTensor`` instances not yet waited for in ``tensor`` (itself, or
    inside a DTensor), as their own dispatch does before an op reads them: a hook that reads a
    module's output then reads the collective's result, not the buffer it is still writing (tensor
    parallelism's ``RowwiseParallel`` hands its all-reduce out unwaited). On CUDA the current stream
    waits; the host does not."""
    async_class = async_tensor_class()
    if async_class is not None:
        for waiting in unwaited(tensor, async_class):
            waits_before(waiting)


def wait_tensor(tensor: torch.Tensor) -> None:
    """Wait for the functional collectives writing into ``tensor``'s storage (none: returns at once);
    on CUDA this orders the current stream after them, without a host synchronisation."""
    torch.ops._c10d_functional.wait_tensor(tensor)


def pending_works() -> int:
    """How many functional collectives' works no ``wait_tensor`` has collected yet, in this process
    (0: every functional collective issued so far has completed)."""
    return torch._C._distributed_c10d._get_work_registry_size()
