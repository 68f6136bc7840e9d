"""The statistics of compiled graphs' values, taken inside the graph or by the host as the graph
runs, equal ``tensor_stats`` of the same values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import torchdebug
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump import _planner as planner
from torchdebug.stats import tensor_stats
from torchdebug.stats._schema import COUNT_KEYS


def _program(f32: torch.Tensor, f16: torch.Tensor, bf16: torch.Tensor, f64: torch.Tensor, i64: torch.Tensor, flags: torch.Tensor):
    outputs = (f32 * 2, (f32 - f32) / (f32 - f32), f16 + 1, bf16 * 3, f64 - 1, i64 * 2, flags.logical_not(), f32.sqrt())
    return (*outputs, f32.relu(), bf16.relu())  # exact zeros, floating and (i64, flags) integral


HALF_UNIT = {"float16": 2**-11, "bfloat16": 2**-8}
"""How far rounding to the dtype moves a value, at most, relative to the value (half a unit in the last place)."""


def _close(key: str, got: float | None, want: float | None, dtype: str, scale: float) -> bool:
    """Whether statistic ``key`` taken in the graph (``got``) is that of the saved tensor (``want``,
    ``scale`` its largest finite magnitude) up to rounding, whatever the values."""
    if got is None or want is None:
        return got is want
    if key in COUNT_KEYS or not math.isfinite(want):
        return got == want or math.isnan(got) and math.isnan(want)
    # inductor computes float16/bfloat16 in float32 and rounds only when it stores, so statistics
    # taken in the same kernel see the unrounded values: each element at most half a unit apart, so
    # the min, max and mean at most half a unit of the largest magnitude (not of the mean, which may
    # be near zero) and the norm half a unit of itself; and float32 sums rounded in another order
    return abs(got - want) <= (HALF_UNIT.get(dtype, 0.0) + 1e-5) * max(scale, abs(want))


@pytest.mark.parametrize("where", ["graph", "host"])
def test_dumped_statistics_match_eager_statistics_for_special_values_and_dtypes(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "graph":  # as on devices without the native kernel
        monkeypatch.setattr(planner, "_host_stats", lambda value: False)
    elif not planner._host_stats(torch.zeros(1)):
        pytest.skip("no native statistics kernel on this machine")
    config = CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.task = "tensor"
    backend = get_backend(config)
    f32 = torch.tensor([1.0, -2.0, float("nan"), float("inf"), -float("inf"), 0.5, float("nan")])
    generator = torch.Generator().manual_seed(0)
    inputs = (
        f32,
        torch.randn(64, generator=generator).half(),
        torch.randn(33, generator=generator).bfloat16(),
        torch.randn(5, 5, generator=generator, dtype=torch.float64),
        torch.arange(-3, 9),
        torch.tensor([True, False, True]),
    )
    torch.compile(_program, backend=backend)(*inputs)
    backend.data_dump.close()
    run = torchdebug.load(backend.data_dump.run_dir).ranks[0]
    records = [r for r in run.records() if r.tensor is not None]
    assert len({r.dtype for r in records}) == 6
    assert any(r.stats["nan"] == 7 for r in records)  # 0 / 0 and nan / nan: every element NaN, no values
    counted = {(r.dtype, r.stats["zeros"]) for r in records if r.io == "output"}
    assert {("float32", 2), ("int64", 1), ("bool", 2)} <= counted  # f32.relu(), i64 * 2, flags.logical_not()
    for record in records:
        want = tensor_stats(run.load_tensor(record))
        scale = max((abs(want[k]) for k in ("min", "max") if want[k] is not None and math.isfinite(want[k])), default=0.0)
        for key, value in want.items():
            assert _close(key, record.stats[key], value, record.dtype, scale), (record.name, key, record.stats, want)


def _planned(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The plan and instrumented graph of a softmax and a large product, traced with ``mode`` sizes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchdebug.graph_dump._capture import GraphCapture
    from torchdebug.graph_dump._instrument import DataDumpPass
    from torchdebug.graph_dump._planner import ModelContext
    from torchdebug.graph_dump._runtime import DUMP_GRAPH
    from torchdebug.graph_dump._settings import DumpSettings

    def fn(x: torch.Tensor, big: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        exp = (x - x.amax(-1, keepdim=True)).exp()
        return exp / exp.sum(-1, keepdim=True), (big * 2).relu()

    gm = make_fx(fn, tracing_mode=mode)(torch.randn(4, 8), torch.randn(300, 256))
    settings = DumpSettings(task="statistics", dump_path=str(tmp_path))
    capture = GraphCapture(settings)
    plans = []
    register = capture.add_graph
    monkeypatch.setattr(capture, "add_graph", lambda plan: plans.append(plan) or register(plan))
    try:
        DataDumpPass(settings, capture, ModelContext("model__0"))(gm)
    finally:
        capture.close()
    (dump,) = gm.graph.find_nodes(op="call_function", target=DUMP_GRAPH)
    return plans[0], dump


def test_symbolic_sizes_split_statistics_between_host_and_graph_as_their_traced_sizes_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dynamic shapes: small values and values inside a row loop still go to the host, the graph
    counts no values (the host knows the run's element counts), and the sizes are handed over."""
    from torchdebug.graph_dump._plan import ACCUMULATORS, SymbolicSize
    from torchdebug.native import fused_stats

    if not fused_stats.available():
        pytest.skip("the native statistics kernel cannot be built here: every value's statistics are in the graph")
    static, static_dump = _planned("fake", tmp_path / "static", monkeypatch)
    symbolic, symbolic_dump = _planned("symbolic", tmp_path / "symbolic", monkeypatch)
    in_graph = [{row for table in plan.tables for row, _ in table.entries} for plan in (static, symbolic)]
    on_host = [{row for table in plan.tables for row in table.rows} for plan in (static, symbolic)]
    assert in_graph[0] and on_host[0]  # the large product in the graph, the softmax's values on the host
    assert in_graph[1] == in_graph[0] and on_host[1] == on_host[0]
    assert all(index != ACCUMULATORS.index("valid") for table in symbolic.tables for _, index in table.entries)
    assert any(isinstance(numel, SymbolicSize) for numel in symbolic.numel)
    assert len(static_dump.args) == 3 and len(symbolic.sizes.symbols) == 4  # x: s0 x s1, big: s2 x s3
    assert [node.target for node in symbolic_dump.args[4]] == [torch.ops.aten.sym_size.int] * 4


def _mutating(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Writes its input in place: functionalisation ends the graph with ``copy_(x, x * 2)``, after
    the product read the doubled value and the step's input was read undoubled by the ``mul``."""
    x.mul_(2)
    return x @ weight


@pytest.mark.parametrize("where", ["graph", "host"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_input_the_graph_writes_in_place_is_dumped_as_the_ops_before_the_write_saw_it(
    where: str, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host reads its values a few at a time, after the last of each group, and the tensors are
    handed over at the graph's end: neither may be later than the ``copy_`` that writes the input."""
    if where == "graph":
        monkeypatch.setattr(planner, "_host_stats", lambda value: False)
    elif not planner._host_stats(torch.zeros(1)):
        pytest.skip("no native statistics kernel on this machine")
    torch._dynamo.reset()
    config = CompilerConfig(backend=backend)
    config.debug.run_eagerly = backend == "inductor"  # inductor's graph, run as the dump backend runs it
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.task = "tensor"
    compiled = get_backend(config)
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(4, 8, generator=generator), torch.randn(8, 3, generator=generator)
    before = x.clone()
    torch.compile(_mutating, backend=compiled)(x, weight)
    compiled.data_dump.close()
    torch._dynamo.reset()
    run = torchdebug.load(compiled.data_dump.run_dir).ranks[0]
    slots = {r.name: r for r in run.records() if r.kind == "tensor"}
    read = slots["forward/-/aten.mul.Tensor#0/input.0"]
    written = slots["forward/-/aten.copy_.default#0/output.0"]
    for record, value in ((read, before), (written, before * 2)):
        assert torch.equal(run.load_tensor(record), value), record.name
        want = tensor_stats(value)
        scale = max(abs(want["min"]), abs(want["max"]))
        assert all(_close(key, record.stats[key], want[key], "float32", scale) for key in want), (record.name, record.stats)
    assert slots["forward/-/aten.copy_.default#0/input.0"].stats == read.stats  # the value the write replaced
