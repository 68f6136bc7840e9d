"""Activation checkpointing's recomputation, as eager capture sees it from inside the backward.

``torch.utils.checkpoint`` (and ``checkpoint_wrapper`` and selective checkpointing, built on it) runs
a region's forward again during the backward, to rebuild the tensors it did not keep. Those ops run
while the autograd engine executes a node, like backward ops: :class:`RecomputeDetector` tells them
apart, :func:`bookkeeping` tells checkpoint's own forward ops from the user's. Each says how, and
which torch release differs. Phases and pairing: docs/capture.md, "Large-model training";
docs/architecture.md, "The torch seam". ``tests/capture/test_checkpointing.py`` runs every flavour on
torch 2.11.0, 2.13.0 and 2.14.1.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint as _checkpoint

from torchdebug._torch import require

require("activation checkpointing (checkpoint internals)")

REENTRANT_NODE = _checkpoint.CheckpointFunction._backward_cls
"""The class of the autograd node a reentrant checkpoint region leaves in the graph."""


def _nested_code(code: types.CodeType) -> Iterator[types.CodeType]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested_code(const)


def _codes_named(*names: str) -> tuple[types.CodeType, ...]:
    """The code of the functions, methods and nested functions of ``torch.utils.checkpoint`` named
    one of ``names``. Found by name in the module's code, so moves between releases do not matter:
    ``recompute_fn`` is a nested function of ``_checkpoint_without_reentrant_generator`` on torch 2.11
    and 2.13, of ``_checkpoint_without_reentrant_generator_impl`` on 2.14 (``CheckpointFunction`` and
    its backward class are unchanged from 2.11 through 2.14.1)."""
    found = []
    for value in vars(_checkpoint).values():
        for function in vars(value).values() if isinstance(value, type) else (value,):
            code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
            if isinstance(code, types.CodeType) and code.co_filename == _checkpoint.__file__:
                found += [c for c in (code, *_nested_code(code)) if c.co_name in names]
    return tuple(dict.fromkeys(found))


RECOMPUTE_CODES = _codes_named("recompute_fn")
"""The code of the non-reentrant checkpoint's ``recompute_fn`` (one object on every torch we support)."""

_NOOP_SAVE = getattr(_checkpoint, "_NoopSaveInputs", None)
"""torch 2.11's autograd function holding a non-reentrant region's inputs (gone in 2.13)."""

BOOKKEEPING_CODES = _codes_named(
    "_maybe_detach", "_detach_helper", "_checkpoint_without_reentrant_generator", "_checkpoint_without_reentrant_generator_impl"
) + ((inspect.unwrap(_NOOP_SAVE.forward).__code__,) if _NOOP_SAVE is not None else ())
"""Functions whose own ``detach`` and ``empty`` calls are checkpoint's bookkeeping."""

BOOKKEEPING_OPS = frozenset({"aten.detach.default", "aten.empty.memory_format"})
"""The ops checkpoint's bookkeeping runs in the forward."""


_grad_enabled = torch.is_grad_enabled


def _in_frame_of(codes: tuple[types.CodeType, ...]) -> bool:
    """Whether a frame running one of ``codes`` is on the Python stack."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        for wanted in codes:
            if code is wanted:
                return True
        frame = frame.f_back
    return False


def bookkeeping() -> bool:
    """Whether the forward op under way (one of :data:`BOOKKEEPING_OPS`) is checkpoint's own: run by
    one of its functions, not by the user's function that checkpoint runs (a generator suspended at
    its ``yield`` while the region runs is not on the stack).

    Selective checkpointing detaches each output it keeps (``_maybe_detach`` on torch 2.11,
    ``_detach_helper`` from 2.13), and on torch 2.11 the non-reentrant checkpoint makes two empty
    tensors per region (a ``dummy`` and the output of ``_NoopSaveInputs``, which holds the inputs; 2.13
    saves them without it): those are told from the user's ops by the functions on the stack, for
    ``detach`` and ``empty`` calls only. Autograd detaches every rebuilt tensor it unpacks in the
    backward (eager capture knows those by identity)."""
    return _in_frame_of(BOOKKEEPING_CODES)


class RecomputeDetector:
    """Tells a checkpoint's recomputation (and its set-up) from backward ops, per op, from the
    autograd node the engine is running.

    - reentrant (``use_reentrant=True``): ``CheckpointFunction.backward`` detaches the saved inputs,
      re-runs the region under ``enable_grad`` and backwards through the rebuilt graph (a nested
      backward, whose ops run in the rebuilt graph's nodes). Every op that the checkpoint's own
      autograd node (``CheckpointFunctionBackward``) runs is recomputation or its set-up.
    - non-reentrant (``use_reentrant=False``, the default of ``checkpoint_wrapper``): the first unpack
      of a saved tensor of the region calls its ``recompute_fn`` from a saved-tensors hook, under
      ``enable_grad``, while the engine runs the node that unpacks it; with early stop (the default)
      ``recompute_fn`` is left by an exception once the last needed tensor is rebuilt. A backward op
      runs with grad mode off unless the backward builds a graph (``create_graph=True``), so only ops
      with grad mode on pay for the walk up the Python stack that looks for ``recompute_fn``'s frame,
      with ``detach`` calls (the rebuilt tensors' saved-tensors hook detaches them with grad mode off)
      and the ops with grad mode off that the same node runs next (a ``no_grad`` block inside the
      region), until one is outside it.
    """

    def __init__(self) -> None:
        self._node: Any = None
        """The node under which a non-reentrant recomputation was last seen (held, so the engine
        hands back the same Python object while it runs)."""

    def __call__(self, node: Any, detach: bool) -> bool:
        """Whether the op under way, run while the engine runs ``node``, is a recomputation's;
        ``detach``: the op is ``aten.detach`` (the recomputation's saved-tensors hook runs one, with
        grad mode off, for each tensor it rebuilds, before the op that saves it reaches the dispatch
        mode: the first op a recomputation runs may be one)."""
        if type(node) is REENTRANT_NODE:
            return True
        if _grad_enabled() or detach:
            if _in_frame_of(RECOMPUTE_CODES):
                self._node = node
                return True
            return False
        if node is self._node:
            if _in_frame_of(RECOMPUTE_CODES):
                return True
            self._node = None
        return False

    def reset(self) -> None:
        self._node = None


Frame = tuple[str, int, str]
"""A symbolized Python frame: ``(file, line, function)``, as ``torch::symbolize`` gives it."""


def _frames_running(codes: tuple[types.CodeType, ...]) -> Callable[[Iterable[Frame]], bool]:
    """Whether symbolized frames hold one running any of ``codes``: its file, its name and a line of
    its body (functions of one name in one file are told apart by their lines)."""
    spans: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for code in codes:
        lines = [line for _, _, line in code.co_lines() if line is not None] or [code.co_firstlineno]
        spans.setdefault((code.co_filename, code.co_name), []).append((min(lines), max(lines)))

    def running(frames: Iterable[Frame]) -> bool:
        return any(first <= line <= last for file, line, function in frames for first, last in spans.get((file, function), ()))

    return running


in_recomputation = _frames_running(RECOMPUTE_CODES)
"""Whether frames taken at an op hold ``recompute_fn``'s: the native path's :class:`RecomputeDetector`
(the observer takes the frames where this class walks the stack)."""

in_bookkeeping = _frames_running(BOOKKEEPING_CODES)
"""Whether frames taken at an op hold one of checkpoint's own functions: the native path's :func:`bookkeeping`."""


def reentrant(node: Any) -> bool:
    """Whether ``node`` is a reentrant checkpoint's own node: the ops it runs directly re-run its
    region from the first op, and the node's sequence number is the one its region's forward ops
    saw (they ran under ``no_grad`` and made no node of their own)."""
    return type(node) is REENTRANT_NODE


__all__ = [
    "BOOKKEEPING_CODES",
    "BOOKKEEPING_OPS",
    "RECOMPUTE_CODES",
    "REENTRANT_NODE",
    "Frame",
    "RecomputeDetector",
    "bookkeeping",
    "in_bookkeeping",
    "in_recomputation",
    "reentrant",
]
