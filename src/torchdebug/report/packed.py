"""Tables packed for a page's script: a shared string table and typed columns, gzip'd and base64'd.

A report with hundreds of thousands of rows cannot carry them as markup (600–700 bytes a row, and a
browser needs minutes to lay out such a page). :func:`pack` turns named tables of columns into one
base64 text, about 10–40 bytes a row, that the page's script unpacks with the browser's
``DecompressionStream`` (``unpack`` in ``compare.js``); only the rows in view become elements.

The packed bytes are gzip of: a 4-byte little-endian length, a JSON header of that length, then each
column's bytes. The header holds the strings (every string column stores indexes into them) and,
per table, its length and its columns as ``[name, type, strings]``: ``type`` a typed-array name
(``u8``, ``u16``, ``u32``, ``i32``, ``f64``), ``strings`` true for string indexes. A column of
``n`` values of ``k`` bytes is stored byte-plane by byte-plane (every value's first byte, then every
second byte, ...), which lets gzip find the runs in exponents and high bytes. Floats keep
:data:`MANTISSA_BITS` of their 52 mantissa bits (rounded, relative error below 1e-10): the page
shows 4 significant digits (8 for a cosine) and the dropped bits would not compress.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["MANTISSA_BITS", "pack"]

MANTISSA_BITS = 32
"""Mantissa bits a float keeps (float32 keeps 23): 8 significant digits survive rounding to it."""

_DROPPED = np.uint64(52 - MANTISSA_BITS)
_INTEGERS = (np.uint8, np.uint16, np.uint32, np.int32)

Column = Sequence[str] | np.ndarray
"""A list of strings, or a numpy array of integers (signed ones fit int32) or floats."""


def _smallest(values: np.ndarray) -> np.ndarray:
    """``values`` (integers) in the smallest of :data:`_INTEGERS` that holds them."""
    low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
    for dtype in _INTEGERS:
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return values.astype(dtype)
    raise ValueError(f"a packed integer column must fit int32 or uint32, got values from {low} to {high}")


def _rounded(values: np.ndarray) -> np.ndarray:
    """float64 ``values`` rounded to :data:`MANTISSA_BITS` (infinities and NaN unchanged)."""
    bits = values.astype(np.float64).view(np.uint64)
    finite = np.isfinite(values)
    half = np.uint64(1) << (_DROPPED - np.uint64(1))
    kept = ((bits + half) >> _DROPPED) << _DROPPED  # a carry into the exponent is the correct rounding
    return np.where(finite, kept, bits).view(np.float64)


def _planes(values: np.ndarray) -> bytes:
    """The little-endian bytes of ``values``, byte-plane by byte-plane."""
    data = values.astype(values.dtype.newbyteorder("<"), copy=False)
    return data.view(np.uint8).reshape(len(data), data.dtype.itemsize).T.tobytes()


def pack(tables: Mapping[str, Mapping[str, Column]]) -> str:
    """``tables`` (name -> column name -> column, the columns of a table of equal length) as base64."""
    strings: dict[str, int] = {}
    header: dict[str, dict[str, object]] = {}
    blobs = []
    for table, columns in tables.items():
        lengths = {len(column) for column in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"packed table {table!r}: columns of different lengths {sorted(lengths)}")
        described = []
        for name, column in columns.items():
            is_text = not isinstance(column, np.ndarray)
            if is_text:
                index = {text: strings.setdefault(text, len(strings)) for text in dict.fromkeys(column)}
                values = _smallest(np.fromiter(map(index.__getitem__, column), dtype=np.int64, count=len(column)))
            elif column.dtype.kind == "f":
                values = _rounded(column)
            else:
                values = _smallest(column)
            described.append([name, _TYPES[values.dtype.type], is_text])
            blobs.append(_planes(values))
        header[table] = {"length": lengths.pop() if lengths else 0, "columns": described}
    head = json.dumps({"strings": list(strings), "tables": header}, separators=(",", ":")).encode()
    raw = b"".join([len(head).to_bytes(4, "little"), head, *blobs])
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


_TYPES = {np.uint8: "u8", np.uint16: "u16", np.uint32: "u32", np.int32: "i32", np.float64: "f64"}
