"""The Python frames a compiled graph runs under: which module's code it was compiled from.

Dynamo compiles a frame (a module's ``forward``, a function, or a resume function it made at a
graph break, ``torch_dynamo_resume_in_forward_at_54``) into new bytecode that keeps the code's
``co_filename`` and ``co_name``, and runs the compiled graph from that frame, so a graph running
now has its frame on the Python stack, under the frames of the compiled code (AOT autograd's and
inductor's wrappers): :func:`running_frame` finds it by the file and function that the first line
of the graph's ``stack_trace`` metadata names. A graph break inside a submodule's ``forward`` makes
Dynamo compile it as a frame whose ``self`` is the submodule: the one thing that tells which
instance of a module class ran the graph (a mixture-of-experts layer's loop over its experts).

:func:`in_compiled_code` tells an op run in a frame of code Dynamo made (``orig_code_map``) or in
the backward of AOT autograd's ``CompiledFunction``, as the native observer tells it by scope.

``torch.compile(module)``'s ``OptimizedModule`` (``_orig_mod``) and ``module.compile()``'s
``_compiled_call_impl`` are called through ``Module._wrapped_call_impl``, whose frame holds the
module as ``self``: :func:`outermost_compiled_module` finds the module the user compiled there.

Unchanged from torch 2.11 through 2.14.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from torch import nn
from torch.nn.modules import module as _module_globals

from torchdebug._torch import require
from torchdebug._torch.nn import is_compiled_wrapper, unwrap_compiled

require("graph dumps (the frames compiled graphs run under)")

_MODULE_FILE = _module_globals.__file__
_CALL = nn.Module._wrapped_call_impl.__code__.co_name

_MAX_DEPTH = 256
"""Frames looked at, at most, from a graph's sink up to its frame or to the outermost module call."""

_COMPILED_DEPTH = 40
"""Frames looked at, at most, for a frame of code Dynamo made above an op: 5 to 19 from a dispatch
mode's handler in compiled code (inductor's extern kernels, aot_eager's graph, an op at a graph
break); each costs about 0.2 µs of host a captured op in a process that compiled anything."""

_COMPILED_BACKWARD = "CompiledFunctionBackward"
"""The class name of the node of AOT autograd's ``CompiledFunction`` (``autograd.Function`` names its
node class after it)."""


def running_frame(file: str, function: str) -> FrameType | None:
    """The innermost frame on the stack running code ``function`` of ``file`` (the frame a graph
    running now was compiled from), or ``None``."""
    frame = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == function and code.co_filename == file:
            return frame
        frame = frame.f_back
    return None


def in_compiled_code(node: Any) -> bool:
    """Whether the caller runs as compiled code: in a frame Dynamo compiled (what its graph calls, and
    what the frame calls eagerly at a graph break), or in autograd's evaluation of ``node``, a compiled
    graph's backward. Inductor's kernels write buffers there with no aten op and no version moved."""
    if node is not None and type(node).__name__ == _COMPILED_BACKWARD:
        return True
    utils = sys.modules.get("torch._dynamo.utils")
    made = utils.orig_code_map.values if utils is not None else None  # the code Dynamo made, by id
    if not made:
        return False
    frame = sys._getframe(1)
    for _ in range(_COMPILED_DEPTH):
        if frame is None:
            return False
        if id(frame.f_code) in made:
            return True
        frame = frame.f_back
    return False


def local_module(frame: FrameType, name: str, index: int | None = None) -> nn.Module | None:
    """The module a frame holds in local ``name`` (``args[0]`` with ``index=0``), else ``None``."""
    value: Any = frame.f_locals.get(name)
    if index is not None:
        value = value[index] if isinstance(value, (tuple, list)) and len(value) > index else None
    return value if isinstance(value, nn.Module) else None


def enclosing_module(frame: FrameType | None, depth: int = 8) -> nn.Module | None:
    """The ``self`` module of ``frame`` or of the nearest of its ``depth`` callers that has one: a
    resume function gets only the locals it still reads, so its ``self`` may be left to the frame
    that called it (the ``forward`` it resumes)."""
    for _ in range(depth):
        if frame is None:
            return None
        found = local_module(frame, "self")
        if found is not None:
            return found
        frame = frame.f_back
    return None


def outermost_compiled_module(frame: FrameType | None) -> nn.Module | None:
    """Of the module calls running at ``frame`` and its callers, the outermost one that runs
    compiled code (``torch.compile(module)``'s wrapper, unwrapped, or a module whose ``compile()``
    ran), else ``None``."""
    found = None
    for _ in range(_MAX_DEPTH):
        if frame is None:
            break
        code = frame.f_code
        if code.co_name == _CALL and code.co_filename == _MODULE_FILE:
            module = frame.f_locals.get("self")
            if is_compiled_wrapper(module):
                found = unwrap_compiled(module)
            elif getattr(module, "_compiled_call_impl", None) is not None:
                found = module
        frame = frame.f_back
    return found


__all__ = ["enclosing_module", "in_compiled_code", "local_module", "outermost_compiled_module", "running_frame"]
