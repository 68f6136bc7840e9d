"""Arrow values read from (and made from) their buffers, without pyarrow's pandas shim.

pyarrow's own conversions (``to_numpy``, ``pa.array`` of a list or even of a numpy array,
``pa.scalar``, a compute function given a Python value such as ``fill_null(0)`` or a separator)
ask its pandas shim whether an object is a pandas one, and that imports pandas when it is
installed: 0.35–0.4 s and about 50 MB the first time a process reads a dump (a compare of 269k
records peaked about 200 bytes per record higher for it), or, in a training process, at the first
captured step's stop. Neither needs pandas: numeric columns are read here from their validity
bitmap and values buffer, and columns and scalars are made here from numpy arrays and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "EXACT_IN_FLOAT",
    "array",
    "bitmap",
    "booleans",
    "column",
    "int_lists",
    "null_column",
    "numbers",
    "strings",
    "text",
    "valid",
]

_NUMPY = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.float64(): np.float64,
}
"""The numpy dtype of each Arrow type read or made here (dictionary indices, record columns, statistics)."""
_ARROW = {np.dtype(kind): arrow for arrow, kind in _NUMPY.items()}


def _chunks(array: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return array.chunks if isinstance(array, pa.ChunkedArray) else [array]


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    """``length`` bits of an Arrow bitmap from bit ``offset``, as booleans."""
    bits = np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")
    return bits[offset : offset + length].astype(bool)


def valid(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Which slots of ``array`` hold a value (its chunks joined)."""
    parts = [
        np.ones(len(chunk), bool) if chunk.null_count == 0 else _bits(chunk.buffers()[0], chunk.offset, len(chunk))
        for chunk in _chunks(array)
    ]
    return np.concatenate(parts) if parts else np.ones(0, bool)


def booleans(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of a boolean column (its chunks joined), false where it has none (a compute
    function's mask: ``to_numpy`` of a chunked one imports pandas, through pyarrow's shim)."""
    parts = [_bits(chunk.buffers()[1], chunk.offset, len(chunk)) & valid(chunk) for chunk in _chunks(array)]
    return np.concatenate(parts) if parts else np.zeros(0, bool)


def numbers(array: pa.Array | pa.ChunkedArray, fill: int | float = 0) -> np.ndarray:
    """The values of an integer or float64 column (its chunks joined), ``fill`` where it has none."""
    kind = np.dtype(_NUMPY[array.type])
    parts = []
    for chunk in _chunks(array):
        values = np.frombuffer(chunk.buffers()[1], kind, len(chunk), chunk.offset * kind.itemsize)
        if chunk.null_count:
            values = np.where(valid(chunk), values, np.array(fill, kind))
        parts.append(values)
    return np.concatenate(parts) if parts else np.empty(0, kind)


def text(value: str) -> pa.StringScalar:
    """``value`` as an Arrow string scalar (an argument of a compute function: a separator)."""
    return strings([value])[0]


def bitmap(missing: np.ndarray | None) -> pa.Buffer | None:
    """Arrow's validity bitmap of the slots ``missing`` does not mark (``None``: all hold a value)."""
    return pa.py_buffer(np.packbits(~missing, bitorder="little")) if missing is not None and missing.any() else None


def array(values: np.ndarray, kind: pa.DataType | None = None, missing: np.ndarray | None = None) -> pa.Array:
    """A numpy array as an Arrow array (``pa.array(values, kind, mask=missing)``): of ``kind``, an
    integer, float64 or bool type (default: the array's own; values cast to it as numpy casts: they
    fit it), empty where ``missing`` is true; its memory taken without a copy where it is contiguous
    and of the type's width."""
    if kind is None:
        kind = pa.bool_() if values.dtype == np.bool_ else _ARROW[values.dtype]
    if kind == pa.bool_():
        data = pa.py_buffer(np.packbits(np.asarray(values, bool), bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values, _NUMPY[kind]))
    nulls = int(missing.sum()) if missing is not None else 0
    return pa.Array.from_buffers(kind, len(values), [bitmap(missing), data], null_count=nulls)


def _missing(values: Sequence[Any], nulls: int) -> np.ndarray | None:
    """Which of ``values`` are ``None`` (``nulls`` of them; ``None`` where none is)."""
    return np.array([value is None for value in values], bool) if nulls else None


_NULLS: dict[tuple[int, int], tuple[pa.DataType, pa.Array]] = {}
"""The all-empty columns made for the last length asked for, by that length and their type's
identity (a struct type's hash takes 6 µs, longer than the column takes to make)."""


def null_column(count: int, kind: pa.DataType) -> pa.Array:
    """``pa.nulls(count, kind)``, made once a length and type in a row: the columns a batch leaves
    empty (a structure step's statistics, checksums, tensor references) are the same every steady
    step, and Arrow arrays are immutable. Only the last length's are kept: memory stays one batch's."""
    key = (count, id(kind))
    kept = _NULLS.get(key)
    if kept is None or kept[0] is not kind:
        if _NULLS and next(iter(_NULLS))[0] != count:
            _NULLS.clear()
        kept = _NULLS[key] = (kind, pa.nulls(count, kind))
    return kept[1]


def strings(values: Sequence[str | None]) -> pa.Array:
    """Texts as an Arrow string column (``None``: an empty slot), made from their UTF-8 bytes;
    raises ``TypeError`` for a value that is not a text, as ``pa.array(values, pa.string())`` does.
    Mostly one join and one encode: the bytes of ASCII texts are as many as their characters."""
    nulls = values.count(None)
    if values and nulls == len(values):
        return pa.nulls(len(values), pa.string())
    missing = _missing(values, nulls)
    present: Sequence[str] = values if missing is None else ["" if value is None else value for value in values]  # type: ignore[assignment]
    joined = "".join(present)  # (TypeError for a value that is not a text)
    if joined.isascii():
        data, lengths = joined.encode("ascii"), map(len, present)
    else:
        encoded = [value.encode() for value in present]
        data, lengths = b"".join(encoded), map(len, encoded)
    if len(data) > np.iinfo(np.int32).max:
        raise OverflowError(f"{len(data)} bytes of text in one string column (at most 2 GiB)")
    offsets = np.zeros(len(present) + 1, np.int32)
    np.cumsum(np.fromiter(lengths, np.int32, len(present)), out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(present), [bitmap(missing), pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
    )


def int_lists(values: Sequence[Sequence[int] | None]) -> pa.Array:
    """Lists of ints as an Arrow ``list<int64>`` column (``None``: an empty slot: a shape, strides);
    raises ``OverflowError`` for an int beyond int64 and ``TypeError`` for a value that is not a list of ints."""
    nulls = values.count(None)
    if values and nulls == len(values):
        return pa.nulls(len(values), pa.list_(pa.int64()))
    missing = _missing(values, nulls)
    present: Sequence[Sequence[int]] = values if missing is None else [() if value is None else value for value in values]  # type: ignore[assignment]
    offsets = np.zeros(len(present) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, present), np.int32, len(present)), out=offsets[1:])
    flat = list(chain.from_iterable(present))
    if not set(map(type, flat)) <= {int}:
        raise TypeError(f"not a list of ints: {next(v for v in present if not set(map(type, v)) <= {int})!r}")
    children = [array(np.array(flat, np.int64), pa.int64())]
    return pa.Array.from_buffers(
        pa.list_(pa.int64()), len(present), [bitmap(missing), pa.py_buffer(offsets)], null_count=nulls, children=children
    )


EXACT_IN_FLOAT = 2**53
"""The largest magnitude up to which a float64 holds every int exactly (pyarrow's limit too)."""


def column(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    """Python values as an Arrow array of ``kind`` (``pa.array(values, kind)``), ``None`` an empty
    slot: texts, int64, float64, bool and ``list<int64>``, the types records hold. A value the type
    cannot hold exactly raises ``TypeError`` (another type: a bool is no number here, a text no
    float) or ``OverflowError`` (an int beyond int64, or beyond what a float64 holds exactly)."""
    if kind == pa.string():
        return strings(values)
    if kind == pa.list_(pa.int64()):
        return int_lists(values)
    nulls = values.count(None)
    if values and nulls == len(values):
        return pa.nulls(len(values), kind)
    if kind == pa.bool_():
        allowed: set[type] = {bool}
    elif kind == pa.int64():
        allowed = {int}
    elif kind == pa.float64():
        allowed = {float, int}
    else:
        raise TypeError(f"no column of {kind} made here")
    kinds = set(map(type, values)) - {type(None)}
    if not kinds <= allowed:
        raise TypeError(f"{next(v for v in values if v is not None and type(v) not in allowed)!r} in a column of {kind}")
    if kind == pa.float64() and int in kinds and any(abs(v) > EXACT_IN_FLOAT for v in values if v.__class__ is int):
        raise OverflowError(f"an int beyond {EXACT_IN_FLOAT} in a column of float64: not exactly a float")
    missing = _missing(values, nulls)
    present = values if missing is None else [False if value is None else value for value in values]
    return array(np.fromiter(present, _NUMPY.get(kind, np.bool_), len(present)), kind, missing)
