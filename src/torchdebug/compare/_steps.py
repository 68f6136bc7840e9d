"""The steps of one comparison, shared by the in-process run and the distributed one.

1. :func:`open_pair` opens both dumps and lists the ranks they have in common;
2. :func:`match_rank` pairs one rank's records (:mod:`torchdebug.compare._matching`) and fills the
   statistics metrics;
3. :func:`tensor_jobs` groups the rows needing tensor metrics by their unique pair of saved tensors;
4. :func:`compute_jobs` runs them in a thread pool (torch kernels release the GIL); each job loads
   its two tensors memory-mapped, computes and drops them, so no more than ``threads`` pairs are in
   memory at once; a damaged tensor file leaves its slots to their statistics;
5. :func:`apply_metrics` writes the results into the rows;
6. :func:`attribute`: tolerances measured from a noise dump (``noise=``), the rerun of calls beyond
   tolerance (``rerun``), then ``judge`` and ``judge_checksums``; rows that cannot be compared lose
   their ``difference``; then :func:`finish` (the notes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError

from torchdebug import progress
from torchdebug.compare._calibration import NoiseKey, calibrate, measured_noise
from torchdebug.compare._checksums import dtype_note, fingerprint_versions, judge_checksums
from torchdebug.compare._config import CompareConfig
from torchdebug.compare._matching import match_records
from torchdebug.compare._metrics import stats_metrics, tensor_metrics
from torchdebug.compare._rerun import NotRerunnable, own_errors
from torchdebug.compare._result import CompareResult, Side
from torchdebug.compare._rows import Row
from torchdebug.compare._shards import data_split, row_note, whole_tensors
from torchdebug.compare._tolerances import Tolerance, lower_precision, tolerance_for
from torchdebug.compare._value_graph import Producers
from torchdebug.compare._verdicts import judge
from torchdebug.errors import DumpError
from torchdebug.records import Record
from torchdebug.store import RankRecords, Run, is_msprobe_dump, load, load_msprobe, shared_keys_dict

__all__ = [
    "Pairing",
    "open_dump",
    "has_tensor",
    "open_pair",
    "metric_pool",
    "match_rank",
    "tensor_jobs",
    "compute_jobs",
    "apply_metrics",
    "rerun_rows",
    "attribute",
    "rank_notes",
    "compare_rank",
    "finish",
]

logger = logging.getLogger("torchdebug.compare")

JobKey = tuple
"""Identifies the values of a pair of saved tensors (see :func:`tensor_jobs`)."""


def open_dump(path: str | Path | Run) -> Run:
    """A torchdebug dump (dump path, run or rank folder) or an msprobe dump folder."""
    if isinstance(path, Run):
        return path
    if is_msprobe_dump(Path(path)):
        return load_msprobe(path)
    return load(path)


@dataclass
class Pairing:
    """Both sides of a comparison, the ranks they share and notes on ranks one side lacks."""

    a: Side
    b: Side
    ranks: list[int]
    problems: list[str]
    noise: Run | None = None
    """The dump of B's step run again with a tiny perturbation (``noise=``), when given."""

    def noise_rank(self, rank: int) -> RankRecords | None:
        """The noise dump's records of ``rank`` (``None``: no noise dump, or none of that rank)."""
        return self.noise.ranks.get(rank) if self.noise is not None else None


def open_pair(a: str | Path | Run, b: str | Path | Run, noise: str | Path | None = None) -> Pairing:
    """Open both dumps (and the ``noise`` dump, against B); fail when they have no rank in common,
    note the ranks one side lacks."""
    run_a, run_b = open_dump(a), open_dump(b)
    run_a, run_b = whole_tensors(run_a, run_b), whole_tensors(run_b, run_a)  # a sharded run against another world size
    side_a, side_b = Side.of(a, run_a), Side.of(b, run_b)
    problems = []
    only_a = sorted(set(run_a.ranks) - set(run_b.ranks))
    only_b = sorted(set(run_b.ranks) - set(run_a.ranks))
    if only_a:
        problems.append(f"ranks only in A (not compared): {only_a}")
    if only_b:
        problems.append(f"ranks only in B (not compared): {only_b}")
    common = sorted(set(run_a.ranks) & set(run_b.ranks))
    if not common:
        raise ValueError(f"A has ranks {sorted(run_a.ranks)} and B has ranks {sorted(run_b.ranks)}: no rank to compare")
    run_noise = None
    if noise is not None:
        run_noise = whole_tensors(open_dump(noise), run_b)
        lacking = sorted(set(common) - set(run_noise.ranks))
        if lacking:
            problems.append(f"noise: ranks without a noise dump (judged at their dtypes' tolerances): {lacking}")
    return Pairing(side_a, side_b, common, problems, run_noise)


@contextmanager
def metric_pool(threads: int | None) -> Iterator[ThreadPoolExecutor]:
    """A pool of ``threads`` threads (default: all cores) with torch's intra-op threads set to 1.

    Parallelism comes from the pool (one tensor pair per thread); torch's own intra-op threads only
    add hand-off stalls on these mostly small tensors. They are restored on exit.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
            yield pool
    finally:
        torch.set_num_threads(previous)


def has_tensor(record: Record | None) -> bool:
    """Whether a record points at a saved tensor (task=tensor)."""
    return record is not None and bool(record.tensor) and "file" in (record.tensor or {})


_Shared = dict[tuple[int, int, int, float], tuple[float | None, dict[str, float]]]
"""Statistics metrics by the identity of both sides' statistics, the element count and ``atol``."""


class _StatsMetrics:
    """The kind of a row's statistics metrics (``torchdebug.store._shared_keys``)."""


def _paired(row: Row) -> tuple[Record, Record]:
    """The two records of a row the caller knows to be matched."""
    a, b = row.record_a, row.record_b
    assert a is not None and b is not None, f"{row.name}: a {row.match} row compared as matched"
    return a, b


def _fill_stats(rows: Sequence[Row], overrides: Mapping[str, Tolerance]) -> None:
    """The statistics metrics, difference and tolerance of each matched tensor row of equal shapes.
    The records of one tensor share their statistics (its output row and the input rows of its
    consumers: about four rows per pair on the GPT bench), so the rows of one pair of statistics
    share one metrics dict, computed once; writers replace a row's dict rather than update it
    (:func:`apply_metrics`). One loop with what it looks up kept per pair of dtypes and per shape:
    it runs for most rows of a compare."""
    tolerances: dict[tuple[str | None, str | None], Tolerance] = {}  # per pair of dtypes: a handful
    numels: dict[int, int] = {}  # per shape list (records share them: a few hundred)
    shared: _Shared = {}
    for row in rows:
        record_a, record_b, shape = row.record_a, row.record_b, row.shape_b
        if record_a is None or record_b is None or row.kind != "tensor" or row.shape_a != shape:
            continue
        dtypes = (row.dtype_a, row.dtype_b)
        tolerance = tolerances.get(dtypes)
        if tolerance is None:
            tolerance = tolerances[dtypes] = tolerance_for(*dtypes, overrides)
        numel = numels.get(id(shape))
        if numel is None:
            numel = numels[id(shape)] = math.prod(shape or ())
        stats_a, stats_b = record_a.stats, record_b.stats
        key = (id(stats_a), id(stats_b), numel, tolerance.atol)  # the records, so their statistics, outlive ``shared``
        found = shared.get(key)
        if found is None:
            metrics = stats_metrics(stats_a, stats_b, numel=numel, atol=tolerance.atol)
            error = metrics.pop("error", None)
            found = shared[key] = (error, shared_keys_dict(_StatsMetrics, metrics.items()))
        row.tolerance = tolerance.rtol
        row.difference, row.metrics = found


def match_rank(
    rank: int, dump_a: RankRecords, dump_b: RankRecords, settings: CompareConfig, made: Producers | None = None
) -> list[Row]:
    """The rows of one rank, in execution order, with statistics metrics filled in (not judged).
    ``made``: the two sides' producers, when the caller keeps them for :func:`attribute`."""
    records_a, records_b = dump_a.records(), dump_b.records()
    compiled = any(r.capture == "graph" for r in (*records_a[:1], *records_b[:1]))
    pairs = match_records(records_a, records_b, settings.mapping, compiled=compiled, made=made)
    rows: list[Any] = pairs  # each pair replaced by its row in place: all pairs and all rows never coexist
    for index, p in enumerate(pairs):
        rows[index] = Row.from_records(rank, p.a, p.b, p.how, p.order, p.inside)
    _fill_stats(rows, settings.tolerances)
    return rows


def _tensor_ref(record: Record, shapes: Mapping[str, list[int] | None]) -> tuple:
    """What identifies the values of a saved tensor: file, key and, for a strided view of another
    slot's tensor, the view. A view that permutes all of its base (a transpose, a reshape) holds
    the same elements, so it shares the base's metrics (they ignore element order)."""
    ref = record.tensor or {}
    view = cast("dict[str, Any] | None", ref.get("view"))  # a view's entry is a dict; ``Record.tensor`` says str
    if view is not None:
        base = shapes.get(ref.get("key", ""))
        covers_base = (
            base is not None
            and view.get("offset", 0) == 0
            and 0 not in view.get("stride", [0])
            and math.prod(view.get("shape", [])) == math.prod(base)
        )
        if not covers_base:
            return ref.get("folder"), ref.get("file"), ref.get("key"), json.dumps(view, sort_keys=True)
    return ref.get("folder"), ref.get("file"), ref.get("key"), None


def tensor_jobs(rows: Iterable[Row], dump_a: RankRecords, dump_b: RankRecords) -> dict[JobKey, list[Row]]:
    """Rows needing tensor metrics, grouped by their unique pair of saved tensor values, in row order."""
    saved = [
        row
        for row in rows
        if (a := row.record_a) is not None  # asked first: a statistics compare has no saved tensor
        and a.tensor
        and row.kind == "tensor"
        and row.shape_a == row.shape_b
        and has_tensor(a)
        and has_tensor(row.record_b)
    ]
    if not saved:
        return {}  # statistics dumps: no need to index the records' shapes
    shapes_a, shapes_b = _saved_shapes(dump_a), _saved_shapes(dump_b)
    jobs: dict[JobKey, list[Row]] = {}
    for row in saved:
        record_a, record_b = _paired(row)
        key = (_tensor_ref(record_a, shapes_a), _tensor_ref(record_b, shapes_b))
        jobs.setdefault(key, []).append(row)
    return jobs


def _saved_shapes(dump: RankRecords) -> dict[str, list[int] | None]:
    """The shape of each tensor saved whole, by its key in its file (a record's name, or the native
    path's ``saved.<n>``)."""
    return {r.tensor["key"]: r.shape for r in dump.records() if r.tensor and "view" not in r.tensor and "key" in r.tensor}


_UNREADABLE = "_unreadable"
"""The key of a tensor job's result whose tensors could not be read: which file, and why."""
_DAMAGED = (DumpError, SafetensorError, OSError, RuntimeError)
"""What reading a damaged tensor file raises (the reader's ``DumpError``, or the library's own)."""


def _missing(dump: RankRecords, record: Record) -> bool:
    """Whether a record's tensor file is absent (a dump error), rather than unreadable (damaged)."""
    folder = getattr(dump, "path", None)
    return folder is not None and not (Path(folder) / str((record.tensor or {}).get("file", ""))).is_file()


def _load(dump: RankRecords, record: Record, label: str) -> torch.Tensor | str:
    """A record's saved tensor, or, when its file is damaged, ``"A tensors/step0-0000.safetensors"``."""
    try:
        return dump.load_tensor(record)
    except _DAMAGED as error:
        if _missing(dump, record):
            raise
        logger.debug("%s: %s", record.name, error)
        folder = getattr(dump, "path", None)
        file = str((record.tensor or {}).get("file"))
        return f"{label} {Path(folder) / file if folder is not None else file}"


def _run_job(row: Row, dump_a: RankRecords, dump_b: RankRecords, overrides: Mapping[str, Tolerance]) -> dict[str, float]:
    record_a, record_b = _paired(row)
    tensor_a = _load(dump_a, record_a, "A")
    tensor_b = _load(dump_b, record_b, "B")
    damaged = [found for found in (tensor_a, tensor_b) if isinstance(found, str)]
    if damaged:
        return {_UNREADABLE: ", ".join(damaged)}  # type: ignore[dict-item]  # the one str value, read by apply_metrics
    assert isinstance(tensor_a, torch.Tensor) and isinstance(tensor_b, torch.Tensor)
    if tensor_a.shape != tensor_b.shape:
        return {"_shape_mismatch": 1.0}
    tolerance = tolerance_for(row.dtype_a, row.dtype_b, overrides)
    low = lower_precision(row.dtype_a, row.dtype_b)
    return tensor_metrics(tensor_a, tensor_b, low_dtype=low, atol=tolerance.atol)


def compute_jobs(
    groups: Sequence[list[Row]],
    dump_a: RankRecords,
    dump_b: RankRecords,
    overrides: Mapping[str, Tolerance],
    pool: ThreadPoolExecutor,
) -> list[dict[str, float]]:
    """Tensor metrics of each group's first row (the group shares its values), in order."""
    results = pool.map(lambda group: _run_job(group[0], dump_a, dump_b, overrides), groups)
    return list(progress.track(results, "tensor metrics", total=len(groups), unit="pair"))


def apply_metrics(groups: Iterable[list[Row]], results: Iterable[dict[str, float]]) -> None:
    """Write each group's tensor metrics into its rows (``error`` replaces the statistics one)."""
    for group, metrics in zip(groups, results):
        if "_shape_mismatch" in metrics:
            continue  # sampled with different strides: keep the statistics verdict
        if _UNREADABLE in metrics:
            for row in group:
                row.unreadable = str(metrics[_UNREADABLE])  # compared by statistics: see finish()
            continue
        for row in group:
            merged = {**row.metrics, **metrics}  # a new dict: rows share their statistics metrics
            row.difference = merged.pop("error", row.difference)
            row.metrics = merged


def _rerun_job(dump: RankRecords, records: Sequence[Record], overrides: Mapping[str, Tolerance]) -> dict[str, dict[str, float]]:
    """The own and kernel errors of each floating output slot of one call on one side (none if not
    rerunnable)."""
    try:
        return own_errors(records, dump.load_tensor, lambda dtype: tolerance_for(dtype, dtype, overrides).atol)
    except NotRerunnable as reason:
        logger.debug("not rerun: %s", reason)
        return {}
    except _DAMAGED as error:  # a damaged tensor file (named by the tensor metrics' warning)
        if any(_missing(dump, record) for record in records if has_tensor(record)):
            raise
        logger.debug("not rerun: %s", error)
        return {}


def _calls(dump: RankRecords) -> dict[tuple[int, str], list[Record]]:
    """A dump's records by op call: ``(step, call name)``."""
    calls: dict[tuple[int, str], list[Record]] = {}
    for record in dump.records():
        calls.setdefault((record.step, record.call_name), []).append(record)
    return calls


def rerun_rows(
    rows: Sequence[Row], dump_a: RankRecords, dump_b: RankRecords, overrides: Mapping[str, Tolerance], pool: ThreadPoolExecutor
) -> None:
    """Rerun, on each side, every call with an output row beyond tolerance, and write the own
    and kernel errors of its output rows into their metrics (:data:`~torchdebug.compare._metrics.RERUN_METRICS`)."""
    outputs = [row for row in rows if row.io == "output" and row.kind == "tensor" and row.matched]
    diverging = [
        row for row in outputs if row.difference is not None and row.tolerance is not None and row.difference > row.tolerance
    ]
    if not diverging:
        return
    jobs: dict[tuple[str, int, str], list[Record]] = {}
    for side, dump in (("a", dump_a), ("b", dump_b)):
        calls = _calls(dump)
        for row in diverging:
            record = _paired(row)[0 if side == "a" else 1]
            key = (record.step, record.call_name)
            jobs.setdefault((side, *key), calls[key])
    dumps = {"a": dump_a, "b": dump_b}
    logger.info("running %d op calls again in float64 (of %d diverging output slots)", len(jobs), len(diverging))
    rerun = pool.map(lambda key: _rerun_job(dumps[key[0]], jobs[key], overrides), jobs)
    results = dict(zip(jobs, progress.track(rerun, "rerun", total=len(jobs), unit="call")))
    for row in outputs:
        for side, record in zip("ab", _paired(row)):
            errors = results.get((side, record.step, record.call_name), {}).get(record.arg, {})
            if errors:  # a new dict: rows share their statistics metrics
                row.metrics = {**row.metrics, **{f"{name}_{side}": value for name, value in errors.items()}}


def _noise(dump_b: RankRecords, noise: RankRecords, settings: CompareConfig, pool: ThreadPoolExecutor) -> dict[NoiseKey, float]:
    """Each slot of B's error against the noise dump (:mod:`torchdebug.compare._calibration`):
    matched and measured as A against B is, without A's renames, not judged."""
    plain = dataclasses.replace(settings, mapping=None, noise=None, rerun=False)
    rows = match_rank(dump_b.rank, dump_b, noise, plain)
    if settings.tensors:
        groups = list(tensor_jobs(rows, dump_b, noise).values())
        apply_metrics(groups, compute_jobs(groups, dump_b, noise, settings.tolerances, pool))
    return measured_noise(rows)


def attribute(
    rows: Sequence[Row],
    dump_a: RankRecords,
    dump_b: RankRecords,
    settings: CompareConfig,
    pool: ThreadPoolExecutor,
    made: Producers | None = None,
    noise: RankRecords | None = None,
) -> None:
    """Verdicts and attribution of one rank's rows, with rerun first when asked; without it, the
    rows left ``undecided`` that have tensor metrics (both sides saved them) are rerun, and all
    rows judged again. ``made``: the producers matching found (else traced again from the rows);
    ``noise``: the noise dump's records of this rank, whose differences from B set the rows'
    tolerances first (:mod:`torchdebug.compare._calibration`)."""
    if noise is not None:
        calibrated = calibrate(rows, _noise(dump_b, noise, settings, pool))
        logger.info("rank %d: %d rows judged at tolerances measured against the noise dump", dump_b.rank, calibrated)
    split = data_split(dump_a, dump_b)
    if settings.rerun:
        rerun_rows(rows, dump_a, dump_b, settings.tolerances, pool)
    judge(rows, growth=settings.growth, rerun=settings.rerun, split=split, made=made, tolerances=settings.tolerances)
    undecided = [row for row in rows if row.verdict == "undecided" and "cosine" in row.metrics]
    if undecided:
        rerun_rows(undecided, dump_a, dump_b, settings.tolerances, pool)
        judge(rows, growth=settings.growth, rerun=True, split=split, made=made, tolerances=settings.tolerances)
    judge_checksums(rows, fingerprint_versions(dump_a, dump_b))  # checksums on both sides: bit for bit instead
    for row in rows:
        a, b = row.record_a, row.record_b
        note = row_note(row) if a is not None and a.extra or b is not None and b.extra else None  # notes read extra
        if note is not None:
            row.message = f"{row.message}; {note}" if row.message else note
        if row.match == "inside":
            if row.verdict == "unmatched":
                row.message = f"inside {row.name_b}: a node of its compiled form, compared where values enter and leave it"
            else:  # judged as an op only the compiled side runs (a structure block): one-sided, as it was judged
                row.match, row.name_b = "only_a" if row.record_b is None else "only_b", None
        elif row.verdict == "incomparable":
            row.difference = None  # two values that cannot be compared have no difference (their metrics stay)


def rank_notes(rank: int, pairing: Pairing) -> list[str]:
    """Notes on one rank's folders (partial, truncated), read where the rank is compared."""
    return [*pairing.a.notes("A", rank), *pairing.b.notes("B", rank)]


def compare_rank(rank: int, pairing: Pairing, settings: CompareConfig, pool: ThreadPoolExecutor) -> list[Row]:
    """One rank from start to verdicts."""
    dump_a, dump_b = pairing.a.run.ranks[rank], pairing.b.run.ranks[rank]
    logger.info("rank %d: reading and pairing records", rank)
    made = Producers.of(dump_a.records(), dump_b.records())  # matching's, reused by the verdicts
    rows = match_rank(rank, dump_a, dump_b, settings, made)
    logger.info("rank %d: %d rows (%d + %d records)", rank, len(rows), len(dump_a.records()), len(dump_b.records()))
    if settings.tensors:
        groups = list(tensor_jobs(rows, dump_a, dump_b).values())
        if groups:
            logger.info("rank %d: tensor metrics of %d saved tensor pairs", rank, len(groups))
        apply_metrics(groups, compute_jobs(groups, dump_a, dump_b, settings.tolerances, pool))
    attribute(rows, dump_a, dump_b, settings, pool, made, pairing.noise_rank(rank))
    return rows


def _damaged_note(rows: Sequence[Row]) -> str | None:
    """One line naming the damaged tensor files and the slots compared by statistics instead."""
    damaged = [row for row in rows if row.unreadable]
    if not damaged:
        return None
    files = sorted({file for row in damaged if row.unreadable for file in row.unreadable.split(", ")})
    names = [row.name for row in damaged]
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"damaged tensor files (truncated or corrupt, unreadable): {', '.join(files)}; their {len(names)} slots "
        f"({listed}) are compared by their statistics instead"
    )


def _steps_note(rows: Sequence[Row]) -> str | None:
    """One line when the two dumps hold different numbers of training steps: steps pair by number,
    so a graph dump that counted steps otherwise than the eager run (gradients cleared in place
    without ``torch.optim`` read as accumulation) pairs other work."""
    steps: dict[str, set[int]] = {"A": set(), "B": set()}
    graph = {"A": False, "B": False}
    for row in rows:
        for side, record in (("A", row.record_a), ("B", row.record_b)):
            if record is not None:
                steps[side].add(record.step)
                graph[side] = graph[side] or record.capture == "graph"
    if not steps["A"] or not steps["B"] or len(steps["A"]) == len(steps["B"]) or min(steps["A"]) != min(steps["B"]):
        return None  # one side empty, as many steps, or steps chosen apart (a dump of step 2 against steps 0-3)
    held = ", ".join(
        f"{side} holds {len(found)} training step{'s' * (len(found) != 1)} ({min(found)}–{max(found)})"
        for side, found in steps.items()
    )
    note = f"{held}: steps are paired by number, so a step may be paired with other work and the extra steps with nothing"
    if graph["A"] != graph["B"]:
        note += (
            " (a graph dump begins a step when the step's first graph runs again, unless gradients are accumulating:"
            " a backward ran, no torch.optim step followed and the parameters hold gradients, as they do when"
            " cleared in place rather than set to None)"
        )
    return note


def finish(rows: list[Row], notes: list[str], pairing: Pairing, settings: CompareConfig) -> CompareResult:
    """The result of judged rows: rank ``notes`` and the pairing's, options, and the overlap check."""
    problems = [*notes, *pairing.problems]
    steps = _steps_note(rows)
    if steps is not None:
        problems.append(steps)
    dtypes = dtype_note(rows)
    if dtypes is not None:
        problems.insert(0, dtypes)
    damaged = _damaged_note(rows)
    if damaged is not None:
        logger.warning("%s", damaged)
        problems.append(damaged)
    if settings.rerun and not any(has_tensor(row.record_a) and has_tensor(row.record_b) for row in rows):
        problems.append('rerun: no slot has saved tensors on both sides (dump with task="tensor"), so nothing was rerun')
    result = CompareResult(rows=rows, a=pairing.a, b=pairing.b, problems=problems, options=settings.options())
    result.check_overlap()
    return result
