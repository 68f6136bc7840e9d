"""The native path's tensor-subclass slots, read at the flush through their inner tensors as the
dispatch mode reads them at the op (``CaptureSession._describe_subclass``).

The observer flags a wrapper subclass (a DTensor, a float8 or NF4 weight, a thin wrapper) and keeps
it: its sizes may call into Python and its storage is not its value. Here each is described as
itself (dtype, global shape, stride, device; the plain tensor holding its elements gives dtype and
device), its facts go to ``extra``, and its statistics and fingerprint are taken from that plain
tensor with the step's other kept tensors; one whose value is computed from several inner tensors
gets the mode's ``capture_error``. Read at the flush, one written in place since its op says so,
as a plain kept tensor does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from torchdebug._torch.autograd import tensor_version
from torchdebug._torch.subclasses import describe
from torchdebug.capture.native_values import CHANGED_TEXT, WalkedSlots
from torchdebug.native.observer import SUBCLASS
from torchdebug.records import layout_not_captured
from torchdebug.slots import dtype_name
from torchdebug.store import SlotOverrides, extra_text

__all__ = ["read_subclasses"]

Due = tuple[torch.Tensor, Callable[[dict], None] | None, Callable[[int], None] | None]
"""A kept tensor to reduce at the flush, with its statistics and fingerprint sinks (``stage``'s item)."""


def read_subclasses(
    walked: WalkedSlots,
    kept: dict[int, torch.Tensor],
    versions: Sequence[int],
    taken: list[dict[str, Any]],
    taken_fingerprints: list[int | None],
    due: list[Due],
    *,
    statistics: bool,
    fingerprints: bool,
) -> SlotOverrides | None:
    """Describe the subclass slots of ``walked`` that the observer kept (``kept``: by drained slot,
    ``versions``: each drained slot's version at its op), or ``None`` when there is none. One written
    in place since its op is not read (``CHANGED_TEXT``). Each read one gets an entry of ``taken`` (and of
    ``taken_fingerprints``) that ``walked.stats`` / ``walked.fingerprints`` now name, its plain
    tensor queued in ``due``; its flag in ``walked.errors`` is cleared (its error, if any, is the
    description's)."""
    flagged = np.flatnonzero(walked.errors == SUBCLASS).tolist()
    positions = [position for position in flagged if int(walked.slots[position]) in kept]
    if not positions:
        return None
    overrides = SlotOverrides(positions, [], [], [], [], [], [])
    for position in positions:
        slot = int(walked.slots[position])
        tensor = kept[slot]
        view = describe(tensor)
        local = tensor if view.local is None else view.local
        overrides.dtypes.append(dtype_name(local.dtype))
        overrides.shapes.append(list(tensor.shape))
        overrides.devices.append(str(local.device))
        overrides.extras.append(extra_text(view.info) if view.info else None)
        walked.errors[position] = 0
        strided = local.layout is torch.strided
        overrides.strides.append(list(tensor.stride()) if strided or view.local is not None else None)
        if view.local is None or not strided:
            overrides.errors.append(view.why_unread() if view.local is None else layout_not_captured(local.layout))
            continue
        if versions[slot] >= 0 and tensor_version(tensor) != versions[slot]:
            overrides.errors.append(CHANGED_TEXT)
            continue
        overrides.errors.append(None)
        if not (statistics or fingerprints):
            continue
        entry = len(taken)
        stats: dict[str, Any] = {}
        taken.append(stats)
        taken_fingerprints.append(None)
        if statistics:
            walked.stats[position] = -2 - entry
        if fingerprints:
            walked.fingerprints[position] = -2 - entry
        fingerprint_sink = functools.partial(taken_fingerprints.__setitem__, entry) if fingerprints else None
        due.append((view.local, stats.update if statistics else None, fingerprint_sink))
    return overrides
