"""Running a bench's child process under Valgrind's callgrind, and reading the counts it dumps (the
benches that count instructions: ``host_instructions.py``, ``monitor.py --per-call --instructions``).

A child marks what it wants counted apart by calling ``os.getppid`` (:data:`MARK`), which callgrind
is told to dump its counts before: the dump ``<out>.<n>-<thread>`` holds what a thread ran between
its marks ``n - 1`` and ``n`` (``n = 1``: from the start).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MARK = "getppid"
"""The C function behind ``os.getppid``: Valgrind dumps the counts of the thread calling it."""

_COUNT = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


def run_counted(arguments: list[str], out: Path, *, marks: bool, what: str) -> None:
    """Run ``python arguments...`` under callgrind, its counts into ``out`` (``marks``: a dump of each
    thread at each :data:`MARK`), under one hash seed (with Python's random one a dict's order, and so
    the instructions, move between runs). A child that fails stops the bench with one line, ``what``
    and the child's last words."""
    command = ["valgrind", "--tool=callgrind", "--cache-sim=no", f"--callgrind-out-file={out}"]
    command += ["--separate-threads=yes", f"--dump-before={MARK}"] if marks else []
    run = subprocess.run(
        [*command, sys.executable, *arguments], capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}
    )
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{what} under callgrind failed ({run.returncode}): {last}")


def dump_count(text: str) -> int | None:
    """The instructions a callgrind dump holds (its ``summary:`` or ``totals:`` line), ``None`` without one."""
    match = _COUNT.search(text)
    return int(match.group(1)) if match is not None else None
