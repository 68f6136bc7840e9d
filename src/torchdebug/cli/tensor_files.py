"""Damaged tensor files of a dump: found from their safetensors headers, without reading tensors.

A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's
``data_offsets`` into the data that follows, then the data; the file must end where the last tensor
does, else ``safe_open`` refuses the whole file. A disk that filled up, a copy cut short or a
killed writer leaves such a file, and the records that point into it keep their statistics while
their tensors cannot be read. ``show`` and ``check`` name these files, ``convert`` skips them,
``report`` lists them: each reads only the headers (a few KiB a file), so a dump of many GB is
checked in moments.

Only ``.safetensors`` files are checked (an msprobe dump's ``.npy``/``.pt`` files are not); a file
that is missing is damaged too, except in a rank that did not finish, whose reader already marks
the records of unwritten files (``capture_error``).
"""

from __future__ import annotations

import json
import logging
import struct
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchdebug.records import Record
    from torchdebug.store import RankRecords

logger = logging.getLogger("torchdebug.cli")

_HEADER_LIMIT = 100 << 20
"""The largest header safetensors reads (100 MB): a larger length means a damaged first 8 bytes."""


def check_file(path: Path) -> str | None:
    """Why the safetensors file at ``path`` cannot be read, or ``None`` when its size matches its
    header (its tensors may still hold wrong bytes: no checksum covers them)."""
    try:
        with path.open("rb") as file:
            size = path.stat().st_size
            if size < 8:
                return f"truncated: {size} bytes, no header"
            (length,) = struct.unpack("<Q", file.read(8))
            if length > _HEADER_LIMIT or 8 + length > size:
                return f"truncated in its header: {size} bytes, the header alone needs {8 + length}"
            header = json.loads(file.read(length))
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        return f"unreadable ({error.strerror or error})"
    except (ValueError, UnicodeDecodeError):
        return "header is not valid JSON"
    try:
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, AttributeError):
        return "header lists no valid data offsets"
    expected = 8 + length + int(end)
    if size < expected:
        return f"truncated: {size} of {expected} bytes"
    if size > expected:
        return f"{size - expected} bytes past the last tensor (the header says {expected})"
    return None


def damaged_files(dump: RankRecords, records: list[Record] | None = None) -> dict[str, tuple[str, int]]:
    """The damaged tensor files ``records`` (default: all of the rank's) point into: file (as the
    records name it) -> (why, how many records' tensors it holds), in order of first use."""
    uses: Counter[str] = Counter()
    for record in dump.records() if records is None else records:
        if record.tensor and record.tensor.get("file", "").endswith(".safetensors"):
            uses[record.tensor["file"]] += 1
    damaged = {}
    for file, count in uses.items():
        reason = check_file(Path(dump.path) / file)
        if reason is not None:
            damaged[file] = (reason, count)
    return damaged


def warn_damaged(rank: int, damaged: dict[str, tuple[str, int]], consequence: str) -> None:
    """One warning per damaged file, naming it, why, and what it means (``consequence``, e.g.
    ``"cannot be read"``) for the records that point into it."""
    for file, (reason, count) in damaged.items():
        tensors = "1 record's tensor" if count == 1 else f"{count} records' tensors"
        logger.warning("rank %s: damaged tensor file %s (%s): %s in it %s", rank, file, reason, tensors, consequence)
