"""Run a comparison: in this process (threads), or split over worker processes.

``compare(a, b)`` opens both dumps, then for each rank they share: pairs records, computes
statistics and tensor metrics, and judges the rows (see :mod:`torchdebug.compare.steps`).
``workers=N`` spreads the same steps over N processes with torch.distributed
(:mod:`torchdebug.compare.distributed`); the result is the same.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchdebug import progress
from torchdebug.compare import distributed
from torchdebug.compare.config import CompareConfig
from torchdebug.compare.matching import NameMapping
from torchdebug.compare.result import CompareResult
from torchdebug.compare.steps import (
    compare_rank,
    finish,
    metric_pool,
    open_dump,
    open_pair,
    paused_gc,
    rank_notes,
)
from torchdebug.store import reader

__all__ = ["compare", "open_dump"]

logger = logging.getLogger("torchdebug.compare")


def compare(
    a: str | Path | reader.Run,
    b: str | Path | reader.Run,
    *,
    tolerances: Mapping[str, Any] | None = None,
    mapping: str | Path | Mapping[str, Any] | NameMapping | None = None,
    growth: float = 16.0,
    tensors: bool = True,
    threads: int | None = None,
    workers: int = 1,
    replay: bool = False,
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
        threads: threads for tensor metrics in each process (default: all cores, shared out among
            the workers). torch's own intra-op threads are set to 1 meanwhile and restored after.
        workers: processes to split the work over (by rank, then by tensor file); more than 1
            spawns them (torch.distributed, gloo, file rendezvous). Under torchrun use
            :func:`torchdebug.compare.distributed.compare_distributed` instead.
        replay: re-run, on each side, every op call with an output beyond tolerance in float64 on
            that side's own saved inputs, and blame a call whose output is far from its replay
            even when its inputs carry inherited error (finds an op's own few-percent error in a
            bf16 run; needs task="tensor" dumps; costs about one more pass over those calls).

    Returns:
        A :class:`CompareResult`; ``result.first_divergence`` is the earliest blamed op.
    """
    settings = CompareConfig(
        tolerances=tolerances, mapping=mapping, growth=growth, tensors=tensors, threads=threads, workers=workers, replay=replay
    )
    if settings.workers > 1:
        return distributed.spawn_compare(a, b, settings)
    pairing = open_pair(a, b)
    rows, notes = [], []
    with paused_gc():
        with metric_pool(settings.threads) as pool:
            for rank in progress.track(pairing.ranks, "compare", unit="rank"):
                rows.extend(compare_rank(rank, pairing, settings, pool))
                notes.extend(rank_notes(rank, pairing))
        return finish(rows, notes, pairing, settings)
