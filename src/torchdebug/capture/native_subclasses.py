"""The native path's tensor-subclass slots, described at the op and read through the plain tensor
holding their elements, as the dispatch mode does (``CaptureSession._describe_subclass``).

The observer flags a wrapper subclass (a DTensor, a float8 or NF4 weight, a thin wrapper) and never
holds it: a hold would count in its use_count, which torch reads (``observer.cpp``, find_subclasses).
At each op taking or returning one it calls a hook (``NativeStepCapture._subclass``) that describes
it here once a drain (:func:`described`: dtype, global shape, stride, the plain tensor's device, the
facts for ``extra``) and names the plain tensor the callback reads at the op, where values are read:
an optimizer writes FSDP2's sharded parameters and their states in place right after. At the flush
:func:`read_subclasses` gives each subclass slot its description; one whose value is computed from
several inner tensors gets the mode's ``capture_error``; one the callback could not read (its plain
tensor not on the CPU) is read from that tensor then, unless it changed since its op (then it says
so, as a plain kept tensor does).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchdebug._torch.autograd import tensor_version
from torchdebug._torch.subclasses import describe
from torchdebug.capture.native_values import CHANGED_TEXT, WalkedSlots
from torchdebug.native.observer import SUBCLASS
from torchdebug.records import STATS_NOT_TAKEN, layout_not_captured
from torchdebug.slots import dtype_name
from torchdebug.stats_table import FingerprintSink, Landing, StatsSink
from torchdebug.store import SlotOverrides, extra_text

__all__ = ["Described", "described", "read_subclasses"]

Due = tuple[torch.Tensor, StatsSink | None, FingerprintSink | None]
"""A kept tensor to reduce at the flush, with its statistics and fingerprint sinks (``stage``'s item)."""


@dataclass(frozen=True, slots=True)
class Described:
    """A subclass instance as described at its first op of a drain."""

    info: dict[str, Any]
    """Its facts for ``extra`` (:attr:`SubclassView.info`)."""
    dtype: str
    """The plain tensor's dtype (the instance's where it has none), as ``device``."""
    device: str
    shape: list[int]
    stride: list[int] | None
    """Its strides, ``None`` where it has none (a layout other than strided, no plain tensor)."""
    unread: str | None
    """Why its value is not read (no one plain tensor holds it, a layout other than strided), else ``None``."""
    instance: weakref.ref
    """The instance, held weakly (as ``local``, its plain tensor, ``None`` for none): read at the flush
    only while both are alive and the instance is at its op's version."""
    local: weakref.ref | None
    plain: int
    """The address of the ``TensorImpl`` the callback reads it through at the op (0: none)."""


def described(tensor: torch.Tensor) -> Described:
    """Describe a subclass instance (see the module docstring); its plain tensor is read at the op
    where it is a plain strided CPU tensor."""
    view = describe(tensor)
    local = tensor if view.local is None else view.local
    strided = local.layout is torch.strided
    plain = view.local is not None and strided and local.__class__ is torch.Tensor and local.device.type == "cpu"
    unread = view.why_unread() if view.local is None else None if strided else layout_not_captured(local.layout)
    return Described(
        view.info,
        dtype_name(local.dtype),
        str(local.device),
        list(tensor.shape),
        list(tensor.stride()) if strided or view.local is not None else None,
        unread,
        weakref.ref(tensor),
        weakref.ref(view.local) if view.local is not None else None,
        local._cdata if plain else 0,
    )


def read_subclasses(
    walked: WalkedSlots,
    kept: Mapping[int, torch.Tensor],
    addresses: Sequence[int],
    described_at: Mapping[int, Described],
    versions: Sequence[int],
    taken: list[dict[str, Any]],
    taken_fingerprints: list[int | None],
    due: list[Due],
    staged: Callable[[int], Any],
    arriving: list[tuple[int, Landing, int]],
    *,
    statistics: bool,
    fingerprints: bool,
) -> SlotOverrides | None:
    """Describe the subclass slots of ``walked`` that were described at their op (``described_at``:
    by ``TensorImpl`` address, ``addresses``: each drained slot's; ``versions``: each drained slot's
    version at its op), or ``None`` when there is none. What the callback did not read was staged at
    its op (``staged``: by drained slot, ``NativeStepCapture.stage_kept``'s entry or ``None``, whose
    fingerprints land later: ``arriving``, as ``slot_columns`` takes them) or is read now:
    from the plain tensor the observer kept for it (``kept``, by drained slot: one a collective was
    still writing), else from the plain tensor itself unless it changed since its op
    (``CHANGED_TEXT``). Such a slot gets an entry of ``taken`` (and of
    ``taken_fingerprints``) that ``walked.stats`` / ``walked.fingerprints`` now name, its plain tensor
    queued in ``due``. Each one's flag in ``walked.errors`` is cleared (its error, if any, is the
    description's)."""
    flagged = np.flatnonzero(walked.errors == SUBCLASS).tolist()
    positions = [position for position in flagged if int(addresses[int(walked.slots[position])]) in described_at]
    if not positions:
        return None
    overrides = SlotOverrides(positions, [], [], [], [], [], [])
    for position in positions:
        slot = int(walked.slots[position])
        found = described_at[int(addresses[slot])]
        overrides.dtypes.append(found.dtype)
        overrides.shapes.append(found.shape)
        overrides.devices.append(found.device)
        overrides.extras.append(extra_text(found.info) if found.info else None)
        overrides.strides.append(found.stride)
        walked.errors[position] = 0
        if found.unread is not None or found.local is None:
            overrides.errors.append(found.unread)
            continue
        read_stats = statistics and walked.stats[position] < 0
        read_fingerprint = fingerprints and walked.fingerprints[position] < 0
        if not (read_stats or read_fingerprint):
            overrides.errors.append(None)
            continue
        early = staged(slot)
        if early is not None:  # its plain tensor staged at its op (observer_stage_kept)
            overrides.errors.append(STATS_NOT_TAKEN if early.failed else None)
            if read_stats:
                walked.stats[position] = -2 - len(taken)
            if read_fingerprint:
                walked.fingerprints[position] = -2 - len(taken)
                arriving.append((len(taken), early.fingerprint, early.at))
            taken.append(early.stats)
            taken_fingerprints.append(None)
            continue
        instance, local = found.instance(), kept.get(slot, found.local())
        if local is None or (
            slot not in kept and (instance is None or (versions[slot] >= 0 and tensor_version(instance) != versions[slot]))
        ):
            overrides.errors.append(CHANGED_TEXT)
            continue
        overrides.errors.append(None)
        entry = len(taken)
        stats: dict[str, Any] = {}
        taken.append(stats)
        taken_fingerprints.append(None)
        if read_stats:
            walked.stats[position] = -2 - entry
        if read_fingerprint:
            walked.fingerprints[position] = -2 - entry
        due.append((local, stats if read_stats else None, (taken_fingerprints, entry) if read_fingerprint else None))
    return overrides
