"""Crash-safe writing of one rank's records, stacks and tensors.

Records and stacks are appended as JSON lines and flushed to the OS with every batch, so a process
killed mid-step (even by SIGKILL) keeps every batch written before the kill; only a last line may
be cut short, and the reader accepts that. Tensor files are written under a temporary name and
renamed into place before any record refers to them, so a record never points at a partial file.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from torchdebug.errors import DumpError
from torchdebug.records import SCHEMA_VERSION, Record
from torchdebug.store import layout

logger = logging.getLogger("torchdebug.store.writer")


def now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def check_writable(path: Path) -> None:
    """Create ``path`` if needed and prove a file can be written there, or raise DumpError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".torchdebug-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise DumpError(f"dump_path: cannot write to {path} ({error.strerror or error}); choose a writable folder") from None


def new_run_name() -> str:
    """A run folder name from the local time, e.g. ``20261122-101500``."""
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def create_run_dir(dump_path: Path, name: str) -> Path:
    """Make a new run folder under ``dump_path``; never reuses an existing one (adds ``-1``, ``-2``)."""
    check_writable(dump_path)
    candidate, suffix = name, 0
    while True:
        run_dir = dump_path / candidate
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            suffix += 1
            candidate = f"{name}-{suffix}"


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


class RankWriter:
    """Appends one rank's records, stacks and tensor batches under its rank folder."""

    def __init__(self, rank_dir: Path, manifest: dict[str, Any]) -> None:
        try:
            rank_dir.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise DumpError(f"{rank_dir} exists already; a dump never overwrites an earlier run") from None
        self.rank_dir = rank_dir
        self.record_count = 0
        self._stack_ids: set[str] = set()
        self._pending_stacks: list[dict[str, Any]] = []
        self._tensor_batches: dict[int, int] = {}
        self._manifest = {"schema_version": SCHEMA_VERSION, "start_time": now_iso(), **manifest}
        _write_json_atomic(rank_dir / layout.MANIFEST, self._manifest)
        # Line-buffered text files: each write of whole lines reaches the OS at once.
        self._records = open(rank_dir / layout.RECORDS, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._stacks = open(rank_dir / layout.STACKS, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self.closed = False

    def add_stack(self, stack_id: str, frames: list[str]) -> None:
        """Queue a stack for writing with the next batch of records (once per id)."""
        if stack_id not in self._stack_ids:
            self._stack_ids.add(stack_id)
            self._pending_stacks.append({"id": stack_id, "frames": frames})

    def has_stack(self, stack_id: str) -> bool:
        return stack_id in self._stack_ids

    def save_tensors(self, step: int, tensors: dict[str, torch.Tensor]) -> str:
        """Write a batch of tensors to a new safetensors file; returns its path in the rank folder."""
        batch = self._tensor_batches.get(step, 0)
        self._tensor_batches[step] = batch + 1
        relative = layout.tensor_file_name(step, batch)
        path = self.rank_dir / relative
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata={"schema_version": str(SCHEMA_VERSION), "step": str(step)})
        os.replace(tmp, path)
        return relative

    def write_records(self, records: Iterable[Record]) -> None:
        """Append records (after the stacks they refer to) and hand both to the OS."""
        if self._pending_stacks:
            self._stacks.write("".join(json.dumps(s) + "\n" for s in self._pending_stacks))
            self._pending_stacks.clear()
        lines = [json.dumps(r.to_json(), default=_json_default) + "\n" for r in records]
        if lines:
            self._records.write("".join(lines))
            self.record_count += len(lines)

    def close(self, status: str = "complete", **info: Any) -> None:
        """Write the completion marker and close the files (idempotent)."""
        if self.closed:
            return
        self.write_records(())
        self._records.close()
        self._stacks.close()
        _write_json_atomic(
            self.rank_dir / layout.COMPLETE,
            {"status": status, "end_time": now_iso(), "records": self.record_count, **info},
        )
        self.closed = True


def _json_default(value: Any) -> Any:
    """Last resort for values json cannot write: their string form."""
    return str(value)
