"""Run a comparison: open both dumps, pair ranks and records, compute metrics, judge the rows.

Statistics differences are computed for every matched tensor row at once (cheap, in Python). Tensor
metrics run in a thread pool over unique tensor pairs (a slot that reuses another slot's saved
tensor is computed once; torch kernels release the GIL, so threads use every core); each worker
loads its two tensors through the dump's ``load_tensor`` (memory-mapped), computes the metrics and
drops them, so no more than ``workers`` pairs are in memory at any time and never a whole dump.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from torchdebug.compare.matching import NameMapping, load_mapping, match_records
from torchdebug.compare.metrics import stats_metrics, tensor_metrics
from torchdebug.compare.result import CompareResult, Side
from torchdebug.compare.rows import Row
from torchdebug.compare.tolerances import Tolerance, lower_precision, parse_tolerances, tolerance_for
from torchdebug.compare.verdicts import judge
from torchdebug.records import Record
from torchdebug.store import msprobe, reader

__all__ = ["compare"]

logger = logging.getLogger("torchdebug.compare")


def open_dump(path: str | Path | reader.Run) -> reader.Run:
    """A torchdebug dump (dump path, run or rank folder) or an msprobe dump folder."""
    if isinstance(path, reader.Run):
        return path
    if msprobe.is_msprobe_dump(Path(path)):
        return msprobe.load(path)
    return reader.load(path)


def _numel(shape: list[int] | None) -> int:
    return math.prod(shape) if shape else 1


def _has_tensor(record: Record | None) -> bool:
    return record is not None and bool(record.tensor) and "file" in (record.tensor or {})


def _fill_stats(row: Row, overrides: Mapping[str, Tolerance]) -> None:
    a, b = row.record_a, row.record_b
    tolerance = tolerance_for(row.dtype_a, row.dtype_b, overrides)
    row.tolerance = tolerance.rtol
    metrics = stats_metrics(a.stats, b.stats, numel=_numel(row.shape_b), atol=tolerance.atol)  # type: ignore[union-attr]
    row.error = metrics.pop("error", None)
    row.metrics.update(metrics)


def _tensor_ref(record: Record, shapes: Mapping[str, list[int] | None]) -> tuple:
    """What identifies the values of a saved tensor: file, key and, for a strided view of another
    slot's tensor, the view. A view that permutes all of its base (a transpose, a reshape) holds
    the same elements, so it shares the base's metrics (they ignore element order)."""
    ref = record.tensor or {}
    view = ref.get("view")
    if view is not None:
        base = shapes.get(ref.get("key", ""))
        covers_base = (
            base is not None and view.get("offset", 0) == 0 and 0 not in view.get("stride", [0])
            and math.prod(view.get("shape", [])) == math.prod(base)
        )  # fmt: skip
        if not covers_base:
            return ref.get("folder"), ref.get("file"), ref.get("key"), json.dumps(view, sort_keys=True)
    return ref.get("folder"), ref.get("file"), ref.get("key"), None


def _tensor_jobs(rows: Iterable[Row], dump_a: Any, dump_b: Any) -> dict[tuple, list[Row]]:
    """Rows needing tensor metrics, grouped by their unique pair of saved tensor values."""
    shapes_a = {r.name: r.shape for r in dump_a.records()}
    shapes_b = {r.name: r.shape for r in dump_b.records()}
    jobs: dict[tuple, list[Row]] = {}
    for row in rows:
        a, b = row.record_a, row.record_b
        if row.kind == "tensor" and row.shape_a == row.shape_b and _has_tensor(a) and _has_tensor(b):
            key = (_tensor_ref(a, shapes_a), _tensor_ref(b, shapes_b))  # type: ignore[arg-type]
            jobs.setdefault(key, []).append(row)
    return jobs


def _run_job(row: Row, dump_a: Any, dump_b: Any, overrides: Mapping[str, Tolerance]) -> dict[str, float]:
    tensor_a = dump_a.load_tensor(row.record_a)
    tensor_b = dump_b.load_tensor(row.record_b)
    if tensor_a.shape != tensor_b.shape:
        return {"_shape_mismatch": 1.0}
    tolerance = tolerance_for(row.dtype_a, row.dtype_b, overrides)
    low = lower_precision(row.dtype_a, row.dtype_b)
    return tensor_metrics(tensor_a, tensor_b, low_dtype=low, atol=tolerance.atol)


def _compare_rank(
    rank: int, dump_a: Any, dump_b: Any, *, mapping: NameMapping, overrides: Mapping[str, Tolerance],
    tensors: bool, pool: ThreadPoolExecutor,
) -> list[Row]:
    pairs = match_records(dump_a.records(), dump_b.records(), mapping)
    rows = [Row.from_records(rank, p.a, p.b, p.how, p.order) for p in pairs]
    for row in rows:
        if row.matched and row.kind == "tensor" and row.shape_a == row.shape_b:
            _fill_stats(row, overrides)
    if tensors:
        jobs = _tensor_jobs(rows, dump_a, dump_b)
        args = [(group[0], dump_a, dump_b, overrides) for group in jobs.values()]
        results = pool.map(lambda job: _run_job(*job), args)
        logger.debug("rank %d: %d rows, %d unique tensor pairs", rank, len(rows), len(jobs))
        for group, metrics in zip(jobs.values(), results):
            if "_shape_mismatch" in metrics:
                continue  # sampled with different strides: keep the statistics verdict
            for row in group:
                row.metrics.update(metrics)
                row.error = metrics.get("error", row.error)
                row.metrics.pop("error", None)
    return rows


def compare(
    a: str | Path | reader.Run,
    b: str | Path | reader.Run,
    *,
    tolerances: Mapping[str, Any] | None = None,
    mapping: str | Path | Mapping[str, Any] | NameMapping | None = None,
    growth: float = 16.0,
    tensors: bool = True,
    workers: int | None = None,
) -> CompareResult:
    """Compare dump ``a`` against the reference dump ``b``, rank by rank.

    Args:
        a, b: a torchdebug dump path (its latest run), run folder or rank folder, or an msprobe dump
            folder (``dump.json`` inside, or ``step*/rank*`` / ``proc*`` above it). ``b`` is the
            reference: relative errors are relative to it.
        tolerances: per-dtype overrides, ``{"bfloat16": 0.02}`` (rtol) or
            ``{"float32": {"rtol": 1e-5, "atol": 1e-6}}``; defaults are torch.testing's.
        mapping: renames for side A (``{"modules": {old: new}, "ops": {old: new}}``, or a JSON/YAML
            file) when modules or ops were renamed between the runs.
        growth: how much an op may amplify its inputs' error before it is blamed.
        tensors: compare saved tensors when both sides have them (else statistics only).
        workers: threads for tensor metrics (default: all cores). torch's own intra-op threads are
            set to 1 while the comparison runs and restored afterwards.

    Returns:
        A :class:`CompareResult`; ``result.first_divergence`` is the earliest blamed op.
    """
    if growth < 1:
        raise ValueError(f"growth: got {growth}, expected a factor >= 1")
    overrides = parse_tolerances(tolerances)
    names = load_mapping(mapping)
    run_a, run_b = open_dump(a), open_dump(b)
    side_a, side_b = Side.of(a, run_a), Side.of(b, run_b)
    problems = [*side_a.problems("A"), *side_b.problems("B")]
    only_a = sorted(set(run_a.ranks) - set(run_b.ranks))
    only_b = sorted(set(run_b.ranks) - set(run_a.ranks))
    if only_a:
        problems.append(f"ranks only in A (not compared): {only_a}")
    if only_b:
        problems.append(f"ranks only in B (not compared): {only_b}")
    common = sorted(set(run_a.ranks) & set(run_b.ranks))
    if not common:
        raise ValueError(f"A has ranks {sorted(run_a.ranks)} and B has ranks {sorted(run_b.ranks)}: no rank to compare")
    workers = workers or os.cpu_count() or 1
    rows: list[Row] = []
    # Parallelism comes from the pool (one tensor pair per thread); torch's own intra-op threads
    # only add hand-off stalls on these mostly small tensors, so they are off while we run.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for rank in common:
                rank_rows = _compare_rank(
                    rank, run_a.ranks[rank], run_b.ranks[rank], mapping=names, overrides=overrides,
                    tensors=tensors, pool=pool,
                )
                judge(rank_rows, growth=growth)
                rows.extend(rank_rows)
    finally:
        torch.set_num_threads(threads)
    options = {"growth": growth, "tolerances": {k: [v.rtol, v.atol] for k, v in overrides.items()}}
    result = CompareResult(rows=rows, a=side_a, b=side_b, problems=problems, options=options)
    result.check_overlap()
    return result
