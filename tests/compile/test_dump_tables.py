"""The statistics a dumped graph hands over: one table per device and dtype, so a graph that mixes
devices (CPU scalars beside CUDA tensors) compiles; checked on fake CUDA tensors, and end to end
where a GPU is present."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torchdebug
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump import _planner as planner
from torchdebug.graph_dump._capture import GraphCapture
from torchdebug.graph_dump._instrument import DataDumpPass
from torchdebug.graph_dump._plan import GraphPlan
from torchdebug.graph_dump._planner import ModelContext
from torchdebug.graph_dump._runtime import DUMP_GRAPH
from torchdebug.graph_dump._settings import DumpSettings


def _scaled(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x * scale).relu(), scale + 1  # scale: a CPU scalar beside a CUDA tensor


@pytest.mark.parametrize("host", [True, False], ids=["cpu-values-on-host", "every-value-in-graph"])
def test_a_graph_mixing_cuda_tensors_and_cpu_scalars_gets_one_table_per_device(
    host: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not host:  # as without the native kernel: the CPU scalars' accumulators are in the graph too
        monkeypatch.setattr(planner, "_host_stats", lambda value: False)
    with FakeTensorMode():
        x, scale = torch.empty(4, 8, device="cuda"), torch.empty((), device="cpu")
    gm = make_fx(_scaled, tracing_mode="fake")(x, scale)
    settings = DumpSettings(task="statistics", dump_path=str(tmp_path))
    capture = GraphCapture(settings)
    plans: list[GraphPlan] = []
    register = capture.add_graph
    monkeypatch.setattr(capture, "add_graph", lambda plan: plans.append(plan) or register(plan))
    try:
        DataDumpPass(settings, capture, ModelContext("model__0"))(gm)  # fake propagation raises on a mixed op
        (dump,) = gm.graph.find_nodes(op="call_function", target=DUMP_GRAPH)
        stats = [node.meta["val"] for node in dump.args[0]]
        (plan,) = plans
        tables, start = [], 0
        for table in plan.tables:
            part = stats[start : start + table.count]
            start += table.count
            assert len({(t.device, t.dtype) for t in part}) == 1
            tables.append(part[0].device.type)
        assert start == len(stats)
        assert {"cuda", "cpu"} <= set(tables)
        assert len(plan.integral) == 5  # x, scale, mul, relu, add
    finally:
        capture.close()


class _MixedDevices(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(x.shape[-1] ** -0.5)  # a CPU scalar in a CUDA graph
        return (self.fc(x) * scale).relu().sum() + scale


@pytest.mark.gpu
def test_every_node_dump_of_a_cuda_model_with_cpu_scalars_compiles_and_runs(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.task = "statistics"
    backend = get_backend(config)
    torch.manual_seed(0)
    model = _MixedDevices().cuda()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(3, 8, device="cuda")
    for _ in range(2):  # two training steps: gradients set to None between them, as the step clock asks
        compiled(x).backward()
        model.zero_grad()
    backend.data_dump.close()
    records = torchdebug.load(backend.data_dump.run_dir).ranks[0].records()
    assert {r.step for r in records} == {0, 1}
    assert {"cuda:0", "cpu"} <= {r.device for r in records if r.kind == "tensor"}
    assert all(r.stats and r.stats["nan"] == 0 for r in records if r.kind == "tensor" and r.capture_error is None)


def test_values_inside_a_softmax_row_loop_are_found_and_an_independent_value_is_not() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        exp = (x - x.amax(-1, keepdim=True)).exp()  # softmax as inductor's decomposition writes it
        return exp / exp.sum(-1, keepdim=True), y * 2

    gm = make_fx(fn)(torch.randn(4, 8), torch.randn(4, 8))
    found = {node.target.overloadpacket for node in planner._in_row_kernels(gm.graph)}
    aten = torch.ops.aten
    assert {aten.sub, aten.exp, aten.div} <= found  # x - rowmax, exp, / rowsum: one kernel over rows
    assert aten.mul not in found and aten.amax not in found
