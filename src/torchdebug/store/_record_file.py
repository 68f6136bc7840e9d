"""A rank's records file: an Arrow IPC stream (``records.arrows``), a record batch per flush.

Each flush appends its records as messages of at most :data:`BATCH_ROWS` records (their buffers
zstd-compressed) with plain ``write`` calls, so a process killed even by SIGKILL keeps every
message written before the kill; only the last message can be cut short. :func:`read_records`
drops such a message and says so, and names a message that is whole but does not decode (the file
was modified or damaged). The stream's schema is written
with its first batch: a file killed before that is empty and holds no records.

:func:`record_stream` reads the messages without decoding them (their bodies stay in the memory-mapped
file): a reader that builds records decodes a group of batches at a time, so a dump's records never
sit whole beside their decompressed columns.

Any Arrow reader opens the file (``pyarrow.ipc.open_stream``, Polars' ``read_ipc_stream``,
DuckDB's ``arrow`` extension).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from torchdebug.errors import DumpError
from torchdebug.store._record_columns import SCHEMA

__all__ = ["RecordFile", "RecordStream", "read_records", "record_stream"]

logger = logging.getLogger("torchdebug.store._record_file")

_OPTIONS = ipc.IpcWriteOptions(compression="zstd")
BATCH_ROWS = 8192
"""The most records one message holds. A reader decodes a few messages at a time
(``_reader._GROUP``): a step the native path or a graph dump hands over as one batch (a 256-layer
step: 269k records, 113 MB decompressed) would otherwise be decoded whole. Each message costs
pyarrow a zstd context per buffer (about 15 µs each, 85 buffers), 0.16 µs a record at this size."""
_CONTINUATION = 0xFFFFFFFF
"""The marker that starts every message of an IPC stream, before its metadata length."""


class RecordFile:
    """Appends record batches to a new records file."""

    def __init__(self, path: Path) -> None:
        self._sink = pa.OSFile(str(path), "wb")  # unbuffered: each message reaches the OS as it is written
        self._stream = ipc.new_stream(self._sink, SCHEMA, options=_OPTIONS)

    def append(self, batch: pa.RecordBatch) -> None:
        """Write one batch, as messages of at most :data:`BATCH_ROWS` records (pyarrow compresses and
        writes each with the GIL released)."""
        for offset in range(0, max(batch.num_rows, 1), BATCH_ROWS):
            self._stream.write_batch(batch.slice(offset, BATCH_ROWS))

    def close(self, end: bool = True) -> None:
        """Close the file; ``end``: after the stream's end marker (not after a failed write, whose
        message may be cut short: the file then ends as a crash leaves it)."""
        try:
            if end:
                self._stream.close()
        finally:
            self._sink.close()


@dataclass(frozen=True)
class RecordStream:
    """The messages of a records file, not decoded yet (each holds its compressed body), and whether
    its last message was cut short (and dropped)."""

    path: Path
    schema: pa.Schema
    messages: list[tuple[int, ipc.Message]]
    """Each record batch's message and its byte offset in the file."""
    truncated: bool

    def tables(self, batches: int) -> Iterator[pa.Table]:
        """The records as tables of ``batches`` messages each (a message holds at most a flush, and at
        most :data:`BATCH_ROWS` records), decoded as they are asked for: the next table is decompressed on a
        thread of its own while the caller works on this one (Arrow releases the GIL). A message
        that does not decode raises a :class:`DumpError` naming it."""
        groups = [range(start, min(start + batches, len(self.messages))) for start in range(0, len(self.messages), batches)]
        with ThreadPoolExecutor(max_workers=1) as pool:
            ahead = [pool.submit(self._decode, group) for group in groups[:1]]
            for group in groups[1:]:
                ahead.append(pool.submit(self._decode, group))
                yield ahead.pop(0).result()
            if ahead:
                yield ahead.pop().result()

    def table(self) -> pa.Table:
        """Every record as one table."""
        return self._decode(range(len(self.messages)))

    def _decode(self, indices: range) -> pa.Table:
        batches = []
        for index in indices:
            offset, message = self.messages[index]
            try:
                batches.append(ipc.read_record_batch(message, self.schema))
            except (pa.ArrowInvalid, OSError) as error:
                raise _corrupt(self.path, index, offset, error) from None
        return pa.Table.from_batches(batches, schema=self.schema)


def record_stream(path: Path) -> RecordStream:
    """The messages of a records file (see :class:`RecordStream`); a file that does not exist holds none."""
    if not path.exists():
        return RecordStream(path, SCHEMA, [], False)
    source = pa.memory_map(str(path))
    size = source.size()
    reader = ipc.MessageReader.open_stream(source)
    schema: pa.Schema | None = None
    messages: list[tuple[int, ipc.Message]] = []
    while True:
        start = source.tell()
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as error:
            if _cut_short(source, start, size, error):
                logger.warning("%s: the last batch of records is incomplete (the run stopped mid-write); skipped", path)
                return RecordStream(path, schema or SCHEMA, messages, True)
            raise _corrupt(path, len(messages), start, error) from None
        if schema is None:
            try:
                schema = ipc.read_schema(message)
            except (pa.ArrowInvalid, OSError) as error:
                raise _corrupt(path, 0, start, error) from None
        else:
            messages.append((start, message))
    return RecordStream(path, schema or SCHEMA, messages, False)


def read_records(path: Path) -> tuple[pa.Table, bool]:
    """The records of a records file as one table, and whether its last message was cut short (and dropped)."""
    stream = record_stream(path)
    return stream.table(), stream.truncated


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
