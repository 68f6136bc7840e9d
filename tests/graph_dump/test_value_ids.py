"""Graph dump records carry value ids read off the FX graph (graph_dump/_value_ids.py, issue 46)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import torchdebug
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump._value_ids import GraphValues
from torchdebug.records import Record


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.norm(self.fc(x)).relu().t() * 2).sum()


def _records(tmp_path: Path, steps: int = 1, model: type[nn.Module] = _Block, decomposed: bool = False) -> list[Record]:
    """Statistics of every node of ``steps`` training steps (``decomposed``: inductor's graphs, run eagerly)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = CompilerConfig(backend="inductor" if decomposed else "aot_eager")
    config.debug.run_eagerly = decomposed
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.task = "statistics"
    backend = get_backend(config)
    instance = model()
    compiled = torch.compile(instance, backend=backend)
    for _ in range(steps):
        compiled(torch.randn(3, 4)).backward()
        instance.zero_grad()  # else the next step reads as a micro-batch of this one
    backend.data_dump.close()
    torch._dynamo.reset()
    return [r for r in torchdebug.load(tmp_path).ranks[0].records() if r.kind == "tensor"]


def _slot(records: list[Record], name: str, step: int = 0) -> Record:
    return next(r for r in records if r.name == name and r.step == step)


def test_an_input_slot_holds_the_value_its_producer_made(tmp_path: Path) -> None:
    records = _records(tmp_path)
    made = _slot(records, "forward/fc/aten.addmm.default#0/output.0")
    read = _slot(records, "forward/norm/aten.native_layer_norm.default#0/input.0")
    assert made.value_id is not None and (read.value_id, read.version) == (made.value_id, made.version)
    outputs = [r.value_id for r in records if r.io == "output"]
    assert len(set(outputs)) == len(outputs)  # every output a value of its own


def test_a_view_names_the_memory_it_shares(tmp_path: Path) -> None:
    records = _records(tmp_path)
    relu = _slot(records, "forward/<root>/aten.relu.default#0/output.0")
    view = _slot(records, "forward/<root>/aten.t.default#0/output.0")
    assert view.value_id != relu.value_id and view.view_of == relu.value_id
    assert _slot(records, "forward/<root>/aten.mul.Tensor#0/input.0").view_of == relu.value_id


def test_backward_inputs_the_forward_saved_hold_its_values(tmp_path: Path) -> None:
    records = _records(tmp_path, steps=2)
    for step in (0, 1):
        made = _slot(records, "forward/fc/aten.addmm.default#0/output.0", step)
        read = _slot(records, "backward/norm/aten.native_layer_norm_backward.default#0/input.1", step)
        assert read.value_id == made.value_id, step
        weight = _slot(records, "forward/fc/aten.addmm.default#0/input.1", step)
        assert _slot(records, "backward/fc/aten.mm.default#0/input.1", step).value_id == weight.value_id
    steps = [{r.value_id for r in records if r.step == step} for step in (0, 1)]
    assert not steps[0] & steps[1]  # each run's ids are its own


def test_an_op_writing_an_input_keeps_its_id_with_the_next_version() -> None:
    def write_back(x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
        buffer.copy_(x * 2)  # the mutation epilogue functionalization adds
        return buffer.view(-1).sum()

    graph = make_fx(write_back)(torch.randn(2, 2), torch.randn(2, 2)).graph
    values = GraphValues(graph)
    nodes = {node.name: node for node in graph.nodes}
    copy, buffer, view = nodes["copy_"], nodes["buffer_1"], nodes["view"]
    before, after = values.read(copy, buffer), values.made(copy, 0)
    assert before is not None and after is not None
    assert after.value_id == before.value_id and (before.version, after.version) == (0, 1)
    viewed = values.made(view, 0)
    assert viewed is not None and viewed.view_of == before.value_id and viewed.version == 1


class _Gated(nn.Module):
    """Activations the partitioner recomputes in the backward graph rather than save."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.out(torch.nn.functional.gelu(h) * torch.sigmoid(h)).sum()


@pytest.mark.parametrize(
    ("decomposed", "recomputed"),
    [(False, "aten.gelu.default"), (True, "aten.sigmoid.default"), (True, "aten.add.Tensor")],
)
def test_a_forward_node_the_backward_graph_recomputes_holds_the_forward_value(
    tmp_path: Path, decomposed: bool, recomputed: str
) -> None:
    """aot_eager's graphs recompute ``gelu``; inductor's (decomposed, run eagerly) recompute
    ``sigmoid`` and the ``add`` of gelu's decomposition (torch 2.11 through 2.14.1)."""
    records = _records(tmp_path, model=_Gated, decomposed=decomposed)
    made = _slot(records, f"forward/<root>/{recomputed}#0/output.0")
    assert not any(r.phase == "backward" and r.io == "output" and r.value_id == made.value_id for r in records)
    readers = {r.name for r in records if r.phase == "backward" and r.io == "input" and r.value_id == made.value_id}
    assert readers, f"no backward call reads the forward {recomputed}'s value"
