"""Dispatcher-level API: the dispatch mode base class, op overloads and their schemas.

``TorchDispatchMode`` lives in ``torch.utils._python_dispatch`` and op overloads in ``torch._ops``,
both private modules with a stable shape from torch 2.11 through 2.14. ``ignore_compile_internals``
(a classmethod a mode overrides) keeps compiled functions compiled while the mode is active.
"""

from __future__ import annotations

import operator

from torchdebug._torch import require

require("op capture and replay (dispatcher internals)")

import torch  # noqa: E402
from torch._ops import OpOverload, OpOverloadPacket  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

op_schema = operator.attrgetter("_schema")
"""``op_schema(op)``: the ``torch.FunctionSchema`` of an op overload (arguments, mutability)."""


def moves_versions(op: OpOverload) -> bool:
    """Whether torch moves the version of the arguments ``op`` writes as the call returns: its
    ``ADInplaceOrView`` kernel does (``add_``, ``copy_``, ``out=`` forms). Ops without one
    (``native_batch_norm``, ``_fused_adam_``, and the in-place ``_foreach_*_``, whose autograd kernel
    moves them only where no dispatch mode runs) write without it."""
    return op.has_kernel_for_dispatch_key(torch._C.DispatchKey.ADInplaceOrView)


__all__ = ["OpOverload", "OpOverloadPacket", "TorchDispatchMode", "moves_versions", "op_schema"]
