"""Tensor subclasses (DTensor, FSDP2's sharded parameters, float8 and NF4 weights) seen through their
plain inner tensors.

Capture must never hand a subclass to native code, read its ``data_ptr()`` or ``.item()`` it: its
storage is not its value (a DTensor's is empty, its local shard lives in an inner tensor). Every
wrapper subclass torch can trace declares its inner tensors through ``__tensor_flatten__``
(``torch.utils._python_dispatch.is_traceable_wrapper_subclass``); :func:`describe` walks them, nested
wrappers included, and says which plain tensor holds the subclass's elements, if one does:

- a DTensor's elements are its local shard (one inner tensor of the same dtype); its record also
  carries its placements, mesh shape and mesh coordinate, and ``partial`` when a placement is
  ``Partial`` (the shard is a summand of the value, not a piece of it);
- a wrapper with one inner tensor of its own dtype likewise (FSDP's and other thin wrappers);
- a wrapper whose value is computed from several inner tensors (float8 data and a scale, NF4
  blocks) has no such tensor: capture records it with a ``capture_error`` that names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["SubclassView", "describe", "is_subclass"]


def is_subclass(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a wrapper subclass (its elements are not in its own storage)."""
    return tensor.__class__ is not torch.Tensor and is_traceable_wrapper_subclass(tensor)


@dataclass(slots=True)
class SubclassView:
    """What capture reads of a subclass instance."""

    kind: str
    """The subclass's name (``DTensor``, ``Float8Tensor``)."""
    local: torch.Tensor | None
    """The plain tensor holding its elements (a DTensor's local shard), ``None`` when no one tensor does."""
    inner: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    """Every plain inner tensor, by attribute path (``_local_tensor``, ``_data``, ``_scale``)."""
    info: dict[str, Any] = field(default_factory=dict)
    """JSON-ready facts for the record's ``extra`` (``subclass``, ``placements``, ``mesh``, ...)."""

    def why_unread(self) -> str:
        """The ``capture_error`` of an instance without a local tensor."""
        parts = ", ".join(f"{path} {str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for path, t in self.inner)
        return f"tensor subclass {self.kind}: its value is computed from several inner tensors ({parts}), not read"


def _flatten(tensor: torch.Tensor, prefix: str, out: list[tuple[str, torch.Tensor]]) -> None:
    names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]  # a wrapper subclass's; not on Tensor's stub
    for name in names:
        inner = getattr(tensor, name)
        path = f"{prefix}{name}"
        if not isinstance(inner, torch.Tensor):  # torch 2.13's DTensor names its device mesh too
            continue
        if is_subclass(inner):
            _flatten(inner, f"{path}.", out)
        else:
            out.append((path, inner))


def _dtensor_info(tensor: torch.Tensor) -> dict[str, Any] | None:
    """Placements and mesh of a DTensor (``None`` for other subclasses), through its public attributes."""
    placements = getattr(tensor, "placements", None)
    mesh = getattr(tensor, "device_mesh", None)
    if placements is None or mesh is None:
        return None
    coordinate = mesh.get_coordinate()
    info: dict[str, Any] = {
        "placements": [str(p) for p in placements],
        "mesh": list(mesh.shape),
        "mesh_coordinate": list(coordinate) if coordinate is not None else None,
    }
    if any(p.is_partial() for p in placements):
        info["partial"] = True  # the local tensor is a summand of the value
    return info


def describe(tensor: torch.Tensor) -> SubclassView:
    """How capture reads a wrapper subclass instance (see the module docstring)."""
    inner: list[tuple[str, torch.Tensor]] = []
    _flatten(tensor, "", inner)
    kind = type(tensor).__name__
    info: dict[str, Any] = {"subclass": kind}
    dtensor = _dtensor_info(tensor)
    if dtensor is not None:
        info.update(dtensor)
    local = inner[0][1] if len(inner) == 1 and inner[0][1].dtype == tensor.dtype else None
    if local is not None:
        info["local_shape"] = list(local.shape)
    return SubclassView(kind, local, inner, info)
