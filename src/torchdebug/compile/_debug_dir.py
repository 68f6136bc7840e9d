"""The folders and files the compile backend writes, and which graph is being compiled now.

With ``TORCH_COMPILE_DEBUG=1`` (read at each compile) everything goes under PyTorch's own run folder,
in ``torchdebug/model__<N>/{joint,forward,backward}/NNN_aot_<phase>_graph[_after_<pass>].txt`` and
a few JSON files beside them; without it only ``debug.graph_dump.type`` files are written, under
``debug.graph_dump.path`` in the same layout. No name carries a uuid, an object id or a timestamp, so
two runs of one program give the same tree. The whole tree, file by file: docs/compile.md, "The debug
folder".
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torchdebug._torch import dynamo as _dynamo
from torchdebug.compile.graph_render import graph_text, write_graph

log = logging.getLogger("torchdebug.compile._debug_dir")

DEFAULT_GRAPH_DUMP_PATH = "torchdebug_graphs"


def debugging() -> bool:
    """True when ``TORCH_COMPILE_DEBUG=1``, read now rather than at import."""
    return os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1"


def run_folder() -> Path:
    """PyTorch's run folder for this process, with ``-rank_<r>`` when torch.distributed is initialised."""
    folder = Path(_dynamo.get_debug_dir())
    if dist.is_available() and dist.is_initialized():
        folder = folder.with_name(f"{folder.name}-rank_{dist.get_rank()}")
    return folder


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "pass"


class DumpTree:
    """One output tree and its per-run state: the next model number, graph breaks, recompiles."""

    def __init__(self, root: Path, *, debug: bool) -> None:
        self.root = root
        self.debug = debug
        self._next_model = 0
        self._graph_breaks: list[dict[str, Any]] = []
        self._recompiles: list[dict[str, Any]] = []
        self._log_depth = 0
        self._log_handler: logging.FileHandler | None = None
        self._log_level = logging.NOTSET

    def new_model(self, kind: str | None) -> ModelDump:
        """The folder for the next graph Dynamo hands over (``model__0``, ``model__1``, ...)."""
        model = ModelDump(self, self._next_model, kind)
        self._next_model += 1
        return model

    def write(self, relative: str, text: str) -> Path:
        """Write ``root/relative`` and, while debugging, log it as a structured-trace artifact."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if self.debug:
            _dynamo.emit_artifact("torchdebug_" + _safe(relative), text)
        return path

    def add_graph_break(self, record: dict[str, Any]) -> None:
        self._graph_breaks.append(record)
        self.write("graph_breaks.json", json.dumps(self._graph_breaks, indent=1) + "\n")

    def add_recompile(self, record: dict[str, Any]) -> None:
        self._recompiles.append(record)
        self.write("recompiles.json", json.dumps(self._recompiles, indent=1) + "\n")

    @contextlib.contextmanager
    def logging_to_file(self) -> Iterator[None]:
        """Send the ``torchdebug`` loggers at DEBUG level to ``debug.log`` (re-entrant, restored on exit)."""
        if not self.debug:
            yield
            return
        logger = logging.getLogger("torchdebug")
        if self._log_depth == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            self._log_handler = logging.FileHandler(self.root / "debug.log")
            self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            self._log_level = logger.level
            logger.addHandler(self._log_handler)
            logger.setLevel(logging.DEBUG)
        self._log_depth += 1
        try:
            yield
        finally:
            self._log_depth -= 1
            if self._log_depth == 0 and self._log_handler is not None:
                logger.removeHandler(self._log_handler)
                logger.setLevel(self._log_level)
                self._log_handler.close()
                self._log_handler = None


_TREES: dict[Path, DumpTree] = {}


def dump_tree(graph_dump_type: str | None, graph_dump_path: str | None) -> DumpTree | None:
    """The tree this compile writes to, or ``None`` when there is nothing to write.

    One tree per folder, so every backend of a process shares the ``model__<N>`` numbering of a run.
    """
    if debugging():
        root = run_folder() / "torchdebug"
    elif graph_dump_type is not None:
        root = Path(graph_dump_path or DEFAULT_GRAPH_DUMP_PATH).absolute()
    else:
        return None
    if root not in _TREES:
        _TREES[root] = DumpTree(root, debug=debugging())
    return _TREES[root]


class ModelDump:
    """``model__<N>/``: one Dynamo graph and the AOT phases compiled from it."""

    def __init__(self, tree: DumpTree, index: int, kind: str | None) -> None:
        self.tree = tree
        self.name = f"model__{index}"
        self.kind = kind
        self.phases: dict[str, float] = {}
        self.summary: dict[str, Any] = {"model": self.name}

    def write_summary(self) -> None:
        """``model.json``: what the backend recorded so far (phases finish as they compile)."""
        if self.tree.debug:
            self.write_json("model.json", {**self.summary, "phase_seconds": self.phases})

    def graph_kinds(self, *, every_pass_txt_written: bool = False) -> list[str]:
        """The formats one dump point gets: txt while debugging, plus ``debug.graph_dump.type``."""
        kinds = [] if every_pass_txt_written or not self.tree.debug else ["txt"]
        if self.kind is not None and self.kind not in kinds and not (every_pass_txt_written and self.kind == "txt"):
            kinds.append(self.kind)
        return kinds

    def write_graph(self, relative: str, gm: torch.fx.GraphModule, kinds: list[str]) -> None:
        """Write ``<relative>.<kind>`` for each of ``kinds`` (dot also gets an SVG when it can)."""
        for kind in kinds:
            if kind == "txt":
                self.tree.write(f"{self.name}/{relative}.txt", graph_text(gm))
                continue
            stem = self.tree.root / self.name / relative
            stem.parent.mkdir(parents=True, exist_ok=True)
            for path in write_graph(gm, stem, kind, f"{self.name}/{relative}"):
                if self.tree.debug:
                    _dynamo.emit_artifact("torchdebug_" + _safe(f"{self.name}/{path.name}"), path.read_text())

    def write_json(self, relative: str, document: Any) -> None:
        self.tree.write(f"{self.name}/{relative}", json.dumps(document, indent=1, default=str) + "\n")


class PhaseDump:
    """One AOT phase of one model (``forward``, ``backward``, ``inference`` or ``joint``): its
    numbered dumps and its ``passes.json``. With ``model=None`` it only names the phase."""

    def __init__(self, model: ModelDump | None, aot_phase: str) -> None:
        self.model = model
        self.aot_phase = aot_phase
        self.folder = "forward" if aot_phase == "inference" else aot_phase
        self.label = self.folder  # as in the file names: 000_aot_forward_graph.txt
        self.index = 0
        self.passes: list[dict[str, Any]] = []
        self.last_stem: str | None = None
        self.last_gm: torch.fx.GraphModule | None = None
        self.finished = False
        self.observed_by_us = False  # set by a torchdebug pass stage so the observer skips its slot
        self.started = time.perf_counter()

    def _stem(self, suffix: str) -> str:
        stem = f"{self.index:03d}_aot_{self.label}_graph{suffix}"
        self.index += 1
        return stem

    def dump_entry(self, gm: torch.fx.GraphModule) -> None:
        """``000_aot_<phase>_graph``: the graph as the phase receives it."""
        stem = self._stem("")
        self.last_stem, self.last_gm = stem, gm
        if self.model is not None:
            self.model.write_graph(f"{self.folder}/{stem}", gm, self.model.graph_kinds())

    def record_pass(self, gm: torch.fx.GraphModule, name: str, owner: str, seconds: float, before: list[str]) -> None:
        """Dump the graph after pass ``name`` and add its line to ``passes.json``."""
        stem = self._stem(f"_after_{_safe(name)}")
        self.last_stem, self.last_gm = stem, gm
        if self.model is None:
            return
        after = [node.name for node in gm.graph.nodes]
        after_set, before_set = set(after), set(before)
        self.passes.append(
            {
                "index": int(stem[:3]),
                "name": name,
                "owner": owner,
                "file": f"{stem}.txt" if self.model.tree.debug else None,
                "seconds": round(seconds, 6),
                "nodes_before": len(before),
                "nodes_after": len(after),
                "added": [n for n in after if n not in before_set],
                "removed": [n for n in before if n not in after_set],
            }
        )
        if self.model.tree.debug:
            self.model.tree.write(f"{self.model.name}/{self.folder}/{stem}.txt", graph_text(gm))

    def finish(self, output_code: str | None = None) -> None:
        """Write the last graph in the dump type, ``output_code.py`` and ``passes.json``."""
        if self.finished:
            return
        self.finished = True
        seconds = time.perf_counter() - self.started
        model = self.model
        if model is None:
            return
        model.phases[self.aot_phase] = round(seconds, 6)
        model.write_summary()
        if self.last_gm is not None and self.index > 1:
            kinds = model.graph_kinds(every_pass_txt_written=model.tree.debug)
            model.write_graph(f"{self.folder}/{self.last_stem}", self.last_gm, kinds)
        if not model.tree.debug:
            return
        if output_code is not None:
            model.tree.write(f"{model.name}/{self.folder}/output_code.py", output_code)
        summary = {
            "model": model.name,
            "phase": self.aot_phase,
            "compile_seconds": round(seconds, 6),
            "output_code": "output_code.py" if output_code is not None else None,
            "passes": self.passes,
        }
        model.write_json(f"{self.folder}/passes.json", summary)
        log.debug("%s/%s: %d passes in %.3f s", model.name, self.aot_phase, len(self.passes), seconds)


current_phase: contextvars.ContextVar[PhaseDump | None] = contextvars.ContextVar("torchdebug_current_phase", default=None)
