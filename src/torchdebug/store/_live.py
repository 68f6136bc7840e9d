"""The dumps this process is still writing, so that reading one here sees every record captured so far.

A capture hands its records to the writer in batches (every 2048 records, at ``stop``/``step`` and,
for compiled graphs, at the next step or ``flush()``), so a script that dumps a compiled step and
then calls ``torchdebug.load`` or ``torchdebug.compare`` on the same path would read a dump that
looks empty. Each capture session registers a flush here; :func:`flush_under` (called by the reader
before it opens a path) flushes those of this thread whose rank folder lies under the path. A
session of another thread is left alone: flushing it would race its capture (the reader then says
that the dump is still being written).

Entries hold weak references, so a registration never keeps a capture alive, and entries whose
flush reports the dump closed are dropped.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from pathlib import Path

__all__ = ["flush_under", "register"]

_live: list[tuple[Path, int, weakref.WeakMethod]] = []
_lock = threading.Lock()


def register(rank_dir: Path, flush: Callable[[], bool]) -> None:
    """Let readers of ``rank_dir`` flush it first: ``flush`` (a bound method, held weakly) writes
    everything captured so far and returns ``False`` once the dump is closed (then it is forgotten)."""
    with _lock:
        _live.append((rank_dir.resolve(), threading.get_ident(), weakref.WeakMethod(flush)))


def flush_under(path: Path) -> None:
    """Flush this thread's live dumps whose rank folder is ``path`` or lies under it."""
    path = path.resolve()
    thread = threading.get_ident()
    with _lock:
        entries = list(_live)
    for entry in entries:
        rank_dir, owner, ref = entry
        flush = ref()
        if flush is None or (owner == thread and rank_dir.is_relative_to(path) and not flush()):
            with _lock:
                if entry in _live:
                    _live.remove(entry)
