"""What the cross-rank check keeps of a rank: one digest per slot data-parallel replicas must agree on.

::

    digest = digest_rank(run.ranks[3], tensors=True, pool=pool)   # reads rank 3, keeps no record
    digest.slots[0]                                                # (step, name, seq, "9f2c...")

A slot's digest is a 16-byte BLAKE2b of its dtype, shape and value: the saved tensor's bytes, or
its statistics where no tensor was saved. Two ranks hold the same value in a slot exactly when their
digests are equal, so the check groups ranks by digest and reads records again only where it needs
them (the reference rank's, and those of ranks that differ). A rank is read from a fresh copy of its
folder whose records are dropped with it: the check's memory does not grow with the number of ranks.
Digests are plain data, sent between processes as JSON (never a pickle), and the ranks can be
digested by worker processes on this machine (:func:`digests_in_processes`) or by the processes of
a torchrun job (:func:`torchdebug.compare._distributed.compare_ranks_distributed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import torch

from torchdebug.compare._result import Side
from torchdebug.compare._shards import sharded
from torchdebug.compare._steps import has_tensor, metric_pool, open_dump
from torchdebug.records import Record
from torchdebug.store import _reader as reader

__all__ = ["SAME_ON_EVERY_RANK", "replicated", "RankDigest", "digest_rank", "fresh", "share_of_cores", "digests_in_processes"]

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

Slot = tuple[int, str, int, str]
"""``(step, name, seq, digest)`` of one replicated slot of a rank."""


def replicated(record: Record) -> bool:
    """Whether data-parallel replicas must hold the same value in this slot (see :mod:`~torchdebug.compare._across_ranks`)."""
    if record.kind != "tensor" or record.capture_error or sharded(record):
        return False
    return record.phase == "optimizer" or record.io == "parameter" or (record.io == "output" and record.op in SAME_ON_EVERY_RANK)


@dataclass(frozen=True, slots=True)
class RankDigest:
    """One rank's replicated slots in the order it wrote them (a slot written twice: its last
    record, at its first place), and the notes on its folder (partial, truncated)."""

    rank: int
    slots: list[Slot]
    notes: list[str]

    def to_plain(self) -> dict[str, Any]:
        """JSON-ready data, for the trip to another process."""
        return {"rank": self.rank, "slots": self.slots, "notes": self.notes}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> RankDigest:
        return cls(data["rank"], [tuple(slot) for slot in data["slots"]], data["notes"])


def fresh(dump: reader.RankRecords) -> reader.RankRecords:
    """A new handle on the same rank folder: the records it reads are freed with it (the handles of
    ``run.ranks`` keep theirs once read)."""
    return dataclasses.replace(dump)  # type: ignore[type-var]  # RankDump and MsprobeRankDump are dataclasses


def _digest(dump: reader.RankRecords, record: Record, tensors: bool) -> str:
    hasher = hashlib.blake2b(f"{record.dtype}|{record.shape}|".encode(), digest_size=16)
    if tensors and has_tensor(record):
        hasher.update(b"tensor|")
        hasher.update(dump.load_tensor(record).detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    else:
        hasher.update(b"stats|" + json.dumps(record.stats, sort_keys=True).encode())
    return hasher.hexdigest()


def digest_rank(dump: reader.RankRecords, tensors: bool, pool: Executor) -> RankDigest:
    """Read one rank (from a :func:`fresh` handle, so nothing stays behind) and digest its
    replicated slots; tensors are read and hashed on ``pool``'s threads."""
    dump = fresh(dump)
    notes = Side.of(dump.path, reader.Run(dump.path.parent, {dump.rank: dump})).notes("run", dump.rank)
    chosen = {(record.step, record.name): record for record in dump.records() if replicated(record)}
    reads = tensors and any(has_tensor(record) for record in chosen.values())
    digests = (pool.map if reads else map)(lambda record: _digest(dump, record, tensors), chosen.values())
    slots = [(step, name, record.seq, digest) for ((step, name), record), digest in zip(chosen.items(), digests)]
    return RankDigest(dump.rank, slots, notes)


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
