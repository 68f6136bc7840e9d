"""The native observer's rows, named by ``NativeStepCapture``, are the records eager capture writes
for the same step, but for what a dispatch mode itself changes in what torch runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import torchdebug
from tests.capture.native_compare import gpt_training, loss_training, on_the_dispatch_mode, without_mode
from torchdebug.capture import native_records
from torchdebug.capture.native_records import NativeStepCapture
from torchdebug.native import build
from torchdebug.native.observer import NativeObserver, load_observer
from torchdebug.records import Record

pytestmark = pytest.mark.skipif(build._cxx_compiler() is None, reason="no C++ compiler to build the observer")


@pytest.fixture(scope="module")
def observer() -> NativeObserver:
    loaded = load_observer()
    assert loaded is not None, "a C++ compiler is here: the observer must build"
    return loaded


def _compare(tmp_path, training: Callable[[], tuple[nn.Module, Callable[[], None]]], observer: NativeObserver) -> list[Record]:
    """The second step of one ``training`` (a model and its step) under eager capture
    (``task="structure"``), and of another under the native observer (tensors at the same versions);
    the native records, once checked against eager capture's: names, dtypes, shapes and ``fwd``
    equal, value ids one to one, versions equal but for values the mode summed out of place and their
    views (in place, without it, their versions move)."""
    model, step = training()
    step()
    with pytest.MonkeyPatch.context() as patch:
        on_the_dispatch_mode(patch)
        with torchdebug.dump(tmp_path, model=model, task="structure"):
            step()
    python = [record for record in torchdebug.load(tmp_path).ranks[0].records() if record.kind == "tensor"]
    model, step = training()
    step()
    capture = NativeStepCapture(observer, model)
    capture.start()
    step()
    capture.stop()
    native = [record for record in capture.records() if record.kind == "tensor"]
    expected, aliases = without_mode(python, native)
    assert [(r.name, r.dtype, r.shape, r.fwd) for r in native] == [(name, r.dtype, r.shape, fwd) for r, name, fwd in expected]
    pairs = {(aliases.get(want.value_id, want.value_id), got.value_id) for (want, _, _), got in zip(expected, native)}
    assert len({want for want, _ in pairs}) == len({got for _, got in pairs}) == len(pairs)
    summed = [want.value_id in aliases or want.view_of in aliases for want, _, _ in expected]  # or a view of one
    versions = [(want.version, got.version) for (want, _, _), got, skip in zip(expected, native, summed) if not skip]
    assert [want for want, _ in versions] == [got for _, got in versions]
    return native


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.second = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.first(x))
        h.mul_(2.0).add_(1.0)
        return self.second(self.norm(h)).sum()


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_small_models_training_step_is_named_as_eager_capture_names_it(
    tmp_path, observer: NativeObserver, micro_batches: int
) -> None:
    native = _compare(tmp_path, lambda: loss_training(_Small, width=8, micro_batches=micro_batches), observer)
    names = {record.name for record in native}
    assert "forward/norm/aten.native_layer_norm.default#0/output.2" in names
    assert "backward/<root>/aten.gelu_backward.default#0/input.0" in names
    assert "forward/<root>/aten.mul_.Tensor#0/output.0" in names
    assert "backward/first.weight/aten.detach.default#0/output.0" in names  # AccumulateGrad's: the parameter's path
    assert any(record.phase == "optimizer" and record.op == "aten.add_.Tensor" for record in native)
    accumulated = {record.name for record in native if record.module == "first.weight" and record.op == "aten.add_.Tensor"}
    assert len(accumulated) == (3 if micro_batches == 2 else 0)  # into the gradient of the first micro-batch


def test_a_closure_given_to_the_optimizer_step_runs_forward_and_backward_ops(tmp_path, observer: NativeObserver) -> None:
    def training() -> tuple[nn.Module, Callable[[], None]]:
        torch.manual_seed(0)
        model = _Small()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(3, 8)

        def closure() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            loss = model(x)
            loss.backward()
            return loss

        return model, lambda: optimizer.step(closure)

    native = _compare(tmp_path, training, observer)
    assert {record.phase for record in native if record.module == "first"} == {"forward", "backward"}
    assert {record.op for record in native if record.phase == "optimizer"} == {"aten.add_.Tensor"}


def test_the_example_gpts_training_step_is_named_as_eager_capture_names_it(tmp_path, observer: NativeObserver) -> None:
    native = _compare(tmp_path, gpt_training, observer)
    assert {record.phase for record in native} == {"forward", "backward", "optimizer"}
    assert len({record.module for record in native}) > 10


def _unshard_on_swept_storages(
    observer: NativeObserver, monkeypatch
) -> tuple[NativeStepCapture, list[int], list[int], list[int]]:
    """One captured unshard of the buffers among 16 tensors made where sweeps at every op let freed
    storages go (those whose key has bits above 48: the allocator put them where a sweep let one go):
    the capture, the 16 keys, the buffers' storage addresses and the storages of the last 16 output
    slots."""
    capture = NativeStepCapture(observer, None)
    capture.start()
    observer.sweep_after(0)  # at every op: the chain's freed storages let go, their addresses taken again
    try:
        x = torch.randn(64)
        for _ in range(24):
            x = x.neg()
        candidates = [x.neg() for _ in range(16)]
        keys = observer.keys([candidate.untyped_storage()._cdata for candidate in candidates])
        buffers = [candidate for candidate, key in zip(candidates, keys) if key >> 48]
        addresses = [buffer.untyped_storage()._cdata for buffer in buffers]
        monkeypatch.setattr(native_records, "unshard_buffers", lambda frame: buffers)
        capture._unshard()
        ops = observer.drain()
    finally:
        observer.sweep_after(-1)
        capture.stop()
        observer.forget_seen()
    outputs = [ops.slot_storage[slot] for slot in range(len(ops.slot_row)) if ops.slot_io[slot] == 1][-16:]
    return capture, keys, addresses, outputs


def test_the_storages_an_unshard_hands_out_are_named_as_the_slots_name_them(observer, monkeypatch):
    """FSDP2's copy-in notes the all-gather buffers its unshard hands out (``_unshard``), which the
    walk marks by the key its slots name their storages by: once a sweep let go of a freed
    ``StorageImpl``, another takes its address under another key (``NativeObserver.sweep_after``),
    and a buffer on it must be named by that key, not by its address. Whether the allocator puts a new
    storage where a sweep let one go is the heap's choice, so the run is tried until it did."""
    for _ in range(20):
        capture, keys, addresses, outputs = _unshard_on_swept_storages(observer, monkeypatch)
        if addresses:
            break
    else:
        pytest.fail("in 20 runs the allocator put none of 320 storages where sweeps let others go")
    named = capture._unshards[-1]
    assert [key & ((1 << 48) - 1) for key in named] == addresses
    assert named == [storage for storage, key in zip(outputs, keys) if key >> 48]  # the buffers' output slots
