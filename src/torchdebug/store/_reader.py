"""Reading dumps back, without pickle.

:func:`load` takes a dump path (its latest run), a run folder or a rank folder. Records come from
the Arrow stream of each rank (``record_file.py``), or from the JSON lines of dumps written before;
a last batch (or line) cut short by a crash is skipped with a warning, and a rank folder without
``complete.json`` is reported as partial. Tensors are memory-mapped from safetensors files.
``to_arrow()`` gives the records as an Arrow table, ``to_pandas()`` as a pandas one
(``torchdebug.store._tables``).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import torch
from safetensors import SafetensorError, safe_open

from torchdebug.errors import DumpError
from torchdebug.gc_paused import paused_gc
from torchdebug.records import READ_SCHEMA_VERSIONS, Record
from torchdebug.store import _layout as layout
from torchdebug.store import _live as live
from torchdebug.store._record_columns import SCHEMA, records_from_table, records_table
from torchdebug.store._record_file import read_records, record_stream
from torchdebug.store._tables import arrow_frame

logger = logging.getLogger("torchdebug.store._reader")

_LEADING = tuple(itertools.takewhile(lambda f: f.default_factory is MISSING, fields(Record)))
"""The record fields before the first one with a default factory (``extra``): those a record can be
built from by position."""
_NAMES = tuple(f.name for f in _LEADING)
_DEFAULTS = tuple(f.default for f in _LEADING)
_REQUIRED = frozenset(f.name for f in _LEADING if f.default is MISSING)
_PLAIN = frozenset(_NAMES)
_GROUP = 4
"""Records built from one decoded table of this many batches at a time (8k records from eager
capture's dispatch mode, a message per flush of 2048; at most 32k, a message holding at most
``_record_file.BATCH_ROWS``): the decompressed columns of two groups (about 4 MB each on the
GPT bench, the next one decoded meanwhile) are all that sits beside the records, however many a
rank holds. Arrow's allocator keeps pages it freed: groups of 32 batches (30 MB) left about 100
bytes more per record resident after reading 269k records, and were no faster."""


def _record(row: dict[str, Any]) -> Record:
    """A record from one decoded JSON line: by position when it holds only plain fields (keyword
    arguments decoded by ``json`` are not the interned names ``Record`` matches by identity, and
    matching them by comparing characters made a record three times slower), else
    :meth:`Record.from_json`, which keeps fields unknown to this version in ``extra``."""
    if _REQUIRED <= row.keys() <= _PLAIN:
        return Record(*map(row.get, _NAMES, _DEFAULTS))
    return Record.from_json(row)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DumpError(f"{path}: unreadable ({error})") from None


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """Rows of a JSON-lines file and whether its last line was cut short (and skipped)."""
    if not path.exists():
        return [], False
    data = path.read_bytes()
    body = data.rstrip(b"\n")
    if not body:
        return [], False
    if data.endswith(b"\n"):
        try:  # the common case in one parse: about four times faster than line by line
            return json.loads(b"[" + body.replace(b"\n", b",") + b"]"), False
        except json.JSONDecodeError:
            pass  # a blank line (",,"), or find the bad line below
    lines = data.split(b"\n")
    rows: list[dict[str, Any]] = []
    truncated = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: the write was cut by a crash
                truncated = True
                logger.warning("%s: last line is incomplete (the run stopped mid-write); skipped", path)
                continue
            raise DumpError(f"{path}:{number}: corrupt record line; the file was modified or damaged") from None
    return rows, truncated


@dataclass
class RankDump:
    """One rank's folder: manifest, records, stacks and tensors."""

    path: Path
    manifest: dict[str, Any] = field(repr=False)
    _handles: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False, compare=False)
    _handles_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def open(cls, path: Path) -> RankDump:
        manifest = _read_json(path / layout.MANIFEST)
        version = manifest.get("schema_version")
        if version not in READ_SCHEMA_VERSIONS:
            raise DumpError(
                f"{path}: schema_version {version!r} is not supported by this torchdebug "
                f"(reads {', '.join(map(str, READ_SCHEMA_VERSIONS))}); use the torchdebug version that wrote it"
            )
        return cls(path=path, manifest=manifest)

    @property
    def rank(self) -> int:
        return int(self.manifest["rank"])

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])

    @cached_property
    def completion(self) -> dict[str, Any] | None:
        """The completion marker, or ``None`` when the run did not close cleanly (partial dump)."""
        path = self.path / layout.COMPLETE
        return _read_json(path) if path.exists() else None

    @property
    def complete(self) -> bool:
        return self.completion is not None

    @property
    def write_fault(self) -> dict[str, Any] | None:
        """The first write of the run that failed (``complete.json``'s ``truncated``: step, slot,
        path, error, free bytes): capture stopped there while training went on; ``None`` when every
        write succeeded."""
        return self.completion.get("truncated") if self.completion else None

    @cached_property
    def _records(self) -> tuple[list[Record], bool]:
        return self._read()

    def _read(self) -> tuple[list[Record], bool]:
        if self._json_lines:
            rows, truncated = _read_jsonl(self.path / layout.RECORDS_JSON)
            records = [_record(row) for row in rows]
        else:
            stream = record_stream(self.path / layout.RECORDS)
            records, truncated = [], stream.truncated
            with paused_gc():  # once for every group: a collection between groups walks every record made
                for table in stream.tables(_GROUP):
                    records += records_from_table(table)
            pa.default_memory_pool().release_unused()  # the decoded columns' pages, kept by Arrow's allocator
        fault = self.write_fault
        if fault is not None:
            self._mark_unwritten_tensors(records, f"writing the dump failed ({fault.get('error')})")
        elif not self.complete:
            self._mark_unwritten_tensors(records, "the run stopped")
        return records, truncated

    def _mark_unwritten_tensors(self, records: list[Record], why: str) -> None:
        """In a run that stopped without closing, or whose writes failed, some tensor files are
        absent: their records keep everything else and say why the tensor is missing."""
        exists: dict[str, bool] = {}
        for record in records:
            file = record.tensor.get("file") if record.tensor else None
            if file is None:
                continue
            if file not in exists:
                exists[file] = (self.path / file).is_file()
            if not exists[file]:
                record.tensor = None
                record.capture_error = f"tensor not saved: {why} before {file} was written"

    @property
    def _json_lines(self) -> bool:
        """Whether the records are JSON lines (a dump written before records were Arrow columns)."""
        return not (self.path / layout.RECORDS).exists() and (self.path / layout.RECORDS_JSON).exists()

    def records(self) -> list[Record]:
        """All records of this rank, in the order they were written."""
        return self._records[0]

    def passing_records(self) -> list[Record]:
        """This rank's records, read without being kept (the kept list when they were read already):
        for a pass over the other ranks of a run that must not hold every rank's records at once."""
        return self.records() if "_records" in self.__dict__ else self._read()[0]

    @property
    def truncated(self) -> bool:
        """True when the records file ended in a half-written line (a crash mid-write)."""
        return self._records[1]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def stored_tables(self) -> Iterator[pa.Table] | None:
        """This rank's records as stored, in tables of a few messages each (as :meth:`records`
        reads them: a pass over a large rank's columns holds one table at a time), where they stand
        for the rank: a rank that closed cleanly, its records in Arrow columns of this version's
        schema. ``None`` for the others (a partial rank's records are marked where a tensor file
        was never written; older dumps hold JSON lines): read its records instead."""
        if not (self.complete and (self.path / layout.RECORDS).is_file()):
            return None
        stream = record_stream(self.path / layout.RECORDS)
        return stream.tables(_GROUP) if stream.schema.equals(SCHEMA, check_metadata=False) else None

    def to_arrow(self) -> pa.Table:
        """This rank's records as an Arrow table, as stored (``record_columns.SCHEMA``: one row per
        record, statistics as a struct column, ``value`` and ``extra`` as JSON text), for pandas,
        Polars or DuckDB without a copy. A dump of JSON lines is converted. Records of a partial
        run whose tensor file was never written keep their ``tensor_file`` here (:meth:`records`
        marks them)."""
        if self._json_lines:
            return records_table(self.records())
        return read_records(self.path / layout.RECORDS)[0]

    def to_pandas(self) -> Any:
        """This rank's records as a ``pandas.DataFrame``, one row per record, statistics as columns
        (:data:`~torchdebug.store._tables.RECORD_COLUMNS`; needs ``pip install 'torchdebug[pandas]'``)."""
        return arrow_frame(self.to_arrow())

    @cached_property
    def stacks(self) -> dict[str, list[str]]:
        rows, _ = _read_jsonl(self.path / layout.STACKS)
        return {row["id"]: row["frames"] for row in rows}

    def stack(self, record: Record) -> list[str]:
        """The call stack of a record, innermost frame last (empty when none was recorded)."""
        return self.stacks.get(record.stack or "", [])

    def load_tensor(self, record: Record, device: str = "cpu") -> torch.Tensor:
        """The saved tensor of a record (task=tensor), memory-mapped from its safetensors file."""
        if not record.tensor or "file" not in record.tensor:
            raise DumpError(f"{record.name}: no tensor saved for this record (dumped with task={self.task!r})")
        try:
            tensor = self._open(record.tensor["file"], device).get_tensor(record.tensor["key"])
        except SafetensorError as error:
            raise DumpError(
                f"{record.name}: cannot read {record.tensor['key']!r} from {record.tensor['file']} ({error})"
            ) from None
        view = record.tensor.get("view")
        if view is not None:  # saved as a strided view of another slot's tensor
            tensor = tensor.reshape(-1).as_strided(view["shape"], view["stride"], view["offset"])
        if record.dtype and record.dtype.startswith("complex") and not tensor.is_complex():
            tensor = torch.view_as_complex(tensor.contiguous())
        return tensor

    def _open(self, file: str, device: str) -> Any:
        """One safetensors handle per file and device, opened once (parsing the header is costly);
        handles are safe to share between threads."""
        key = (file, device)
        handle = self._handles.get(key)
        if handle is None:
            with self._handles_lock:
                handle = self._handles.get(key)
                if handle is None:
                    path = self.path / file
                    if not path.is_file():
                        raise DumpError(f"tensor file {path} is missing")
                    handle = self._handles[key] = safe_open(str(path), framework="pt", device=device)
        return handle

    @property
    def task(self) -> str:
        return str(self.manifest.get("config", {}).get("task", "?"))


class RankRecords(Protocol):
    """One rank of a dump, whoever wrote it: what compare, show and convert read. Ours is a
    :class:`RankDump`, an msprobe dump's a :class:`~torchdebug.store._msprobe.MsprobeRankDump`."""

    @property
    def rank(self) -> int: ...
    @property
    def path(self) -> Path: ...
    @property
    def complete(self) -> bool: ...
    @property
    def truncated(self) -> bool: ...
    def records(self) -> list[Record]: ...
    def stack(self, record: Record) -> list[str]: ...
    def load_tensor(self, record: Record, device: str = "cpu") -> torch.Tensor: ...


@dataclass
class Run:
    """One run of a dump: the rank folders written together."""

    path: Path
    ranks: dict[int, RankRecords]

    @property
    def partial_ranks(self) -> list[int]:
        """Ranks whose folder has no completion marker (the process died or was killed)."""
        return [rank for rank, dump in self.ranks.items() if not dump.complete]

    def records(self) -> Iterator[Record]:
        """Records of every rank, rank by rank."""
        for rank in sorted(self.ranks):
            yield from self.ranks[rank].records()

    def to_arrow(self) -> pa.Table:
        """The records of every rank as one Arrow table, rank by rank (see :meth:`RankDump.to_arrow`;
        ranks of another reader, msprobe's, are converted)."""
        ranks = [self.ranks[rank] for rank in sorted(self.ranks)]
        tables = [dump.to_arrow() if isinstance(dump, RankDump) else records_table(dump.records()) for dump in ranks]
        return pa.concat_tables(tables) if tables else records_table([])

    def to_pandas(self) -> Any:
        """The records of every rank as one ``pandas.DataFrame`` (see :meth:`RankDump.to_pandas`)."""
        return arrow_frame(self.to_arrow())


def write_fault_note(rank: int, dump: RankRecords) -> str | None:
    """One line on a rank whose dump is truncated by a failed write (``None`` for any other)."""
    fault = getattr(dump, "write_fault", None)
    if fault is None:
        return None
    slot = f" ({fault['slot']})" if fault.get("slot") else ""
    lost = fault.get("unwritten_records")
    lost = f", {lost} captured records were not written" if lost else ""
    return (
        f"rank {rank}: the dump is truncated at step {fault.get('step')}{slot}: writing {fault.get('path')} failed "
        f"({fault.get('error')}); capture stopped there, training went on{lost}"
    )


def list_runs(dump_path: Path) -> list[Path]:
    """Run folders under a dump path, oldest first."""
    runs = [child for child in dump_path.iterdir() if layout.is_run_dir(child)]
    return sorted(runs, key=lambda p: (p.stat().st_mtime, p.name))


def is_dump(path: str | Path) -> bool:
    """Whether ``path`` is a torchdebug dump path (with at least one run), a run folder or a rank folder."""
    path = Path(path)
    if not path.is_dir():
        return False
    return layout.is_rank_dir(path) or layout.is_run_dir(path) or bool(list_runs(path))


def load(path: str | Path) -> Run:
    """Open a dump path (its latest run), a run folder or a rank folder.

    Dumps this thread is still capturing under ``path`` are flushed first, so every record captured
    so far is read (``torchdebug.store._live``)."""
    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such dump folder")
    live.flush_under(path)
    if not path.is_dir():
        raise DumpError(f"{path}: not a folder; give a dump path, a run folder or a rank folder")
    if layout.is_rank_dir(path):
        dump = RankDump.open(path)
        return Run(path=path.parent, ranks={dump.rank: dump})
    if not layout.is_run_dir(path):
        runs = list_runs(path)
        if not runs:
            raise DumpError(f"{path}: no torchdebug dump here (no worldsize*_global_rank* folders with a manifest)")
        path = runs[-1]
    ranks = {}
    for child in sorted(path.iterdir()):
        if layout.is_rank_dir(child):
            dump = RankDump.open(child)
            ranks[dump.rank] = dump
    return Run(path=path, ranks=ranks)
