"""A rank's records file: an Arrow IPC stream (``records.arrows``), a record batch per flush.

Each flush appends its records as messages of at most :data:`BATCH_ROWS` records, each handed to
the OS as it is made, so a process killed even by SIGKILL keeps every message written before the
kill; only the last message can be cut short. :func:`read_records` drops such a message and says
so, and names a message that is whole but does not decode (the file was modified or damaged). The
stream's schema is written with its first batch: a file killed before that is empty and holds no
records.

On disk (:data:`STORED_SCHEMA`, schema version 2) the repeating string columns are dictionaries,
written only where they differ from the last batch's, and the buffers LZ4-compressed; readers get
:data:`SCHEMA`'s plain strings back, and still read version 1 (plain, zstd). Why, and what it
measured: ``docs/architecture.md``, "Decisions and their reasons" ("Records on disk").

:func:`record_stream` reads the messages' headers without decoding them (their bodies stay in the
memory-mapped file): a reader that builds records decodes a group of batches at a time, in order
(a batch's dictionaries are in the messages before it), so a dump's records never sit whole beside
their decompressed columns. Any Arrow reader opens the file (``pyarrow.ipc.open_stream``, Polars'
``read_ipc_stream``, DuckDB's ``arrow`` extension).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from torchdebug.errors import DumpError
from torchdebug.store._arrow_buffers import strings
from torchdebug.store._record_columns import SCHEMA

__all__ = ["STORED_SCHEMA", "RecordFile", "RecordStream", "read_records", "record_stream"]

logger = logging.getLogger("torchdebug.store._record_file")

_OPTIONS = ipc.IpcWriteOptions(compression="lz4", use_threads=False)
"""LZ4, compressed on the writer's thread, not on Arrow's thread pool (which took more CPU to hand
the columns over than to compress them): ``docs/architecture.md``, "Decisions and their reasons"
("Records on disk")."""
_DISTINCT = frozenset({"checksum", "tensor_key"})
"""String columns whose values differ record by record: stored as they are."""
STORED_SCHEMA = pa.schema(
    [
        pa.field(field.name, pa.dictionary(pa.int32(), field.type))
        if field.type == pa.string() and field.name not in _DISTINCT
        else field
        for field in SCHEMA
    ],
    metadata=SCHEMA.metadata,
)
""":data:`SCHEMA` as a records file holds it: its repeating string columns dictionary-encoded."""
_ENCODED = [SCHEMA.names.index(field.name) for field in STORED_SCHEMA if pa.types.is_dictionary(field.type)]
_VALUE_AT = SCHEMA.get_field_index("value")
_MESSAGE_BUFFER = 1 << 20
"""Bytes of a message gathered before they are written: pyarrow writes a message buffer by buffer,
a system call each unbuffered (about 145 a tiny-GPT step); a message is written with one where it
fits, and the buffer flushed after each."""
BATCH_ROWS = 8192
"""The most records one message holds. A reader decodes a few messages at a time
(``_reader._GROUP``): a step the native path or a graph dump hands over as one batch (a 256-layer
step: 269k records, 113 MB decompressed) would otherwise be decoded whole."""
_CONTINUATION = 0xFFFFFFFF
"""The marker that starts every message of an IPC stream, before its metadata length."""


class RecordFile:
    """Appends record batches to a new records file."""

    def __init__(self, path: Path) -> None:
        self._file = pa.OSFile(str(path), "wb")
        self._sink = pa.BufferedOutputStream(self._file, buffer_size=_MESSAGE_BUFFER)
        self._stream = ipc.new_stream(self._sink, STORED_SCHEMA, options=_OPTIONS)
        self._encoded: dict[tuple[int, int], tuple[pa.Array, pa.Array]] = {}
        """By (column, offset in the batch): the last batch's column there, and its encoding (of
        the last batch only: an earlier, larger batch's columns are not held)."""

    def append(self, batch: pa.RecordBatch) -> None:
        """Write one batch of :data:`SCHEMA`, as messages of at most :data:`BATCH_ROWS` records
        (pyarrow encodes, compresses and writes each with the GIL released), each reaching the OS
        before the next is made."""
        encoded: dict[tuple[int, int], tuple[pa.Array, pa.Array]] = {}
        for offset in range(0, max(batch.num_rows, 1), BATCH_ROWS):
            message = batch if batch.num_rows <= BATCH_ROWS else batch.slice(offset, BATCH_ROWS)  # (a slice: new arrays)
            self._stream.write_batch(self._stored(message, offset, encoded))
            self._sink.flush()
        self._encoded = encoded

    def _stored(
        self, batch: pa.RecordBatch, offset: int, encoded: dict[tuple[int, int], tuple[pa.Array, pa.Array]]
    ) -> pa.RecordBatch:
        """``batch`` in :data:`STORED_SCHEMA`. A column encoded already goes as it is (the native
        path's ``value``: ``VALUE_CODES``); a column equal to the one encoded at its place in the
        last batch (a steady step's names, which the native path makes once, ``FixedColumns``: the
        same arrays, which Arrow finds equal at once; nulls where that one was nulls of its length)
        takes that encoding again; ``encoded`` gets this batch's, for the next to compare."""
        columns = batch.columns
        for index in _ENCODED:
            column, key = columns[index], (index, offset)
            if index == _VALUE_AT and pa.types.is_dictionary(column.type):
                continue
            last = self._encoded.get(key)
            if last is not None and column.equals(last[0]):
                columns[index] = last[1]
            elif column.null_count == len(column):  # mostly none (node, extra, json_fields): no hashing
                columns[index] = pa.DictionaryArray.from_arrays(pa.nulls(len(column), pa.int32()), _no_strings())
            else:
                columns[index] = pc.dictionary_encode(column)
            encoded[key] = (column, columns[index])
        return pa.RecordBatch.from_arrays(columns, schema=STORED_SCHEMA)

    def close(self, end: bool = True) -> None:
        """Close the file; ``end``: after the stream's end marker (not after a failed write, whose
        message may be cut short: the file then ends as a crash leaves it)."""
        self._encoded.clear()  # the last batch's columns, held for the next: none comes
        try:
            if end:
                self._stream.close()
                self._sink.flush()
        finally:
            self._file.close()  # first: what a failed write left in the buffer is not written
            with contextlib.suppress(pa.ArrowInvalid):  # (raised where bytes were left: the file is closed)
                self._sink.close()


@functools.cache
def _no_strings() -> pa.Array:
    """The dictionary of a column of nulls."""
    return strings([])


def _plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its dictionary-encoded columns as their values' type."""
    fields = [pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


@dataclass(frozen=True)
class RecordStream:
    """Where the record batches of a records file start (not decoded yet), its columns as read
    (dictionary-encoded ones as plain strings), and whether its last message was cut short (and dropped)."""

    path: Path
    schema: pa.Schema
    offsets: list[int]
    """Each record batch's byte offset in the file."""
    truncated: bool

    def tables(self, batches: int) -> Iterator[pa.Table]:
        """The records as tables of ``batches`` messages each (a message holds at most a flush, and at
        most :data:`BATCH_ROWS` records), decoded as they are asked for: the next table is decompressed on a
        thread of its own while the caller works on this one (Arrow releases the GIL). A message
        that does not decode raises a :class:`DumpError` naming it."""
        count = len(self.offsets)
        groups = [range(start, min(start + batches, count)) for start in range(0, count, batches)]
        decoder = _Decoder(self)
        with ThreadPoolExecutor(max_workers=1) as pool:  # one thread: the groups are decoded in order
            ahead = [pool.submit(decoder.decode, group) for group in groups[:1]]
            for group in groups[1:]:
                ahead.append(pool.submit(decoder.decode, group))
                yield ahead.pop(0).result()
            if ahead:
                yield ahead.pop().result()

    def table(self) -> pa.Table:
        """Every record as one table."""
        return _Decoder(self).decode(range(len(self.offsets)))


class _Decoder:
    """Decodes a records file's batches in order, from the first (a batch's dictionaries are in the
    messages before it)."""

    def __init__(self, stream: RecordStream) -> None:
        self._stream = stream
        self._reader: ipc.RecordBatchStreamReader | None = None
        self._next = 0

    def decode(self, indices: range) -> pa.Table:
        """The batches ``indices`` (the next ones) as one table of the stream's plain schema."""
        stream = self._stream
        if not indices:
            return stream.schema.empty_table()
        if indices.start != self._next:
            raise ValueError(f"batches are decoded in order: {indices.start} asked for, {self._next} next")
        batches = []
        for index in indices:
            try:
                if self._reader is None:
                    self._reader = ipc.open_stream(pa.memory_map(str(stream.path)))
                batches.append(self._reader.read_next_batch())
            except (pa.ArrowInvalid, OSError, StopIteration) as error:
                raise _corrupt(stream.path, index, stream.offsets[index], error) from None
            self._next = index + 1
        table = pa.Table.from_batches(batches)
        return table if table.schema == stream.schema else table.cast(stream.schema)


def record_stream(path: Path) -> RecordStream:
    """The messages of a records file (see :class:`RecordStream`); a file that does not exist holds none."""
    if not path.exists():
        return RecordStream(path, SCHEMA, [], False)
    source = pa.memory_map(str(path))
    size = source.size()
    reader = ipc.MessageReader.open_stream(source)
    schema: pa.Schema | None = None
    offsets: list[int] = []
    while True:
        start = source.tell()
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError) as error:
            if _cut_short(source, start, size, error):
                logger.warning("%s: the last batch of records is incomplete (the run stopped mid-write); skipped", path)
                return RecordStream(path, _plain(schema or SCHEMA), offsets, True)
            raise _corrupt(path, len(offsets), start, error) from None
        if schema is None:
            try:
                schema = ipc.read_schema(message)
            except (pa.ArrowInvalid, OSError) as error:
                raise _corrupt(path, 0, start, error) from None
        elif message.type == "record batch":  # dictionaries are read with the batch they precede
            offsets.append(start)
    return RecordStream(path, _plain(schema or SCHEMA), offsets, False)


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
