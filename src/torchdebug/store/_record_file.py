"""A rank's records file: an Arrow IPC stream (``records.arrows``), one record batch per flush.

Each flush appends one message (its buffers zstd-compressed) with plain ``write`` calls, so a
process killed even by SIGKILL keeps every batch written before the kill; only the last message
can be cut short. :func:`read_records` drops such a message and says so, and names a message that
is whole but does not decode (the file was modified or damaged). The stream's schema is written
with its first batch: a file killed before that is empty and holds no records.

Any Arrow reader opens the file (``pyarrow.ipc.open_stream``, Polars' ``read_ipc_stream``,
DuckDB's ``arrow`` extension).
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from torchdebug.errors import DumpError
from torchdebug.store._record_columns import SCHEMA

__all__ = ["RecordFile", "read_records"]

logger = logging.getLogger("torchdebug.store._record_file")

_OPTIONS = ipc.IpcWriteOptions(compression="zstd")
_CONTINUATION = 0xFFFFFFFF
"""The marker that starts every message of an IPC stream, before its metadata length."""


class RecordFile:
    """Appends record batches to a new records file."""

    def __init__(self, path: Path) -> None:
        self._sink = pa.OSFile(str(path), "wb")  # unbuffered: each message reaches the OS as it is written
        self._stream = ipc.new_stream(self._sink, SCHEMA, options=_OPTIONS)

    def append(self, batch: pa.RecordBatch) -> None:
        """Write one batch (pyarrow compresses and writes it with the GIL released)."""
        self._stream.write_batch(batch)

    def close(self) -> None:
        self._stream.close()
        self._sink.close()


def read_records(path: Path) -> tuple[pa.Table, bool]:
    """The records of a records file as one table, and whether its last message was cut short (and dropped)."""
    if not path.exists():
        return SCHEMA.empty_table(), False
    source = pa.memory_map(str(path))
    size = source.size()
    reader = ipc.MessageReader.open_stream(source)
    schema: pa.Schema | None = None
    batches: list[pa.RecordBatch] = []
    while True:
        start = source.tell()
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as error:
            if _cut_short(source, start, size, error):
                logger.warning("%s: the last batch of records is incomplete (the run stopped mid-write); skipped", path)
                return _table(schema, batches), True
            raise _corrupt(path, len(batches), start, error) from None
        try:
            if schema is None:
                schema = ipc.read_schema(message)
            else:
                batches.append(ipc.read_record_batch(message, schema))
        except (pa.ArrowInvalid, OSError) as error:
            raise _corrupt(path, len(batches), start, error) from None
    return _table(schema, batches), False


def _table(schema: pa.Schema | None, batches: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(batches, schema=schema or SCHEMA)


def _cut_short(source: pa.NativeFile, start: int, size: int, error: Exception) -> bool:
    """Whether the message at ``start`` fails because the file ends inside it (a crash mid-write),
    rather than because its bytes are wrong: its prefix is cut, its metadata would end past the
    end of the file, or its body could not be read whole."""
    if size - start < 8:
        return True
    source.seek(start)
    marker, length = struct.unpack("<Ii", source.read(8))
    if marker != _CONTINUATION:
        return False
    return start + 8 + length > size or (isinstance(error, OSError) and not isinstance(error, pa.ArrowInvalid))


def _corrupt(path: Path, batch: int, offset: int, error: Exception) -> DumpError:
    return DumpError(
        f"{path}: batch {batch + 1} of records (byte {offset}) is corrupt ({error}); the file was modified or damaged"
    )
