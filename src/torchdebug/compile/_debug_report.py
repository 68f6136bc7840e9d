"""One offline HTML page for a ``TORCH_COMPILE_DEBUG`` run of the torchdebug backend.

Reads the tree :mod:`torchdebug.compile._debug_dir` writes (models, phases, ``passes.json``,
numbered dumps, ``graph_breaks.json``, ``recompiles.json``, ``model.json``) and renders models and
phases, the pass pipeline with node-count changes, a diff between consecutive pass dumps, graph
breaks and recompiles with source lines, and compile times. The page itself is drawn by
:mod:`torchdebug.report.compile`: self-contained, every name HTML-escaped.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchdebug.errors import DumpError
from torchdebug.report.compile import render_compile

MAX_DIFF_LINES = 400
_PHASE_ORDER = {"joint": 0, "forward": 1, "backward": 2}


def find_torchdebug_folder(path: Path) -> Path:
    """The ``torchdebug/`` folder for ``path``: itself, a run folder holding it, or the newest run
    under a ``torch_compile_debug`` root."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such folder; pass a torch_compile_debug/run_* folder")
    for candidate in (path, path / "torchdebug"):
        if (candidate / "debug.log").exists() or any(candidate.glob("model__*")):
            return candidate
    runs = sorted(path.glob("run_*/torchdebug"), key=lambda p: p.stat().st_mtime)
    if runs:
        return runs[-1]
    raise DumpError(
        f"{path}: no torchdebug debug output here; run with TORCH_COMPILE_DEBUG=1 and pass the "
        "torch_compile_debug/run_* folder it prints"
    )


def _read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


@dataclass
class PassStep:
    index: int
    name: str
    owner: str
    seconds: float
    nodes_before: int
    nodes_after: int
    added: list[str]
    removed: list[str]
    diff: list[str] = field(default_factory=list)
    diff_truncated: bool = False


@dataclass
class Phase:
    name: str
    compile_seconds: float | None
    steps: list[PassStep]
    entry_nodes: int | None


@dataclass
class Model:
    name: str
    summary: dict[str, Any]
    phases: list[Phase]


def _diff(before: Path | None, after: Path | None) -> tuple[list[str], bool]:
    if before is None or after is None or not before.is_file() or not after.is_file():
        return [], False
    lines = list(
        difflib.unified_diff(
            before.read_text().splitlines(), after.read_text().splitlines(), before.name, after.name, lineterm="", n=2
        )
    )
    return lines[:MAX_DIFF_LINES], len(lines) > MAX_DIFF_LINES


def _phase(folder: Path) -> Phase:
    passes = _read_json(folder / "passes.json", {})
    entry = next(iter(sorted(folder.glob("000_aot_*_graph.txt"))), None)
    steps = []
    previous = entry
    for record in passes.get("passes", []):
        current = folder / record["file"] if record.get("file") else None
        diff, truncated = _diff(previous, current)
        steps.append(
            PassStep(
                index=record["index"],
                name=record["name"],
                owner=record["owner"],
                seconds=record["seconds"],
                nodes_before=record["nodes_before"],
                nodes_after=record["nodes_after"],
                added=record["added"],
                removed=record["removed"],
                diff=diff,
                diff_truncated=truncated,
            )
        )
        previous = current or previous
    return Phase(folder.name, passes.get("compile_seconds"), steps, steps[0].nodes_before if steps else None)


def collect(folder: Path) -> dict[str, Any]:
    """Everything the page shows, read from one ``torchdebug/`` folder."""
    models = []
    model_folders = sorted(folder.glob("model__*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    for model_folder in model_folders:
        phases = sorted((p for p in model_folder.iterdir() if p.is_dir()), key=lambda p: _PHASE_ORDER.get(p.name, 9))
        models.append(Model(model_folder.name, _read_json(model_folder / "model.json", {}), [_phase(p) for p in phases]))
    return {
        "folder": str(folder),
        "models": models,
        "graph_breaks": _read_json(folder / "graph_breaks.json", []),
        "recompiles": _read_json(folder / "recompiles.json", []),
    }


def render_report(folder: Path) -> str:
    """The HTML page for the ``torchdebug/`` folder of a debug run."""
    return render_compile(**collect(folder), max_diff=MAX_DIFF_LINES)
