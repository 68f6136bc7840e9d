"""Recomputed forward ops (activation checkpointing): told from backward ops, paired with the
forward calls they repeat.

A checkpointed region's forward runs again inside the backward (``torchdebug._torch.checkpoint``
says how each flavour is recognised). Its ops, and the module calls around them, are recorded in
phase ``recompute``, named and counted on their own (``recompute/h.0.attn.qkv/aten.addmm.default#0``),
so the backward's call numbers are those of a run without checkpointing (docs/capture.md).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from torchdebug._torch.autograd import node_sequence_nr
from torchdebug._torch.checkpoint import reentrant
from torchdebug.records import NO_MODULE

RECOMPUTE = "recompute"
"""The phase of recomputed forward ops and module calls."""

ForwardCall = tuple[str, str, Any, str, "int | None"]
"""``(module, call name, captured stack, op, index in the step's forward log)``; recomputed calls
stand for their forward call with this shape too (index ``None`` for those without a pair)."""

LOOKAHEAD = 64
"""How many forward calls a recomputed op inside a module may skip to find its pair (the ops whose
outputs selective checkpointing kept are not run again)."""

LOOKBACK = 4096
"""How far before the node being run a non-reentrant region's first op is looked for."""


class RecomputePairing:
    """Pairs the ops of the recomputation under way with the forward calls they repeat; the
    forward call's name becomes the record's ``fwd``.

    A recomputation replays its region's forward from the first op (selective checkpointing skips
    the ops whose outputs it kept, early stop cuts the tail), so pairing walks the step's forward
    calls in order from the region's first one: a reentrant checkpoint's region starts at the forward
    call its node's sequence number names (the region ran under ``no_grad``, so each of its ops saw
    that node as the last one made); a non-reentrant region's start is found from its first
    recomputed op inside a module: the last forward call of that op and module before the call that
    made the node being run. Checkpointing's own ``detach`` calls are phase ``recompute`` too
    (:class:`RebuiltTensors`), so neither phase holds more calls than a run without checkpointing.
    An op inside a module is paired with the next forward call of that op and module within
    :data:`LOOKAHEAD` calls; an op outside every module only with the very next forward call of its
    op. An op without a pair keeps the module the tracker gives and no ``fwd``.
    """

    def __init__(self) -> None:
        self._node: int | None = None
        """Sequence number of the node whose backward runs the recomputation."""
        self._next: int | None = None
        """Log index where the next pair is looked for; ``None`` until the region's start is known."""
        self._before: int | None = None
        """Log index of the forward call that made that node (non-reentrant: the region holds it)."""

    def reset(self) -> None:
        self._node = self._next = self._before = None

    def pair(
        self, node: Any, op: str, module: str, log: list[ForwardCall], forward: dict[int, ForwardCall]
    ) -> ForwardCall | None:
        """The forward call that the op ``op`` in ``module``, recomputed while ``node`` runs, repeats."""
        key = node_sequence_nr(node)
        if key != self._node:
            made_by = forward.get(key)
            self._node, self._before = key, made_by[4] if made_by is not None else None
            self._next = self._before if reentrant(node) else None
        if self._next is None:
            found = self._region_start(op, module, log)
        elif module == NO_MODULE:
            found = self._next if self._next < len(log) and log[self._next][3] == op else None
        else:
            found = next(
                (i for i in range(self._next, min(self._next + LOOKAHEAD, len(log))) if log[i][3] == op and log[i][0] == module),
                None,
            )
        if found is None:
            return None
        self._next = found + 1
        return log[found]

    def _region_start(self, op: str, module: str, log: list[ForwardCall]) -> int | None:
        if module == NO_MODULE or self._before is None:
            return None
        for index in range(self._before, max(self._before - LOOKBACK, -1), -1):
            if log[index][3] == op and log[index][0] == module:
                return index
        return None


class RebuiltTensors:
    """The tensors a checkpoint handed to autograd to unpack in the backward: the outputs of the
    ``detach`` calls of phase ``recompute`` (a recomputation's saved-tensors hook detaches each
    tensor it rebuilds; selective checkpointing detaches each output it keeps). Held weakly and
    known by identity, with the module whose call made them."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[weakref.ref, str]] = {}

    def add(self, tensor: Any, module: str) -> None:
        if isinstance(tensor, torch.Tensor):
            self._made[id(tensor)] = (weakref.ref(tensor), module)

    def module_of(self, tensor: Any) -> str | None:
        """The module of a rebuilt ``tensor``, ``None`` for any other object."""
        found = self._made.get(id(tensor))
        return found[1] if found is not None and found[0]() is tensor else None

    def clear(self) -> None:
        self._made.clear()
