"""The calls of a compiled AOT graph, seen from outside it: what the backend hands AOT autograd.

AOT autograd calls a compiled graph *boxed*: with one list of its inputs, which inductor's code
clears to free each input as soon as it is read (``_boxed_call``, set by ``make_boxed_func``).
Inductor's ``compile_fx_inner`` returns a ``CompiledFxGraph`` whose ``__call__`` runs its
``current_callable``; AOT autograd reads the object's type and fields (``partition_maps``: the
forward graph split around CUDA-graph-unsafe ops), so the object is kept and only its
``current_callable`` is wrapped, after ``post_compile`` set it (CUDA graphs inside). Unchanged from
torch 2.11 through 2.14.1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdebug._torch import require

require("graph dumps (compiled graphs' calls)")

__all__ = ["calls_around"]


def calls_around(compiled: Any, before: Callable[[list[Any]], None], after: Callable[[Any], None]) -> Any:
    """``compiled`` (a boxed compiled graph) calling ``before(inputs)`` before each run, while the
    list still holds the inputs, and ``after(outputs)`` with what the run returned; a graph that is
    not boxed is returned as it is."""
    inner = getattr(compiled, "current_callable", None)
    if inner is not None:  # inductor's CompiledFxGraph
        compiled.current_callable = _around(inner, before, after)
        return compiled
    if not getattr(compiled, "_boxed_call", False):
        return compiled
    run = _around(compiled, before, after)
    run._boxed_call = True  # type: ignore[attr-defined]  # AOT autograd's mark of a boxed callable
    return run


Boxed = Callable[[list[Any]], Any]


def _around(call: Boxed, before: Callable[[list[Any]], None], after: Callable[[Any], None]) -> Boxed:
    def run(inputs: list[Any]) -> Any:
        before(inputs)
        outputs = call(inputs)
        after(outputs)
        return outputs

    return run
