"""A value one compiled graph hands the next keeps its id: across a graph break, between per-block
graphs, forward and backward (graph_dump/_handover.py, issue 46, item 1)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump._handover import Handover
from torchdebug.records import Record


class _Broken(nn.Module):
    """Two linear layers with a graph break between them: the second graph reads the first's output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x).relu()
        torch._dynamo.graph_break()
        return self.fc2(h).sum()


class _BrokenView(nn.Module):
    """A view of an intermediate crosses the graph break (AOT autograd makes it again outside the
    graph: another tensor over the same elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.fc(x)[:, :4]
        torch._dynamo.graph_break()
        return (first * 2).sum()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * scale


class _Blocks(nn.Module):
    """Blocks run one after the other by eager code, each compiled on its own, each reading a
    tensor the eager code made once."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.full((4,), 0.5)
        for layer in self.layers:
            x = layer(x, scale)
        return x.sum()


def _records(
    tmp_path: Path, model: nn.Module, backend_name: str, per_block: bool = False, steps: int = 2, inference: bool = False
) -> list[Record]:
    """Statistics of every node, ``steps`` training steps (``inference``: forward runs under
    ``torch.inference_mode``)."""
    torch._dynamo.reset()
    config = CompilerConfig(backend=backend_name)
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.task = "statistics"
    backend = get_backend(config, model=model)
    if per_block:
        for layer in model.layers:
            layer.compile(backend=backend)
        run = model
    else:
        run = torch.compile(model, backend=backend)
    for step in range(steps):
        torch.manual_seed(step)
        if inference:
            with torch.inference_mode():
                run(torch.randn(3, 4))
        else:
            run(torch.randn(3, 4)).backward()
            model.zero_grad()  # else the next step reads as a micro-batch of this one
    backend.data_dump.close()
    torch._dynamo.reset()
    return [r for r in torchdebug.load(tmp_path).ranks[0].records() if r.kind == "tensor"]


def _slot(records: list[Record], name: str, step: int) -> Record:
    found = [r for r in records if r.name == name and r.step == step]
    assert len(found) == 1, (name, step, len(found))
    return found[0]


def _graph(record: Record) -> str:
    return record.extra["graph"]


def _value(record: Record) -> tuple[int | None, int | None, int | None]:
    return record.value_id, record.version, record.view_of


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_a_value_crossing_a_graph_break_keeps_its_id_forward_and_backward(tmp_path: Path, backend_name: str) -> None:
    records = _records(tmp_path, _Broken(), backend_name)
    for step in (0, 1):
        made = _slot(records, "forward/<root>/aten.relu.default#0/output.0", step)
        read = _slot(records, "forward/fc2/aten.addmm.default#0/input.1", step)
        assert _graph(made) != _graph(read) and _value(read) == _value(made), step
        # the gradient of the relu's output: made by the second graph's backward, read by the first's
        gradient = _slot(records, "backward/fc2/aten.mm.default#0/output.0", step)
        readers = [r for r in records if r.step == step and r.io == "input" and r.value_id == gradient.value_id]
        assert {_graph(r) for r in readers} == {"model__0/backward"}, step
    steps = [{r.value_id for r in records if r.step == step} for step in (0, 1)]
    assert not steps[0] & steps[1]  # a value flows within its step


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_a_view_crossing_a_graph_break_keeps_its_id_and_its_memory(tmp_path: Path, backend_name: str) -> None:
    records = _records(tmp_path, _BrokenView(), backend_name)
    for step in (0, 1):
        made = _slot(records, "forward/<root>/aten.slice.Tensor#0/output.0", step)
        (read,) = [r for r in records if r.step == step and r.phase == "forward" and r.name.endswith("mul.Tensor#0/input.0")]
        assert _graph(read) != _graph(made) and _value(read) == _value(made) and made.view_of is not None, step


def test_per_block_graphs_hand_each_block_the_value_the_block_before_made(tmp_path: Path) -> None:
    torch.manual_seed(0)
    records = _records(tmp_path, _Blocks(), "aot_eager", per_block=True)
    for step in (0, 1):
        for block in (1, 2):
            made = _slot(records, f"forward/layers.{block - 1}/aten.mul.Tensor#0/output.0", step)
            read = _slot(records, f"forward/layers.{block}.fc/aten.addmm.default#0/input.1", step)
            assert (read.value_id, read.version) == (made.value_id, made.version), (step, block)
            # and back: the gradient block ``block`` makes for its input is what block ``block - 1`` reads
            gradient = _slot(records, f"backward/layers.{block}.fc/aten.mm.default#0/output.0", step)
            readers = [r for r in records if r.step == step and r.io == "input" and r.value_id == gradient.value_id]
            assert {r.module for r in readers} == {f"layers.{block - 1}"}, (step, block)


def test_a_tensor_that_several_graphs_read_holds_one_id_in_each_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    records = _records(tmp_path, _Blocks(), "aot_eager", per_block=True)
    for step in (0, 1):
        scales = {_slot(records, f"forward/layers.{block}/aten.mul.Tensor#0/input.1", step).value_id for block in range(3)}
        assert len(scales) == 1 and None not in scales, step
    assert _slot(records, "forward/layers.0/aten.mul.Tensor#0/input.1", 0).value_id not in {
        r.value_id for r in records if r.step == 1
    }


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_inference_tensors_cross_a_graph_break_with_their_id(tmp_path: Path, backend_name: str) -> None:
    """Under ``torch.inference_mode`` the tensors keep no version: the hand-over still follows them."""
    records = _records(tmp_path, _Broken(), backend_name, inference=True)
    for step in (0, 1):
        made = _slot(records, "forward/<root>/aten.relu.default#0/output.0", step)
        read = _slot(records, "forward/fc2/aten.addmm.default#0/input.1", step)
        assert _graph(made) != _graph(read) and read.value_id == made.value_id, step


def test_a_fault_in_the_hand_over_is_said_once_and_leaves_the_run_and_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(Handover, "hold", broken)
    with caplog.at_level(logging.WARNING, logger="torchdebug.graph_dump._capture"):
        records = _records(tmp_path, _Broken(), "aot_eager")
    said = [r.getMessage() for r in caplog.records if "graph to graph" in r.getMessage()]
    assert len(said) == 1 and "planted" in said[0]
    assert {r.step for r in records} == {0, 1} and _slot(
        records, "forward/fc2/aten.addmm.default#0/input.1", 1
    ).value_id is not None
