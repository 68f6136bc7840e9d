"""A 16-byte digest of a slot's value, from its record or straight from the rows of a records table.

::

    value_digest(dump, record, tensors=True)   # "9f2c...": dtype, shape and the saved tensor's bytes
    column_digests(table)                     # the same digest for each row, from its statistics

The digest is a BLAKE2b of the dtype, the shape and the value: the saved tensor's bytes, or the
statistics where no tensor was saved (or ``tensors`` is off). Two slots hold the same value exactly
when their digests are equal, whichever of the two ways made them: the statistics are hashed as the
64 bits of each value in :data:`~torchdebug.records.STAT_KEYS` order (every NaN as one NaN), then a
mask of the empty ones, which is what a record's ``stats`` dict and the table's ``stats`` struct
column both give. :func:`column_digests` works on whole columns (no ``Record`` is built): the
cross-rank check digests tens of thousands of slots per rank this way.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from torchdebug.compare._steps import has_tensor
from torchdebug.records import STAT_KEYS, Record
from torchdebug.stats import VALUE_KEYS
from torchdebug.store import RankRecords, arrow_booleans, arrow_numbers, arrow_text

__all__ = ["DIGEST_BYTES", "value_digest", "column_digests"]

DIGEST_BYTES = 16
"""The size of a digest (given as hex text: twice as many characters)."""

_WIDTH = len(STAT_KEYS)
_COUNTS = tuple(key not in VALUE_KEYS for key in STAT_KEYS)
"""Whether each statistic is a count (64-bit int) rather than a value (64-bit float)."""
_STAT_KEY_SET = frozenset(STAT_KEYS)
_FORMAT = "<" + "".join("q" if count else "d" for count in _COUNTS) + "q"
"""A record's statistics as bytes: each statistic, then the mask of the empty ones."""
_NO_STATS = struct.pack(_FORMAT, *([0] * _WIDTH), 1 << _WIDTH)


def _hasher(dtype: str | None, shape: str | None) -> Any:
    return hashlib.blake2b(f"{dtype}|{shape}|".encode(), digest_size=DIGEST_BYTES)


def _shape_text(shape: list[int] | None) -> str | None:
    """A shape as the table's sizes joined by commas give it (``None`` stays ``None``)."""
    return None if shape is None else ",".join(map(str, shape))


def _stats_bytes(stats: dict[str, Any] | None) -> bytes:
    """A record's statistics as :func:`_column_stats_bytes` gives a row's (other keys or values: sorted JSON)."""
    if stats is None:
        return _NO_STATS
    if stats.keys() != _STAT_KEY_SET:
        return b"json|" + json.dumps(stats, sort_keys=True).encode()
    values, empty = [], 0
    for i, (key, count) in enumerate(zip(STAT_KEYS, _COUNTS)):
        value = stats[key]
        if value is None:
            empty |= 1 << i
            value = 0
        elif value.__class__ is not int and (count or value.__class__ is not float):
            return b"json|" + json.dumps(stats, sort_keys=True).encode()
        elif value != value:
            value = math.nan  # one NaN for all: their sign and payload bits are not the value
        values.append(value)
    return struct.pack(_FORMAT, *values, empty)


def value_digest(dump: RankRecords, record: Record, tensors: bool) -> str:
    """The digest of a record's value: its saved tensor's bytes when ``tensors`` and it has one, else its statistics."""
    hasher = _hasher(record.dtype, _shape_text(record.shape))
    if tensors and has_tensor(record):
        hasher.update(b"tensor|")
        hasher.update(dump.load_tensor(record).detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    else:
        hasher.update(b"stats|" + _stats_bytes(record.stats))
    return hasher.hexdigest()


def _mask(array: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A boolean column as 0 and 1 (int64)."""
    return arrow_booleans(array).astype(np.int64)


def _column_stats_bytes(stats: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Each row's statistics as :func:`_stats_bytes` packs them, one row of ``_WIDTH + 1`` int64 words each."""
    words = np.zeros((len(stats), _WIDTH + 1), "<i8")
    for i, count in enumerate(_COUNTS):
        child = pc.struct_field(stats, [i])
        values = arrow_numbers(child)
        if not count:
            values = np.where(np.isnan(values), np.nan, values).view("<i8")
        words[:, i] = values
        if child.null_count:
            words[:, _WIDTH] |= _mask(child.is_null()) << i
    if stats.null_count:
        empty = _mask(stats.is_null()).astype(bool)
        words[empty] = 0
        words[empty, _WIDTH] = 1 << _WIDTH
    return words


def column_digests(table: pa.Table) -> list[str]:
    """The :func:`value_digest` by statistics of each row of ``table`` (columns ``dtype``, ``shape``
    and ``stats`` of :data:`~torchdebug.store._record_columns.SCHEMA`; rows whose ``json_fields``
    override them must be digested as records)."""
    if not table.num_rows:
        return []
    dtypes = table.column("dtype").to_pylist()
    shapes = pc.binary_join(table.column("shape").cast(pa.list_(pa.string())), arrow_text(",")).to_pylist()
    stats = memoryview(_column_stats_bytes(table.column("stats")).tobytes())
    size = (_WIDTH + 1) * 8
    started: dict[tuple[str | None, str | None], Any] = {}  # a hasher fed with each dtype and shape, copied per row
    digests = []
    for row, (dtype, shape) in enumerate(zip(dtypes, shapes)):
        hasher = started.get((dtype, shape))
        if hasher is None:
            hasher = started[dtype, shape] = _hasher(dtype, shape)
            hasher.update(b"stats|")
        hasher = hasher.copy()
        hasher.update(stats[row * size : (row + 1) * size])
        digests.append(hasher.hexdigest())
    return digests
