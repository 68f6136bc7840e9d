"""Levels ``mix`` and ``module`` on the native path (``capture/native_modules.py``): module records
beside the op records (or alone), record by record as the dispatch mode (or Python's
``ModuleRecorder``) writes them: names, statistics, fingerprints, value ids shared with the ops'
slots, and the order of the step (the dump's and ``seq``'s)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import torchdebug
from tests.capture.native_compare import gpt_training, loss_training, without_mode
from tests.capture.test_native_capture import (
    Training,
    _accumulating_training,
    _assert_same_dumps,
    _checkpointed_training,
    _compiled_gpt,
    _dump,
    _hf_training,
    _hooked_training,
    _less_common_training,
    _quantized_training,
)
from torchdebug.capture import native_modules
from torchdebug.records import MODULE_OP, Record


def _assert_same_order(python: list[Record], native: list[Record]) -> None:
    """Each step's calls numbered in the same order on both paths (``seq``: the dispatch mode's also
    counts the calls of its own it leaves out)."""
    for step in sorted({record.step for record in native}):
        got = [record for record in native if record.step == step]
        expected, _ = without_mode([record for record in python if record.step == step], got)
        pairs = sorted({(want.seq, record.seq) for (want, _, _), record in zip(expected, got)})
        assert len({want for want, _ in pairs}) == len({seq for _, seq in pairs}) == len(pairs)
        assert [seq for _, seq in pairs] == sorted(seq for _, seq in pairs)


def _assert_mixed(python: list[Record], native: list[Record], joins: bool = False) -> None:
    """The same records, in the same order; module records among the op records, sharing their
    value ids (``joins``: as ``_assert_same_dumps``'s, for filtered dumps)."""
    _assert_same_dumps(python, native, joins)
    _assert_same_order(python, native)
    modules = [record for record in native if record.op == MODULE_OP]
    assert modules and len(modules) < len(native)
    # a module's tensors are the values its ops read and made: one value id in both records
    ops = {record.value_id for record in native if record.op != MODULE_OP}
    assert any(record.value_id in ops for record in modules)


@pytest.mark.parametrize(
    ("training", "options"),
    [
        (gpt_training, {"task": "structure"}),
        (gpt_training, {"task": "statistics", "checksum": True}),
        (gpt_training, {"task": "checksum"}),
        (gpt_training, {"task": "statistics", "data_mode": ["forward"]}),
        (gpt_training, {"task": "statistics", "data_mode": ["backward", "input"]}),
        (gpt_training, {"task": "checksum", "data_mode": ["output"]}),
        (_checkpointed_training("non_reentrant"), {"task": "statistics"}),
        (_checkpointed_training("reentrant"), {"task": "statistics", "checksum": True}),
        (_checkpointed_training("selective"), {"task": "structure"}),
        (_hf_training("llama", checkpointing="non-reentrant"), {"task": "statistics"}),
        (_hf_training("gpt2", autocast=True), {"task": "statistics", "checksum": True}),
        (_quantized_training, {"task": "statistics", "checksum": True}),
        (_hooked_training, {"task": "statistics"}),
        (_less_common_training, {"task": "statistics"}),
        (_accumulating_training, {"task": "statistics", "checksum": True}),
    ],
    ids=[
        "gpt-structure",
        "gpt-statistics+checksum",
        "gpt-checksum",
        "gpt-forward",
        "gpt-backward-inputs",
        "gpt-outputs",
        "non_reentrant",
        "reentrant",
        "selective",
        "llama-checkpointed",
        "gpt2-autocast",
        "quantized",
        "own-hooks",
        "less-common",
        "accumulating",
    ],
)
def test_module_and_op_records_are_the_same_on_both_paths(tmp_path, monkeypatch, caplog, training: Training, options: dict):
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, level="mix", **options)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, level="mix", **options)
    _assert_mixed(python, native, joins="data_mode" in options)


class _Gate(nn.Module):
    """A module called with numbers, flags and ``None`` beside its tensor, returning some too."""

    def forward(self, x: torch.Tensor, scale: float, mask: torch.Tensor | None = None, *, flag: bool = False) -> tuple:
        return x * scale, None, 3, flag


class _Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = _Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _, _, _ = self.gate(self.fc(x), 0.5, None, flag=True)
        return y.sum()


def test_a_module_calls_values_are_among_its_tensors_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """A module call's non-tensor arguments and results are value records, in their places among
    the call's tensor records, as the dispatch mode writes them."""
    python = _dump(tmp_path, monkeypatch, caplog, lambda: loss_training(_Gated), native=False, kind="any", level="mix")
    native = _dump(tmp_path, monkeypatch, caplog, lambda: loss_training(_Gated), native=True, kind="any", level="mix")
    modules = [(r.name, r.kind, repr(r.value), r.dtype, r.seq) for r in native if r.op == MODULE_OP]
    assert modules == [(r.name, r.kind, repr(r.value), r.dtype, r.seq) for r in python if r.op == MODULE_OP]
    gate = {(r.io, r.arg): r.value for r in native if r.module == "gate" and r.kind == "value" and r.step == 0}
    assert gate == {
        ("input", "1"): 0.5,
        ("input", "2"): None,
        ("input", "flag"): True,
        ("output", "1"): None,
        ("output", "2"): 3,
        ("output", "3"): True,
    }
    tensors = [r for r in native if r.kind == "tensor"]
    _assert_mixed([r for r in python if r.kind == "tensor"], tensors)


def test_a_module_call_of_more_tensors_than_a_row_holds_takes_several_rows(tmp_path, monkeypatch, caplog) -> None:
    """The tensors of one side of a call beyond what one observer row holds go to the next rows:
    the records are the same, in the same order."""
    monkeypatch.setattr(native_modules, "MODULE_ROW_SLOTS", 1)
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, level="mix", task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, level="mix", task="statistics")
    _assert_mixed(python, native)
    sides = {(r.step, r.call_name, r.io) for r in native if r.op == MODULE_OP}
    assert max(sum((r.step, r.call_name, r.io) == side for r in native) for side in sides) > 1  # (a linear's weight and bias)


@pytest.mark.parametrize(
    "spelling, backend, task",
    [
        ("method", "aot_eager", "statistics"),
        ("whole", "inductor", "statistics"),
        ("checkpointed wrapper", "aot_eager", "structure"),
    ],
)
def test_compiled_code_records_its_module_calls_the_same_on_both_paths(tmp_path, monkeypatch, caplog, spelling, backend, task):
    """Run as compiled, the module calls whose hooks the compiled code runs are recorded among its
    ops as the dispatch mode records them (``test_native_capture``'s compiled GPT)."""
    training = _compiled_gpt(spelling, backend)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, steps=3, task=task, stack="none", level="mix")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, steps=3, task=task, stack="none", level="mix")
    _assert_mixed(python, native, joins=backend == "inductor")
    torch._dynamo.reset()


def test_a_fault_in_the_merge_loses_that_steps_records_only(tmp_path, monkeypatch, caplog) -> None:
    """A fault of ours while module records are merged costs that step's records, said once; the
    training goes on, and the next step is recorded whole (nothing of the failed one kept)."""
    merged, calls = native_modules.NativeModuleRecorder.merged, []

    def failing_once(self, *args, **kwargs):  # noqa: ANN001, ANN202
        calls.append(None)
        if len(calls) == 1:
            raise MemoryError("no memory for the merge")
        return merged(self, *args, **kwargs)

    monkeypatch.setattr(native_modules.NativeModuleRecorder, "merged", failing_once)
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    model, step = gpt_training()
    with caplog.at_level(logging.WARNING), torchdebug.Debugger(tmp_path, level="mix", task="statistics") as debugger:
        for _ in range(2):
            debugger.start(model)
            step()
            debugger.step()
    native = list(torchdebug.load(tmp_path).ranks[0].records())
    assert {record.step for record in native} == {1}
    assert {record.op for record in native} >= {MODULE_OP, "aten.addmm.default"}
    lost = [record.getMessage() for record in caplog.records if "lost a step's ops" in record.getMessage()]
    assert lost == ["torchdebug: the native op capture lost a step's ops (MemoryError: no memory for the merge)"]


@pytest.mark.parametrize(
    ("training", "options"),
    [
        (gpt_training, {"task": "structure"}),
        (gpt_training, {"task": "statistics", "checksum": True}),
        (gpt_training, {"task": "statistics", "data_mode": ["forward", "output"]}),
        (_checkpointed_training("non_reentrant"), {"task": "statistics"}),
        (_quantized_training, {"task": "checksum"}),
        (lambda: loss_training(_Gated), {"task": "statistics"}),
    ],
    ids=["gpt-structure", "gpt-statistics+checksum", "gpt-forward-outputs", "non_reentrant", "quantized", "values"],
)
def test_module_records_alone_are_the_same_on_both_paths(tmp_path, monkeypatch, caplog, training: Training, options: dict):
    """Level ``module``: the observer records no op (no callback), only the module calls' rows. The
    engine's in-place gradient sums are seen as they run: Python's records hold the gradient a hook
    is handed, so torch sums out of place into new tensors there, where the native path's weak hold
    lets it sum in place, one tensor whose version moves (``joins``: one native id for several)."""
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, kind="any", level="module", **options)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, kind="any", level="module", **options)
    assert native and {record.op for record in native} == {MODULE_OP}
    assert [(r.name, r.kind, repr(r.value)) for r in native] == [(r.name, r.kind, repr(r.value)) for r in python]
    tensors = [[record for record in records if record.kind == "tensor"] for records in (python, native)]
    _assert_same_dumps(*tensors, joins=True)
    _assert_same_order(*tensors)
