"""Records as a pandas table, and tables as Parquet files (extras ``pandas`` and ``parquet``).

One table row per record, the record's fields as columns, with the statistics spread into their own
columns (``torchdebug.stats.schema.STAT_KEYS``: ``min`` ... ``neginf``) so that a dump can be
filtered, grouped and plotted where analysts work. Columns that hold JSON of varying shape
(``value``, ``extra``) are JSON text, so every column has one type and the table writes to Parquet
as it is. Parquet is an export format only: dumps stay JSON lines (a crash mid-write leaves a
Parquet file unreadable).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torchdebug.extras import import_extra
from torchdebug.records import Record
from torchdebug.stats.schema import COUNT_KEYS, STAT_KEYS, VALUE_KEYS

__all__ = ["RECORD_COLUMNS", "pandas", "records_frame", "require_parquet", "write_parquet"]

_LEADING = ("rank", "step", "phase", "module", "op", "call", "io", "arg", "name", "kind", "dtype", "shape")
_TRAILING = (
    "stride",
    "device",
    "requires_grad",
    "value",
    "sampled",
    "tensor_file",
    "tensor_key",
    "checksum",
    "seq",
    "stack",
    "source",
    "fwd",
    "node",
    "capture",
    "capture_error",
    "extra",
)
RECORD_COLUMNS = (*_LEADING, *STAT_KEYS, *_TRAILING)
"""Columns of :func:`records_frame`: where the slot is, what it holds, its statistics, then the rest."""

_COUNTS = (*COUNT_KEYS, "sampled")
"""Integer columns that may be empty (pandas' nullable ``Int64``)."""


def pandas() -> Any:
    """The pandas module, or one ``ImportError`` line naming the extra that installs it."""
    return import_extra("pandas", "pandas", "to_pandas")


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def records_frame(records: Iterable[Record]) -> Any:
    """A ``pandas.DataFrame`` of ``records``, columns :data:`RECORD_COLUMNS`."""
    pd = pandas()
    columns: dict[str, list[Any]] = {name: [] for name in RECORD_COLUMNS}
    plain = [
        name for name in RECORD_COLUMNS if name not in STAT_KEYS and name not in ("value", "extra", "tensor_file", "tensor_key")
    ]
    for record in records:
        for name in plain:
            columns[name].append(getattr(record, name))
        stats = record.stats or {}
        for key in STAT_KEYS:
            columns[key].append(stats.get(key))
        tensor = record.tensor or {}
        columns["tensor_file"].append(tensor.get("file"))
        columns["tensor_key"].append(tensor.get("key"))
        columns["value"].append(_json_text(record.value) if record.kind == "value" else None)
        columns["extra"].append(_json_text(record.extra or None))
    frame = pd.DataFrame(columns)
    for name in VALUE_KEYS:
        frame[name] = frame[name].astype("float64")
    for name in _COUNTS:
        frame[name] = frame[name].astype("Int64")
    return frame


def require_parquet() -> None:
    """Fail with one line naming the extra unless pandas and pyarrow are installed (a command that
    works for minutes before writing its table checks first)."""
    import_extra("pandas", "parquet", "writing Parquet")
    import_extra("pyarrow", "parquet", "writing Parquet")


def write_parquet(frame: Any, path: str | Path) -> Path:
    """Write a table to a Parquet file with pyarrow (``pip install 'torchdebug[parquet]'``)."""
    require_parquet()
    path = Path(path)
    frame.to_parquet(path, engine="pyarrow", index=False)
    return path
