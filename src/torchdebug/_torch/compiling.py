"""Dynamo's compilations, as they start and end on a thread.

Dynamo runs ops of its own while it compiles a frame (AOT autograd copies the RNG state to restore
it; a backend may run the graph), with the dispatch modes taken off meanwhile, so eager capture's
dispatch mode never sees them; the native observer would, as ops of the module being compiled.
:class:`CompileEvents` tells it when a compilation starts and ends, through the callbacks Dynamo
runs around each (``torch._dynamo.callback.callback_handler``, private, torch 2.11 through 2.14: a
frame's compilation, an AOT backward compiled at its first run, a CUDA graph's recording). Dynamo
runs them for the outermost compilation of the process only: with two threads compiling at once,
the second thread's is not told. :func:`frame_callback_setter` turns Dynamo off around the Python
hooks the native observer calls from inside ops.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CompileEvents", "frame_callback_setter"]


class CompileEvents:
    """Calls ``starts(True)`` as each compilation starts and ``starts(False)`` as it ends, on the
    compiling thread, while entered."""

    def __init__(self, starts: Callable[[bool], None]) -> None:
        self._start = lambda _: starts(True)
        self._end = lambda _: starts(False)
        self._handler: Any = None

    def enter(self) -> None:
        """Register the callbacks, where Dynamo is loaded: without it nothing was compiled, and a step
        that compiles its first code loads it, after this call (its compilations are not told)."""
        if "torch._dynamo" not in sys.modules or self._handler is not None:
            return
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)
        self._handler = callback_handler

    def exit(self) -> None:
        """Take the callbacks out, where they still are: ``torch._dynamo.reset()`` clears them (a
        compilation after it, in the same step, is not told)."""
        handler, self._handler = self._handler, None
        if handler is not None and self._start in handler.start_callbacks:
            handler.remove_start_callback(self._start)
        if handler is not None and self._end in handler.end_callbacks:
            handler.remove_end_callback(self._end)


def frame_callback_setter() -> Callable[[Any], Any] | None:
    """Dynamo's setter of the thread's frame callback, ``torch._C._dynamo.eval_frame.set_eval_frame``
    (private; torch 2.11 through 2.14.1): ``setter(None)`` turns Dynamo off for the Python frames that
    start from then on and returns the callback it replaced, which ``setter(prior)`` puts back, as
    ``torch.compiler.disable`` does around what it wraps. ``None`` where torch has no such function."""
    eval_frame = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    return getattr(eval_frame, "set_eval_frame", None)
