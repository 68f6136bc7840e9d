"""``compare``: the one way in to every comparison (two dumps, or the ranks of one dump), in this
process, in worker processes it spawns, or on the processes of a process group.

``compare(a, b)`` opens both dumps, then for each rank they share: pairs records, computes
statistics and tensor metrics, and judges the rows (see :mod:`torchdebug.compare._steps`).
``compare(dump)`` compares the ranks of one dump with each other (:mod:`torchdebug.compare._across_ranks`).
``workers=N`` spreads the same steps over N processes with torch.distributed
(:mod:`torchdebug.compare._distributed`); the result is the same.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

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
from torchdebug.dist import dist_initialized, rank_and_world_size
from torchdebug.errors import ConfigError
from torchdebug.gc_paused import paused_gc
from torchdebug.options import accepts
from torchdebug.store import Run

if TYPE_CHECKING:
    from torchdebug.compare._across_ranks import RanksResult

__all__ = ["compare", "open_dump"]

logger = logging.getLogger("torchdebug.compare")


def _in_group(workers: int) -> bool:
    """Whether the processes of this process's default group are the ``workers`` (as many of them)."""
    return workers > 1 and dist_initialized() and rank_and_world_size()[1] == workers


@accepts(CompareConfig)
def compare(a: str | Path | Run, b: str | Path | Run | None = None, *, config: CompareConfig) -> CompareResult | None:
    """Compare dump ``a`` against the reference dump ``b``, rank by rank; or, without ``b``, the
    ranks of dump ``a`` with each other where data-parallel replicas must agree.

    Args:
        a, b: a torchdebug dump path (its latest run), run folder or rank folder, or an msprobe dump
            folder (``dump.json`` inside, or ``step*/rank*`` / ``proc*`` above it). ``b`` is the
            reference: relative differences are relative to it. Without ``b``: ``a``'s ranks, each
            against the value most of them hold (``tolerances`` default to bitwise equality there;
            ``mapping``, ``noise``, ``rerun`` and ``growth`` need a reference dump).
        config: a :class:`~torchdebug.compare.CompareConfig`; or give its options as keywords
            (``tolerances={"bfloat16": 0.02}``, ``rerun=True``, ...), listed below. ``workers=N``
            (N > 1): N processes share the work. In a process of an initialised default process
            group of N processes (torchrun), those processes do: call ``compare`` on every one of
            them, process 0 gets the result and the others ``None`` (in a gloo group, a process that
            calls it alone gets a ``ConfigError`` after 5 minutes rather than waiting for the
            others). Otherwise it spawns N processes
            on this machine (gloo, file rendezvous); guard a script that does with
            ``if __name__ == "__main__"``.

    Returns:
        A :class:`CompareResult` (a :class:`RanksResult` without ``b``); ``result.first_divergence``
        is the earliest blamed op. ``None`` on the processes of a group other than process 0.
    """
    group = _in_group(config.workers)
    if b is None:
        return _ranks(a, config, group)
    if config.ranks is not None:
        raise ConfigError(
            "ranks: chooses the ranks of one dump compared with each other (compare(dump)); leave it out with two dumps"
        )
    if group or config.workers > 1:
        # imported here: the spread run's modules (torch.distributed, the cross-rank digests) are
        # not an in-process compare's
        from torchdebug.compare import _distributed as distributed

        return distributed.compare_in_group(a, b, config) if group else distributed.spawn_compare(a, b, config)
    pairing = open_pair(a, b, config.noise)
    rows, notes = [], []
    with paused_gc():
        with metric_pool(config.threads) as pool:
            for rank in progress.track(pairing.ranks, "compare", unit="rank"):
                rows.extend(compare_rank(rank, pairing, config, pool))
                notes.extend(rank_notes(rank, pairing))
        return finish(rows, notes, pairing, config)


def _ranks(dump: str | Path | Run, config: CompareConfig, group: bool) -> RanksResult | None:
    """The ranks of one dump compared with each other: in this process (its ``workers`` spawned
    to digest the ranks) or on the processes of the default group."""
    # imported here, as the spread run's modules (a comparison of two dumps never needs them)
    from torchdebug.compare._across_ranks import ranks_config, ranks_in_process

    options = ranks_config(config)
    if not group:
        return ranks_in_process(dump, options)
    from torchdebug.compare import _distributed as distributed

    return distributed.ranks_in_group(dump, options)
