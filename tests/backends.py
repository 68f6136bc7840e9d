"""The torchdebug compile backend with a data dump, as the graph-dump tests build it, the pair of
dumps eager-against-compiled compare tests read, and the spellings a model is compiled in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch import nn

import torchdebug
from torchdebug.compile import CompilerConfig, get_backend


def compile_as(model: nn.Module, spelling: str, backend: Any) -> nn.Module:
    """Compile ``model`` with ``backend`` as ``spelling`` says: ``"method"`` (each block of
    ``model.layers``: ``block.compile()``, torchtitan's per-block compile), ``"wrapper"``
    (``model.layers[i] = torch.compile(block)``), ``"forward"`` (``model.forward`` replaced by a
    compiled function, as Lightning compiles it) or ``"whole"``. Returns what a step calls:
    ``torch.compile(model)`` for ``"whole"``, else ``model``."""
    for index, block in enumerate(model.layers):
        if spelling == "method":
            block.compile(backend=backend)
        elif spelling == "wrapper":
            model.layers[index] = torch.compile(block, backend=backend)
    if spelling == "forward":
        model.forward = torch.compile(model.forward, backend=backend)
    return torch.compile(model, backend=backend) if spelling == "whole" else model


def dump_backend(
    path: Path, *, backend: str = "inductor", run_eagerly: bool = False, model: nn.Module | None = None, **options: Any
) -> Any:
    """A ``backend`` (``inductor`` or ``aot_eager``) dumping ``task="statistics"`` (unless
    ``options`` say otherwise) into ``path``, which is created; ``options`` are further
    ``dump_config`` fields, ``model`` the root model records are named in. ``run_eagerly``: the
    graphs inductor would compile run eagerly (``debug.run_eagerly``), for tests whose point is not
    inductor's generated code and that would otherwise wait on a C++ compile per kernel."""
    path.mkdir(parents=True, exist_ok=True)
    config = CompilerConfig(backend=backend)
    config.debug.run_eagerly = run_eagerly
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = "statistics"
    for key, value in options.items():
        setattr(config.dump_config, key, value)
    return get_backend(config, model=model)


def graph_and_eager_dumps(
    path: Path,
    compiled_model: Callable[[], nn.Module],
    eager_model: Callable[[], nn.Module],
    step: Callable[[Any], object],
    *,
    backend: str = "aot_eager",
    compile: Callable[[nn.Module, Any], Any] | None = None,
    steps: int = 1,
) -> tuple[Path, Path]:
    """``step`` run ``steps`` times on ``compiled_model()`` compiled with a statistics graph dump into
    ``path/compiled``, and as many times on ``eager_model()`` under an eager statistics dump into
    ``path/eager`` (each model built after ``torch.manual_seed(0)``): an eager-against-compiled pair.
    ``compile(model, backend)`` returns what ``step`` runs (default: the whole model compiled);
    inductor's graphs run eagerly (``dump_backend``)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = compiled_model()
    compiled = dump_backend(path / "compiled", backend=backend, run_eagerly=backend == "inductor", model=model)
    runnable = compile(model, compiled) if compile is not None else torch.compile(model, backend=compiled)
    for _ in range(steps):
        step(runnable)
    compiled.data_dump.close()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = eager_model()
    with torchdebug.Debugger(path / "eager", task="statistics") as debugger:
        for _ in range(steps):
            debugger.start(model)
            step(model)
            debugger.stop()
            debugger.step()
    return path / "compiled", path / "eager"


class Inner(nn.Module):
    """Two linear layers with a tanh between them, 8 wide (16 inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class ResidualBlock(nn.Module):
    """A block compiled one by one in the per-block tests: ``x + inner(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)
