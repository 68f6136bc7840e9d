"""Flattening nested values: ``torch.utils._pytree`` (private, stable from torch 2.11 to 2.14)."""

from __future__ import annotations

from torch.utils._pytree import tree_leaves

__all__ = ["tree_leaves"]
