"""Records as a pandas table, and tables as Parquet files (extra ``pandas``).

One table row per record, the record's fields as columns, with the statistics spread into their own
columns (``torchdebug.stats._schema.STAT_KEYS``: ``min`` ... ``neginf``) so that a dump can be
filtered, grouped and plotted where analysts work. It is the dump's Arrow table
(``record_columns.SCHEMA``) with the statistics' struct flattened: columns that hold JSON of
varying shape (``value``, ``extra``) are JSON text, so every column has one type and the table
writes to Parquet as it is. Parquet is an export format only: a crash mid-write leaves a Parquet
file unreadable, while a dump's Arrow stream keeps every batch written before.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from torchdebug.extras import import_extra
from torchdebug.records import Record
from torchdebug.stats import STAT_KEYS
from torchdebug.store._record_columns import records_table

__all__ = ["RECORD_COLUMNS", "arrow_frame", "pandas", "records_frame", "require_parquet", "write_parquet"]

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
    "value_id",
    "version",
    "view_of",
    "extra",
)
RECORD_COLUMNS = (*_LEADING, *STAT_KEYS, *_TRAILING)
"""Columns of :func:`records_frame`: where the slot is, what it holds, its statistics, then the rest."""


def pandas() -> Any:
    """The pandas module, or one ``ImportError`` line naming the extra that installs it."""
    return import_extra("pandas", "pandas", "to_pandas")


def records_frame(records: Iterable[Record]) -> Any:
    """A ``pandas.DataFrame`` of ``records``, columns :data:`RECORD_COLUMNS`."""
    return arrow_frame(records_table(list(records)))


def arrow_frame(table: pa.Table) -> Any:
    """A ``pandas.DataFrame`` of a records table (``record_columns.SCHEMA``), columns :data:`RECORD_COLUMNS`."""
    pd = pandas()
    stats = table.select(["stats"]).flatten()  # a record without statistics: empty cells
    flat = {name: stats.column(f"stats.{name}") if name in STAT_KEYS else table.column(name) for name in RECORD_COLUMNS}
    frame = pa.table(flat).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    for name in ("step", "rank", "call", "seq"):
        frame[name] = frame[name].astype("int64")
    for name in ("shape", "stride"):
        frame[name] = table.column(name).to_pylist()
    return frame


def require_parquet() -> None:
    """Fail with one line naming the extra unless pandas is installed (a command that works for
    minutes before writing its table checks first)."""
    import_extra("pandas", "pandas", "writing Parquet")


def write_parquet(frame: Any, path: str | Path) -> Path:
    """Write a table to a Parquet file with pyarrow (``pip install 'torchdebug[pandas]'``)."""
    require_parquet()
    path = Path(path)
    frame.to_parquet(path, engine="pyarrow", index=False)
    return path
