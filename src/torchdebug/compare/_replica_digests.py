"""What the cross-rank check keeps of a rank: one digest per slot data-parallel replicas must agree on.

::

    digest = digest_rank(run.ranks[3], tensors=True, pool=pool)   # reads rank 3, keeps no record
    digest.slots[0]                                                # (step, name, seq, "9f2c...")

A slot's digest is a 16-byte hash of its dtype, shape and value (:mod:`~torchdebug.compare._value_digests`):
the saved tensor's bytes, or its statistics where no tensor was saved. Two ranks hold the same
value in a slot exactly when their digests are equal, so the check groups ranks by digest and reads
records again only where it needs them (one rank of each value). A rank is read from a fresh copy
of its folder whose records are dropped with it: the check's memory does not grow with the number
of ranks. A rank that closed cleanly is digested straight from its Arrow columns: the replicated
rows are picked and their statistics hashed column by column, and only rows the columns do not hold
whole (``json_fields``, ``extra``) or whose saved tensor is hashed become ``Record`` objects.
Digests are plain data, sent between processes as JSON (never a pickle), and the ranks can be
digested by worker processes on this machine (:func:`digests_in_processes`) or by the processes of
a torchrun job (:func:`torchdebug.compare._distributed.compare_ranks_distributed`).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torchdebug.compare._result import Side
from torchdebug.compare._shards import sharded
from torchdebug.compare._steps import has_tensor, metric_pool, open_dump
from torchdebug.compare._value_digests import DIGEST_BYTES, column_digests, value_digest
from torchdebug.records import Record
from torchdebug.store import (
    MsprobeRankDump,
    RankDump,
    RankRecords,
    Run,
    arrow_array,
    arrow_booleans,
    arrow_strings,
    arrow_text,
    records_from_table,
)

__all__ = [
    "SAME_ON_EVERY_RANK",
    "replicated",
    "RankDigest",
    "digest_rank",
    "fresh",
    "stored_tables",
    "share_of_cores",
    "digests_in_processes",
]

SAME_ON_EVERY_RANK = frozenset(
    {
        "c10d.allreduce_.default",
        "c10d.allreduce_coalesced_.default",
        "c10d.allgather_.default",
        "c10d._allgather_base_.default",
        "c10d.allgather_coalesced_.default",
        "c10d.allgather_into_tensor_coalesced_.default",
        "c10d.broadcast_.default",
    }
)
"""Collectives whose outputs hold the same values on every rank of the group."""

_SAME = arrow_strings(sorted(SAME_ON_EVERY_RANK))

Slot = tuple[int, str, int, str]
"""``(step, name, seq, digest)`` of one replicated slot of a rank."""


def replicated(record: Record) -> bool:
    """Whether data-parallel replicas must hold the same value in this slot (see :mod:`~torchdebug.compare._across_ranks`)."""
    if record.kind != "tensor" or record.capture_error or sharded(record):
        return False
    return record.phase == "optimizer" or record.io == "parameter" or (record.io == "output" and record.op in SAME_ON_EVERY_RANK)


def _replicated_rows(table: pa.Table) -> np.ndarray:
    """:func:`replicated` on whole columns (a boolean per row), for rows without ``extra`` (where a
    DTensor's placements are) or ``json_fields`` (which override the columns)."""

    def holds(name: str, value: str) -> pa.ChunkedArray:  # (a scalar made by pyarrow from a str imports pandas)
        return pc.equal(table.column(name), arrow_text(value))

    tensor = pc.and_kleene(holds("kind", "tensor"), pc.is_null(table.column("capture_error")))
    output = pc.and_kleene(holds("io", "output"), pc.is_in(table.column("op"), value_set=_SAME))
    where = pc.or_kleene(pc.or_kleene(holds("phase", "optimizer"), holds("io", "parameter")), output)
    return arrow_booleans(pc.and_kleene(tensor, where))


@dataclass(frozen=True, slots=True)
class RankDigest:
    """One rank's replicated slots in the order it wrote them (a slot written twice: its last
    record, at its first place), and the notes on its folder (partial, truncated)."""

    rank: int
    slots: list[Slot]
    notes: list[str]

    def to_plain(self) -> dict[str, Any]:
        """JSON-ready data, for the trip to another process: the slots as columns, the digests as
        one text (a list per slot took the receiving process seven times longer to decode)."""
        steps, names, seqs, digests = zip(*self.slots) if self.slots else ((), (), (), ())
        return {"rank": self.rank, "steps": steps, "names": names, "seqs": seqs, "digests": "".join(digests), "notes": self.notes}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> RankDigest:
        text, size = data["digests"], 2 * DIGEST_BYTES
        digests = [text[start : start + size] for start in range(0, len(text), size)]
        return cls(data["rank"], list(zip(data["steps"], data["names"], data["seqs"], digests)), data["notes"])


def fresh(dump: RankRecords) -> RankRecords:
    """A new handle on the same rank folder: the records it reads are freed with it (the handles of
    ``run.ranks`` keep theirs once read)."""
    assert isinstance(dump, (RankDump, MsprobeRankDump)), f"{type(dump).__name__}: not a reader's handle on a rank folder"
    return dataclasses.replace(dump)


def stored_tables(dump: RankRecords) -> Iterator[pa.Table] | None:
    """A rank's records as the Arrow tables they are stored in, a few messages each, where they stand
    for its records (:meth:`RankDump.stored_tables`); ``None`` for the others (msprobe's are not
    ours): read their records instead."""
    return dump.stored_tables() if isinstance(dump, RankDump) else None


def _record_digests(
    dump: RankRecords, records: Iterable[tuple[int, Record]], tensors: bool, pool: Executor
) -> list[tuple[int, Slot]]:
    """The replicated slots among numbered records, digested as records (tensors read on ``pool``)."""
    chosen = [(row, record) for row, record in records if replicated(record)]
    reads = tensors and any(has_tensor(record) for _, record in chosen)
    digests = (pool.map if reads else map)(lambda item: value_digest(dump, item[1], tensors), chosen)
    return [(row, (record.step, record.name, record.seq, digest)) for (row, record), digest in zip(chosen, digests)]


def _table_digests(dump: RankRecords, table: pa.Table, tensors: bool, pool: Executor) -> list[tuple[int, Slot]]:
    """The replicated slots of one of a rank's stored tables, numbered by row: rows the columns hold
    whole are chosen and digested column by column; the others, and those whose saved tensor is
    hashed, as records."""
    whole = arrow_booleans(pc.and_kleene(pc.is_null(table.column("json_fields")), pc.is_null(table.column("extra"))))
    chosen = _replicated_rows(table) & whole
    as_records = ~whole
    if tensors:
        saved = arrow_booleans(pc.is_valid(table.column("tensor_file")))
        as_records |= chosen & saved
        chosen &= ~saved
    rows = np.flatnonzero(chosen)
    picked = table.select(["step", "name", "seq", "dtype", "shape", "stats"]).take(arrow_array(rows))
    steps, names, seqs = (picked.column(name).to_pylist() for name in ("step", "name", "seq"))
    found = list(zip(rows.tolist(), zip(steps, names, seqs, column_digests(picked))))
    others = np.flatnonzero(as_records)
    if len(others):
        records = zip(others.tolist(), records_from_table(table.take(arrow_array(others))))
        found = sorted(found + _record_digests(dump, records, tensors, pool))
    return found


def digest_rank(dump: RankRecords, tensors: bool, pool: Executor) -> RankDigest:
    """Read one rank (from a :func:`fresh` handle, so nothing stays behind) and digest its
    replicated slots; tensors are read and hashed on ``pool``'s threads."""
    dump = fresh(dump)
    tables = stored_tables(dump)
    if tables is None:
        notes = Side.of(dump.path, Run(dump.path.parent, {dump.rank: dump})).notes("run", dump.rank)
        found = _record_digests(dump, enumerate(dump.records()), tensors, pool)
    else:  # closed cleanly: neither partial nor cut short (its records file was closed before the marker was written)
        notes, found = [], []
        for table in tables:  # in order: each table's slots are in row order
            found += _table_digests(dump, table, tensors, pool)
    slots: dict[tuple[int, str], Slot] = {}
    for _, slot in found:
        slots[slot[0], slot[1]] = slot  # a slot written twice: its last record, at its first place
    return RankDigest(dump.rank, list(slots.values()), notes)


def _digest_in_worker(path: str, rank: int, tensors: bool, threads: int) -> str:
    """A worker process's task: one rank's digest as JSON."""
    with metric_pool(threads) as pool:
        return json.dumps(digest_rank(open_dump(path).ranks[rank], tensors, pool).to_plain())


def share_of_cores(processes: int) -> int:
    """Threads for one of ``processes`` processes on this machine: its share of the cores."""
    return max(1, (os.cpu_count() or 1) // max(1, processes))


def digests_in_processes(
    path: str | Path, ranks: Sequence[int], tensors: bool, workers: int, threads: int | None
) -> Iterator[RankDigest]:
    """The digests of ``ranks``, in that order, computed by ``workers`` spawned processes on this
    machine (``threads`` each, default :func:`share_of_cores`); yielded in order as they come, so
    only a few are held at once."""
    threads = threads or share_of_cores(workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        texts = pool.map(_digest_in_worker, repeat(str(path)), ranks, repeat(tensors), repeat(threads))
        for text in texts:
            yield RankDigest.from_plain(json.loads(text))
