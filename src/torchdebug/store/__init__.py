"""Persisting records: folder layout, crash-safe writer, pickle-free reader.

Typical use::

    run = torchdebug.load("dump")            # latest run under a dump path
    for rank, rank_dump in run.ranks.items():
        for record in rank_dump.records():
            print(record.name, record.stats)
"""

from torchdebug.store._reader import RankDump, Run, load
from torchdebug.store._writer import RankWriter

__all__ = ["RankDump", "RankWriter", "Run", "load"]
