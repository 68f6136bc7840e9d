"""Compare over several processes with torch.distributed; process 0 gathers the one result.

``compare(a, b, workers=N)`` spawns N processes on this machine (:func:`spawn_compare`), or, called
on every process of an initialised group of N (torchrun), shares the work with them
(:func:`compare_in_group`); the cross-rank check does the same by rounds (:func:`ranks_in_group`).
Each worker's metrics are computed exactly as in one process, so the gathered result is the same.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from torchdebug.compare._across_ranks import RanksResult, checked_ranks, ranks_result
from torchdebug.compare._config import CompareConfig, RanksConfig
from torchdebug.compare._replica_digests import RankDigest, digest_rank, share_of_cores
from torchdebug.compare._result import CompareResult
from torchdebug.compare._rows import Row
from torchdebug.compare._steps import (
    JobKey,
    Pairing,
    apply_metrics,
    attribute,
    compare_rank,
    compute_jobs,
    finish,
    match_rank,
    metric_pool,
    open_dump,
    open_pair,
    rank_notes,
    tensor_jobs,
)
from torchdebug.dist import broadcast_from_rank0, gather_to_rank0
from torchdebug.errors import ConfigError, TorchDebugError
from torchdebug.gc_paused import paused_gc
from torchdebug.options import accepts
from torchdebug.store import Run

__all__ = [
    "Share",
    "plan",
    "compare_in_group",
    "ranks_in_group",
    "compare_distributed",
    "compare_ranks_distributed",
    "spawn_compare",
    "launched_by_torchrun",
    "process_group_from_env",
]

_EXPECTED = (TorchDebugError, ValueError, OSError)
"""Errors a worker reports to the others instead of leaving them waiting in a collective."""

_JOIN_TIMEOUT = timedelta(minutes=5)
"""How long a process of the group waits for the others to call ``compare`` too (:func:`_joined`):
the processes of one launch arrive within seconds; a process calling it alone gets an error."""


def _joined(call: str) -> None:
    """Raise a :class:`ConfigError` where a process of the default group calls ``compare`` with
    ``workers`` set to the group's size and not every process does (``call`` names the call): the
    work is shared, so a lone caller would wait for the others forever. A gloo group is checked
    with a barrier that names the processes missing after :data:`_JOIN_TIMEOUT`; other backends
    have no such barrier and are not checked."""
    if dist.get_backend() != "gloo":
        return
    try:
        dist.monitored_barrier(timeout=_JOIN_TIMEOUT, wait_all_ranks=True)
    except RuntimeError as error:  # the barrier's own error names the processes that did not arrive
        size = dist.get_world_size()
        raise ConfigError(
            f"workers: {call} with workers={size} on process {dist.get_rank()} of an initialised process group of "
            f"{size} shares the work with every process of the group, and not all of them called it within "
            f"{_JOIN_TIMEOUT.total_seconds():g} s ({error}); call it on every process (process 0 gets the result), "
            "or leave workers out to compare in this process alone"
        ) from error


@dataclass(frozen=True, slots=True)
class Share:
    """One worker's part of one dump rank: ``part`` of ``parts`` (``parts == 1``: the whole rank)."""

    rank: int
    part: int = 0
    parts: int = 1


def plan(ranks: Sequence[int], world_size: int) -> list[list[Share]]:
    """The shares of each worker, the same on every worker (each opens both dumps, manifests only,
    and computes this plan). With R ranks and W workers: if R >= W, worker ``w`` takes ranks ``w,
    w+W, ...`` whole (matches, computes, judges them); if R < W, the workers ``w ≡ i (mod R)`` share
    rank ``i``: each matches it (cheap next to tensor metrics) and computes the tensor jobs of its
    contiguous range of tensor files, balanced by element count; part 0 also sends the rows, and
    process 0 applies every part's metrics and judges."""
    if len(ranks) >= world_size:
        return [[Share(rank) for rank in ranks[worker::world_size]] for worker in range(world_size)]
    count = len(ranks)
    return [
        [Share(ranks[worker % count], worker // count, len(range(worker % count, world_size, count)))]
        for worker in range(world_size)
    ]


def _part_of(jobs: Mapping[JobKey, list[Row]], share: Share) -> list[JobKey]:
    """The jobs of one part: a contiguous range in file order, balanced by element count."""
    keys = sorted(jobs, key=str)  # (folder, file, key, view) of side A first: file order
    sizes = [max(1, math.prod(jobs[key][0].shape_a or [])) for key in keys]
    total, before, mine = sum(sizes), 0, []
    for key, size in zip(keys, sizes):
        if min(share.parts - 1, (before + size // 2) * share.parts // total) == share.part:
            mine.append(key)
        before += size
    return mine


@dataclass(slots=True)
class _Piece:
    """What a worker sends for one share: rows (whole rank, or part 0), and tensor metrics by job."""

    rank: int
    rows: list[Row] | None = None
    judged: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)
    groups: dict[JobKey, list[int]] | None = None
    """Part 0: the row indices of each tensor job, so process 0 can apply every part's metrics."""
    metrics: dict[JobKey, dict[str, float]] = dataclasses.field(default_factory=dict)


def _work(shares: list[Share], pairing: Pairing, settings: CompareConfig) -> list[_Piece]:
    pieces = []
    with paused_gc(), metric_pool(settings.threads) as pool:
        for share in shares:
            if share.parts == 1:
                rows = compare_rank(share.rank, pairing, settings, pool)
                pieces.append(_Piece(share.rank, rows, judged=True, notes=rank_notes(share.rank, pairing)))
                continue
            dump_a, dump_b = pairing.a.run.ranks[share.rank], pairing.b.run.ranks[share.rank]
            rows = match_rank(share.rank, dump_a, dump_b, settings)
            jobs = tensor_jobs(rows, dump_a, dump_b) if settings.tensors else {}
            mine = _part_of(jobs, share)
            metrics = dict(zip(mine, compute_jobs([jobs[key] for key in mine], dump_a, dump_b, settings.tolerances, pool)))
            if share.part == 0:
                index = {id(row): position for position, row in enumerate(rows)}
                groups = {key: [index[id(row)] for row in group] for key, group in jobs.items()}
                pieces.append(_Piece(share.rank, rows, notes=rank_notes(share.rank, pairing), groups=groups, metrics=metrics))
            else:
                pieces.append(_Piece(share.rank, metrics=metrics))
    return pieces


def _merge(pieces: list[_Piece], pairing: Pairing, settings: CompareConfig) -> tuple[list[Row], list[str]]:
    """Rows and notes of every rank, in rank order, with split ranks' metrics applied and judged
    (rerun here, when asked: which calls diverge is known once every part's metrics are in)."""
    by_rank: dict[int, list[_Piece]] = defaultdict(list)
    for piece in pieces:
        by_rank[piece.rank].append(piece)
    rows: list[Row] = []
    notes: list[str] = []
    with metric_pool(settings.threads) as pool:
        for rank in pairing.ranks:
            main = next(piece for piece in by_rank[rank] if piece.rows is not None)
            assert main.rows is not None
            if not main.judged:
                metrics = {key: value for piece in by_rank[rank] for key, value in piece.metrics.items()}
                groups = main.groups or {}
                apply_metrics([[main.rows[i] for i in groups[key]] for key in groups], [metrics[key] for key in groups])
                dump_a, dump_b = pairing.a.run.ranks[rank], pairing.b.run.ranks[rank]
                attribute(main.rows, dump_a, dump_b, settings, pool, noise=pairing.noise_rank(rank))
            rows.extend(main.rows)
            notes.extend(main.notes)
    return rows, notes


def _compare_in_group(a: str | Path | Run, b: str | Path | Run, settings: CompareConfig) -> CompareResult | None:
    """Run on every process of the default group; the result on process 0, ``None`` elsewhere.
    An expected error on any worker is raised on every worker (none is left waiting). Rows (with
    their records) and metrics travel with ``gather_object``, pickled in memory between workers;
    dump data is only read through the dump reader, never unpickled from disk."""
    _joined("compare(a, b)")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    outcome: list[_Piece] | Exception
    pairing = None
    try:
        pairing = open_pair(a, b, settings.noise)
        outcome = _work(plan(pairing.ranks, world_size)[rank], pairing, settings)
    except _EXPECTED as error:
        outcome = error
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(outcome, gathered, dst=0)
    result, failure = None, None
    if gathered is not None:
        failure = next((item for item in gathered if isinstance(item, Exception)), None)
        if failure is None and pairing is not None:
            try:
                rows, notes = _merge([piece for pieces in gathered for piece in pieces], pairing, settings)
                result = finish(rows, notes, pairing, settings)
            except _EXPECTED as error:
                failure = error
    box = [failure]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise box[0]
    return result


def compare_in_group(a: str | Path | Run, b: str | Path | Run, config: CompareConfig) -> CompareResult | None:
    """Two dumps compared by the processes of the initialised default process group, each called
    with the same arguments; process 0 gets the result, the others ``None``. ``threads`` defaults to
    the cores per process on this node."""
    if config.threads is None:
        config = dataclasses.replace(config, threads=_node_threads())
    return _compare_in_group(a, b, config)


@accepts(CompareConfig)
def compare_distributed(a: str | Path, b: str | Path, *, config: CompareConfig) -> CompareResult | None:
    """Former spelling of ``torchdebug.compare(a, b, workers=N)`` on every process of a group of N
    (one release, with a ``FutureWarning``)."""
    _deprecated("compare_distributed(a, b)", "torchdebug.compare(a, b, workers=N)")
    _require_group("compare_distributed", "compare(..., workers=N)")
    return compare_in_group(a, b, config)


def _deprecated(old: str, new: str) -> None:
    message = f"torchdebug.compare.{old} is deprecated; use {new} on every process of the group of N processes"
    warnings.warn(message, FutureWarning, stacklevel=4)  # the caller's line: past the accepts wrapper


def _require_group(function: str, instead: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{function}: torch.distributed is not initialised; call init_process_group first, or use {instead}")


def _node_threads() -> int:
    """This process's share of its node's cores (torchrun's ``LOCAL_WORLD_SIZE`` processes share them)."""
    return share_of_cores(int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())))


def _digests_in_group(run: Any, selected: Sequence[int], tensors: bool, threads: int) -> Iterator[RankDigest]:
    """Run on every process: the checked ranks' digests in rank order on process 0 (nothing on the
    others), a round of one rank per process at a time (module docstring). An expected error on any
    process is raised on every process once the rounds are over (none is left waiting)."""
    process, processes = dist.get_rank(), dist.get_world_size()
    failure = ""
    with metric_pool(threads) as pool:
        for first in range(0, len(selected), processes):
            mine = selected[first + process] if first + process < len(selected) else None
            try:
                payload = "" if mine is None else json.dumps(digest_rank(run.ranks[mine], tensors, pool).to_plain())
            except _EXPECTED as error:
                payload = json.dumps({"error": f"rank {mine}: {error}"})
            for data in gather_to_rank0(payload.encode()) or []:
                plain = json.loads(data) if data else None
                if plain is not None and "error" in plain:
                    failure = failure or plain["error"]
                elif plain is not None and not failure:
                    yield RankDigest.from_plain(plain)
    failure = broadcast_from_rank0(failure)
    if failure:
        raise ValueError(failure)


def ranks_in_group(dump: str | Path | Run, config: RanksConfig) -> RanksResult | None:
    """The ranks of one dump compared by the processes of the initialised default process group:
    each digests its share of the dump's ranks, process 0 gathers the digests and judges. Each is
    called with the same arguments; process 0 gets the result, the others ``None``. ``threads``
    defaults to the cores per process on this node. Every process must see the dump at the same
    path; process 0 reads again one rank of each value a slot holds. Round by round: in round ``k``
    worker ``w`` digests dump rank ``ranks[w + k*W]`` and process 0 gathers the round's digests as
    JSON bytes in tensors (:func:`torchdebug.dist.gather_to_rank0`, no pickle) and folds them in, so
    it holds one round's digests at a time."""
    _joined("compare(dump)")
    run = open_dump(dump)
    selected = checked_ranks(run, config.ranks)
    digests = _digests_in_group(run, selected, config.tensors, config.threads or _node_threads())
    if dist.get_rank() != 0:
        for _ in digests:  # nothing comes out here: the rounds run, process 0 gathers
            pass
        return None
    return ranks_result(dump, run, selected, digests, config)


@accepts(RanksConfig)
def compare_ranks_distributed(dump: str | Path, *, config: RanksConfig) -> RanksResult | None:
    """Former spelling of ``torchdebug.compare(dump, workers=N)`` on every process of a group of N
    (one release, with a ``FutureWarning``)."""
    _deprecated("compare_ranks_distributed(dump)", "torchdebug.compare(dump, workers=N)")
    _require_group("compare_ranks_distributed", "compare(dump, workers=N)")
    if config.workers != 1:
        raise ConfigError(f"workers: got {config.workers}, the processes of the group do the work; leave workers out")
    return ranks_in_group(dump, config)


def _spawned(index: int, world_size: int, init_method: str, a: str, b: str, settings: CompareConfig, results: Any) -> None:
    """A spawned worker: join the group, do its share; process 0 hands the outcome to the parent."""
    dist.init_process_group("gloo", init_method=init_method, rank=index, world_size=world_size)
    try:
        try:
            result = _compare_in_group(a, b, settings)
            outcome: Any = (result.rows, result.problems) if result is not None else None
        except _EXPECTED as error:
            outcome = error
        if index == 0:
            results.put(outcome)
    finally:
        dist.destroy_process_group()


def _wait(results: Any, processes: mp.ProcessContext) -> Any:
    """Process 0's outcome; a worker that died raises (and the others are stopped)."""
    while True:
        try:
            outcome = results.get(timeout=0.2)
            break
        except queue.Empty:
            if processes.join(timeout=0):
                raise RuntimeError("compare workers exited without a result") from None
    while not processes.join():
        pass
    return outcome


def spawn_compare(a: Any, b: Any, settings: CompareConfig) -> CompareResult:
    """Spawn ``settings.workers`` processes on this machine to compare ``a`` and ``b``; the result comes back here."""
    workers = settings.workers
    pairing = open_pair(a, b, settings.noise)  # bad paths fail here, before any process starts
    if settings.threads is None:
        settings = dataclasses.replace(settings, threads=share_of_cores(workers))
    results = mp.get_context("spawn").Queue()
    with tempfile.TemporaryDirectory(prefix="torchdebug-compare-") as temp:
        init_method = Path(temp, "rendezvous").as_uri()
        args = (workers, init_method, pairing.a.path, pairing.b.path, settings, results)
        processes = mp.start_processes(_spawned, args=args, nprocs=workers, join=False, start_method="spawn")
        outcome = _wait(results, processes)
    if isinstance(outcome, Exception):
        raise outcome
    rows, problems = outcome
    return CompareResult(rows=rows, a=pairing.a, b=pairing.b, problems=problems, options=settings.options())


def launched_by_torchrun() -> bool:
    """Whether torchrun (or a launcher setting the same variables) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ and "MASTER_ADDR" in os.environ


@contextmanager
def process_group_from_env() -> Iterator[None]:
    """Inside the block, the gloo process group torchrun's variables describe (``env://``); one
    that is already initialised is used as it is."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()
