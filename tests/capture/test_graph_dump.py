"""Records from inside compiled graphs: names like eager ones, real values, filters, scenes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug
import torchdebug.store._reader
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump import find_overwrites


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)).sum()


def _backend(tmp_path: Path, backend: str = "inductor", compile_mode: str | None = None, **options: object):
    config = CompilerConfig(backend=backend, compile_mode=compile_mode)
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    for key, value in options.items():
        setattr(config.dump_config, key, value)
    return get_backend(config)


def _run(backend) -> torchdebug.store._reader.RankDump:
    backend.data_dump.close()
    return torchdebug.load(backend.data_dump.run_dir).ranks[0]


def _records(backend) -> list[torchdebug.Record]:
    return _run(backend).records()


def _train(backend, steps: int = 1) -> Net:
    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net, backend=backend)
    for step in range(steps):
        net.zero_grad()  # else a step reads as a micro-batch of the one before
        compiled(torch.randn(2, 4, generator=torch.Generator().manual_seed(step))).backward()
    return net


def test_graph_records_are_named_like_eager_records(tmp_path: Path) -> None:
    backend = _backend(tmp_path, task="statistics")
    _train(backend)
    records = _records(backend)
    names = {r.name for r in records}
    assert "forward/fc/aten.addmm.default#0/output.0" in names
    assert "forward/<root>/aten.relu.default#0/output.0" in names
    addmm = next(r for r in records if r.name == "forward/fc/aten.addmm.default#0/output.0")
    assert addmm.capture == "graph" and addmm.node == "addmm" and addmm.source.endswith("in forward")
    assert addmm.stats["nan"] == 0 and addmm.shape == [2, 3]
    backward = [r for r in records if r.phase == "backward" and r.module == "fc" and r.op == "aten.mm.default"]
    assert backward and all(r.fwd == "forward/fc/aten.addmm.default#0" for r in backward)
    manifest = json.loads((backend.data_dump.rank_dir / "manifest.json").read_text())
    assert manifest["capture"] == "graph" and manifest["config"]["task"] == "statistics"


@pytest.mark.parametrize("backend_name", ["inductor", "aot_eager"])
def test_an_inference_graphs_write_back_into_its_input_is_a_forward_op(tmp_path: Path, backend_name: str) -> None:
    """Functionalization's ``copy_`` of an in-place op's result back into a graph input: AOT autograd
    tags it ``must_be_in_backward``, which makes it a backward op only in a backward graph."""
    backend = _backend(tmp_path, backend_name, task="statistics")

    def accumulate(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        total.add_(x)
        return total.sum()

    with torch.no_grad():
        torch.compile(accumulate, backend=backend)(torch.ones(4), torch.zeros(4))
    calls = {r.call_name for r in _records(backend)}
    assert "forward/-/aten.copy_.default#0" in calls and not any(call.startswith("backward/") for call in calls)


def test_dumped_values_equal_an_eager_recomputation_forward_and_backward(tmp_path: Path) -> None:
    backend = _backend(tmp_path, task="tensor")
    net = _train(backend)
    run = _run(backend)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    by_name = {r.name: r for r in run.records()}
    linear = run.load_tensor(by_name["forward/fc/aten.addmm.default#0/output.0"])
    torch.testing.assert_close(linear, net.fc(x).detach())
    grads = [run.load_tensor(r) for r in run.records() if r.phase == "backward" and r.io == "output" and r.shape == [3, 4]]
    assert any(torch.allclose(g, net.fc.weight.grad) or torch.allclose(g.t(), net.fc.weight.grad) for g in grads)


def test_step_selects_steps(tmp_path: Path) -> None:
    backend = _backend(tmp_path, task="statistics", step="1|2")
    _train(backend, steps=4)
    assert {r.step for r in _records(backend)} == {1, 2}


def test_nodes_select_nodes_and_their_inputs(tmp_path: Path) -> None:
    backend = _backend(tmp_path, task="statistics", nodes="relu")
    _train(backend)
    records = _records(backend)
    assert {r.node for r in records} == {"relu"}
    assert {r.io for r in records} == {"input", "output"}


def test_data_mode_output_keeps_only_outputs(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "aot_eager", task="statistics", data_mode="output")
    _train(backend)
    assert {r.io for r in _records(backend)} == {"output"}


def test_scope_marks_nodes_forward_and_backward_without_a_graph_break(tmp_path: Path) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        with torchdebug.scope.data_dump():
            z = y * 3
        return z.cos().sum()

    backend = _backend(tmp_path, task="statistics")
    explained = torch._dynamo.explain(fn)(torch.randn(5, requires_grad=True))
    assert explained.graph_break_count == 0
    x = torch.randn(5, requires_grad=True)
    torch.compile(fn, backend=backend, fullgraph=True)(x).backward()
    records = _records(backend)
    assert {(r.phase, r.op) for r in records} == {("forward", "aten.mul.Tensor"), ("backward", "aten.mul.Tensor")}


def overflow_backend(tmp_path: Path):
    """A torchdebug backend running TorchAir's overflow scene (a scene file with ``dump_debug: on``)."""
    scene = tmp_path / "overflow.json"
    scene.write_text(json.dumps({"dump": {"dump_path": str(tmp_path), "dump_debug": "on"}}))
    config = CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_config_path = str(scene)
    return get_backend(config)


def test_overflow_scene_names_the_first_nan_in_a_backward_graph(tmp_path: Path) -> None:
    backend = overflow_backend(tmp_path)
    x = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
    torch.compile(lambda t: t.sqrt().sum(), backend=backend)(x).backward()  # d sqrt(0) = inf
    first = backend.data_dump.overflows[0]
    assert first.name.startswith("backward/") and first.inf >= 1 and first.source.endswith("in <lambda>")
    records = _records(backend)
    assert records and all(r.phase == "backward" for r in records)


@torch.library.custom_op("torchdebug_test::stomp", mutates_args=())
def _stomp(x: torch.Tensor, victim: torch.Tensor) -> torch.Tensor:
    victim.zero_()  # an undeclared write into memory the op does not own: the bug to catch
    return x + 1


@_stomp.register_fake
def _stomp_fake(x: torch.Tensor, victim: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_watcher_catches_a_buffer_overwritten_after_it_was_produced(tmp_path: Path) -> None:
    def fn(a: torch.Tensor) -> torch.Tensor:
        c = a * 2
        d = torch.ops.torchdebug_test.stomp(a, c)
        return d + c

    probe = tmp_path / "probe"
    probe.mkdir()
    backend = _backend(probe, "aot_eager")
    torch.compile(fn, backend=backend)(torch.ones(4))
    names = {r.node: r.name for r in _records(backend)}
    torch._dynamo.reset()
    scene = tmp_path / "watch.json"
    scene.write_text(
        json.dumps(
            {
                "dump": {
                    "dump_path": str(tmp_path),
                    "dump_scene": "watcher",
                    "dump_mode": "output",
                    "dump_list": [{"layer": ["stomp"], "watcher_nodes": ["mul"]}],
                }
            }
        )
    )
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    config.dump_config.dump_config_path = str(scene)
    backend = get_backend(config)
    torch.compile(fn, backend=backend)(torch.ones(4))
    overwrites = find_overwrites(_records(backend))
    assert [(o.name, o.before, o.after) for o in overwrites] == [(names["mul"].rsplit("/", 1)[0] + "/output.0", "mul", "stomp")]


def test_original_stage_interprets_the_graph_before_the_passes(tmp_path: Path) -> None:
    backend = _backend(tmp_path, task="tensor", dump_stage="original")
    net = _train(backend)
    run = _run(backend)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    record = next(r for r in run.records() if r.name == "forward/fc/aten.addmm.default#0/output.0")
    torch.testing.assert_close(run.load_tensor(record), net.fc(x).detach())


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_the_original_stage_leaves_an_input_the_graph_writes_as_the_program_had_it(tmp_path: Path, backend_name: str) -> None:
    """The interpreter runs the graph before the compiled graph does, on the same inputs: it writes a
    copy of an input the graph writes in place, or the compiled graph would read it written twice."""

    def double_then_project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x @ weight

    torch._dynamo.reset()
    backend = _backend(tmp_path, backend=backend_name, task="tensor", dump_stage="original")
    x, weight = torch.ones(4, 8), torch.ones(8, 3)
    out = torch.compile(double_then_project, backend=backend)(x, weight)
    run = _run(backend)
    torch._dynamo.reset()
    assert torch.equal(x, torch.full((4, 8), 2.0)) and torch.equal(out, torch.full((4, 3), 16.0))
    slots = {r.name: r for r in run.records()}
    assert torch.equal(run.load_tensor(slots["forward/-/aten.mul.Tensor#0/input.0"]), torch.ones(4, 8))
    assert torch.equal(run.load_tensor(slots["forward/-/aten.copy_.default#0/output.0"]), torch.full((4, 8), 2.0))


@pytest.mark.gpu
def test_dumps_keep_working_under_reduce_overhead_on_cuda(tmp_path: Path) -> None:
    backend = _backend(tmp_path, compile_mode="reduce-overhead", task="statistics")
    torch.manual_seed(0)
    net = Net().cuda()
    compiled = torch.compile(net, backend=backend)
    x = torch.randn(2, 4, device="cuda")
    for _ in range(3):  # warm-up, record, replay
        net.zero_grad(set_to_none=True)  # as a training loop does: a replay overwrites the last gradients
        compiled(x).backward()
    # inductor decomposes the linear into mm and add on CUDA (addmm on the CPU): fc's last output
    records = [r for r in _records(backend) if r.name == "forward/fc/aten.add.Tensor#0/output.0"]
    expected = net.fc(x).detach()
    assert [r.step for r in records] == [0, 1, 2]
    assert all(abs(r.stats["mean"] - expected.mean().item()) < 1e-5 for r in records)


def test_a_backward_traced_by_compiled_autograd_is_dumped_with_a_warning_that_it_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Compiled autograd hands the whole backward to the backend as one more graph to compile: the
    dump says that it records it as a forward graph, once a process (docs/graph_dump.md, "Limits")."""
    from torchdebug.graph_dump import _instrument

    _instrument._warn_compiled_autograd.cache_clear()
    torch._dynamo.reset()
    backend = _backend(tmp_path, backend="aot_eager", task="statistics")
    torch.manual_seed(0)
    net = Net()
    loss = torch.compile(net, backend=backend)(torch.randn(2, 4, generator=torch.Generator().manual_seed(0)))
    with caplog.at_level("WARNING", logger="torchdebug.graph_dump._instrument"):
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend)):
            loss.backward()
    records = _records(backend)
    torch._dynamo.reset()
    warned = [r.getMessage() for r in caplog.records if "compiled autograd" in r.getMessage()]
    assert len(warned) == 1 and "phase forward in module '-'" in warned[0]
    traced = {(r.phase, r.module) for r in records if r.extra["graph"] != "model__0/forward"}  # compiled autograd's
    assert net.fc.weight.grad is not None and traced == {("forward", "-")}
