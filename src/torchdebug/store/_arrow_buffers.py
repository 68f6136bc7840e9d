"""Arrow values read from (and made from) their buffers, without pyarrow's pandas shim.

pyarrow's own conversions (``to_numpy``, ``pa.array``, ``pa.scalar``, a compute function given a
Python value such as ``fill_null(0)``) ask its pandas shim whether an object is a pandas one, and
that imports pandas when it is installed: 0.4 s and about 50 MB the first time a process reads a
dump (a compare of 269k records peaked about 200 bytes per record higher for it). Reading records
needs none of pandas: its numeric columns are read here from their validity bitmap and values
buffer, and the one text argument it passes to Arrow is made here from bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["numbers", "text", "valid"]

_NUMPY = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.float64(): np.float64,
}
"""The numpy dtype of each Arrow type read here (dictionary indices, record columns, statistics)."""


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
    """``value`` as an Arrow string scalar (an argument of a compute function)."""
    data = value.encode()
    offsets = pa.py_buffer(np.array([0, len(data)], np.int32))
    return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])[0]
