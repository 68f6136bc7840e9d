"""Running the Triton statistics kernel in Triton's interpreter, on the CPU, in a subprocess: the
suite's way to check it on machines without a GPU (where Triton is installed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def interpreter_skip() -> str | None:
    """Why the interpreter cannot run the kernel here, or ``None``."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (torch's CPU builds do not ship it)"
    major, minor = (int(part) for part in version("triton").split(".")[:2])
    if (major, minor) < (3, 8):
        return "Triton's interpreter before 3.8 cannot run loops with runtime bounds under NumPy 2"
    return None


def interpreter_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess that runs the Triton kernel in Triton's interpreter (this
    checkout's sources, then the checkout itself for ``tests``, first on the path, whatever else the
    path held)."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path, **extra}


def run_in_interpreter(script: str, *args: str, **env: str) -> Any:
    """Run ``script`` (dedented) with ``args`` in a subprocess under Triton's interpreter, ``env``
    added to its environment; what the JSON of its last line of output holds."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        env=interpreter_env(**env),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1], parse_constant=float)
