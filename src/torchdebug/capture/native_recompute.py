"""Activation checkpointing on the native path: which drained rows are a recomputation's, or
checkpoint's own bookkeeping, told as the dispatch mode tells them (``_torch/checkpoint.py``'s
``RecomputeDetector`` and ``bookkeeping``), from the frames the observer took at those rows.

The observer marks the rows a reentrant checkpoint's node runs and takes the Python frames of the
rows that may be a recomputation's (grad mode on in a backward, a ``detach``, the ops after one in
its node) and of checkpoint's ``detach`` and ``empty`` calls in the forward; a drain's frames are
symbolized once, each distinct stack judged once. The walk (``native/slot_walk.cpp``) names the
marked rows phase ``recompute`` and pairs them with the forward calls they repeat, as
``recompute.py`` does for the dispatch mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from torchdebug._torch.checkpoint import BOOKKEEPING_OPS, REENTRANT_NODE, Frame, in_bookkeeping, in_recomputation
from torchdebug.capture.native_values import RECOMPUTED
from torchdebug.native.observer import CHECKPOINT_NODE, GRAD_ON, NativeObserver, ObservedOps

__all__ = ["RecomputeMarks"]

_IN_RECOMPUTATION, _IN_BOOKKEEPING = 1, 2
"""What a stack's frames hold (bits)."""

_DETACH = "aten.detach.default"


class RecomputeMarks:
    """The walk's row marks of a capture's drains: the observer's, and ``native_values.RECOMPUTED``."""

    def __init__(self, observer: NativeObserver) -> None:
        observer.watch_checkpoint(REENTRANT_NODE.__name__, sorted(BOOKKEEPING_OPS))
        self._node: int | None = None
        """The node under which a non-reentrant recomputation was last seen (``RecomputeDetector._node``)."""
        self._stacks: list[int] = []
        """By the observer's stack id: ``_IN_RECOMPUTATION`` and ``_IN_BOOKKEEPING`` bits."""
        self._checkpoint_frames = False
        """Whether a stack seen so far holds checkpoint's frames (a recomputation's or its bookkeeping's)."""
        self._op_kinds: list[int] = []
        """By op id: 1 ``detach``, 2 one of checkpoint's bookkeeping ops (``detach`` is both)."""
        self.recomputed = False
        """Whether a row was marked ``RECOMPUTED`` since the capture began: only then can the walk
        name a row after a tensor a checkpoint rebuilt (``SlotWalk.name_rows``' ``ends``)."""

    def reset(self) -> None:
        """A capture stopped (the mode's detector forgets its node then)."""
        self._node = None

    def marks(self, ops: ObservedOps, stack_ids: np.ndarray, stacks: Sequence[Sequence[Frame]]) -> np.ndarray:
        """Per row of ``ops``: its marks; ``stack_ids`` the observer's stack id of each row's frames
        (-1: none taken), ``stacks`` the frames by id."""
        judged = [
            _IN_RECOMPUTATION * in_recomputation(frames) | _IN_BOOKKEEPING * in_bookkeeping(frames)
            for frames in stacks[len(self._stacks) :]
        ]
        self._stacks += judged
        self._checkpoint_frames = self._checkpoint_frames or any(judged)
        self._op_kinds += [(name == _DETACH) | 2 * (name in BOOKKEEPING_OPS) for name in ops.names[len(self._op_kinds) :]]
        rows = len(ops.op)
        if not rows:
            return np.zeros(0, np.int8)
        mark = np.frombuffer(ops.mark, np.int8)
        marks = mark.copy()
        if not self._checkpoint_frames and not (mark & CHECKPOINT_NODE).any():
            return marks  # no checkpoint ran yet (a model without one: every drain)
        backward = np.frombuffer(ops.backward, np.int8).astype(bool)
        in_frames = np.where(stack_ids >= 0, np.array(self._stacks + [0], np.int8)[stack_ids], 0)
        kinds = np.array(self._op_kinds, np.int8)[np.frombuffer(ops.op, np.int32)]
        reentrant = backward & (mark & CHECKPOINT_NODE != 0)
        marks[reentrant] |= RECOMPUTED
        marks[~backward & (kinds & 2 != 0) & (in_frames & _IN_BOOKKEEPING != 0)] |= RECOMPUTED
        seqs = np.frombuffer(ops.seq, np.int64)
        for row in np.flatnonzero(backward & ~reentrant & (stack_ids >= 0)).tolist():  # RecomputeDetector, row by row
            recomputing = bool(in_frames[row] & _IN_RECOMPUTATION)
            node = int(seqs[row])
            if mark[row] & GRAD_ON or kinds[row] & 1:
                if recomputing:
                    self._node = node
                    marks[row] |= RECOMPUTED
            elif node == self._node:
                if recomputing:
                    marks[row] |= RECOMPUTED
                else:
                    self._node = None
        self.recomputed = self.recomputed or bool((marks & RECOMPUTED).any())
        return marks
