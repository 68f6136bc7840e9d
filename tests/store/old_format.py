"""Dumps as torchdebug wrote them before records were Arrow columns: ``records.jsonl``, one JSON record a line."""

from __future__ import annotations

from pathlib import Path

from torchdebug.store import _layout as layout
from torchdebug.store._reader import RankDump
from torchdebug.store._record_json import encode_records

OLD_DUMP = Path(__file__).with_name("old_dump")
"""A dump written by torchdebug 0.1 before the Arrow records (a Linear and a ReLU, forward and backward, statistics)."""


def to_json_lines(dump: Path) -> Path:
    """Rewrite the first rank folder under ``dump`` with its records as JSON lines (the encoder
    that wrote them, byte for byte); the path of its ``records.jsonl``."""
    rank_dir = next(path.parent for path in sorted(dump.rglob(layout.RECORDS)))
    records = RankDump.open(rank_dir).records()
    path = rank_dir / layout.RECORDS_JSON
    path.write_text(encode_records(records), encoding="utf-8")
    (rank_dir / layout.RECORDS).unlink()
    return path
