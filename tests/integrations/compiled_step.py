"""What the trainer callbacks' tests share: a dumped step of a model the trainer compiles."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import torchdebug


def check_a_compiled_step_dump(train: Callable[[str], Path], caplog: pytest.LogCaptureFixture, recompiles_as_run: bool) -> None:
    """``train(compiled_code)`` trains a two-layer model (``fc1``, ``fc2``) that the trainer
    compiles, the callback dumping step 1 with that ``compiled_code``, and returns the dump's run
    folder. By default (``as_run``) the dump sees only what the compiled code calls, and one
    warning says so; with ``eager`` the step runs eagerly, every module's ops in it, and the run
    keeps one graph, nothing compiled again (``recompiles_as_run``: ``as_run`` may compile once more)."""
    modules = {}
    for compiled_code in ("as_run", "eager"):
        torch._dynamo.reset()
        counters.clear()
        caplog.clear()
        run_dir = train(compiled_code)
        assert not counters["graph_break"]
        assert counters["stats"]["unique_graphs"] == 1 or (recompiles_as_run and compiled_code == "as_run")
        records = torchdebug.load(run_dir).ranks[0].records()
        modules[compiled_code] = {r.module for r in records if r.phase == "forward" and r.op == "aten.addmm.default"}
        told = [r for r in caplog.records if r.name == "torchdebug.debugger" and "compiled_code='eager'" in r.getMessage()]
        assert len(told) == (compiled_code == "as_run")
    assert modules["eager"] == {"fc1", "fc2"}
    assert modules["as_run"] and not modules["as_run"] & {"fc1", "fc2"}  # inside the compiled graph: its module
    torch._dynamo.reset()
