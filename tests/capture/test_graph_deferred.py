"""Graph dumps read their statistics once per flush, never once per graph run: the path a GPU takes,
run here on the CPU by making the session's staging defer CPU results as it defers device ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo

import torchdebug
from tests.backends import dump_backend
from tests.capture.test_graph_dump import overflow_backend
from torchdebug import stats_table
from torchdebug._torch.dispatch import TorchDispatchMode
from torchdebug.graph_dump import _planner as planner


@pytest.fixture(autouse=True)
def deferred(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Staging as on a GPU (delivered at the next flush) and every statistic in the graph."""
    monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    monkeypatch.setattr(planner, "_host_stats", lambda value: False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _one_graph(x: torch.Tensor) -> torch.Tensor:
    return ((x * 2).sin() + 1).cos().sum()


def _three_graphs(x: torch.Tensor) -> torch.Tensor:
    y = (x * 2).sin()
    torch._dynamo.graph_break()
    z = (y + 1).cos()
    torch._dynamo.graph_break()
    return (z * z).sum()


class _HostReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` (``.item()``) and, with ``tolist`` patched, host reads."""

    def __init__(self) -> None:
        super().__init__()
        self.scalars = 0
        self.reads = 0

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # the compiled functions stay compiled under the mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalars += 1
        return func(*args, **(kwargs or {}))


def _host_reads(
    fn: Callable[[torch.Tensor], torch.Tensor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: object
) -> tuple[int, int, list]:
    """Run 5 steps of ``fn`` after a compiling one; returns (``.item()`` calls, host reads, records)."""
    tmp_path.mkdir()
    backend = dump_backend(tmp_path, **options)
    compiled = torch.compile(fn, backend=backend)
    compiled(torch.randn(256))
    counter = _HostReads()
    tolist = torch.Tensor.tolist

    def counting_tolist(self: torch.Tensor) -> list:
        counter.reads += 1
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    with counter:
        for step in range(1, 6):
            compiled(torch.randn(256, generator=torch.Generator().manual_seed(step)))
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    backend.data_dump.close()
    return counter.scalars, counter.reads, torchdebug.load(backend.data_dump.run_dir).ranks[0].records()


def test_host_reads_per_step_do_not_grow_with_graph_runs_or_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _host_reads(_one_graph, tmp_path / "one", monkeypatch)
    three = _host_reads(_three_graphs, tmp_path / "three", monkeypatch)
    assert one[0] == three[0] == 0  # no .item()
    # one read per flush (a step) and table dtype (int32 counts, float32 min/max/sum, float64 squares)
    assert one[1] == three[1] <= 5 * 3
    for records in (one[2], three[2]):
        assert {r.step for r in records} == set(range(6))
        tensors = [r for r in records if r.kind == "tensor"]
        assert tensors and all(set(r.stats) >= {"min", "max", "mean", "norm", "nan"} for r in tensors)


def test_original_stage_statistics_are_read_once_per_flush_not_per_graph_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _host_reads(_one_graph, tmp_path / "one", monkeypatch, dump_stage="original")
    three = _host_reads(_three_graphs, tmp_path / "three", monkeypatch, dump_stage="original")
    assert one[0] == three[0] == 0  # no .item()
    assert one[1] == three[1] <= 5  # one table read per step, however many graphs and values
    tensors = [r for r in three[2] if r.kind == "tensor"]
    assert tensors and all(r.stats and r.stats["norm"] is not None for r in tensors if r.shape)


def test_deferred_statistics_equal_eager_statistics(tmp_path: Path) -> None:
    backend = dump_backend(tmp_path, task="tensor")
    x = torch.tensor([1.0, -2.0, float("nan"), float("inf"), -float("inf"), 0.5] * 4)
    torch.compile(lambda t: (t * 3, (t - t) / (t - t)), backend=backend)(x)
    backend.data_dump.close()
    run = torchdebug.load(backend.data_dump.run_dir).ranks[0]
    records = [r for r in run.records() if r.tensor is not None]
    assert len(records) >= 3
    for record in records:
        assert record.stats == pytest.approx(torchdebug.stats.tensor_stats(run.load_tensor(record)), nan_ok=True)


def test_overflow_scene_decides_at_the_flush_and_records_only_overflowing_calls(tmp_path: Path) -> None:
    backend = overflow_backend(tmp_path)
    compiled = torch.compile(lambda t: (t.exp() * 2).log().sum(), backend=backend)
    compiled(torch.tensor([1.0, 2.0, 100.0]))  # exp(100) overflows float32
    assert backend.data_dump.overflows == []  # the statistics have not been read yet
    backend.data_dump.flush()
    first = backend.data_dump.overflows[0]
    assert first.name == "forward/-/aten.exp.default#0" and first.inf == 1
    backend.data_dump.close()
    records = torchdebug.load(backend.data_dump.run_dir).ranks[0].records()
    assert records and {r.op for r in records} <= {"aten.exp.default", "aten.mul.Tensor", "aten.log.default", "aten.sum.default"}
    assert all(r.io == "input" or r.stats["posinf"] + r.stats["nan"] > 0 for r in records if r.kind == "tensor")


@pytest.mark.gpu
@pytest.mark.parametrize("dump_stage", ["optimized", "original"])
def test_a_compiled_cuda_graph_dump_never_synchronises_with_the_host(tmp_path: Path, dump_stage: str) -> None:
    backend = dump_backend(tmp_path, dump_stage=dump_stage)
    compiled = torch.compile(_three_graphs, backend=backend)
    x = torch.randn(4096, device="cuda")
    compiled(x)  # compiles (inductor may synchronise while it benchmarks)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            compiled(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    backend.data_dump.close()
    records = torchdebug.load(backend.data_dump.run_dir).ranks[0].records()
    tensors = [r for r in records if r.kind == "tensor" and r.shape]
    assert {r.step for r in records} == set(range(4))
    assert tensors and all(r.stats["norm"] is not None for r in tensors)
