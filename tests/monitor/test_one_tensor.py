"""A module's one output in one native call of its own: the same bits as the general path, read as the call returns."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchdebug
from torchdebug.monitor import _watch
from torchdebug.monitor._one_tensor import cpu_sums_one_into
from torchdebug.stats._cpu import cpu_sums_into
from torchdebug.stats._schema import STAT_KEYS, WIDTH


def _sums(write, tensor: torch.Tensor) -> list[float]:  # noqa: ANN001
    out = (ctypes.c_double * WIDTH)()
    write(tensor, ctypes.addressof(out))
    return list(out)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(8, 128, 32),
        torch.randn(64, 3).to(torch.bfloat16),
        torch.randn(5, 7, dtype=torch.float64),
        torch.randn(6, 10).t(),  # not contiguous: the general path walks its layout
        torch.randn(9).half(),  # a dtype the kernel does not take
        torch.tensor([1.0, float("nan"), -float("inf"), 3.0]),
    ],
    ids=["float32", "bfloat16", "float64", "transposed", "float16", "nonfinite"],
)
def test_one_tensor_sums_are_the_general_paths_bits(tensor: torch.Tensor) -> None:
    assert np.array_equal(_sums(cpu_sums_one_into, tensor), _sums(cpu_sums_into, tensor), equal_nan=True)


class _Transposed(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t()


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.to(torch.bfloat16), x.new_empty(0)


class _Outputs(nn.Module):
    """Outputs the fast path takes and those it leaves to the general one: a child's output passed on
    unchanged (one tensor, two slots), one changed in place after its module returned (by an
    in-place ReLU module, then by the parent's own code), a transposed one, a tuple of a bfloat16
    tensor and an empty one."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8))
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.proj = nn.Linear(8, 8)
        self.transposed = _Transposed()
        self.pair = _Pair()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inner(x)
        y = self.proj(self.act(self.fc(x)))
        y += 1  # the parent's own code changes proj's output in place
        low, _ = self.pair(self.transposed(y))
        return low.float().sum() + x.sum()


def _train(tmp_path: Path, general: bool, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202
    if general:
        monkeypatch.setattr(_watch.Watcher, "_add_output", lambda self, name, call, tensor: False)
    torchdebug.seed_all(0)
    model = _Outputs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.Monitor(model, optimizer, dump_path=tmp_path / str(general), window=4, replay="off") as monitor:
        for step in range(3):
            optimizer.zero_grad()
            loss = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(step)))
            loss.backward()
            optimizer.step()
            monitor.step(loss=loss)
    monkeypatch.undo()
    slots = [(slot.name, slot.dtype, slot.shape) for slot in monitor.ring.slots]
    return monitor, slots, [monitor.ring.row(step).copy() for step in range(3)]


def test_module_outputs_in_a_native_call_each_fill_the_ring_as_the_general_path_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module's one plain floating CPU tensor takes a native call of its own, its slot found by
    module and call: the ring holds the same slots, dtypes, shapes and bits as when every output
    goes through the general path; each output is read as its module returned it (before an
    in-place module or the parent's code change it), and one passed on unchanged is read once."""
    calls = []
    one = _watch.cpu_sums_one_into

    def spy(tensor: torch.Tensor, address: int) -> None:
        calls.append(tensor.shape)
        one(tensor, address)

    monkeypatch.setattr(_watch, "cpu_sums_one_into", spy)
    monitor, slots, rows = _train(tmp_path, general=False, monkeypatch=monkeypatch)
    # a step: inner.0, fc, act (fc's output changed in place since), proj, transposed and the model's output;
    # not inner (inner.0's output again), nor pair's tuple
    assert len(calls) == 3 * 6
    _, general_slots, general_rows = _train(tmp_path, general=True, monkeypatch=monkeypatch)
    assert slots == general_slots
    for row, general_row in zip(rows, general_rows):
        assert np.array_equal(row, general_row, equal_nan=True)
    index = {name: i for i, (name, _, _) in enumerate(slots)}
    minimum = list(monitor.ring.row(0)[:, STAT_KEYS.index("min")])
    assert minimum[index["forward/fc/module#0/output.0"]] < 0  # before the ReLU ran on it
    assert minimum[index["forward/act/module#0/output.0"]] == 0
    transposed = minimum[index["forward/transposed/module#0/output.0"]]
    assert transposed == pytest.approx(minimum[index["forward/proj/module#0/output.0"]] + 1)  # proj's: before the parent added 1
    inner = rows[0][index["forward/inner/module#0/output.0"]]
    assert np.array_equal(inner, rows[0][index["forward/inner.0/module#0/output.0"]], equal_nan=True)
    assert ("forward/pair/module#0/output.1", "float32", (0,)) in slots
