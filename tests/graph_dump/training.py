"""A few training steps dumped eagerly and in compiled graphs, for the tests that compare the two.

``train(model, run, step)`` runs one step: ``run`` is what is called (the model, or its compiled
wrapper), ``model`` the module whose gradients are cleared after it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch._dynamo
from torch import nn

import torchdebug
from tests.backends import compile_as
from torchdebug.compile import CompilerConfig, get_backend

Train = Callable[[nn.Module, nn.Module, int], None]


def eager_dump(path: Path, model: nn.Module, train: Train, steps: int) -> Path:
    """Statistics of every op of ``steps`` steps, one eager step per debugger step, in ``path``."""
    debugger = torchdebug.Debugger(path, task="statistics")
    for step in range(steps):
        debugger.start(model)
        train(model, model, step)
        debugger.step()
    debugger.close()
    return path


def compiled_dump(
    path: Path,
    model: nn.Module,
    train: Train,
    steps: int,
    *,
    backend: str = "aot_eager",
    spelling: str = "whole",
    root: bool = True,
) -> list[torchdebug.records.Record]:
    """Statistics of every node of ``steps`` steps of ``model`` (its blocks are ``model.layers``)
    compiled whole (``spelling="whole"``) or block by block (``"method"``: ``block.compile()``,
    ``"wrapper"``: ``model.layers[i] = torch.compile(block)``), with the root model handed to the
    backend (``root``) or not; the records."""
    torch._dynamo.reset()
    path.mkdir(parents=True, exist_ok=True)
    config = CompilerConfig(backend=backend)
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = "statistics"
    backend = get_backend(config, model=model if root else None)
    run = compile_as(model, spelling, backend)
    for step in range(steps):
        train(model, run, step)
    backend.data_dump.close()
    torch._dynamo.reset()
    return torchdebug.load(path).ranks[0].records()
