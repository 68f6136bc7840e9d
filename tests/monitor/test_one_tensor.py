"""A module's one output in one native call of its own: the same bits as the general path, read as the call returns."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import torchdebug
from torchdebug.monitor import _watch
from torchdebug.monitor._native import ring_sums
from torchdebug.monitor._one_tensor import cpu_sums_one_into
from torchdebug.monitor._ring import Ring
from torchdebug.stats._cpu import cpu_sums_into
from torchdebug.stats._schema import IDENTITY, STAT_KEYS, WIDTH


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


class _CountedNative:
    """The native module (:mod:`~torchdebug.monitor._native`), noting the shape of each output it
    takes and whether it took each list."""

    def __init__(self, native: Any, calls: list) -> None:
        self.native, self.calls = native, calls
        self.lists: list[bool] = []

    def output_sums(self, tensor: torch.Tensor, *where: Any) -> bool:
        taken = self.native.output_sums(tensor, *where)
        if taken:
            self.calls.append(tensor.shape)
        return taken

    def group_sums(self, *arguments: Any) -> bool:
        self.lists.append(self.native.group_sums(*arguments))
        return self.lists[-1]


def _train(tmp_path: Path, general: bool, monkeypatch: pytest.MonkeyPatch, native: Any = None):  # noqa: ANN202
    """``general``: every output through the general path; ``native``: the native module the watcher
    uses (``None``: none, the Python path)."""
    monkeypatch.setattr(_watch, "ring_sums", lambda: native)
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
    _, general_slots, general_rows = _train(tmp_path / "general", general=True, monkeypatch=monkeypatch)
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


def test_the_native_path_fills_the_ring_as_the_python_path_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Module outputs, gradients and parameters through one native call each (an output) or a list
    (``ring_sums.cpp``): the same slots, dtypes, shapes and bits as the Python path, each output read as
    its module returned it, one passed on unchanged read once; the outputs it leaves alone
    (transposed, a tuple) go the Python way."""
    native = ring_sums()
    if native is None:
        pytest.skip("the native module cannot be built here")
    taken: list = []
    counted = _CountedNative(native, taken)
    _, slots, rows = _train(tmp_path, general=False, monkeypatch=monkeypatch, native=counted)
    assert len(counted.lists) >= 2 * 3 and all(counted.lists)  # each step's gradients and parameters
    # a step: inner.0, inner (inner.0's output again: a copy of its sums), fc, act (fc's output changed
    # in place since), proj and the model's output; not transposed (not contiguous), nor pair's tuple;
    # from the second step on (the first finds the slots)
    assert taken == ([torch.Size([4, 8])] * 5 + [torch.Size([])]) * 2
    _, python_slots, python_rows = _train(tmp_path / "python", general=False, monkeypatch=monkeypatch)
    assert slots == python_slots
    for row, python_row in zip(rows, python_rows):
        assert np.array_equal(row, python_row, equal_nan=True)


def test_the_native_path_leaves_a_list_with_a_tensor_it_does_not_take_to_python() -> None:
    """A list of tensors is taken whole or not at all: one it does not take (float16, transposed, a
    subclass) leaves every slot unwritten and undescribed, for the Python path."""
    native = ring_sums()
    if native is None:
        pytest.skip("the native module cannot be built here")
    ring = Ring(2)
    ring.begin(0)
    indices = [ring.slot("optimizer", "m", "module", 0, "parameter", str(i)) for i in range(3)]
    slots = [ring.slots[i] for i in indices]
    plain = [torch.randn(3, 2), torch.randn(4, dtype=torch.float64), torch.empty(0)]
    for odd in (torch.randn(2).half(), torch.randn(2, 3).t(), nn.Parameter(torch.randn(2)).as_subclass(_Marked)):
        assert not native.group_sums([*plain[:2], odd], slots, indices, *ring.rows(0))
        assert [slot.shape for slot in slots] == [(), (), ()] and np.isnan(ring.sums[0, :3]).all()
    assert native.group_sums(plain, slots, indices, *ring.rows(0))
    assert [(slot.dtype, slot.shape) for slot in slots] == [("float32", (3, 2)), ("float64", (4,)), ("float32", (0,))]
    out = (ctypes.c_double * WIDTH)()
    cpu_sums_into(plain[1], ctypes.addressof(out))
    assert np.array_equal(ring.sums[0, 1], list(out)) and list(ring.numel[0, :3]) == [6, 4, 0]
    assert tuple(ring.sums[0, 2]) == IDENTITY


class _Marked(torch.Tensor):
    """A tensor subclass: never handed to native code."""


@pytest.mark.parametrize("path", ["native", "python"])
def test_outputs_made_under_inference_mode_are_read_as_their_module_returned_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A model left in train mode run under ``torch.inference_mode`` (a quick evaluation): its outputs
    keep no version counter, so none is taken for a read before; each is read as its module returned
    it (the linear's before the in-place ReLU wrote it), on the native call and the Python path. The
    native call read the version and aborted the process; the Python path raised into the loop."""
    if path == "python":
        monkeypatch.setattr(_watch, "ring_sums", lambda: None)
    elif ring_sums() is None:
        pytest.skip("the native module cannot be built here")
    torchdebug.seed_all(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.Monitor(model, optimizer, dump_path=tmp_path, window=4, replay="off") as monitor:
        for step in range(3):
            with torch.inference_mode():
                loss = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(step))).sum()
            monitor.step(loss=loss)
    index = {slot.name: i for i, slot in enumerate(monitor.ring.slots)}
    for step in range(3):
        minimum = monitor.ring.row(step)[:, STAT_KEYS.index("min")]
        assert minimum[index["forward/0/module#0/output.0"]] < 0 and minimum[index["forward/1/module#0/output.0"]] == 0
