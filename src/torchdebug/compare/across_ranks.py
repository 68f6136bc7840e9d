"""Cross-rank check: do the data-parallel replicas of one run agree where they must?

::

    result = torchdebug.compare.compare_ranks("dump")       # the latest run, every rank
    result.first_divergence                                  # first rank and op that disagree

Replicas of a data-parallel run (DDP, or gradients all-reduced by hand) hold the same parameters,
see the same reduced gradients and run the same optimizer step. The records where that must hold:

* every tensor slot of the ``optimizer`` phase: its inputs are the parameters, the reduced
  gradients and the optimizer state, its outputs the updated values (in-place updates such as
  ``add_``, ``lerp_``, ``addcdiv_``, ``_foreach_*``);
* module-level ``parameter`` records (``level="module"`` or ``"mix"``): the parameters each
  forward starts from, i.e. after the previous step's optimizer step;
* outputs of the collectives whose result is the same on every rank (``all_reduce``,
  ``all_gather`` and its variants, ``broadcast``). With gradients all-reduced by hand these are the
  gradients after all-reduce. DDP reduces gradients in C++ inside the autograd engine, which a
  dispatch mode does not see: there the reduced gradients appear as inputs of the optimizer.

Not compared: pieces of a split DTensor (``Shard`` or ``Partial`` placements: FSDP2's sharded
parameters, gradients and optimizer state, tensor-parallel weights; each rank holds another piece,
while ``Replicate`` ones are compared), activations and local gradients (each rank has its own
batch), ``reduce_scatter``, ``send``/``recv`` outputs (they differ by design), ``parameter_grad``
records (taken before the all-reduce), argument values. Sharded optimizers on plain tensors (ZeRO,
FSDP1) give ranks different state: pass the ``ranks`` that hold the same shard (one data-parallel
group).

**Reference**: for each slot the ranks are grouped by value (bitwise; by statistics where no tensor
was saved). The largest group is the reference, on a tie the group holding the lowest rank: with
three or more ranks one bad rank is named; with two, rank 1 is named against rank 0 and either may
be the culprit. A rank's first slot that differs from the reference by more than the tolerance
(exact unless given) is ``error``/``blamed``; its later differing slots are ``warning``/``inherited``.
The first divergence is the earliest blamed slot in execution order (step, then call), lowest rank
on a tie.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from torchdebug import progress
from torchdebug.compare.judgement import Judgement
from torchdebug.compare.metrics import stats_metrics, tensor_metrics
from torchdebug.compare.result import CompareResult, Side
from torchdebug.compare.rows import Row
from torchdebug.compare.shards import sharded
from torchdebug.compare.steps import has_tensor, metric_pool, open_dump
from torchdebug.compare.tolerances import Tolerance, lower_precision, parse_tolerances
from torchdebug.records import Record
from torchdebug.store import reader

__all__ = ["compare_ranks", "replicated", "RanksResult"]

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

_EXACT = Tolerance(0.0, 0.0)


def replicated(record: Record) -> bool:
    """Whether data-parallel replicas must hold the same value in this slot (module docstring)."""
    if record.kind != "tensor" or record.capture_error or sharded(record):
        return False
    return record.phase == "optimizer" or record.io == "parameter" or (record.io == "output" and record.op in SAME_ON_EVERY_RANK)


class RanksResult(CompareResult):
    """A :class:`CompareResult` whose rows compare each rank with the reference ranks, slot by slot.

    ``row.rank`` is the rank checked, ``row.record_a`` its record, ``row.record_b`` the reference's.
    """

    heading = "torchdebug compare --across-ranks"

    def title(self) -> str:
        return f"compare the ranks of {self.a.path} with each other (reference: the majority of ranks, on a tie the lowest)"

    def sides(self) -> list[tuple[str, str]]:
        return [("run", self.a.path), ("reference", "per slot, the value most ranks hold (on a tie, the lowest rank's)")]

    def _first(self, finder: Callable[[Sequence[Row]], Row | None]) -> Row | None:
        return finder(sorted(self.rows, key=lambda row: (row.order, row.rank)))


def _fingerprint(dump: reader.RankRecords, record: Record, tensors: bool) -> tuple:
    """What two ranks must share to hold the same value: dtype, shape and the bytes (or statistics)."""
    if tensors and has_tensor(record):
        data = dump.load_tensor(record).detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        content = hashlib.blake2b(data, digest_size=16).hexdigest()
    else:
        content = json.dumps(record.stats, sort_keys=True)
    return record.dtype, tuple(record.shape or ()), content


def _slots(run: reader.Run, ranks: Sequence[int]) -> list[dict[int, Record]]:
    """Replicated slots in execution order: ``{rank: record}`` per ``(step, name)``."""
    slots: dict[tuple[int, str], dict[int, Record]] = {}
    for rank in ranks:
        for record in run.ranks[rank].records():
            if replicated(record):
                slots.setdefault((record.step, record.name), {})[rank] = record
    position = {key: index for index, key in enumerate(slots)}
    ordered = sorted(slots, key=lambda key: (key[0], next(iter(slots[key].values())).seq, position[key]))
    return [slots[key] for key in ordered]


def _metrics(run: reader.Run, row: Row, tensors: bool, tolerance: Tolerance) -> dict[str, float]:
    a, b = row.record_a, row.record_b
    assert a is not None and b is not None
    if tensors and has_tensor(a) and has_tensor(b):
        tensor_a, tensor_b = run.ranks[a.rank].load_tensor(a), run.ranks[b.rank].load_tensor(b)
        return tensor_metrics(tensor_a, tensor_b, low_dtype=lower_precision(a.dtype, b.dtype), atol=tolerance.atol)
    return stats_metrics(a.stats, b.stats, numel=math.prod(b.shape or []), atol=tolerance.atol)


def _difference(row: Row, tolerance: float) -> Judgement:
    """How a rank's value, which is not the reference's, compares with it."""
    reference = row.record_b.rank if row.record_b is not None else None
    if row.shape_a != row.shape_b or row.dtype_a != row.dtype_b:
        # no number measures it: the message says what differs
        return Judgement(
            "error", "", f"{row.dtype_a} {row.shape_a} vs {row.dtype_b} {row.shape_b} on rank {reference}", error=math.inf
        )
    if row.metrics.get("nonfinite_mismatch") or (row.error or 0.0) > tolerance:
        error = math.inf if row.error is None else row.error  # NaN/Inf statistics: no finite number to compare
        return Judgement("error", "", f"differs from rank {reference} by {error:.3g} (tolerance {tolerance:.3g})", error=error)
    return Judgement("pass", "", f"within tolerance of rank {reference}")


def _attribute(rows: Iterable[Row], agreeing: Mapping[Row, str]) -> None:
    """Blame each rank's first differing slot; later ones are inherited."""
    first: dict[int, Row] = {}
    for row in sorted(rows, key=lambda r: r.order):
        if row.verdict != "error":
            continue
        if row.rank in first:
            already = f"; rank {row.rank} already diverged at {first[row.rank].name} (step {first[row.rank].step})"
            Judgement("warning", "inherited", row.message + already).apply(row)
        else:
            Judgement("error", "blamed", f"{row.message} ({agreeing[row]}): rank {row.rank} diverges here first").apply(row)
            first[row.rank] = row


def compare_ranks(
    dump: str | Path | reader.Run,
    *,
    ranks: Sequence[int] | None = None,
    tolerances: Mapping[str, Any] | None = None,
    tensors: bool = True,
    threads: int | None = None,
) -> RanksResult:
    """Compare the ranks of one run with each other where data-parallel replicas must agree.

    Args:
        dump: a dump path (its latest run) or a run folder.
        ranks: the ranks of one data-parallel group (default: every rank of the run).
        tolerances: per-dtype overrides as in :func:`torchdebug.compare`; by default values must
            be bitwise equal (replicas run the same kernels on the same values).
        tensors: compare saved tensors when there are any (else statistics).
        threads: threads reading and hashing tensors (default: all cores).

    Returns:
        A :class:`RanksResult`; ``first_divergence`` names the first rank and op that disagree.
    """
    run = open_dump(dump)
    selected = sorted(run.ranks) if ranks is None else sorted(set(ranks))
    missing = [rank for rank in selected if rank not in run.ranks]
    if missing:
        raise ValueError(f"ranks: {missing} not in {run.path} (it has ranks {sorted(run.ranks)})")
    if len(selected) < 2:
        raise ValueError(f"{run.path}: ranks {selected} only; comparing across ranks needs two or more")
    overrides = parse_tolerances(tolerances)
    slots = _slots(run, selected)
    rows: list[Row] = []
    differing: list[Row] = []
    agreeing: dict[Row, str] = {}
    with metric_pool(threads) as pool:
        jobs = [(rank, record) for present in slots for rank, record in present.items()]
        fingerprints = pool.map(lambda job: _fingerprint(run.ranks[job[0]], job[1], tensors), jobs)
        fingerprints = progress.track(fingerprints, "reading replicated slots", total=len(jobs), unit="slot")
        prints = dict(zip(((rank, id(record)) for rank, record in jobs), fingerprints))
        for order, present in enumerate(slots):
            groups: dict[tuple, list[int]] = {}
            for rank, record in present.items():
                groups.setdefault(prints[rank, id(record)], []).append(rank)
            reference = max(groups, key=lambda key: (len(groups[key]), -min(groups[key])))
            reference_rank = min(groups[reference])
            for rank in selected:
                record = present.get(rank)
                row = Row.from_records(rank, record, present[reference_rank], "exact" if record else "only_b", float(order))
                rows.append(row)
                if record is None:
                    Judgement("unmatched", "", f"not on rank {rank}").apply(row)
                elif prints[rank, id(record)] == reference:
                    row.error = 0.0
                    Judgement("pass", "", "reference" if rank == reference_rank else "").apply(row)
                else:
                    differing.append(row)
                    agreeing[row] = f"ranks {', '.join(map(str, groups[reference]))} hold the reference value"
        tolerance_of = {row: overrides.get(lower_precision(row.dtype_a, row.dtype_b) or "", _EXACT) for row in differing}
        comparable = [row for row in differing if row.shape_a == row.shape_b and row.dtype_a == row.dtype_b]
        results = pool.map(lambda row: _metrics(run, row, tensors, tolerance_of[row]), comparable)
        for row, metrics in zip(comparable, results):
            row.error = metrics.pop("error", None)
            row.metrics.update(metrics)
    for row in differing:
        row.tolerance = tolerance_of[row].rtol
        _difference(row, row.tolerance).apply(row)
    _attribute(rows, agreeing)
    side = Side.of(dump, run)
    notes = [note for rank in selected for note in side.notes("run", rank)]
    if not slots:
        notes.append("no slot replicas must agree on: capture the optimizer step, parameters (level=mix) or collectives")
    options = {"across_ranks": selected, "tolerances": {k: [v.rtol, v.atol] for k, v in overrides.items()}}
    return RanksResult(rows=rows, a=side, b=side, problems=notes, options=options)
