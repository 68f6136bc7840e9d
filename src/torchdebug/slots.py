"""The slots of an op call: its arguments flattened into named slots, and how slots are written.

A record describes one slot (``docs/format.md``): ``0``, ``1.2`` (an element of a list argument),
``alpha`` (a keyword). Eager capture, module capture and the compiled-graph dump pass all name
slots with :func:`iter_slots` and write non-tensor values with :func:`json_value`, so their
records pair up.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Slot", "dtype_name", "iter_slots", "json_value", "output_slots", "written_slot"]

Slot = tuple[str, Any]
"""``(argument path, value)``: one tensor or non-tensor argument of a call."""


_INDEX_NAMES = tuple(str(i) for i in range(64))
"""``"0"``, ``"1"``, ...: argument paths of the first positional arguments, made once."""


_NESTED = (torch.Tensor, list, tuple)
"""Elements that make a list argument be walked into element slots rather than kept whole."""

_SCALARS = frozenset({type(None), bool, int, float, str})
"""Exact types :func:`json_value` returns unchanged, checked by type first in lists (sizes are int lists)."""


def iter_slots(args: tuple | list, kwargs: dict[str, Any] | None = None) -> Iterator[Slot]:
    """Flatten call arguments into slots: ``0``, ``1.2`` (list element), ``alpha`` (keyword)."""
    for index, value in enumerate(args):
        path = _INDEX_NAMES[index] if index < 64 else str(index)
        if (value.__class__ is list or value.__class__ is tuple) and _holds_nested(value):
            yield from _walk_items(value, path)
        else:
            yield path, value
    if kwargs:
        for key, value in kwargs.items():
            if isinstance(value, (list, tuple)) and _holds_nested(value):
                yield from _walk_items(value, key)
            else:
                yield key, value


def written_slot(arg: str, value: Any, written: frozenset[str]) -> bool:
    """Whether slot ``arg`` holds a tensor its call writes (``written``: the top-level argument keys
    the call writes). A call that writes and returns nothing (an in-place ``_foreach_*_`` op) has
    these slots for its outputs, named as its inputs (``output.0.<i>``)."""
    return isinstance(value, torch.Tensor) and arg.split(".", 1)[0] in written


def output_slots(output: Any) -> Iterator[Slot]:
    """A module's output as slots: a tuple's or list's items by position (``0``, ``1.2``), a dict's (a
    Hugging Face ``ModelOutput``, a model's ``{"loss": ...}``) by key, as keywords are (``logits``),
    any other value as ``0``."""
    if isinstance(output, (tuple, list)):
        return iter_slots(output)
    if isinstance(output, dict):
        return iter_slots((), output)
    return iter_slots((output,))


def _holds_nested(values: list | tuple) -> bool:
    """Whether a list holds tensors or lists (a loop: cheaper than ``any`` on short size lists;
    ints, the elements of sizes, are let through before the slower ``isinstance``)."""
    for value in values:
        if value.__class__ is not int and isinstance(value, _NESTED):
            return True
    return False


def _walk_items(values: list | tuple, path: str) -> Iterator[Slot]:
    for index, value in enumerate(values):
        item_path = f"{path}.{index}"
        if isinstance(value, (list, tuple)) and _holds_nested(value):
            yield from _walk_items(value, item_path)
        else:
            yield item_path, value


def json_value(value: Any) -> Any:
    """A JSON-ready form of a non-tensor argument: other integer and real types (numpy's) as the int
    or float they are; dtypes, devices and anything else (a symbolic int the graph dump could not
    evaluate) as strings."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [item if item.__class__ in _SCALARS else json_value(item) for item in value]
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    if isinstance(value, numbers.Real):
        return float(value)
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


DTYPE_NAMES: dict[torch.dtype, str] = {}
"""The names :func:`dtype_name` made so far (a hot path may look one up before calling it)."""


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        name = DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name
