"""The window as an ordinary dump: module-level records, one step each, that show, compare, check and report read.

Each kept step becomes one step of the dump; each slot seen in it one record (``op`` is ``module``,
or ``monitor.loss`` for the loss), named as a module-level :class:`~torchdebug.Debugger` dump names
the same slot, so a window compares with such a dump, or with another rank's window. The event that
fired goes into the rank folder's ``complete.json`` (``monitor``) so that ``show`` and ``report``
can name the step, the reason and the first slot.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torchdebug.monitor._ring import Ring
from torchdebug.records import Record
from torchdebug.stats import COUNT_KEYS, STAT_KEYS
from torchdebug.store import RankWriter, WriteFault, rank_dir_name, run_manifest


def window_records(ring: Ring, step: int, rank: int) -> list[Record]:
    """The records of kept ``step``: one per slot seen that step, in execution order."""
    row = ring.row(step)
    if row is None:
        return []
    records = []
    for index in ring.execution_order():
        if index >= len(row):
            continue
        slot, values = ring.slots[index], row[index]
        if all(math.isnan(v) for v in values):
            continue  # not seen this step
        stats: dict[str, Any] = {key: None if math.isnan(v) else float(v) for key, v in zip(STAT_KEYS, values)}
        for key in COUNT_KEYS:
            if stats[key] is not None:
                stats[key] = int(stats[key])
        records.append(
            Record(
                name=slot.name,
                step=step,
                rank=rank,
                phase=slot.phase,
                module=slot.module,
                op=slot.op,
                call=slot.call,
                seq=len(records),
                io=slot.io,
                arg=slot.arg,
                dtype=slot.dtype,
                shape=list(slot.shape),
                stats=stats,
            )
        )
    return records


def write_window(
    ring: Ring, run_dir: Path, rank: int, world_size: int, config: dict[str, Any], event: dict[str, Any]
) -> WriteFault | None:
    """Write every kept step of ``ring`` as this rank's folder of the run ``run_dir``; returns the
    first write that failed (``config["on_write_error"] == "raise"``: raises DumpError instead)."""
    rank_dir = run_dir / rank_dir_name(world_size, rank)
    config = {"task": "statistics", "level": "module", **config}  # what the records hold, as a Debugger's manifest says
    manifest = run_manifest(run_dir.name, rank, world_size, config, capture="monitor")
    writer = RankWriter(rank_dir, manifest, on_write_error=config.get("on_write_error", "continue"))
    try:
        for step in ring.kept_steps():
            writer.submit(step, window_records(ring, step, rank), None, [])
    finally:
        writer.close(monitor=event)
    return writer.fault
