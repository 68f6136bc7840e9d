"""A BatchNorm model's eager dump against its compiled dump: the running statistics line up.

BatchNorm's kernel writes the running statistics in place in training, and torch moves no version
for it; the compiled graph's functional form reads the old statistics and returns the new ones. The
eager forward's read pairs with the graph's input, and the backward's read of the new statistics
with the graph's output (``CaptureSession.wrote``: the write counts in the version)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))


def _train(model: nn.Module, steps: int, debugger: torchdebug.Debugger | None = None) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(4, 3, 6, 6), torch.randint(0, 4, (4,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        if debugger is not None:
            debugger.start(model)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_a_batch_norm_models_compiled_step_has_no_error_against_its_eager_step(tmp_path: Path, monkeypatch, native: str) -> None:
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    with torchdebug.Debugger(tmp_path / "eager", task="statistics", step=[1]) as debugger:
        _train(_model(), 2, debugger)
    torch._dynamo.reset()
    config = torchdebug.CompilerConfig()
    config.backend = "aot_eager"
    (tmp_path / "graph").mkdir()
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path / "graph")
    config.dump_config.task = "statistics"
    config.dump_config.step = "1"
    model = _model()
    backend = torchdebug.get_backend(config, model=model)
    _train(torch.compile(model, backend=backend), 2)
    backend.data_dump.close()
    torch._dynamo.reset()
    result = torchdebug.compare(tmp_path / "graph", tmp_path / "eager")
    assert result.counts()["error"] == 0 and result.first_divergence is None, result.summary()
    rows = {row.name: row for row in result.rows}
    read = rows["forward/1/aten.native_batch_norm.default#0/input.3"]
    assert read.record_a.name == "forward/1/aten._native_batch_norm_legit_functional.default#0/input.3"
    assert read.verdict == "pass"
    counter = next(row for row in result.rows if row.name_b == "forward/1/aten.add_.Tensor#0/input.0")  # num_batches_tracked
    assert counter.record_b.stats is not None and counter.verdict == "pass", counter.message
