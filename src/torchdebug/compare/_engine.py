"""Run a comparison: in this process (threads), or split over worker processes.

``compare(a, b)`` opens both dumps, then for each rank they share: pairs records, computes
statistics and tensor metrics, and judges the rows (see :mod:`torchdebug.compare._steps`).
``workers=N`` spreads the same steps over N processes with torch.distributed
(:mod:`torchdebug.compare._distributed`); the result is the same.
"""

from __future__ import annotations

import logging
from pathlib import Path

from torchdebug import progress
from torchdebug.compare._config import CompareConfig
from torchdebug.compare._result import CompareResult
from torchdebug.compare._steps import (
    compare_rank,
    finish,
    metric_pool,
    open_dump,
    open_pair,
    rank_notes,
)
from torchdebug.gc_paused import paused_gc
from torchdebug.options import accepts
from torchdebug.store import _reader as reader

__all__ = ["compare", "open_dump"]

logger = logging.getLogger("torchdebug.compare")


@accepts(CompareConfig)
def compare(a: str | Path | reader.Run, b: str | Path | reader.Run, *, config: CompareConfig) -> CompareResult:
    """Compare dump ``a`` against the reference dump ``b``, rank by rank.

    Args:
        a, b: a torchdebug dump path (its latest run), run folder or rank folder, or an msprobe dump
            folder (``dump.json`` inside, or ``step*/rank*`` / ``proc*`` above it). ``b`` is the
            reference: relative errors are relative to it.
        config: a :class:`~torchdebug.compare._config.CompareConfig`; or give its options as keywords
            (``tolerances={"bfloat16": 0.02}``, ``rerun=True``, ...), listed below. ``workers=N``
            (N > 1) spawns N processes (torch.distributed, gloo, file rendezvous); under torchrun use
            :func:`torchdebug.compare._distributed.compare_distributed` instead.

    Returns:
        A :class:`CompareResult`; ``result.first_divergence`` is the earliest blamed op.
    """
    if config.workers > 1:
        # imported here: the spread run's modules (torch.distributed, the cross-rank digests) are
        # not an in-process compare's, and one of them builds an Arrow array when imported, which
        # imports pandas through pyarrow's shim (0.4 s, 50 MB; ``torchdebug.store._arrow_buffers``)
        from torchdebug.compare import _distributed as distributed

        return distributed.spawn_compare(a, b, config)
    pairing = open_pair(a, b, config.noise)
    rows, notes = [], []
    with paused_gc():
        with metric_pool(config.threads) as pool:
            for rank in progress.track(pairing.ranks, "compare", unit="rank"):
                rows.extend(compare_rank(rank, pairing, config, pool))
                notes.extend(rank_notes(rank, pairing))
        return finish(rows, notes, pairing, config)
