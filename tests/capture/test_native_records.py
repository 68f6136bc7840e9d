"""The native observer's rows, named by ``NativeStepCapture``, are the records eager capture writes
for the same step, but for what a dispatch mode itself changes in what torch runs."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from itertools import groupby

import pytest
import torch
from torch import nn

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from torchdebug.capture.native_records import NativeStepCapture, OpSlotNames
from torchdebug.native import build
from torchdebug.native.observer import NativeObserver, load_observer
from torchdebug.records import Record, make_name

pytestmark = pytest.mark.skipif(build._cxx_compiler() is None, reason="no C++ compiler to build the observer")


@pytest.fixture(scope="module")
def observer() -> NativeObserver:
    loaded = load_observer()
    assert loaded is not None, "a C++ compiler is here: the observer must build"
    return loaded


_DETACH, _VIEW, _RESHAPE_ALIAS = "aten.detach.default", "aten.view.default", "aten._reshape_alias.default"
_ADD, _ADD_ = "aten.add.Tensor", "aten.add_.Tensor"
_MODE_ONLY_CALLS = {_DETACH}
"""Calls only a dispatch mode makes: the ``detach`` autograd saves an output through, the one it
unpacks it through, and ``AccumulateGrad``'s of a gradient summed out of place (``docs/architecture.md``,
the native observer)."""
_MODE_RENAMES = {_VIEW: _RESHAPE_ALIAS, _ADD: _ADD_}
"""Ops a dispatch mode runs in place of others, in the backward: ``reshape``'s backward takes ``view`` for
``_reshape_alias``; gradients summed in the engine's input buffer are added out of place."""


def _calls(records: list[Record]) -> list[list[Record]]:
    return [list(call) for _, call in groupby(records, key=lambda record: record.call_name)]


def _without_mode(python: list[Record], native: list[Record]) -> tuple[list[tuple[Record, str, str]], dict[int, int]]:
    """Eager capture's tensor records with the mode's own calls undone by the rule above, as
    ``(record, name, fwd)``: the name and ``fwd`` it would have had without them (calls renumbered);
    and the value ids that name, without the mode, another tensor: a mode-only ``detach``'s output is
    its input, an out-of-place gradient sum's output the buffer summed into in place. Fails on any
    other difference in the calls' order."""
    calls = _calls(python)
    want_ops, got_ops = [call[0].op for call in calls], [call[0].op for call in _calls(native)]
    kept: list[tuple[list[Record], str]] = []
    aliases: dict[int, int] = {}
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, want_ops, got_ops, autojunk=False).get_opcodes():
        if tag == "equal":
            kept += [(call, call[0].op) for call in calls[a0:a1]]
            continue
        real = [call for call in calls[a0:a1] if call[0].op not in _MODE_ONLY_CALLS]
        ops = [_MODE_RENAMES.get(call[0].op) if call[0].phase == "backward" else None for call in real]
        if ops != got_ops[b0:b1]:
            raise AssertionError(f"{tag}: eager {want_ops[a0:a1]} against native {got_ops[b0:b1]}")
        kept += zip(real, ops)
        for call in calls[a0:a1]:
            if call[0].op in _MODE_ONLY_CALLS or call[0].op == _ADD:
                source = next(r.value_id for r in call if r.io == "input" and r.arg == "0")
                aliases |= {r.value_id: aliases.get(source, source) for r in call if r.io == "output"}
    counts: dict[tuple[str, str, str], int] = {}
    renamed: dict[str, tuple[str, int]] = {}
    """By call name: the op and call index without the mode."""
    for call, op in kept:
        key = (call[0].phase, call[0].module, op)
        renamed[call[0].call_name] = (op, counts.get(key, 0))
        counts[key] = renamed[call[0].call_name][1] + 1
    new_names = {name: f"{name.rpartition('/')[0]}/{op}#{index}" for name, (op, index) in renamed.items()}
    expected = [
        (r, make_name(r.phase, r.module, *renamed[r.call_name], r.io, r.arg), new_names.get(r.fwd))
        for call, _ in kept
        for r in call
    ]
    return expected, aliases


def _compare(tmp_path, training: Callable[[], tuple[nn.Module, Callable[[], None]]], observer: NativeObserver) -> list[Record]:
    """The second step of one ``training`` (a model and its step) under eager capture
    (``task="structure"``), and of another under the native observer (tensors at the same versions);
    the native records, once checked against eager capture's: names, dtypes, shapes and ``fwd``
    equal, value ids one to one, versions equal but for values the mode summed out of place and their
    views (in place, without it, their versions move)."""
    model, step = training()
    step()
    with torchdebug.dump(tmp_path, model=model, task="structure"):
        step()
    python = [record for record in torchdebug.load(tmp_path).ranks[0].records() if record.kind == "tensor"]
    model, step = training()
    step()
    capture = NativeStepCapture(observer, model)
    capture.start()
    step()
    capture.stop()
    native = capture.records()
    expected, aliases = _without_mode(python, native)
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


def _small_training(micro_batches: int) -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = _Small()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 8)

    def step() -> None:
        for _ in range(micro_batches):
            model(x).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_small_models_training_step_is_named_as_eager_capture_names_it(
    tmp_path, observer: NativeObserver, micro_batches: int
) -> None:
    native = _compare(tmp_path, lambda: _small_training(micro_batches), observer)
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


def _gpt_training() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(config, batch=2)
    return model, lambda: train_step(model, optimizer, batch)


def test_the_example_gpts_training_step_is_named_as_eager_capture_names_it(tmp_path, observer: NativeObserver) -> None:
    native = _compare(tmp_path, _gpt_training, observer)
    assert {record.phase for record in native} == {"forward", "backward", "optimizer"}
    assert len({record.module for record in native}) > 10


def test_slots_are_named_from_the_schema_as_a_dispatch_mode_names_them() -> None:
    split = OpSlotNames.of("aten.split.Tensor")
    assert (split.slot(0, 0, -1), split.slot(1, 0, 2)) == ("0", "2")  # one list result: its elements
    cat = OpSlotNames.of("aten.cat.default")
    assert cat.slot(0, 0, 1) == "0.1"
    add_out = OpSlotNames.of("aten.add.out")
    assert (add_out.slot(0, 3, -1), add_out.mutable) == ("out", True)  # keyword-only: its name
    layer_norm = OpSlotNames.of("aten.native_layer_norm.default")
    assert layer_norm.slot(1, 2, -1) == "2"
