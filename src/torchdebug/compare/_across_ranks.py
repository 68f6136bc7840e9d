"""Cross-rank check: do the data-parallel replicas of one run agree where they must?

``torchdebug.compare("dump")``: the slots replicas must agree on (optimizer-phase slots, module
``parameter`` records, outputs of collectives whose result is the same on every rank), each rank
against the value most ranks hold. Which slots, the reference and the verdicts: docs/compare.md,
"Cross-rank check"; the digests and workers: docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torchdebug import progress
from torchdebug.compare._config import CompareConfig, RanksConfig
from torchdebug.compare._judgement import Judgement
from torchdebug.compare._metrics import stats_metrics, tensor_metrics
from torchdebug.compare._rank_rows import RankRows, SlotRows
from torchdebug.compare._replica_digests import (
    SAME_ON_EVERY_RANK,
    RankDigest,
    digest_rank,
    digests_in_processes,
    fresh,
    replicated,
    stored_tables,
)
from torchdebug.compare._result import CompareResult, Side
from torchdebug.compare._rows import VERDICTS, Row
from torchdebug.compare._steps import has_tensor, metric_pool, open_dump
from torchdebug.compare._structure import StructureBlock
from torchdebug.compare._tolerances import Tolerance, lower_precision
from torchdebug.errors import ConfigError
from torchdebug.options import accepts
from torchdebug.records import Record
from torchdebug.store import Run, arrow_array, arrow_booleans, records_from_table

__all__ = [
    "compare_ranks",
    "ranks_config",
    "ranks_in_process",
    "replicated",
    "RanksResult",
    "SAME_ON_EVERY_RANK",
    "checked_ranks",
    "ranks_result",
]

_EXACT = Tolerance(0.0, 0.0)
_NONE: frozenset[int] = frozenset()

SlotKey = tuple[int, str]
"""``(step, name)``: a slot, the same on every rank."""


class RanksResult(CompareResult):
    """A :class:`CompareResult` whose rows compare each rank with the reference ranks, slot by slot.

    ``row.rank`` is the rank checked, ``row.record_b`` the reference's record, ``row.record_a`` the
    checked rank's (the reference's where the rank holds the reference value, the first rank's of
    its value where it holds another). ``rows`` is a :class:`~torchdebug.compare._rank_rows.RankRows`:
    the rows of ranks that hold the reference value are made when read, and the counts, phases and
    first divergence come without making them. The rows are final once made.
    """

    heading = "torchdebug compare --across-ranks"
    rows: RankRows

    def title(self) -> str:
        return f"compare the ranks of {self.a.path} with each other (reference: the majority of ranks, on a tie the lowest)"

    def sides(self) -> list[tuple[str, str]]:
        return [("run", self.a.path), ("reference", "per slot, the value most ranks hold (on a tie, the lowest rank's)")]

    def _first(self, finder: Callable[[Sequence[Row]], Row | None]) -> Row | None:
        return finder(self.rows.differing)  # blamed rows are rows that differ

    @property
    def structure_differences(self) -> list[StructureBlock]:
        """None: the ranks of one run are compared slot by slot, no op runs on one side only."""
        return []

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rows.ranks) if self.rows.slots else []

    def rank_rows(self, rank: int) -> Sequence[Row]:  # type: ignore[override]  # CompareResult's says list[Row]
        return self.rows.of_rank(rank) if rank in self.ranks else []

    def counts(self, rank: int | None = None) -> dict[str, int]:
        counter = self.rows.counts(rank)
        return {verdict: counter.get(verdict, 0) for verdict in VERDICTS}

    @property
    def diverged(self) -> bool:
        return any(row.verdict == "error" for row in self.rows.differing)

    def phases(self) -> dict[str, dict[str, Any]]:
        return self.rows.phases()

    def coverage(self) -> dict[str, dict[str, Any]]:
        # counted over the records the rows hold: the rows of ranks holding the reference add none
        return CompareResult(rows=self.rows.distinct(), a=self.a, b=self.b).coverage()

    def to_html(self, path: str | Path) -> Path:
        with self.rows.made():  # the page passes over the rows many times
            return super().to_html(path)


@dataclass(slots=True)
class _Slot:
    """A replicated slot over the ranks: where the first rank holding it wrote it, and which ranks
    hold which value (digest -> ranks, ascending)."""

    step: int
    seq: int
    position: int
    holders: dict[str, list[int]] = field(default_factory=dict)

    def reference(self) -> list[int]:
        """The ranks holding the reference value: the largest group, on a tie the one with the lowest rank."""
        return max(self.holders.values(), key=lambda ranks: (len(ranks), -ranks[0]))


def _slots(digests: Iterable[RankDigest]) -> tuple[list[tuple[SlotKey, _Slot]], list[str]]:
    """Every rank's digest folded into the slots, in execution order (step, then the first holder's
    call order, then first appearance), and the ranks' notes; the digests are consumed one by one."""
    slots: dict[SlotKey, _Slot] = {}
    notes: list[str] = []
    for digest in digests:
        notes.extend(digest.notes)
        for step, name, seq, value in digest.slots:
            slot = slots.get((step, name))
            if slot is None:
                slot = slots[step, name] = _Slot(step, seq, len(slots))
            slot.holders.setdefault(value, []).append(digest.rank)
    ordered = sorted(slots.items(), key=lambda item: (item[1].step, item[1].seq, item[1].position))
    return ordered, notes


def _records(run: Run, wanted: Mapping[int, set[SlotKey]]) -> dict[tuple[int, SlotKey], Record]:
    """The records of the wanted slots, rank by rank (each rank read from a fresh handle, not kept).
    From a stored table only the wanted rows become records (and those with ``json_fields``, which
    may hold their step)."""
    found: dict[tuple[int, SlotKey], Record] = {}
    for rank in sorted(wanted):
        keys = wanted[rank]
        dump = fresh(run.ranks[rank])
        tables = stored_tables(dump)
        records = dump.records() if tables is None else itertools.chain.from_iterable(_wanted(table, keys) for table in tables)
        for record in records:
            key = (record.step, record.name)
            if key in keys:
                found[rank, key] = record
    return found


def _wanted(table: pa.Table, keys: set[SlotKey]) -> list[Record]:
    """The records of a stored table's rows holding one of ``keys`` (and those with ``json_fields``,
    which may hold their step)."""
    odd = arrow_booleans(pc.is_valid(table.column("json_fields")))
    steps, names = table.column("step").to_pylist(), table.column("name").to_pylist()
    rows = [row for row, key in enumerate(zip(steps, names)) if key in keys or odd[row]]
    return records_from_table(table.take(arrow_array(np.array(rows, np.int64)))) if rows else []


def _metrics(run: Run, row: Row, holder: int, reference: int, tensors: bool, tolerance: Tolerance) -> dict[str, float]:
    """The metrics of a row whose record is rank ``holder``'s against the reference rank's."""
    a, b = row.record_a, row.record_b
    assert a is not None and b is not None
    if tensors and has_tensor(a) and has_tensor(b):
        tensor_a, tensor_b = run.ranks[holder].load_tensor(a), run.ranks[reference].load_tensor(b)
        return tensor_metrics(tensor_a, tensor_b, low_dtype=lower_precision(a.dtype, b.dtype), atol=tolerance.atol)
    return stats_metrics(a.stats, b.stats, numel=math.prod(b.shape or []), atol=tolerance.atol)


def _difference(row: Row, reference: int, tolerance: float) -> Judgement:
    """How a rank's value, which is not the reference's, compares with it."""
    if row.shape_a != row.shape_b or row.dtype_a != row.dtype_b:
        # no number measures it: the message says what differs
        return Judgement(
            "error", "", f"{row.dtype_a} {row.shape_a} vs {row.dtype_b} {row.shape_b} on rank {reference}", difference=math.inf
        )
    if row.metrics.get("nonfinite_mismatch") or (row.difference or 0.0) > tolerance:
        difference = math.inf if row.difference is None else row.difference  # NaN/Inf statistics: no finite number to compare
        message = f"differs from rank {reference} by {difference:.3g} (tolerance {tolerance:.3g})"
        return Judgement("error", "", message, difference=difference)
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


def _judge(
    run: Run,
    values: Sequence[tuple[list[Row], list[int]]],
    overrides: Mapping[str, Tolerance],
    tensors: bool,
    threads: int | None,
) -> None:
    """Metrics and verdicts of the rows of ranks holding another value than the reference (each
    value's rows, first rank first, with the reference ranks): the metrics once per value, from
    its first rank's record, the verdicts rank by rank."""
    tolerances = [overrides.get(lower_precision(rows[0].dtype_a, rows[0].dtype_b) or "", _EXACT) for rows, _ in values]
    comparable = [
        i for i, (rows, _) in enumerate(values) if rows[0].shape_a == rows[0].shape_b and rows[0].dtype_a == rows[0].dtype_b
    ]

    def metrics_of(i: int) -> dict[str, float]:
        (first, *_), reference = values[i]
        return _metrics(run, first, first.rank, reference[0], tensors, tolerances[i])

    with metric_pool(threads) as pool:
        for i, metrics in zip(comparable, pool.map(metrics_of, comparable)):
            difference = metrics.pop("error", None)
            for row in values[i][0]:  # one dict for the value's rows (rows replace theirs, never update it)
                row.difference, row.metrics = difference, metrics
    agreeing: dict[Row, str] = {}
    for (rows, reference), tolerance in zip(values, tolerances):
        holders = f"ranks {', '.join(map(str, reference))} hold the reference value"
        for row in rows:
            row.tolerance = tolerance.rtol
            _difference(row, reference[0], row.tolerance).apply(row)
            agreeing[row] = holders
    _attribute(agreeing, agreeing)


def checked_ranks(run: Run, ranks: Collection[int] | None) -> list[int]:
    """The ranks to check (default: every rank of the run), validated: present, two or more."""
    selected = sorted(run.ranks) if ranks is None else sorted(set(ranks))
    missing = [rank for rank in selected if rank not in run.ranks]
    if missing:
        raise ValueError(f"ranks: {missing} not in {run.path} (it has ranks {sorted(run.ranks)})")
    if len(selected) < 2:
        raise ValueError(f"{run.path}: ranks {selected} only; comparing across ranks needs two or more")
    return selected


def ranks_result(
    dump: str | Path | Run,
    run: Run,
    selected: Sequence[int],
    digests: Iterable[RankDigest],
    config: RanksConfig,
) -> RanksResult:
    """The verdicts from every checked rank's digest (in rank order): the rows, with one record per
    slot and value read again (from the first rank holding it), and the metrics of each value that
    is not the reference's, computed once for the ranks holding it. One rank is read at a time and
    kept as one digest per replicated slot; the rows of ranks holding the reference value are made
    when read, so memory does not grow with the ranks that agree."""
    slots, notes = _slots(progress.track(digests, "digesting ranks", total=len(selected), unit="rank"))
    wanted: dict[int, set[SlotKey]] = {}
    for key, slot in slots:
        for ranks in slot.holders.values():
            wanted.setdefault(ranks[0], set()).add(key)
    records = _records(run, wanted)
    kept: list[SlotRows] = []
    values: list[tuple[list[Row], list[int]]] = []  # the rows of the ranks holding one value, and the reference ranks
    everyone = frozenset(selected)
    for order, (key, slot) in enumerate(slots):
        reference = slot.reference()
        reference_record = records[reference[0], key]
        differing: dict[int, Row] = {}
        for ranks in slot.holders.values():
            if ranks is not reference:
                record = records[ranks[0], key]
                rows = [Row.from_records(rank, record, reference_record, "exact", float(order)) for rank in ranks]
                differing.update((row.rank, row) for row in rows)
                values.append((rows, reference))
        held = sum(map(len, slot.holders.values()))
        missing = _NONE if held == len(selected) else everyone.difference(*slot.holders.values())
        kept.append(SlotRows(reference_record, reference[0], float(order), differing, missing))
    _judge(run, values, config.tolerances, config.tensors, config.threads)
    if not slots:
        notes.append("no slot replicas must agree on: capture the optimizer step, parameters (level=mix) or collectives")
    options = {"across_ranks": list(selected), **config.options()}
    side = Side.of(dump, run)
    return RanksResult(rows=RankRows(selected, kept), a=side, b=side, problems=notes, options=options)


def ranks_config(config: CompareConfig) -> RanksConfig:
    """The options of comparing one dump's ranks from :func:`torchdebug.compare`'s: those both take.
    An option only a comparison with a reference dump reads, set away from its default, is refused."""
    shared, default = {f.name for f in dataclasses.fields(RanksConfig)}, CompareConfig()
    for f in dataclasses.fields(CompareConfig):
        if f.name not in shared and getattr(config, f.name) != getattr(default, f.name):
            raise ConfigError(f"{f.name}: applies to a comparison with a reference dump B; leave it out with one dump")
    return RanksConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(CompareConfig) if f.name in shared})


def ranks_in_process(dump: str | Path | Run, config: RanksConfig) -> RanksResult:
    """The ranks of one run compared with each other from this process: ``config.workers`` spawned
    processes read that many ranks at once (each reads ranks ``w, w+N, ...`` in turn)."""
    run = open_dump(dump)
    selected = checked_ranks(run, config.ranks)
    workers = min(config.workers, len(selected))
    if workers > 1:
        folder = dump.path if isinstance(dump, Run) else dump
        digests = digests_in_processes(folder, selected, config.tensors, workers, config.threads)
        return ranks_result(dump, run, selected, digests, config)
    with metric_pool(config.threads) as pool:
        digests = (digest_rank(run.ranks[rank], config.tensors, pool) for rank in selected)
        return ranks_result(dump, run, selected, digests, config)


@accepts(RanksConfig)
def compare_ranks(dump: str | Path | Run, *, config: RanksConfig) -> RanksResult:
    """Former spelling of ``torchdebug.compare(dump)`` (one release, with a ``FutureWarning``)."""
    warnings.warn(
        "torchdebug.compare.compare_ranks(dump) is deprecated; use torchdebug.compare(dump)", FutureWarning, stacklevel=3
    )
    return ranks_in_process(dump, config)
