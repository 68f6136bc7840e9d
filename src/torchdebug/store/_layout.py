"""Where a dump puts its files. One function per path, so writer and reader cannot disagree.

The tree (``DUMP_PATH/<run>/worldsize{N}_global_rank{R}/``, its files and what each holds):
docs/format.md.
"""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST = "manifest.json"
RECORDS = "records.arrows"
RECORDS_JSON = "records.jsonl"
"""The records file of dumps written before records were Arrow columns."""
STACKS = "stacks.jsonl"
COMPLETE = "complete.json"
RESERVE = ".reserve"
TENSORS = "tensors"

_RANK_DIR = re.compile(r"^worldsize(\d+)_global_rank(\d+)$")


def rank_dir_name(world_size: int, rank: int) -> str:
    """``worldsize{W}_global_rank{R}``, ptdbg's, msprobe's and TorchAir's convention."""
    return f"worldsize{world_size}_global_rank{rank}"


def parse_rank_dir_name(name: str) -> tuple[int, int] | None:
    """``(world_size, rank)`` of a rank folder name, or ``None`` if it is not one."""
    match = _RANK_DIR.match(name)
    return (int(match[1]), int(match[2])) if match else None


def tensor_file_name(step: int, batch: int) -> str:
    """Path of a tensor batch file relative to the rank folder."""
    return f"{TENSORS}/step{step}-{batch:04d}.safetensors"


def is_rank_dir(path: Path) -> bool:
    return path.is_dir() and parse_rank_dir_name(path.name) is not None and (path / MANIFEST).is_file()


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any(is_rank_dir(child) for child in path.iterdir())
