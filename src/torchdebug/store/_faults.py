"""What a failed write of the dump leaves behind, and a seam that makes writes fail on purpose.

:class:`WriteFault` is the first write of a rank's dump that failed: the step, the slot it was
writing, the error and the free space then, as ``complete.json`` keeps it under ``truncated`` and
every command that reads the dump reports it. :func:`failing_writes` makes the store's writes fail
with a chosen ``errno`` once a number of bytes has been written, in every thread: the fault-injection
tests and ``bench/faults.py`` use it (a real full filesystem is tested too where one can be mounted).
"""

from __future__ import annotations

import errno as errno_codes
import fnmatch
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WriteFault:
    """The first write of a rank's dump that failed (``complete.json``'s ``truncated``)."""

    step: int
    """The step whose records or tensors were being written."""
    slot: str | None
    """The first record or saved tensor of the write that failed (``None``: a file of the run, not a slot)."""
    path: str
    """The file being written."""
    error: str
    """What the OS said, e.g. ``[Errno 28] No space left on device``."""
    free_bytes: int | None
    """Free space on the dump's filesystem when it failed (``None`` where it could not be read)."""

    @classmethod
    def of(cls, error: BaseException, step: int, slot: str | None, path: Path) -> WriteFault:
        if isinstance(error, OSError) and error.strerror:
            text = f"[Errno {error.errno}] {error.strerror}"
        else:
            text = f"{type(error).__name__}: {error}"
        return cls(step, slot, str(path), text, free_bytes(path))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line: where, what, and the free space."""
        free = f"; {self.free_bytes / 2**20:.1f} MiB free there" if self.free_bytes is not None else ""
        at = f" ({self.slot})" if self.slot else ""
        return f"writing {self.path} failed at step {self.step}{at}: {self.error}{free}"


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing folder)."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


class _Budget:
    def __init__(self, after_bytes: int, code: int, files: str) -> None:
        self.left = after_bytes
        self.code = code
        self.files = files
        self.lock = threading.Lock()

    def take(self, path: Path, nbytes: int) -> None:
        if not fnmatch.fnmatch(path.name, self.files):
            return
        with self.lock:
            if nbytes > self.left:
                self.left = 0
                raise OSError(self.code, os.strerror(self.code), str(path))
            self.left -= nbytes


_budget: _Budget | None = None


def charge(path: Path, nbytes: int | Callable[[], int]) -> None:
    """Count a write of ``nbytes`` to ``path`` against the budget of :func:`failing_writes`, which
    raises the chosen ``OSError`` once the budget is spent (no-op outside it; a callable, a size
    that takes a pass to count, is called only inside it)."""
    if _budget is not None:
        _budget.take(path, nbytes() if callable(nbytes) else nbytes)


def freed(path: Path, nbytes: int) -> None:
    """Give the ``nbytes`` of ``path``, deleted, back to the budget of :func:`failing_writes` when
    the budget counts that file, as a real filesystem gets its space back."""
    if _budget is not None and fnmatch.fnmatch(path.name, _budget.files):
        with _budget.lock:
            _budget.left += nbytes


@contextmanager
def failing_writes(after_bytes: int, code: int = errno_codes.ENOSPC, files: str = "*") -> Iterator[None]:
    """Inside the block, the store's writes to files whose name matches the glob ``files`` fail
    with ``OSError(code)`` once ``after_bytes`` bytes were written to them (a write that would cross
    the budget fails whole); for tests and benches."""
    global _budget
    previous, _budget = _budget, _Budget(after_bytes, code, files)
    try:
        yield
    finally:
        _budget = previous
