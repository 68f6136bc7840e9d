"""``torch._guards``: which Dynamo frame the graph being compiled comes from.

``CompileContext.current_compile_id()`` is the ``frame/attempt`` id (``0/1``: frame 0's first
recompile) of the compile in progress; AOT autograd keeps it for the backward graph it compiles
lazily, at the first backward. The data dump uses the frame to tell a recompiled graph of the same
code (a new sequence length under dynamic shapes) from a second graph of the step: the first ends
a step when it runs, as the graph it replaces would have. Its ``compiled_autograd_id`` is set while
Dynamo compiles a backward traced by compiled autograd, which the data dump does not follow and
says so. Unchanged from torch 2.11 through 2.14.
"""

from __future__ import annotations

from torchdebug._torch import require

require("graph dumps (Dynamo's compile ids)")

from torch._guards import CompileContext  # noqa: E402

__all__ = ["compiling_compiled_autograd", "current_frame"]


def current_frame() -> str | None:
    """The Dynamo frame id of the compile in progress (``"0"``), ``None`` outside one."""
    compile_id = CompileContext.current_compile_id()
    frame = getattr(compile_id, "frame_id", None)
    return None if frame is None else str(frame)


def compiling_compiled_autograd() -> bool:
    """Whether the compile in progress is of a backward traced by compiled autograd."""
    return getattr(CompileContext.current_compile_id(), "compiled_autograd_id", None) is not None
