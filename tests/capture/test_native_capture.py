"""The Debugger records ops on the native path where it applies (``TORCHDEBUG_NATIVE=1``), and the
dumps of the two paths are the same record by record, but for what a dispatch mode itself changes in
what torch runs (``native_compare.py``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from tests.backends import compile_as
from tests.blocks import MLPBlock
from tests.capture.native_compare import gpt_training, loss_training, on_the_dispatch_mode, without_mode
from torchdebug.capture import native_records
from torchdebug.capture.native_capture import why_not_native
from torchdebug.capture.native_subclasses import described
from torchdebug.checksum import FINGERPRINT_VERSION
from torchdebug.config import DebuggerConfig
from torchdebug.native import build
from torchdebug.nonfinite import find_origin
from torchdebug.records import NO_MODULE, STATS_NOT_TAKEN, Record
from torchdebug.stats import NO_STATISTICS
from torchdebug.store import FixedColumns

pytestmark = pytest.mark.skipif(build._cxx_compiler() is None, reason="no C++ compiler to build the observer")

Training = Callable[[], tuple[nn.Module, Callable[[], None]]]


def _hf_training(family: str = "gpt2", autocast: bool = False, checkpointing: str = "") -> Training:
    """A tiny Hugging Face model of ``family`` trained by SGD, its forward in a bfloat16 autocast
    region where ``autocast``, its layers checkpointed by Hugging Face's gradient checkpointing where
    ``checkpointing`` says how (``reentrant``, ``non-reentrant``)."""

    def training() -> tuple[nn.Module, Callable[[], None]]:
        pytest.importorskip("transformers")
        from tests.hf_models import tiny_model

        model = tiny_model(family, 2)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"})
            model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

        def step() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return model, step

    return training


def _dump(  # noqa: ANN001
    tmp_path,
    monkeypatch,
    caplog,
    training: Training,
    native: bool,
    steps: int = 2,
    kind: str = "tensor",
    with_model: bool = True,
    **options,
) -> list[Record]:
    """The records of ``kind`` (``tensor``, ``value``; ``any``: all) of ``steps`` steps of
    ``training`` dumped by a Debugger on one path (``with_model``: handed the model, else none), each
    ``stack`` its frames from the training step's line in this file inwards."""
    if native:
        monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
        monkeypatch.setattr(torchdebug.debugger, "why_not_native", why_not_native)  # if the other run held it on the mode
    else:
        on_the_dispatch_mode(monkeypatch)
    model, step = training()
    folder = tmp_path / ("native" if native else "python")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torchdebug.debugger"):
        with torchdebug.Debugger(folder, **options) as debugger:
            for _ in range(steps):
                debugger.start(model if with_model else None)
                step()
                debugger.step()
    said = [
        record.getMessage()
        for record in caplog.records
        if "op capture" in record.getMessage() or "module records" in record.getMessage()
    ]
    what, other = ("module records", "Python") if options.get("level") == "module" else ("op capture", "the dispatch mode")
    held = f"torchdebug: {what} through {other}: the test holds it on the dispatch mode"
    assert said == [f"torchdebug: {what} on the native path" if native else held]
    rank = torchdebug.load(folder).ranks[0]
    assert rank.manifest["fingerprint"] == FINGERPRINT_VERSION  # what its checksums follow, on either path
    records = [record for record in rank.records() if kind in ("any", record.kind)]
    for record in records:  # the frames from this file's training step inwards: the same on both runs
        if record.stack is not None:
            frames = rank.stack(record)
            here = max(index for index, frame in enumerate(frames) if __file__ in frame)
            record.stack = "\n".join(frames[here:])
    return records


def _assert_same_dumps(python: list[Record], native: list[Record], joins: bool = False) -> None:
    """Step by step: names, dtypes, shapes, strides, devices, ``fwd``, unread marks, statistics
    (bit for bit) and capture errors equal, value ids one to one and ``view_of`` naming the same values, once the mode's
    own calls are undone. ``joins``: a value id of eager capture is one of the native path's, which
    may join two of them (the saved tensors a mode unpacks through a ``detach`` its filter leaves out;
    what compiled kernels hand aten), and ``view_of`` is not compared."""
    pairs = set()
    views: list[tuple[int | None, int | None]] = []
    """``view_of`` of each record but those the mode's own ``detach``es hold (views only there)."""
    for step in sorted({record.step for record in python} | {record.step for record in native}):
        got = [record for record in native if record.step == step]
        expected, aliases = without_mode([record for record in python if record.step == step], got)
        assert [(r.name, r.dtype, r.shape, r.stride, r.device, r.fwd, r.extra, r.stack, r.source) for r in got] == [
            (name, r.dtype, r.shape, r.stride, r.device, fwd, r.extra, r.stack, r.source) for r, name, fwd in expected
        ]
        assert [r.stats for r in got] == [r.stats for r, _, _ in expected]
        assert [r.checksum for r in got] == [r.checksum for r, _, _ in expected]
        assert [r.capture_error for r in got] == [r.capture_error for r, _, _ in expected]
        pairs |= {(aliases.get(want.value_id, want.value_id), got.value_id) for (want, _, _), got in zip(expected, got)}
        views += [
            (aliases.get(want.view_of, want.view_of), got.view_of)
            for (want, _, _), got in zip(expected, got)
            if want.value_id not in aliases
        ]
    assert len({want for want, _ in pairs}) == len(pairs)
    assert joins or len({got for _, got in pairs}) == len(pairs)
    if joins:  # a tensor first seen as a backward op's input is the value made in its memory, not a view
        return
    native_id = dict(pairs)  # and the ids only views name (a base made outside capture): one to one
    native_id |= {want: got for want, got in views if want not in native_id}
    assert [native_id.get(want) for want, _ in views] == [got for _, got in views]
    assert len(set(native_id.values())) == len(native_id)


@pytest.mark.parametrize(
    "options",
    [{"task": "structure"}, {"task": "statistics"}, {"task": "statistics", "checksum": True}, {"task": "checksum"}],
    ids=["structure", "statistics", "statistics+checksum", "checksum"],
)
def test_the_example_gpt_dumps_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog, options: dict) -> None:
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, **options)
    _assert_same_dumps(python, native)
    assert {record.phase for record in native} == {"forward", "backward", "optimizer"}
    assert all(record.source is not None for record in native if record.phase == "forward")  # stacks, by default
    if options["task"] == "statistics":
        assert all(record.stats is not None for record in native)
        assert {record.dtype for record in native} >= {"float32", "int64"}  # the C kernel's and torch ops'
    fingerprinted = [record for record in native if record.checksum is not None]
    if options["task"] == "checksum" or options.get("checksum"):  # the callback's (float32) and the drain's (int64)
        assert len(fingerprinted) == len(native) and {record.dtype for record in native} >= {"float32", "int64"}
        assert all(record.stats is None for record in native) == (options["task"] == "checksum")
    else:
        assert not fingerprinted


def _batches_that_change_size() -> tuple[nn.Module, Callable[[], None]]:
    """The example GPT stepped on batches of 2, 2, 2, 3 and 3 sequences: its first step makes the
    optimizer's state (other ops), the second and third are alike, the fourth's shapes are others."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = iter([make_batch(config, batch=size, seed=index) for index, size in enumerate((2, 2, 2, 3, 3))])
    return model, lambda: train_step(model, optimizer, next(batches))


def test_a_steady_steps_columns_are_kept_and_made_again_when_its_structure_changes(tmp_path, monkeypatch, caplog) -> None:
    """A drain of the same structure as the last reuses the columns that structure sets (names,
    shapes, dtypes: ``FixedColumns``) and fills its own values; a batch of another size makes them again."""
    kept = []
    get = FixedColumns.get
    monkeypatch.setattr(FixedColumns, "get", lambda self, *args: kept.append(get(self, *args) is not None) or get(self, *args))
    python = _dump(tmp_path, monkeypatch, caplog, _batches_that_change_size, native=False, steps=5, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, _batches_that_change_size, native=True, steps=5, task="statistics")
    _assert_same_dumps(python, native)
    assert kept == [False, False, True, False, True]
    tokens = [r for r in native if r.name == "forward/tok/aten.embedding.default#0/input.1"]
    assert [r.shape for r in tokens] == [[2, 16]] * 3 + [[3, 16]] * 2


def _scaled_by_the_step() -> tuple[nn.Module, Callable[[], None]]:
    """A linear layer whose output is multiplied by a float that changes every step: drains of one
    structure whose value texts differ."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    scales = iter([0.5, 0.5, 2.0, 3.0])
    x = torch.randn(2, 4)
    return model, lambda: torch.mul(model(x), next(scales)).sum().backward()


def test_a_value_that_changes_from_step_to_step_is_written_as_it_ran(tmp_path, monkeypatch, caplog) -> None:
    python = _dump(tmp_path, monkeypatch, caplog, _scaled_by_the_step, native=False, steps=4, kind="any", task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, _scaled_by_the_step, native=True, steps=4, kind="any", task="statistics")
    _assert_same_dumps(python, native)
    scales = [r.value for r in native if r.op == "aten.mul.Tensor" and r.phase == "forward" and r.kind == "value"]
    assert scales == [0.5, 0.5, 2.0, 3.0]


class _WrittenBetweenReads(nn.Module):
    """A tensor read, written in place, read again: its two reads have two fingerprints."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight
        y.add_(1.0)
        return (y * 3.0).t().sum()


def _written_between_reads() -> tuple[nn.Module, Callable[[], None]]:
    model = _WrittenBetweenReads()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    return model, lambda: model(x).backward()


@pytest.mark.parametrize("options", [{"task": "checksum"}, {"task": "statistics", "checksum": True}], ids=["checksum", "both"])
def test_a_tensor_written_between_two_reads_has_the_fingerprint_of_each_read(tmp_path, monkeypatch, caplog, options) -> None:
    python = _dump(tmp_path, monkeypatch, caplog, _written_between_reads, native=False, steps=1, **options)
    native = _dump(tmp_path, monkeypatch, caplog, _written_between_reads, native=True, steps=1, **options)
    _assert_same_dumps(python, native)
    checksum = {record.name.removeprefix("forward/<root>/"): record.checksum for record in native}
    made, before_add = checksum["aten.mm.default#0/output.0"], checksum["aten.add_.Tensor#0/input.0"]
    after_add, read_again = checksum["aten.add_.Tensor#0/output.0"], checksum["aten.mul.Tensor#0/input.0"]
    assert made == before_add and after_add == read_again and made != after_add  # each read's own bits
    product = checksum["aten.mul.Tensor#0/output.0"]
    assert checksum["aten.t.default#0/input.0"] == product != checksum["aten.t.default#0/output.0"]


class _ValueArguments(nn.Module):
    """Ops with non-tensor arguments and results of every kind a dispatch mode is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x @ self.weight).sum(dim=1, keepdim=True)  # a list of ints, a bool
        y = nn.functional.gelu(y, approximate="tanh").to(torch.float64).float()  # a keyword-only string; a dtype
        z = torch.add(y, y, alpha=2).mul(0.1).mul(2)  # a keyword-only number; numbers wrapped as tensors
        z = z.clamp(min=None, max=1.0) + torch.full((1,), 1.5)  # None before a passed argument; a factory's device
        for k in range(2 * _SCALES):  # more distinct floats than the observer keeps texts of, each twice (its cache's evictions)
            z = z.mul(1 + (k % _SCALES) / 1e6)
        scale = z.mean().item()  # a number as the result
        rotated = torch.ones(2, dtype=torch.complex64).mul(1j)  # a complex number
        return (z * scale).sum() + torch.view_as_real(rotated).sum() + torch.cat([z, z], dim=-1).sum()


_SCALES = 97
"""Distinct floats ``_ValueArguments`` multiplies by: more than ``observer.cpp`` keeps the texts of."""


def _value_arguments() -> tuple[nn.Module, Callable[[], None]]:
    model = _ValueArguments()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    return model, lambda: model(x).backward()


@pytest.mark.parametrize("training", [_value_arguments, gpt_training], ids=["values", "gpt"])
def test_non_tensor_arguments_and_results_are_the_same_values_on_both_paths(tmp_path, monkeypatch, caplog, training) -> None:
    """Value records: the arguments a dispatch mode is handed (none left at its default), dtypes,
    devices, None, wrapped numbers, complex numbers and a number as a result, named and written as
    eager capture writes them; but for the calls a mode runs as other ops (``view`` for
    ``_reshape_alias``: other arguments)."""
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, kind="any")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, kind="any")
    for step in (0, 1):
        got = [record for record in native if record.step == step]
        expected, _ = without_mode([record for record in python if record.step == step], got)
        renamed = {name.rpartition("/")[0] for r, name, _ in expected if f"/{r.op}#" not in name}
        # repr: a float is one on both paths (1.0, not 1: the observer writes the fewest digits that read back)
        want = [(name, repr(r.value)) for r, name, _ in expected if r.kind == "value" and name.rpartition("/")[0] not in renamed]
        assert want and [(r.name, repr(r.value)) for r in got if r.kind == "value" and r.call_name not in renamed] == want
        assert all(r.dtype is None and r.shape is None and r.value_id is None for r in got if r.kind == "value")
    values: dict[tuple[str, str], list] = {}
    for r in native:
        if r.kind == "value" and r.step == 0 and r.phase == "forward":
            values.setdefault((r.op, r.arg), []).append(r.value)
    if training is _value_arguments:
        assert values[("aten.sum.dim_IntList", "1")] == [[1]] and values[("aten.sum.dim_IntList", "2")] == [True]
        assert values[("aten._to_copy.default", "dtype")] == ["float64", "float32"]
        assert ("aten._to_copy.default", "non_blocking") not in values  # left at its default: not handed
        assert values[("aten.gelu.default", "approximate")] == ["tanh"] and values[("aten.add.Tensor", "alpha")] == [2]
        assert values[("aten.clamp.default", "1")] == [None] and values[("aten.full.default", "device")] == ["cpu"]
        assert {0.1, 2, "1j"} <= set(values[("aten.mul.Tensor", "1")])
        assert values[("aten.mul.Tensor", "1")][2 : 2 + 2 * _SCALES] == [1 + (k % _SCALES) / 1e6 for k in range(2 * _SCALES)]
        assert [type(number) for number in values[("aten._local_scalar_dense.default", "0")]] == [float]  # .item()


@pytest.mark.gpu
@pytest.mark.parametrize("level", ["op", "mix", "module"])
def test_a_cuda_models_structure_dump_is_the_same_on_both_paths(tmp_path, monkeypatch, caplog, level) -> None:
    """On CUDA the native path takes structure dumps (the backward runs on the engine's device
    thread, its module gradient records too); it declines statistics there (``why_not_native``)."""
    python = _dump(tmp_path, monkeypatch, caplog, lambda: gpt_training("cuda"), native=False, task="structure", level=level)
    native = _dump(tmp_path, monkeypatch, caplog, lambda: gpt_training("cuda"), native=True, task="structure", level=level)
    _assert_same_dumps(python, native, joins=level == "module")  # (see test_native_modules: torch's in-place sums)
    assert {record.device for record in native} >= {"cuda:0"}


def test_statistics_of_a_cuda_model_go_to_the_dispatch_mode(monkeypatch) -> None:
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    model = nn.Linear(2, 2).to("meta")  # a device other than the CPU, without one
    assert "statistics or fingerprints of meta tensors" in why_not_native(DebuggerConfig.from_dict({}), model)
    assert why_not_native(DebuggerConfig.from_dict({"task": "structure"}), model) is None


@pytest.mark.parametrize(
    ("family", "autocast", "checkpointing"),
    [
        ("gpt2", False, ""),
        ("llama", False, ""),
        ("bert", False, ""),
        ("llama", True, ""),
        ("llama", False, "non-reentrant"),
        ("llama", True, "reentrant"),
    ],
)
def test_the_hugging_face_models_dump_the_same_records_on_both_paths(
    tmp_path, monkeypatch, caplog, family, autocast, checkpointing
) -> None:
    """The suite's Hugging Face families (``tests/hf_models.py``), Llama's forward under bfloat16
    autocast, and Llama with its layers checkpointed: a norm's input that its ``pow`` and ``mul``
    both save, and the input the three projections save, are each restored by a detach of its own."""
    python = _dump(tmp_path, monkeypatch, caplog, _hf_training(family, autocast, checkpointing), native=False)
    native = _dump(tmp_path, monkeypatch, caplog, _hf_training(family, autocast, checkpointing), native=True)
    _assert_same_dumps(python, native)
    assert ("bfloat16" in {record.dtype for record in native}) == autocast
    assert any(record.phase == "recompute" for record in native) == bool(checkpointing)


@pytest.mark.parametrize(
    "options",
    [
        {"list": ["re:/ln1/", "aten.mm"]},
        {"range": ["forward/layers.0.attn.qkv/aten.addmm.default#0", "forward/layers.1.mlp/aten.gelu.default#0"]},
        {"data_mode": ["backward", "input"]},
        {"data_mode": ["forward"]},
        {"data_mode": ["output"]},
    ],
    ids=["list", "range", "backward-inputs", "forward", "outputs"],
)
def test_filters_select_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog, options: dict) -> None:
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, **options)
    assert native
    _assert_same_dumps(python, native, joins=True)


@pytest.mark.parametrize(
    ("stack", "phases"),
    [
        (["forward/layers.0.attn.qkv/aten.addmm.default#0", "forward/layers.1.mlp/aten.gelu.default#0"], {"forward"}),
        (["re:^forward/layers.1.mlp", "re:^backward/layers.0"], {"forward", "backward"}),
        (["re:^backward/layers.1", "re:^optimizer"], {"optimizer"}),  # their forward calls had none
    ],
    ids=["forward", "into-backward", "backward-only"],
)
def test_stacks_for_a_range_of_calls_are_the_same_on_both_paths(tmp_path, monkeypatch, caplog, stack, phases) -> None:
    """``stack=[FROM, TO]``: only the calls of that range have a stack, each step, and a backward
    call only where the forward call it differentiates had one (native since 2026-11-28)."""
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, stack=stack)
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, stack=stack)
    _assert_same_dumps(python, native)
    assert {record.phase for record in native if record.stack is not None} == phases
    assert any(record.stack is None for record in native)


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"task": "overflow_check", "list": ["mm"]}, "task='overflow_check' with list"),
        ({"task": "overflow_check", "data_mode": ["backward"]}, "task='overflow_check' with data_mode"),
        ({"task": "tensor", "tensor_list": ["mm"]}, "task='tensor' with tensor_list"),
        ({"task": "tensor", "list": ["mm"]}, "task='tensor' with list"),
        ({"task": "tensor", "range": ["mm", "add"]}, "task='tensor' with range"),
        ({"task": "tensor", "data_mode": ["forward"]}, "task='tensor' with data_mode"),
        ({"task": "tensor", "level": "mix"}, "task='tensor' at level='mix'"),
        ({"task": "tensor", "level": "module"}, "task='tensor' at level='module'"),
    ],
)
def test_configs_the_native_path_does_not_take_go_to_the_dispatch_mode(monkeypatch, options: dict, why: str) -> None:
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    assert why in why_not_native(DebuggerConfig.from_dict({"stack": "none", **options}), None)


def test_compiled_code_takes_the_native_path(monkeypatch) -> None:
    """Compiled blocks, wrapped or compiled in place, and a method replaced by a compiled function
    (Lightning's ``trainer.fit(torch.compile(model))`` compiles ``forward`` and ``training_step`` so),
    run compiled (``compiled_code="as_run"``) or eagerly: either way the observer sees what a
    dispatch mode sees."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    inner = nn.Linear(2, 2)
    inner.compile(backend="eager")
    model = nn.Sequential(torch.compile(nn.Linear(2, 2), backend="eager"), inner, nn.ReLU())
    model.forward = torch.compile(model.forward, backend="eager")
    assert why_not_native(DebuggerConfig.from_dict({"stack": "none"}), model) is None
    assert why_not_native(DebuggerConfig.from_dict({"stack": "none", "compiled_code": "eager"}), model) is None


def _compiled_gpt(spelling: str, backend: str) -> Training:
    """The example GPT compiled with ``backend`` in ``spelling`` (``tests/backends.compile_as``;
    ``"checkpointed method"``: each block in a ``checkpoint_wrapper`` first, as torchtitan applies
    activation checkpointing before its per-block compile, and compiled by a step before capture
    starts, as at a run's first step: Dynamo traces the wrapped block's call, with no hooks then); the
    debugger is handed the model, the step calls what was compiled."""

    def training() -> tuple[nn.Module, Callable[[], None]]:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        torch._dynamo.reset()
        torch.manual_seed(0)
        config = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
        model = GPT(config)
        checkpointed, _, how = spelling.rpartition(" ")
        if checkpointed:
            for index, block in enumerate(model.layers):
                model.layers[index] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        called = compile_as(model, how, backend)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = make_batch(config, batch=2)
        if checkpointed:
            train_step(called, optimizer, batch)
        return model, lambda: train_step(called, optimizer, batch)

    return training


@pytest.mark.parametrize(
    "spelling, backend, task",
    [
        ("method", "aot_eager", "statistics"),
        ("wrapper", "aot_eager", "structure"),
        ("method", "inductor", "statistics"),
        ("forward", "aot_eager", "structure"),
        ("whole", "inductor", "statistics"),
        ("checkpointed method", "inductor", "statistics"),
        ("checkpointed wrapper", "aot_eager", "structure"),
        ("method", "inductor", "tensor"),
        ("checkpointed method", "inductor", "tensor"),
    ],
)
def test_compiled_code_dumps_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog, spelling, backend, task) -> None:
    """Run as compiled (``compiled_code="as_run"``), compiled code's ops are its graph's (aot_eager
    runs its aten ops, inductor calls its extern kernels through aten), named after the compiled
    block (or the graph module a backend runs) on both paths, from the first step, whose compilation
    runs ops of its own that neither path records (AOT autograd copies the RNG state); the backward
    ops of a graph's node are named after its forward graph's first op. Under inductor its kernels
    hand aten views and buffers made without an aten op: the dispatch mode gives each new tensor
    object a value id of its own, the native path the value made in its memory, so one of its ids
    may join several of the mode's (``joins``). Stacks are left out: a graph's frames are in code
    generated anew for each run."""
    training = _compiled_gpt(spelling, backend)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, steps=3, task=task, stack="none")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, steps=3, task=task, stack="none")
    _assert_same_dumps(python, native, joins=backend == "inductor")
    if task == "tensor":  # staged as each compiled op ends: inductor's kernels write extern kernels' outputs after them
        assert assert_same_saved_tensors(tmp_path / "python", tmp_path / "native", python, native)
    backward = {record.module for record in native if record.phase == "backward"}
    assert backward and NO_MODULE not in backward  # each named after its forward op, or the parameter it sums into
    if spelling.endswith(("method", "wrapper")):  # a compiled checkpoint wrapper's too, whose block's call is traced
        assert {f"layers.{index}" for index in range(2)} <= {record.module.removesuffix(".GraphModule") for record in native}
    torch._dynamo.reset()


def test_statistics_go_to_the_dispatch_mode_where_the_c_kernel_cannot_be_built(monkeypatch) -> None:
    """The observer takes sums with stats.c's kernels: without them it would take none."""
    from torchdebug.native import fused_stats

    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    monkeypatch.setattr(fused_stats, "available", lambda: False)
    assert "without the C kernel" in why_not_native(DebuggerConfig.from_dict({"stack": "none", "task": "statistics"}), None)
    assert why_not_native(DebuggerConfig.from_dict({"stack": "none", "task": "structure"}), None) is None


def test_the_native_path_is_the_default_and_torchdebug_native_0_turns_it_off(monkeypatch) -> None:
    config = DebuggerConfig.from_dict({"stack": "none"})
    monkeypatch.delenv("TORCHDEBUG_NATIVE", raising=False)
    assert why_not_native(config, None) is None
    assert why_not_native(config, nn.Linear(2, 2)) is None
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")
    assert why_not_native(config, None) == "TORCHDEBUG_NATIVE=0"
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    assert why_not_native(config, nn.Linear(2, 2)) is None


def _hooked_training() -> tuple[nn.Module, Callable[[], None]]:
    """The example GPT with forward hooks of its own: one scales the attention's input projection's
    output (the attention's own ops follow, with no module call between), one on a block runs
    another module (the next block's layer norm) on its output, and a pre-hook scales an input."""
    model, step = gpt_training()
    model.layers[0].attn.qkv.register_forward_hook(lambda module, args, output: output * 1.03)
    model.layers[0].register_forward_hook(lambda module, args, output: output + model.layers[1].ln1(output) * 0.01)
    model.layers[1].mlp.register_forward_pre_hook(lambda module, args: (args[0] * 0.5,))
    return model, step


@pytest.mark.parametrize("options", [{"task": "statistics"}, {"task": "structure", "stack": "all"}], ids=["statistics", "stacks"])
def test_a_model_with_forward_hooks_of_its_own_dumps_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog, options):
    """The ops a module's own forward hooks run are named after that module (a module a hook runs,
    after its own path), on both paths."""
    python = _dump(tmp_path, monkeypatch, caplog, _hooked_training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, _hooked_training, native=True, **options)
    _assert_same_dumps(python, native)
    hooked = {r.module for r in native if r.op == "aten.mul.Tensor" and r.phase == "forward"}
    assert {"layers.0.attn.qkv", "layers.0", "layers.1.mlp"} <= hooked


def _checkpointed_training(flavour: str) -> Training:
    """The checkpointing tests' TinyGPT, its blocks checkpointed as ``flavour`` says, and SGD."""

    def training() -> tuple[nn.Module, Callable[[], None]]:
        from tests.capture.test_checkpointing import TinyGPT

        torch.manual_seed(0)
        model = TinyGPT(flavour, layers=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        tokens = torch.randint(0, 32, (2, 8))

        def step() -> None:
            model(tokens).logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return model, step

    return training


@pytest.mark.parametrize(
    ("flavour", "options"),
    [
        ("non_reentrant", {"task": "structure"}),
        ("non_reentrant", {"task": "statistics", "checksum": True}),
        ("reentrant", {"task": "statistics"}),
        ("wrapper", {"task": "statistics"}),
        ("selective", {"task": "statistics", "checksum": True}),
        ("selective", {"task": "structure"}),
    ],
    ids=[
        "non_reentrant-structure",
        "non_reentrant-statistics+checksum",
        "reentrant-statistics",
        "wrapper-statistics",
        "selective-statistics+checksum",
        "selective-structure",
    ],
)
def test_a_checkpointed_model_dumps_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog, flavour, options) -> None:
    """Recomputed ops are phase ``recompute``, paired with the forward calls they repeat, the
    backward's calls are numbered as without checkpointing, and the tensors autograd unpacks from
    rebuilt ones share their statistics, on the native path as in the dispatch mode."""
    training = _checkpointed_training(flavour)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, **options)
    _assert_same_dumps(python, native)
    recomputed = [record for record in native if record.phase == "recompute"]
    assert {record.step for record in recomputed} == {0, 1}
    assert {record.module for record in recomputed} >= {"blocks.0.attn.qkv", "blocks.1.fc"}
    assert any(record.fwd is not None and record.fwd.startswith("forward/blocks.0.") for record in recomputed)


class _AutocastListed(nn.Module):
    """Calls ops ``torch.autocast`` has kernels of its own for (``bmm``, ``addmm``) directly, as
    attention code does, and one it decomposes (``matmul``)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 4, 4))
        self.bias = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.bmm(x.view(1, 3, 4).expand(2, 3, 4), self.weight)
        return torch.addmm(self.bias, y.sum(0), self.weight[0]).matmul(self.weight[1]).float().sum()


_PRODUCTS = ("aten.bmm.default", "aten.addmm.default", "aten.mm.default")
"""The products ``_AutocastListed`` computes (``matmul`` of two matrices is ``mm``)."""


def _autocast_training(whole_step: bool) -> Training:
    """A bfloat16 autocast region around the forward (the usual way), or around the whole step
    (its backward then runs the autocast kernels of ``mm`` and ``bmm`` too)."""

    def training() -> tuple[nn.Module, Callable[[], None]]:
        if whole_step:
            model, step = gpt_training()
        else:
            model, step = loss_training(_AutocastListed)
            model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)

        def autocast_step() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=whole_step):
                step()

        return model, autocast_step

    return training


@pytest.mark.parametrize("whole_step", [False, True], ids=["forward", "whole_step"])
@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_ops_under_autocast_are_recorded_once_on_both_paths(tmp_path, monkeypatch, caplog, whole_step, task) -> None:
    """An op with an autocast kernel casts its arguments and calls itself again with autocast off:
    a dispatch mode sees the casts and that call, and so does the native path (it once recorded
    the outer call too)."""
    training = _autocast_training(whole_step)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task=task)
    _assert_same_dumps(python, native)
    if not whole_step:  # each product once, of bfloat16 arguments
        products = [record for record in native if record.op in _PRODUCTS and record.phase == "forward" and record.step == 0]
        assert sorted(record.op for record in products if record.io == "output") == sorted(_PRODUCTS)
        assert {record.dtype for record in products if record.arg in ("0", "1", "2")} == {"bfloat16"}
    cast_in = "backward" if whole_step else "forward"
    assert "aten._to_copy.default" in {record.op for record in native if record.phase == cast_in}


def test_ops_under_autocast_in_inference_mode_are_recorded_once_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """Under inference mode no call is live, and autocast's kernels still cast and call again."""

    def training() -> tuple[nn.Module, Callable[[], None]]:
        torch.manual_seed(0)
        model, x = _AutocastListed(), torch.randn(3, 4)

        def step() -> None:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
                model(x)

        return model, step

    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task="structure")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task="structure")
    _assert_same_dumps(python, native)
    products = [record for record in native if record.op in _PRODUCTS and record.step == 0]
    assert {record.dtype for record in products if record.arg in ("0", "1", "2")} == {"bfloat16"}


class _ConvAttention(nn.Module):
    """Convolution, batch norm, ``nn.MultiheadAttention``, ``scaled_dot_product_attention`` and a
    ``baddbmm`` on one batch of three rows of four."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm2d = nn.BatchNorm2d(4)
        self.attention = nn.MultiheadAttention(4, 2, batch_first=True)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm2d(self.conv(x.view(3, 1, 2, 2).repeat(1, 1, 2, 2))))
        sequence = y.flatten(2).transpose(1, 2)  # 3 sequences of 16 positions of 4
        attended, _ = self.attention(sequence, sequence, sequence)
        heads = self.norm(attended).view(3, 16, 2, 2).transpose(1, 2)
        flat = nn.functional.scaled_dot_product_attention(heads, heads, heads, is_causal=True).flatten(0, 1)
        return torch.baddbmm(flat[:, :2, :2], flat[:, :2], flat[:, :2].transpose(1, 2)).float().sum()


class _LessCommon(nn.Module):
    """Weight normalisation (a parametrization), a full backward hook, a real FFT and its
    magnitude (conjugate views in the backward), a gradient penalty (a double backward) and a
    reparametrised sample."""

    def __init__(self) -> None:
        super().__init__()
        self.normalised = nn.utils.parametrizations.weight_norm(nn.Linear(4, 4))
        self.hooked = nn.Linear(4, 4)
        self.hooked.register_full_backward_hook(lambda module, grad_input, grad_output: None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_(True)
        h = self.hooked(self.normalised(x))
        spectrum = torch.fft.rfft(h, dim=-1)
        h = h + spectrum.abs().mean() + (spectrum * spectrum.conj()).real.mean()
        (grad_x,) = torch.autograd.grad(h.pow(2).sum(), x, create_graph=True)
        penalty = grad_x.norm(2, dim=1).sub(1).pow(2).mean()
        return torch.distributions.Normal(h, 1.0).rsample().mean() + penalty


def _less_common_training() -> tuple[nn.Module, Callable[[], None]]:
    """:class:`_LessCommon` trained by SGD, with an exponential moving average of its parameters
    (``_foreach_lerp_``) and ops writing into ``out=`` tensors after each step."""
    model, step = loss_training(_LessCommon)
    average = [parameter.detach().clone() for parameter in model.parameters()]
    x = torch.randn(3, 4)

    def averaged_step() -> None:
        step()
        with torch.no_grad():
            torch._foreach_lerp_(average, [parameter.detach() for parameter in model.parameters()], 0.01)
            torch.mm(x, x.t(), out=torch.empty(3, 3))
            torch.add(x[0], 1.0, out=torch.empty(4))

    return model, averaged_step


class _SigmoidGate(torch.autograd.Function):
    """A custom autograd function: its node takes the sequence number an op before it left unused."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, gate)
        return x * gate.sigmoid()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, gate = ctx.saved_tensors
        opened = gate.sigmoid()
        return grad * opened, (grad * x * opened * (1 - opened)).sum(0)


class _Assorted(nn.Module):
    """A custom autograd function applied to an input that requires no gradient, a module called
    twice with a forward hook of its own, a gradient hook that clamps, transposed convolution, group
    norm, resampling, unfolding, a transformer encoder layer, indexing by a mask and by indices
    (their backwards scatter into zeros), label smoothing and class weights."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.randn(8))
        self.gate.register_hook(lambda grad: grad.clamp(-1, 1))
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.transposed = nn.ConvTranspose2d(4, 2, 2, stride=2)
        self.norm = nn.GroupNorm(2, 4)
        self.embedding = nn.Embedding(10, 8, padding_idx=0)
        self.shared = nn.Linear(8, 8)
        self.shared.register_forward_hook(lambda module, args, output: output * 1.0)
        self.encoder = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _SigmoidGate.apply(x.repeat(1, 2), self.gate)
        h = self.shared(self.shared(h))
        image = F.interpolate(self.norm(self.conv(h.view(3, 2, 2, 2))), scale_factor=2, mode="bilinear", align_corners=False)
        image = self.transposed(F.pixel_unshuffle(image, 2)[:, :4])
        sampled = F.grid_sample(image, torch.zeros(3, 2, 2, 2), align_corners=False).sum()
        ids = torch.tensor([[0, 1, 2], [3, 0, 4], [5, 6, 0]])
        encoded = self.encoder(self.embedding(ids) + h.unsqueeze(1))
        targets = torch.tensor([1, 0, 2])
        loss = F.cross_entropy(encoded.mean(1)[:, :3], targets, label_smoothing=0.1)
        loss = loss + F.nll_loss(F.log_softmax(encoded[:, 0, :3], -1), targets, weight=torch.tensor([1.0, 2.0, 3.0]))
        selected = torch.masked_select(h, h > 0).sum() + h[h.nonzero(as_tuple=True)].sum() + torch.unique(ids).float().sum()
        scattered = torch.zeros(3, 8).scatter_add(0, ids[:, :1].expand(3, 8) % 3, h).sum() + h.gather(1, ids % 8).sum()
        folded = F.fold(F.unfold(image, 2), image.shape[-2:], 2).sum()
        return loss + selected + scattered + folded + sampled + torch.where(h > 0, h, h * 0.1).sum()


def _conv_attention_training() -> tuple[nn.Module, Callable[[], None]]:
    model, step = loss_training(_ConvAttention)
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    return model, step


@pytest.mark.parametrize(
    "training",
    [_conv_attention_training, _less_common_training, functools.partial(loss_training, _Assorted)],
    ids=["conv_attention", "less_common", "assorted"],
)
@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_more_layers_and_training_patterns_dump_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog, training, task):
    """Convolution, batch norm and attention under autocast; a parametrization, a full backward hook,
    a complex spectrum, a double backward, a moving average and ``out=`` ops; :class:`_Assorted`'s
    layers and patterns (a custom autograd function's backward ops are named after the call made
    first inside its forward, as a mode names them: before 2026-11-28 the native path named them
    after the op before it, which had left its sequence number to the function's node)."""
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task=task)
    _assert_same_dumps(python, native)


def assert_same_saved_tensors(
    python_dump: Path, native_dump: Path, python: list[Record], native: list[Record], rank: int = 0
) -> int:
    """The records of both paths (as ``_assert_same_dumps`` takes them) save the same tensors, bit
    for bit, of dumps ``python_dump`` and ``native_dump``; returns how many are saved."""
    dumps = [torchdebug.load(folder).ranks[rank] for folder in (python_dump, native_dump)]
    saved = 0
    for step in sorted({record.step for record in native}):
        got = [record for record in native if record.step == step]
        expected, _ = without_mode([record for record in python if record.step == step], got)
        for (want, name, _), have in zip(expected, got):
            assert (want.tensor is None, want.sampled) == (have.tensor is None, have.sampled), name
            if want.tensor is not None:
                saved += 1
                (shape, dtype, bits), (shape_got, dtype_got, bits_got) = (_saved_bits(d, r) for d, r in zip(dumps, (want, have)))
                assert (shape, dtype) == (shape_got, dtype_got) and torch.equal(bits, bits_got), name
    return saved


def _saved_bits(dump: Any, record: Record) -> tuple[list[int], torch.dtype, torch.Tensor]:
    """A saved tensor as it loads: its shape, dtype and bytes."""
    tensor = dump.load_tensor(record).resolve_conj()
    flat = tensor.contiguous().reshape(-1)
    return list(tensor.shape), tensor.dtype, flat if flat.dtype == torch.bool else flat.view(torch.uint8)


@pytest.mark.parametrize(
    ("training", "options"),
    [
        (gpt_training, {}),
        (gpt_training, {"sample_stride": 3, "checksum": True}),
        (_checkpointed_training("selective"), {}),
        (_checkpointed_training("reentrant"), {}),
        (functools.partial(loss_training, _Assorted), {}),
        (_less_common_training, {}),
        (_conv_attention_training, {}),
    ],
    ids=[
        "gpt",
        "gpt-sampled+checksum",
        "selective",
        "reentrant",
        "assorted",
        "less_common",
        "conv_attention",
    ],
)
def test_tensor_dumps_save_the_same_tensors_on_both_paths(tmp_path, monkeypatch, caplog, training, options) -> None:
    """``task="tensor"`` on the native path: every tensor kept and saved as it is staged (before an op
    writes its memory, every ``STAGE_AFTER_BYTES``, as an op of compiled code ends) or at the drain,
    under keys of its own (``Snapshots``); the same records as the dispatch mode's, and each record's
    saved tensor loads bit for bit as the mode's (complex ones, views, empty ones, sampled ones)."""
    _assert_same_saved_tensors(tmp_path, monkeypatch, caplog, training, dict(options))


def _assert_same_saved_tensors(tmp_path, monkeypatch, caplog, training: Training, options: dict) -> None:  # noqa: ANN001
    """``training`` dumped with ``task="tensor"`` and ``options`` on both paths: the same records, and
    the same saved tensors, bit for bit."""
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task="tensor", **options)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task="tensor", **options)
    _assert_same_dumps(python, native)
    saved = assert_same_saved_tensors(tmp_path / "python", tmp_path / "native", python, native)
    assert saved > 10 and any("view" in record.tensor for record in native if record.tensor)
    written = [sum(path.stat().st_size for path in (tmp_path / side).rglob("*.safetensors")) for side in ("python", "native")]
    assert written[1] <= 1.5 * written[0]  # a tensor staged again at its version is saved once, a view of one as its view


class _SparseGradients(nn.Module):
    """An embedding with sparse gradients beside a bag of embeddings: a sparse COO gradient, made,
    accumulated and read by the optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 4, sparse=True)
        self.bag = nn.EmbeddingBag(10, 4, mode="mean")
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.abs().mul(3).long().clamp(max=9)
        return self.head(self.embedding(ids).mean(1) + self.bag(ids)).sum()


@pytest.mark.parametrize("task", ["structure", "statistics", "checksum"])
def test_a_sparse_tensor_is_described_not_read_on_both_paths(tmp_path, monkeypatch, caplog, task) -> None:
    """A tensor with no strides (a sparse gradient) is described, not read, on both paths: dtype,
    shape, device and a ``capture_error`` naming its layout (before 2026-11-28 the native path kept
    it to read at the flush, failed there, and lost the step's records). Its accumulation into
    ``.grad`` differs by the mode's own doing (``docs/architecture.md``, "The native path (issue 48)"),
    so those rows are left out of the comparison."""

    def not_accumulation(records: list[Record]) -> list[Record]:
        return [record for record in records if not record.name.startswith("backward/embedding.weight/")]

    training = functools.partial(loss_training, _SparseGradients)
    python = not_accumulation(_dump(tmp_path, monkeypatch, caplog, training, native=False, task=task))
    native = not_accumulation(_dump(tmp_path, monkeypatch, caplog, training, native=True, task=task))
    _assert_same_dumps(python, native)
    sparse = [record for record in native if record.kind == "tensor" and record.stride is None]
    assert sparse and {(record.capture_error, record.stats, record.checksum) for record in sparse} == {
        ("layout torch.sparse_coo is not captured", None, None)
    }
    assert all(record.shape == [10, 4] and record.device == "cpu" for record in sparse)


_BACKEND_ONLY = torch.library.Library("torchdebug_backend_only", "DEF")  # noqa: TOR901 (a test's own namespace)
_BACKEND_ONLY.define("scaled(Tensor x) -> Tensor")
_BACKEND_ONLY.impl("scaled", lambda x: x.mul(2.0).add(1.0), "CPU")  # no autograd kernel: autograd's fallback


def _no_autograd_kernels() -> tuple[nn.Module, Callable[[], None]]:
    """An op registered for the CPU only (its kernel calls ``mul`` and ``add`` with autograd still
    live), a dynamically quantized model (``quantized::linear_dynamic``, whose kernel calls
    ``empty_like``) and a quantized tensor's statistics."""
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model = torch.ao.quantization.quantize_dynamic(linear, {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(3, 4)

    def step() -> None:
        with torch.no_grad():
            out = model(torch.ops.torchdebug_backend_only.scaled(x))
            torch.quantize_per_tensor(out, 0.05, 0, torch.qint8).dequantize()

    return model, step


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.ao.quantization
@pytest.mark.parametrize("task", ["structure", "statistics", "checksum"])
def test_the_calls_inside_an_op_without_an_autograd_kernel_are_its_own_on_both_paths(tmp_path, monkeypatch, caplog, task) -> None:
    """Autograd's fallback runs an op with no autograd kernel below autograd without excluding it, so
    what its kernel calls is live: a dispatch mode sees only the op, and so does the native path
    (before 2026-11-28 it recorded those calls too). A quantized tensor's statistics are those of its
    dequantized values on both paths (before, the dispatch mode's raised into the step)."""
    python = _dump(tmp_path, monkeypatch, caplog, _no_autograd_kernels, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, _no_autograd_kernels, native=True, task=task)
    _assert_same_dumps(python, native)
    ops = [record.op for record in native if record.step == 0 and record.io == "output"]
    assert ops == [
        "torchdebug_backend_only.scaled.default",
        "quantized.linear_dynamic.default",
        "aten.relu.default",
        "quantized.linear_dynamic.default",
        "aten.quantize_per_tensor.default",
        "aten.dequantize.self",
    ]
    quantized = [record for record in native if record.dtype == "qint8"]
    assert quantized and all((record.stats is not None) == (task == "statistics") for record in quantized)


def _bits_dtypes() -> tuple[nn.Module, Callable[[], None]]:
    """Tensors whose dtype holds bits torch reduces no values of: fp4 pairs packed in a byte (the
    scales of microscaling formats sit beside them) and ``bits8``."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    x = torch.randn(3, 4)

    def step() -> None:
        h = model(x)
        packed = h.detach().to(torch.float8_e4m3fn).view(torch.uint8).view(torch.float4_e2m1fn_x2)
        packed.view(torch.uint8).float().sum()
        torch.zeros(4, dtype=torch.uint8).view(torch.bits8).view(torch.uint8).add(1)
        h.sum().backward()

    return model, step


@pytest.mark.parametrize("task", ["statistics", "checksum"])
def test_a_dtype_with_no_statistics_has_a_fingerprint_and_says_why_on_both_paths(tmp_path, monkeypatch, caplog, task) -> None:
    """No statistics of a packed fp4 or ``bits8`` tensor, a ``capture_error`` saying why, and its
    fingerprint (bits) on both paths (before 2026-11-28 the dispatch mode raised into the step, and
    the native path lost the step's records)."""
    python = _dump(tmp_path, monkeypatch, caplog, _bits_dtypes, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, _bits_dtypes, native=True, task=task)
    _assert_same_dumps(python, native)
    bits = [record for record in native if record.dtype in ("float4_e2m1fn_x2", "bits8")]
    assert {record.dtype for record in bits} == {"float4_e2m1fn_x2", "bits8"}
    if task == "statistics":
        assert {(record.stats, record.capture_error) for record in bits} == {(None, NO_STATISTICS)}
    else:
        assert all(record.checksum is not None and record.capture_error is None for record in bits)


def _half_training() -> tuple[nn.Module, Callable[[], None]]:
    """A float32 layer whose output is cast to float16 (kept by the native path, read at the flush)
    and added to a float32 tensor (one op reading both)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    x = torch.randn(3, 4)

    def step() -> None:
        model(x).half().add(x).sum().backward()

    return model, step


@pytest.mark.parametrize(
    ("native", "resolution"),
    [(False, "at once"), (False, "at flush"), (True, "at once"), (True, "at flush")],
    ids=["dispatch_mode", "staged", "native", "native_staged"],
)
def test_a_failure_to_take_statistics_is_recorded_and_the_step_goes_on(tmp_path, monkeypatch, caplog, native, resolution) -> None:
    """Taking a float16 tensor's statistics fails (as device memory running out would): the step
    runs on, its other records keep their statistics, and those of the float16 tensor say why (before
    2026-11-28 the dispatch mode raised into the step, and the native path lost the step's records).
    ``staged``: the statistics wait for the flush, as on an accelerator."""
    from torchdebug import stats_table

    def failing(taken: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
        def take(tensor: torch.Tensor) -> Any:
            if tensor.dtype == torch.float16:
                raise RuntimeError("planted")
            return taken(tensor)

        return take

    def failing_many(taken: Callable[[list[torch.Tensor], list[int]], None]) -> Callable[[list[torch.Tensor], list[int]], None]:
        def take(tensors: list[torch.Tensor], addresses: list[int]) -> None:
            if any(tensor.dtype == torch.float16 for tensor in tensors):
                raise RuntimeError("planted")
            taken(tensors, addresses)

        return take

    if resolution == "at flush":
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
        monkeypatch.setattr(stats_table, "device_sums", failing(stats_table.device_sums))
    else:  # (the native path's kept tensors land their sums, a staging's in one call: retried alone where it fails)
        monkeypatch.setattr(stats_table, "cpu_stats", failing(stats_table.cpu_stats))
        monkeypatch.setattr(stats_table, "cpu_sums_many_into", failing_many(stats_table.cpu_sums_many_into))
    records = _dump(tmp_path, monkeypatch, caplog, _half_training, native=native, task="statistics")
    half = [record for record in records if record.dtype == "float16"]
    assert half and {(record.stats, record.capture_error) for record in half} == {(None, STATS_NOT_TAKEN)}
    others = [record for record in records if record.dtype == "float32" and record.shape]
    assert others and all(record.stats is not None for record in others)
    assert any("could not take the statistics" in record.getMessage() for record in caplog.records)


def _math_bit_views() -> tuple[nn.Module, Callable[[], None]]:
    """Products of complex tensors handed as conjugate and negative views (``mul`` has no kernel for
    either: the math-bit fallback clones them), one, two and the same view twice, and one under
    inference mode."""
    torch.manual_seed(0)
    x, y = torch.randn(3, dtype=torch.complex64), torch.randn(3, dtype=torch.complex64)

    def step() -> None:
        torch.mul(x.conj(), y)
        torch.mul(x._neg_view(), y.conj())
        conjugate = x.conj()
        torch.mul(conjugate, conjugate).abs()
        with torch.inference_mode():  # no call live: the clone is called inside a recorded op's kernel
            torch.mul(x.conj(), y)

    return nn.Linear(2, 2), step


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_an_argument_with_a_math_bit_is_cloned_before_the_op_on_both_paths(tmp_path, monkeypatch, caplog, task) -> None:
    """The math-bit fallback clones a conjugate or negative view below autograd and above the Python
    key: a dispatch mode sees the clone, then the op reading it; the native path records them so."""
    python = _dump(tmp_path, monkeypatch, caplog, _math_bit_views, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, _math_bit_views, native=True, task=task)
    _assert_same_dumps(python, native)
    ops = [(record.op, record.io, record.arg) for record in native if record.step == 0 and record.io == "output"]
    assert [op for op, _, _ in ops if op in ("aten.clone.default", "aten.mul.Tensor")] == [
        "aten.clone.default",
        "aten.mul.Tensor",
        *["aten.clone.default"] * 2,
        "aten.mul.Tensor",
        *["aten.clone.default"] * 2,
        "aten.mul.Tensor",
        "aten.clone.default",
        "aten.mul.Tensor",
    ]
    clones = {record.value_id for record in native if record.op == "aten.clone.default" and record.io == "output"}
    products = [record for record in native if record.op == "aten.mul.Tensor" and record.io == "input"]
    assert all(record.value_id in clones for record in products if record.arg == "0")  # each reads its clone


class _CheckpointedBlock(nn.Module):
    """An ``MLPBlock`` run through a non-reentrant checkpoint, then one run plainly and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = MLPBlock(), MLPBlock(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(checkpoint(self.a, x, use_reentrant=False)))


def _accumulating_training() -> tuple[nn.Module, Callable[[], None]]:
    """Two micro-batches' gradients through ``_CheckpointedBlock``, then an SGD step."""
    torch.manual_seed(0)
    model = _CheckpointedBlock()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step() -> None:
        model(x).square().mean().backward()
        model(x * 2).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, step


def test_micro_batches_through_a_checkpoint_dump_the_same_records_and_stacks_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """Each backward recomputes its micro-batch's region: the recomputation's ``detach``es (its pack
    hook's, at the checkpointed block's line) are the native path's records as the mode's, told from
    the mode's own at the backward's line by their stacks."""
    python = _dump(tmp_path, monkeypatch, caplog, _accumulating_training, native=False, task="statistics", stack="all")
    native = _dump(tmp_path, monkeypatch, caplog, _accumulating_training, native=True, task="statistics", stack="all")
    _assert_same_dumps(python, native)
    recomputed = [r for r in native if r.step == 0 and r.phase == "recompute" and r.op == "aten.detach.default"]
    assert len({r.call_name for r in recomputed}) == 6 and all(r.source.endswith("blocks.py:16 in forward") for r in recomputed)


_REGION_ENDS = {
    "relu": torch.relu,
    "relu_": lambda y: torch.relu_(y * 1.0),  # in place: its output is its argument
    "sigmoid": torch.sigmoid,
    "softmax": lambda y: y.softmax(-1),
    "tanh": torch.tanh,
    "layer_norm": lambda y: F.layer_norm(y, (4,)),
}


def _ends_saving_its_output(end: str) -> Training:
    """A checkpointed region whose last op saves its output for the backward (``_REGION_ENDS``), a
    head after it, and SGD: checkpoint's early stop raises from that output's saved-tensors hook, in
    the op's autograd kernel after its kernel ran."""

    def training() -> tuple[nn.Module, Callable[[], None]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(3, 4)

        def step() -> None:
            h = checkpoint(lambda x: _REGION_ENDS[end](model[0](x)), x, use_reentrant=False)
            model[1](h).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return model, step

    return training


@pytest.mark.parametrize("end", list(_REGION_ENDS))
def test_an_op_whose_recomputation_stops_after_its_kernel_has_the_outputs_its_hook_saved(tmp_path, monkeypatch, caplog, end):
    """The op the recomputation stops in ran its kernel, which the mode saw return: the native path
    takes its outputs from the saved-tensors hook's detaches where they are all of them (one result that
    requires grad); layer norm's mean and rstd require none and its output is not saved, so it has
    inputs only there, the one record-level difference (``docs/capture.md``)."""
    training = _ends_saving_its_output(end)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task="statistics")
    stopped = {"relu": "aten.relu.default", "relu_": "aten.relu_.default", "sigmoid": "aten.sigmoid.default"}
    stopped |= {"softmax": "aten._softmax.default", "tanh": "aten.tanh.default"}
    op = stopped.get(end, "aten.native_layer_norm.default")
    unseen = [r for r in python if r.phase == "recompute" and r.op == op and r.io == "output"]
    if end == "layer_norm":
        assert [r.arg for r in unseen if r.step == 0] == ["0", "1", "2"]
        python = [r for r in python if r not in unseen]
    _assert_same_dumps(python, native)
    outputs = [r for r in native if r.phase == "recompute" and r.op == op and r.io == "output"]
    assert len(outputs) == (0 if end == "layer_norm" else 2)  # a step each
    if outputs:
        assert outputs[0].fwd == f"forward/-/{op}#0" and outputs[0].stats == unseen[0].stats


def test_selective_checkpointing_takes_the_native_path(monkeypatch) -> None:
    """Selective checkpointing runs its regions under a dispatch mode of its own, whose handler's calls
    the observer records (``test_a_checkpointed_model_dumps_the_same_records_on_both_paths``)."""
    from tests.capture.test_checkpointing import TinyGPT

    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    assert why_not_native(DebuggerConfig.from_dict({}), TinyGPT("selective")) is None


class _HookedBlock(nn.Module):
    """A residual block whose first layer has a forward hook of its own (as tensor parallelism's
    layers do), trained with no model handed to the capture."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 4)
        self.down = nn.Linear(4, 4)
        self.up.register_forward_hook(lambda module, args, output: output * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.down(torch.relu(self.up(x))) + x).sum()


def test_a_capture_with_no_model_names_hooks_and_accumulations_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """With no model handed over, the native path takes each top-level module as its call starts: the
    ops a layer's own forward hook runs are the layer's, the next ones its parent's again, and each
    gradient accumulation is named after its parameter, as the dispatch mode names them."""
    training = functools.partial(loss_training, _HookedBlock)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, with_model=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, with_model=False, task="statistics")
    _assert_same_dumps(python, native)
    calls = {r.call_name.split("#")[0] for r in native if r.step == 0}
    assert {"forward/up/aten.mul.Tensor", "forward/<root>/aten.relu.default", "backward/up.weight/aten.detach.default"} <= calls


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_a_step_that_runs_no_op_records_nothing_and_loses_nothing(tmp_path, monkeypatch, caplog, task) -> None:
    """A step with no op (one that raised before its first, or ran nothing captured) drains no row:
    no record, no warning, and the next step records as any (its drain once failed on the empty
    columns' types and said the step's ops were lost)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    with caplog.at_level(logging.WARNING, logger="torchdebug"):
        with torchdebug.Debugger(tmp_path, task=task) as debugger:
            debugger.start(None)
            debugger.step()
            debugger.start(None)
            torch.ones(2).mul(2.0)
            debugger.step()
    assert not [record.getMessage() for record in caplog.records]
    records = torchdebug.load(tmp_path).ranks[0].records()
    assert {record.step for record in records} == {1} and "forward/-/aten.mul.Tensor#0/output.0" in {r.name for r in records}


def test_an_inference_tensor_has_no_version_on_the_native_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    with torch.inference_mode():
        made = torch.ones(3)
    with torchdebug.Debugger(tmp_path, task="structure") as debugger:
        debugger.start(None)
        made.mul(2)
        debugger.step()
    read = {r.name: r for r in torchdebug.load(tmp_path).ranks[0].records()}["forward/-/aten.mul.Tensor#0/input.0"]
    assert read.value_id is not None and read.version is None


class _Scaling(TorchDispatchMode):
    """A user's dispatch mode: each ``addmm`` returns its output times 1.5."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        return out * 1.5 if func is torch.ops.aten.addmm.default else out


def test_a_dispatch_mode_entered_before_capture_is_seen_through_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """A capture mode entered inside a user's mode sees each op and the output the user's handler
    returns, not the handler's own calls: so does the observer. (Stacks are left out: the observer
    takes a ``detach`` that autograd runs to save an output with the handler's frame on the stack.)"""
    with _Scaling():
        python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, task="statistics", stack="none")
        native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, task="statistics", stack="none")
    _assert_same_dumps(python, native)
    assert "aten.addmm.default" in {record.op for record in native}


def _scaled_training() -> tuple[nn.Module, Callable[[], None]]:
    """A step whose forward runs under a user's dispatch mode entered inside it (``_Scaling``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)

    def step() -> None:
        with _Scaling():
            loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, step


def test_a_dispatch_mode_entered_in_the_step_dumps_its_handlers_calls_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """A capture mode sits below a mode entered after it started, and sees the calls that mode's
    handler makes (the op it was handed, and ``_Scaling``'s ``mul``), not the ones made under it: so
    does the observer, each call linked to the node its op made (the backward's names and ``fwd``).
    Value ids are not compared: under such a mode autograd saves ``relu``'s output through a
    ``detach`` both paths record, whose output the mode's backward reads, where the native path's
    reads the output itself (docs/architecture.md, "The native path (issue 48)")."""
    python = _dump(tmp_path, monkeypatch, caplog, _scaled_training, native=False, task="statistics", stack="none")
    native = _dump(tmp_path, monkeypatch, caplog, _scaled_training, native=True, task="statistics", stack="none")
    for step in (0, 1):
        got = [r for r in native if r.step == step]
        expected, _ = without_mode([r for r in python if r.step == step], got)
        assert [(r.name, r.shape, r.fwd, r.stats) for r in got] == [(name, r.shape, fwd, r.stats) for r, name, fwd in expected]
    forward = [r.call_name for r in native if r.step == 0 and r.phase == "forward" and r.io == "input"]
    assert "forward/0/aten.addmm.default#0" in forward and "forward/0/aten.mul.Tensor#0" in forward
    assert any(r.fwd == "forward/0/aten.addmm.default#0" for r in native if r.phase == "backward")


def test_ops_inside_a_torch_func_transform_are_said_and_not_recorded_in_its_place(tmp_path, monkeypatch, caplog) -> None:
    """Under vmap a dispatch mode sees the plain ops the batching rules run (a matmul's unsqueeze, mm
    and squeeze_), which the observer cannot tell from a kernel's own calls: the native path records
    none of the transform's ops, says how many once, and records the backward outside it (named
    without the forward calls it would take its module from)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    model = nn.Linear(4, 4)
    with caplog.at_level(logging.WARNING, logger="torchdebug.capture.native_capture"):
        with torchdebug.Debugger(tmp_path, task="structure") as debugger:
            debugger.start(model)
            torch.vmap(lambda row: model(row).tanh())(torch.ones(3, 4)).sum().backward()
            torch.func.grad(lambda x: model(x).sum())(torch.ones(4))
            debugger.step()
    said = [record.getMessage() for record in caplog.records if "torch.func transform" in record.getMessage()]
    assert len(said) == 1 and "TORCHDEBUG_NATIVE=0" in said[0]
    records = torchdebug.load(tmp_path).ranks[0].records()
    forward = {r.op for r in records if r.phase == "forward"}
    assert "aten.sum.default" in forward and not {"aten.matmul.default", "aten.mm.default", "aten.tanh.default"} & forward
    assert {"aten.tanh_backward.default", "aten.mm.default"} <= {r.op for r in records if r.phase == "backward"}


@pytest.mark.parametrize("native", [False, True], ids=["dispatch mode", "native"])
def test_an_allocation_freed_unwritten_leaves_no_mark_on_the_storage_that_takes_its_place(
    tmp_path, monkeypatch, caplog, native: bool
) -> None:
    """An allocation is described, not read (``uninitialised``); once it is freed unwritten, the
    allocator may hand its storage's address to the next op's output, whose values are read. The
    native path held no storage, so that output passed for the allocation and lost its statistics."""
    x = torch.arange(4.0)

    def training() -> tuple[nn.Module, Callable[[], None]]:
        def step() -> None:
            for _ in range(4):
                torch.empty(4)  # freed at once, never written
                x.add(1)

        return nn.Identity(), step

    records = _dump(tmp_path, monkeypatch, caplog, training, native=native, steps=1, task="statistics")
    outputs = [r for r in records if r.op == "aten.add.Tensor" and r.io == "output"]
    assert len(outputs) == 4 and all(r.extra == {} and r.stats["max"] == 4.0 for r in outputs)
    assert all(r.extra == {"unread": "uninitialised"} for r in records if r.op == "aten.empty.memory_format" and r.io == "output")


@pytest.mark.parametrize("level", ["op", "mix", "module"])
def test_a_second_debugger_on_the_native_path_records_nothing_while_the_first_observes(tmp_path, monkeypatch, caplog, level):
    """Not even its module records (level ``mix``), and it keeps none of that step for its next; at
    level ``module`` (no op of its own) its module records go through Python's meanwhile."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING, logger="torchdebug.capture.native_capture"):
        with (
            torchdebug.Debugger(tmp_path / "first", stack="none") as first,
            torchdebug.Debugger(tmp_path / "second", stack="none", level=level) as second,
        ):
            first.start(model)
            second.start(model)
            model(torch.ones(1, 2))
            second.stop()
            first.stop()
            second.step()
            second.start(model)  # alone now
            model(torch.ones(1, 2))
            second.stop()
    assert "aten.addmm.default" in {record.op for record in torchdebug.load(tmp_path / "first").ranks[0].records()}
    records = list(torchdebug.load(tmp_path / "second").ranks[0].records())
    assert {record.step for record in records} == ({0, 1} if level == "module" else {1})
    ops = {record.op for record in records}
    assert ops == {"module"} if level == "module" else ops >= {"aten.addmm.default", *(["module"] if level == "mix" else [])}
    if level == "module":  # the same records each step, whichever path took them
        steps = [[(r.name.split("/", 1)[1], r.dtype, r.shape) for r in records if r.step == step] for step in (0, 1)]
        assert steps[0] == steps[1]
    assert sum("another debugger" in record.getMessage() for record in caplog.records) == 1
    assert not [record for record in caplog.records if "lost" in record.getMessage()]


_SUBCLASS_TASKS = pytest.mark.parametrize(
    "options",
    [{"task": "structure"}, {"task": "statistics", "checksum": True}, {"task": "checksum"}],
    ids=["structure", "statistics+checksum", "checksum"],
)
"""The tasks the tensor-subclass tests dump with: what a subclass slot is described and read by."""


def _subclass_training() -> tuple[nn.Module, Callable[[], None]]:
    """A linear layer whose frozen weight is quantized (a subclass computed from int8 data and a
    scale, held as a buffer), a trained adapter beside it, and a thin wrapper added after."""
    from tests.capture.test_subclasses import ScaledInt8, Wrapped

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    data = torch.randint(-8, 8, (2, 4), dtype=torch.int8)
    del model.weight
    model.register_buffer("weight", ScaledInt8(data, torch.tensor(0.25)))
    adapter = nn.Linear(4, 2, bias=False)
    model.register_module("adapter", adapter)
    optimizer = torch.optim.SGD(adapter.parameters(), lr=0.1)
    x, thin = torch.randn(3, 4), Wrapped(torch.randn(3, 2))

    def step() -> None:
        (model(x) + adapter(x) + thin).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


@_SUBCLASS_TASKS
def test_tensor_subclasses_are_read_through_their_inner_tensors_on_both_paths(tmp_path, monkeypatch, caplog, options) -> None:
    """A wrapper subclass flowing through a run is described as itself and read through the plain
    tensor holding its elements; one computed from several inner tensors says so: on both paths."""
    python = _dump(tmp_path, monkeypatch, caplog, _subclass_training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, _subclass_training, native=True, **options)
    _assert_same_dumps(python, native)
    assert [r.capture_error for r in native] == [r.capture_error for r in python]
    wrapped = [r for r in native if r.extra.get("subclass") == "Wrapped"]
    assert wrapped and all(r.shape == [3, 2] and r.capture_error is None for r in wrapped)
    if options["task"] != "structure":
        assert all(r.checksum is not None for r in wrapped)
    assert any("computed from several inner tensors" in (r.capture_error or "") for r in native)


class _QuantizedBlock(nn.Module):
    """A frozen quantized linear layer (its weight a parameter that does not require grad, as torchao
    holds one) with a trained low-rank adapter beside it, QLoRA's block."""

    def __init__(self, quantized: type, width: int = 4, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(width, width)
        data = torch.randint(-8, 8, (width, width), dtype=torch.int8)
        self.base.weight = nn.Parameter(quantized(data, torch.tensor(0.25)), requires_grad=False)
        self.down, self.up = nn.Linear(width, rank, bias=False), nn.Linear(rank, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.base(x) + self.up(self.down(x)))


def _quantized_training() -> tuple[nn.Module, Callable[[], None]]:
    """Two checkpointed quantized blocks (one quantized below the dispatcher, one taking ``F.linear``
    through ``__torch_function__``, NF4's way) and a head whose weight, a thin wrapper, is trained by AdamW."""
    from tests.capture.test_subclasses import LinearScaledInt8, ScaledInt8, Wrapped

    torch.manual_seed(0)
    model = nn.Sequential(_QuantizedBlock(ScaledInt8), _QuantizedBlock(LinearScaledInt8), nn.Linear(4, 2))
    model[2].weight = nn.Parameter(Wrapped(torch.randn(2, 4)))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    x = torch.randn(3, 4)

    def step() -> None:
        h = x
        for block in model[:2]:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
        model[2](h).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


@_SUBCLASS_TASKS
def test_a_model_with_quantized_weights_dumps_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog, options) -> None:
    """Tensor-subclass parameters (quantized weights, a trained wrapper) take the native path and
    record what the mode records: the weights as themselves, read through their inner tensors or
    saying why not, in the forward, the recomputation and the optimizer's in-place updates."""
    python = _dump(tmp_path, monkeypatch, caplog, _quantized_training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, _quantized_training, native=True, **options)
    _assert_same_dumps(python, native)
    subclasses = {(r.phase, r.extra["subclass"]) for r in native if "subclass" in r.extra}
    assert {("forward", "ScaledInt8"), ("recompute", "ScaledInt8")} <= subclasses
    # the Function the second block's weight takes F.linear to reads its int8 data, as NF4's does
    assert any(r.module == "1.base" and r.dtype == "int8" for r in native if r.phase == "forward")
    assert ("optimizer", "Wrapped") in subclasses
    updated = [r for r in native if r.phase == "optimizer" and r.io == "output" and r.extra.get("subclass") == "Wrapped"]
    assert updated and all(r.capture_error is None for r in updated)
    if options["task"] != "structure":
        assert all(r.checksum is not None for r in updated)


@torch.library.custom_op("torchdebug_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class _CustomOpInput(nn.Module):
    """A layer fed through a custom op with a Python kernel (``torch.library.custom_op``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(_scaled(x)).sum()


def test_a_custom_op_dumps_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """A custom op with a Python kernel is one call, not the ops its kernel runs, on both paths
    (torch 2.14 dispatches it past the dispatcher's call the observer sees, unless told not to:
    ``_torch.custom_ops.DispatcherCalls``)."""
    training = functools.partial(loss_training, _CustomOpInput)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task="statistics")
    _assert_same_dumps(python, native)
    assert "torchdebug_test.scaled.default" in {r.op for r in native} and "aten.mul.Tensor" not in {r.op for r in native}


class _MadeParameter(nn.Module):
    """A forward that makes a parameter of its own, as FSDP2's first unshard does (``nn.Parameter``
    detaches its data where no dispatch mode sees it)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = nn.Parameter(self.base.detach() * 2)
        return (x @ scale).sum()


def test_a_parameter_made_in_the_step_dumps_the_same_records_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """The detach ``nn.Parameter`` makes its tensor with is no call of the step's (a dispatch mode never
    sees it): the native path leaves it out; the user's own detach before it stays."""
    training = functools.partial(loss_training, _MadeParameter)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task="statistics")
    _assert_same_dumps(python, native)
    assert {r.op for r in native if r.module == "<root>" and r.phase == "forward"} == {
        "aten.detach.default",
        "aten.mul.Tensor",
        "aten.mm.default",
        "aten.sum.default",
    }


def test_the_hooks_the_observer_calls_from_inside_ops_are_never_compiled_by_dynamo(tmp_path, monkeypatch) -> None:
    """Where Dynamo runs a frame of compiled code eagerly with its callback on (one its backend failed
    to compile), it compiles each Python frame that starts there: the observer turns it off around
    the hooks it calls from inside ops (here the subclass hook), which describe the instance as in
    eager code, and the step's result is as without capture."""
    from tests.capture.test_subclasses import Wrapped

    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    seen = []
    hook = native_records.NativeStepCapture._subclass

    def spy(self, tensor: torch.Tensor) -> int:
        seen.append(torch._C._dynamo.eval_frame.get_eval_frame_callback())
        return hook(self, tensor)

    monkeypatch.setattr(native_records.NativeStepCapture, "_subclass", spy)

    def failing(gm, example_inputs):  # noqa: ANN001, ANN202
        raise RuntimeError("a backend that cannot compile")

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: (x * 2).sum(), backend=failing)
    thin = Wrapped(torch.randn(3))
    with torch._dynamo.config.patch(suppress_errors=True), torchdebug.Debugger(tmp_path, task="statistics") as debugger:
        debugger.start(None)
        total = compiled(thin)
        debugger.step()
    torch._dynamo.reset()
    assert seen and seen == [None] * len(seen)
    assert torch.equal(total, (thin._inner * 2).sum())
    records = {r.name: r for r in torchdebug.load(tmp_path).ranks[0].records()}
    assert records["forward/-/aten.mul.Tensor#0/input.0"].extra == {"subclass": "Wrapped", "local_shape": [3]}


def _subclass_written_in_place(tmp_path: Path) -> list[Record]:
    """The records of a thin wrapper subclass read, written in place, and read again, in one step."""
    from tests.capture.test_subclasses import Wrapped

    thin = Wrapped(torch.ones(3))
    with torchdebug.Debugger(tmp_path, task="statistics") as debugger:
        debugger.start(None)
        thin.mul(2.0)
        thin.add_(1.0)
        thin.mul(3.0)
        debugger.step()
    return [r for r in torchdebug.load(tmp_path).ranks[0].records() if r.extra.get("subclass") == "Wrapped"]


_WRAPPED_READS = [
    ("forward/-/aten.mul.Tensor#0/input.0", [3], 0),
    ("forward/-/aten.add_.Tensor#0/input.0", [3], 0),
    ("forward/-/aten.add_.Tensor#0/output.0", [3], 1),  # the op returns its argument (a mode sees the handler's result)
    ("forward/-/aten.mul.Tensor#1/input.0", [3], 1),
]


def test_a_tensor_subclass_is_read_at_the_op_through_its_plain_tensor(tmp_path, monkeypatch) -> None:
    """The native path reads a subclass instance at the op, through the plain tensor holding its
    elements, as the dispatch mode does: one written in place later keeps the values it had there."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    reads = _subclass_written_in_place(tmp_path)
    assert [(r.name, r.shape, r.version) for r in reads] == _WRAPPED_READS
    assert [r.stats["max"] for r in reads] == [1.0, 1.0, 2.0, 2.0]
    assert [r.capture_error for r in reads] == [None] * 4


def test_a_tensor_subclass_not_read_at_the_op_and_written_before_the_flush_is_said_unread(tmp_path, monkeypatch) -> None:
    """Where the callback cannot read a subclass instance at the op (its plain tensor not on the CPU;
    here the description names none), the native path reads it at the step's end: one written in
    place since an op read it is described (shape, extra) and says it was not read."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    monkeypatch.setattr(native_records, "described", lambda tensor: dataclasses.replace(described(tensor), plain=0))
    reads = _subclass_written_in_place(tmp_path)
    assert [(r.name, r.shape, r.version) for r in reads] == _WRAPPED_READS
    assert [r.stats for r in reads[:2]] == [None, None] and [r.stats["max"] for r in reads[2:]] == [2.0, 2.0]
    assert all("changed in place before the flush" in r.capture_error for r in reads[:2])
    assert [r.capture_error for r in reads[2:]] == [None, None]


def _evaluation() -> tuple[nn.Module, Callable[[], None]]:
    """A model in eval mode run under ``no_grad`` and ``inference_mode``, where the tensors made keep no
    version: a float and an int64 inference tensor are each written in place between two reads, and
    one is copied in another memory order."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.LayerNorm(4)).eval()
    x = torch.randn(3, 4)

    def step() -> None:
        with torch.no_grad():
            model(x)
        with torch.inference_mode():
            y = model(x * 2)
            y.add_(1.0)
            y.mul(3.0)
            positions = torch.arange(4)  # read at the flush on the native path: copied before its add_
            positions.add_(1)
            positions.sum()
            torch.randn(48, 40).mul(3.0).t().contiguous()  # a copy summed in another order than its argument

    return model, step


@pytest.mark.parametrize(
    "options", [{"task": "statistics"}, {"task": "statistics", "checksum": True}], ids=["statistics", "statistics+checksum"]
)
def test_inference_tensors_are_read_at_each_op_on_both_paths(tmp_path, monkeypatch, caplog, options) -> None:
    """An inference tensor keeps no version counter (reading it raises): each read takes its values as
    they are then, on both paths, and nothing is recorded as an error (the dispatch mode recorded
    "Inference tensors do not track version counter" for every one)."""
    python = _dump(tmp_path, monkeypatch, caplog, _evaluation, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, _evaluation, native=True, **options)
    _assert_same_dumps(python, native)
    for records in (python, native):
        assert not [r.name for r in records if r.capture_error]
        maxima = {r.name: r.stats["max"] for r in records if r.step == 0}
        assert maxima["forward/-/aten.arange.default#0/output.0"] == 3
        assert maxima["forward/-/aten.add_.Tensor#1/input.0"] == 3 and maxima["forward/-/aten.sum.default#0/input.0"] == 4
        written = maxima["forward/-/aten.add_.Tensor#0/input.0"]
        assert maxima["forward/-/aten.add_.Tensor#0/output.0"] == maxima["forward/-/aten.mul.Tensor#1/input.0"] == written + 1
        copied = {r.io: r.stats["mean"] for r in records if r.step == 0 and r.op == "aten.contiguous.default"}
        assert copied["input"] != copied["output"]  # each its own read (the native path once shared the argument's)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _HookedWeight(nn.Module):
    """A user's gradient hook on a parameter (registered before capture's own) and a custom autograd
    function."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.linear.weight.register_hook(lambda grad: grad * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Square.apply(self.linear(x)).mean()


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_a_gradient_hook_on_a_parameter_runs_in_the_parameters_name_on_both_paths(tmp_path, monkeypatch, caplog, task) -> None:
    """The ops of a user's hook on a parameter's gradient are the parameter's, as its accumulation is
    (the mode names them from the node they run in; the native path's parameter hook, which sets that
    name, ran after the user's, so they were named outside any module)."""
    training = functools.partial(loss_training, _HookedWeight, micro_batches=2)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task=task)
    _assert_same_dumps(python, native)
    hooked = [
        r.call_name for r in native if r.step == 0 and r.phase == "backward" and r.op == "aten.mul.Tensor" and r.io == "output"
    ]
    assert [name for name in hooked if name.startswith("backward/linear.weight/")] == [
        "backward/linear.weight/aten.mul.Tensor#0",  # a micro-batch each
        "backward/linear.weight/aten.mul.Tensor#1",
    ]


class _Hooked(nn.Module):
    """Hooks of every kind: a gradient hook and ``retain_grad`` on an activation, a forward hook that
    replaces a module's output, full backward hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)
        self.a.register_forward_hook(lambda module, args, output: output * 1.5)
        self.b.register_full_backward_hook(lambda module, grad_input, grad_output: (grad_input[0] * 0.5,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h.register_hook(lambda grad: grad * 2)
        h.retain_grad()
        return self.b(h).square().mean()


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_a_gradient_hook_on_an_activation_runs_in_its_forward_ops_name_on_both_paths(tmp_path, monkeypatch, caplog, task) -> None:
    """The ops of a hook on an activation's gradient run in the evaluation of the node that made the
    activation, before the node's apply gives its sequence number: they take it then, and with it
    the forward op's module (they were named outside any module on the native path)."""
    training = functools.partial(loss_training, _Hooked)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task=task)
    _assert_same_dumps(python, native)
    first = [r for r in native if r.step == 0 and r.phase == "backward" and r.io == "output"]
    tanh = next(index for index, r in enumerate(first) if r.op == "aten.tanh_backward.default")
    assert first[tanh - 1].call_name == "backward/<root>/aten.mul.Tensor#1"  # the hook's, just before
    assert first[tanh - 1].fwd == "forward/<root>/aten.tanh.default#0"


class _DroppedOut(nn.Module):
    """A non-reentrant checkpointed block whose last op that saves a tensor is dropout's ``mul`` by its
    mask (an input that needs no gradient): checkpoint's early stop raises from the mask's
    saved-tensors hook, inside the recomputed ``mul``'s autograd kernel, before its kernel runs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 1)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(self.a(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(checkpoint(self.block, x, use_reentrant=False)).square().mean()


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_an_op_checkpoints_early_stop_interrupts_is_not_recorded_on_both_paths(tmp_path, monkeypatch, caplog, task) -> None:
    """The recomputed op whose input's saved-tensors hook raises checkpoint's early stop never reaches
    its kernel, and no dispatch mode sees it: the native path recorded it, with inputs and no outputs."""
    training = functools.partial(loss_training, _DroppedOut)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task=task)
    _assert_same_dumps(python, native)
    recomputed = [r.call_name for r in native if r.step == 0 and r.phase == "recompute"]
    assert "recompute/drop/aten.div_.Scalar#0" in recomputed and "recompute/drop/aten.mul.Tensor#0" not in recomputed


def _written_through_views() -> tuple[nn.Module, Callable[[], None]]:
    """In-place ops on views of an activation: their backward runs in ``CopySlices`` nodes, which
    apply the in-place op's node inside their own."""
    torch.manual_seed(0)
    model = nn.Linear(6, 6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6)

    def step() -> None:
        h = model(x).clone()
        h[:, 0] += 1.0
        h[1:].mul_(2.0)
        h.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_the_backward_of_an_in_place_op_on_a_view_is_named_after_the_node_run_on_both_paths(
    tmp_path, monkeypatch, caplog, task
) -> None:
    """A node applied inside another's apply (``CopySlices`` runs the in-place op's node) adds no
    sequence number of its own: its ops are the running node's, as a dispatch mode names them from
    the node the engine runs (the native path named them after the in-place op's forward call)."""
    python = _dump(tmp_path, monkeypatch, caplog, _written_through_views, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, _written_through_views, native=True, task=task)
    _assert_same_dumps(python, native)
    copy_slices = [r for r in native if r.step == 0 and r.phase == "backward" and r.op == "aten.copy_.default"]
    assert copy_slices and {(r.module, r.fwd) for r in copy_slices} == {("-", None)}


class _Offloaded(nn.Module):
    """Saved-tensors hooks that run ops: torch's ``save_on_cpu``, and a pack and an unpack hook of
    the model's own (under no_grad, inside the autograd kernel of the op that saves, before the op
    below it runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.save_on_cpu():
            h = torch.tanh(self.a(x))
        with torch.autograd.graph.saved_tensors_hooks(lambda saved: saved * 1.0, lambda saved: saved + 0.0):
            out = self.b(h).sigmoid()
        return out.square().mean()


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_the_ops_of_saved_tensors_hooks_leave_the_backward_named_after_the_op_that_saved_on_both_paths(
    tmp_path, monkeypatch, caplog, task
) -> None:
    """A pack hook's op runs before the op that saves is seen below autograd: on the dispatch mode it
    took that op's node, so the node's backward ops (the unpack hook's among them) were named after the
    hook's ``mul``, not the ``addmm`` that made the node."""
    training = functools.partial(loss_training, _Offloaded)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task=task)
    _assert_same_dumps(python, native)
    unpacked = [r for r in python if r.step == 0 and r.phase == "backward" and r.module == "b" and r.op == "aten.add.Tensor"]
    assert unpacked and {r.fwd for r in unpacked} == {"forward/b/aten.addmm.default#0"}


class _Bucketed(nn.Module):
    """A gradient copied into a bucket by a post hook of its accumulator (an autograd node of the
    model's, held by it), as DDP's reducer copies each gradient, scaled, into its bucket."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.bucket = torch.zeros(2)
        self.accumulator = get_gradient_edge(self.linear.bias).node
        self.accumulator.register_hook(self._copy)

    def _copy(self, grad_inputs: tuple, grad_outputs: tuple) -> None:
        torch.mul(self.linear.bias.grad, 0.5, out=self.bucket)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).square().mean()


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_the_ops_of_a_gradient_accumulators_post_hook_are_the_parameters_on_both_paths(
    tmp_path, monkeypatch, caplog, task
) -> None:
    """The ops of a post hook of a parameter's gradient accumulator run after the accumulation, in its
    node (the dispatch mode names them after the parameter; the native path restored the context
    before them, so they were named outside any module: DDP's copies into its buckets)."""
    training = functools.partial(loss_training, _Bucketed)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, task=task)
    _assert_same_dumps(python, native)
    assert {r.call_name for r in native if r.op == "aten.mul.out"} == {"backward/linear.bias/aten.mul.out#0"}


def _optimizer_in_backward() -> tuple[nn.Module, Callable[[], None]]:
    """An optimizer per parameter, stepped from the parameter's post-accumulate hook as its gradient
    is ready (the optimizer in the backward: torchtune's, to free each gradient at once)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizers = {parameter: torch.optim.AdamW([parameter], lr=1e-2) for parameter in model.parameters()}

    def step_one(parameter: torch.Tensor) -> None:
        optimizers[parameter].step()
        optimizers[parameter].zero_grad()

    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(step_one)
    x = torch.randn(3, 4)
    return model, lambda: model(x).sum().backward()


@pytest.mark.parametrize("task", ["structure", "statistics"])
def test_an_optimizer_stepped_in_the_backward_runs_the_parameters_backward_ops_on_both_paths(
    tmp_path, monkeypatch, caplog, task
) -> None:
    """The ops of an optimizer step run from a post-accumulate hook are backward ops of the parameter
    (the dispatch mode names them from the node running; the native path's optimizer hooks had
    named them outside any module)."""
    python = _dump(tmp_path, monkeypatch, caplog, _optimizer_in_backward, native=False, task=task)
    native = _dump(tmp_path, monkeypatch, caplog, _optimizer_in_backward, native=True, task=task)
    _assert_same_dumps(python, native)
    stepped = {r.module for r in native if r.step == 1 and r.op == "aten.addcdiv_.default"}
    assert stepped == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert {r.phase for r in native} == {"forward", "backward"}


def _clipped_through_data() -> tuple[nn.Module, Callable[[], None]]:
    """Weights clipped through ``.data`` after the optimizer step (a WGAN critic's), then read again in
    the same step: ``.data`` is an alias with a version counter of its own, so the write leaves each
    parameter's version where it was."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(3, 4)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for parameter in model.parameters():
            parameter.data.clamp_(-0.05, 0.05)
        model(x)  # the clipped critic's output, logged

    return model, step


def test_a_parameter_written_through_its_data_alias_is_read_again_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """What was taken of a tensor is taken again once an op wrote its storage, though its version did
    not move: both paths gave the clipped weight the statistics it had before the clipping."""
    python = _dump(tmp_path, monkeypatch, caplog, _clipped_through_data, native=False, task="statistics", checksum=True)
    native = _dump(tmp_path, monkeypatch, caplog, _clipped_through_data, native=True, task="statistics", checksum=True)
    for step in (0, 1):  # value ids aside: on both paths the write names no new value (the alias's own op is the mode's)
        got = [record for record in native if record.step == step]
        expected, _ = without_mode([record for record in python if record.step == step], got)
        assert [(r.name, r.stats, r.checksum) for r in got] == [(name, r.stats, r.checksum) for r, name, _ in expected]
    for records in (python, native):
        reads = {r.name: r for r in records if r.step == 0 and r.op == "aten.t.default" and r.io == "input"}
        before, after = reads["forward/<root>/aten.t.default#0/input.0"], reads["forward/<root>/aten.t.default#1/input.0"]
        assert before.stats["max"] > 0.05 and after.stats["max"] == pytest.approx(0.05)


def _half_precision() -> tuple[nn.Module, Callable[[], None]]:
    """A float16 model trained with a foreach AdamW: its tensors' statistics are taken at the flush
    (stats.c takes float32, bfloat16 and float64 in the callback), so the observer keeps them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 1)).half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    x = torch.randn(3, 4, dtype=torch.float16)

    def step() -> None:
        model(x).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, step


def test_tensors_kept_for_the_flush_leave_torch_deciding_as_without_capture(tmp_path, monkeypatch, caplog) -> None:
    """What the observer keeps for the flush counts neither in a tensor's use_count nor in its version
    counter's: AccumulateGrad steals a float16 gradient (``detach``) instead of copying it
    (``new_empty_strided``, ``copy_``), and ``zeros_like``'s optimizer state keeps the TensorImpl its
    slot recorded (Python wraps a result in place only while nothing else holds it), as on the mode."""
    python = _dump(tmp_path, monkeypatch, caplog, _half_precision, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, _half_precision, native=True, task="statistics")
    _assert_same_dumps(python, native)
    accumulated = {r.op for r in native if r.step == 0 and r.phase == "backward" and r.module == "3.bias"}
    assert accumulated == {"aten.detach.default"}
    assert all(r.stats is not None and r.dtype == "float16" for r in native if r.op == "aten.zeros_like.default")


def _dropped_results() -> tuple[None, Callable[[], None]]:
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))

    def step() -> None:
        x.mul(3).to(torch.int32)  # an integer result Python drops at once: its statistics are taken at the drain
        torch.arange(5).add(1)  # a factory's result, then one made from it
        x.sum()

    return None, step


def test_a_result_python_drops_before_the_next_op_is_read_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    python = _dump(tmp_path, monkeypatch, caplog, _dropped_results, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, _dropped_results, native=True, task="statistics")
    _assert_same_dumps(python, native)
    assert all(r.stats is not None and r.capture_error is None for r in native)


class _Router(nn.Module):
    """A mixture-of-experts router's selection: top-k of a softmax, its backward a scatter into zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, _ = torch.topk(self.gate(x).softmax(-1), 2, dim=-1)
        return weights.sum()


def _routed_training() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = _Router()
    x = torch.randn(6, 8)
    return model, lambda: model(x).backward()


def test_a_selections_backward_is_its_decomposition_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """``value_selecting_reduction_backward`` decomposes above autograd; the first op it calls makes
    its zeros (no tensor argument), which tells the observer so: its ops are recorded, not the op."""
    python = _dump(tmp_path, monkeypatch, caplog, _routed_training, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, _routed_training, native=True, task="statistics")
    _assert_same_dumps(python, native)
    backward = {r.op for r in native if r.phase == "backward"}
    assert "aten.scatter_.src" in backward and "aten.value_selecting_reduction_backward.default" not in backward


class _BatchNormed(nn.Module):
    """A BatchNorm in training, whose kernel writes the running statistics in place though its schema
    does not say so (and torch moves no version), and one in eval, which writes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.frozen = nn.BatchNorm1d(8).eval()
        self.second = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.frozen(torch.relu(self.norm(self.first(x))))).square().mean()


def _batch_norm_training(fused: bool) -> Training:
    def training() -> tuple[nn.Module, Callable[[], None]]:
        torch.manual_seed(0)
        model = _BatchNormed()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)  # fused: its writes move no version
        x = torch.randn(5, 6)

        def step() -> None:
            model(x).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return model, step

    return training


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "fused-adamw"])
@pytest.mark.parametrize("options", [{"task": "structure"}, {"task": "statistics"}], ids=["structure", "statistics"])
def test_writes_torch_does_not_count_in_a_version_make_new_values_on_both_paths(
    tmp_path, monkeypatch, caplog, options: dict, fused: bool
) -> None:
    """BatchNorm's running statistics: the backward reads the values the forward wrote, a later
    version of the tensor than the forward read, with their own statistics; nothing of the eval one
    changes. The same on both paths, and for a fused optimizer's writes."""
    training = _batch_norm_training(fused)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, **options)
    _assert_same_dumps(python, native)
    for records in (python, native):  # each path on its own: the comparison above leaves versions out
        by_name = {record.name: record for record in records if record.step == 1}
        for module, moved in (("norm", 1), ("frozen", 0)):
            read = by_name[f"forward/{module}/aten.native_batch_norm.default#0/input.3"]
            read_again = by_name[f"backward/{module}/aten.native_batch_norm_backward.default#0/input.3"]
            assert read_again.value_id == read.value_id and read_again.version == read.version + moved
            if options["task"] == "statistics":
                assert (read_again.stats != read.stats) == bool(moved)
        if fused:  # each step's update is a write: the weight the next step reads is a later version
            weights = {r.step: r.version for r in records if r.phase == "forward" and r.module == "first" and r.shape == [8, 6]}
            assert weights[1] > weights[0]


class _FilledThroughAView(nn.Module):
    """Tensors whose statistics wait for the flush (int64, complex) written after an op read them:
    zeros a counter fills through a slice, and the complex zeros ``rfft``'s backward fills through one."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        counts = torch.zeros(4, dtype=torch.int64)
        counts[1:3].add_(2)
        return torch.fft.rfft(self.linear(x)).abs().sum() + counts.sum()


def _filled_through_a_view() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = _FilledThroughAView()
    x = torch.randn(3, 6)
    return model, lambda: model(x).backward()


def test_a_tensor_read_at_the_flush_and_written_since_holds_what_its_op_read_on_both_paths(tmp_path, monkeypatch, caplog) -> None:
    """The native path reads an int64 or complex tensor at the flush; one a later op writes (through
    a view) is copied before that write, so its records hold what each op read, as the mode's do."""
    python = _dump(tmp_path, monkeypatch, caplog, _filled_through_a_view, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, _filled_through_a_view, native=True, task="statistics")
    _assert_same_dumps(python, native)
    unread = [r.name for r in native if r.stats is None and "unread" not in r.extra]  # copy_'s destination is unread
    assert not unread, unread
    assert {record.dtype for record in native} >= {"int64", "complex64"}
    zeros = next(r for r in native if r.op == "aten.zeros.default" and r.step == 1)
    assert zeros.stats["max"] == 0  # as made, before the add_ through its slice


def _wrapped_chain_training() -> tuple[nn.Module, Callable[[], None]]:
    """A linear layer whose output is wrapped anew (a thin subclass) at each of six links, each
    instance freed before an op that makes no tensor: the sweep at its start lets go of it, and the
    next instance takes its address (the allocator hands the last freed block of a size out first)."""
    from tests.capture.test_subclasses import Wrapped

    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)

    def step() -> None:
        h, total = model(x), 0.0
        for link in range(6):
            inner = h * (link + 1)
            wrapped = None
            inner.mul_(1.0)
            wrapped = Wrapped(inner)
            total = total + wrapped.sum()
        (h.sum() + total).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


@pytest.mark.parametrize(
    ("training", "options"),
    [
        (gpt_training, {"task": "statistics", "checksum": True}),
        (_checkpointed_training("non_reentrant"), {"task": "structure"}),
        (functools.partial(loss_training, _Assorted), {"task": "statistics"}),
        (_subclass_training, {"task": "statistics", "checksum": True}),
        (_wrapped_chain_training, {"task": "statistics"}),
        (gpt_training, {"task": "statistics", "level": "mix"}),
        (gpt_training, {"task": "statistics", "level": "module"}),
    ],
    ids=["gpt", "checkpointed", "assorted", "subclasses", "wrapped-chain", "gpt-mix", "gpt-module"],
)
def test_records_are_the_same_when_the_observer_lets_go_of_freed_tensors_at_every_op(
    tmp_path, monkeypatch, caplog, training, options
) -> None:
    """Sweeps at every op (``NativeObserver.sweep_after``; at level module, every module call): the
    tensors freed inside a step are let go at once, others take their addresses before the drain
    under other keys, and the records (value ids, views, shared statistics, recomputations, subclass
    instances: a description by address alone read a freed instance's plain tensor) are still the
    dispatch mode's. ``test_native_distributed.py`` sweeps at every op too (collectives, FSDP2, DDP);
    at level module one native id may join several (``test_module_records_alone_...``)."""
    monkeypatch.setattr(native_records, "SWEEP_AFTER_BYTES", 0)
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, **options)
    _assert_same_dumps(python, native, joins=options.get("level") == "module")


@pytest.mark.parametrize("training", [_subclass_training, _quantized_training], ids=["subclasses", "quantized"])
def test_tensor_dumps_of_subclasses_save_the_same_tensors_on_both_paths(tmp_path, monkeypatch, caplog, training) -> None:
    """A subclass slot saves the plain tensor it is read through, on both paths."""
    _assert_same_saved_tensors(tmp_path, monkeypatch, caplog, training, {})


def _overflowing(training: Training) -> Training:
    """``training`` with its model's first linear (or convolution) weight scaled to overflow float32:
    its product is the first Inf; NaNs follow, and the optimizer writes them into the weights."""

    def build() -> tuple[nn.Module, Callable[[], None]]:
        model, step = training()
        with torch.no_grad():
            next(module for module in model.modules() if isinstance(module, (nn.Linear, nn.Conv2d))).weight.mul_(1e37)
        return model, step

    return build


@pytest.mark.parametrize("overflow_nums", [1, -1])
def test_overflow_checks_record_the_same_calls_and_tensors_on_both_paths(tmp_path, monkeypatch, caplog, overflow_nums) -> None:
    """``task="overflow_check"`` on the native path: the observer judges each call as it ends
    (``native_overflow.py``); the calls found are the dispatch mode's, with the same records, and
    each saved tensor loads bit for bit as the mode's (an in-place op's inputs as they were before it)."""
    options = {"task": "overflow_check", "overflow_nums": overflow_nums}
    python = _dump(tmp_path, monkeypatch, caplog, _overflowing(gpt_training), native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, _overflowing(gpt_training), native=True, **options)
    _assert_same_dumps(python, native)
    saved = assert_same_saved_tensors(tmp_path / "python", tmp_path / "native", python, native)
    if overflow_nums == 1:
        assert len({record.call_name for record in native}) == 1 and saved >= 2
    else:
        # step 0 makes the Inf and the first NaN; step 1 reads the NaN the optimizer wrote into the weights
        assert find_origin([r for r in native if r.step == 0]).kind == "origin"
        assert find_origin([r for r in native if r.step == 1]).kind == "entry"


def _foreach_overflowing_gpt() -> tuple[nn.Module, Callable[[], None]]:
    """The example GPT trained by AdamW with ``foreach`` (its updates ``_foreach_*_`` ops, which
    return nothing), whose weight decay (``1 - lr * weight_decay``, -3e37) makes its first linear
    weight (at 1e4) overflow float32 in the first step."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
    model = GPT(config)
    with torch.no_grad():
        next(module for module in model.modules() if isinstance(module, nn.Linear)).weight.fill_(1e4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e37, weight_decay=1.0, foreach=True)
    batch = make_batch(config, batch=2)
    return model, lambda: train_step(model, optimizer, batch)


@pytest.mark.parametrize(
    "training",
    [
        _foreach_overflowing_gpt,
        _checkpointed_training("selective"),
        _checkpointed_training("reentrant"),
        functools.partial(loss_training, _Assorted),
        _less_common_training,
    ],
    ids=["foreach", "selective", "reentrant", "assorted", "less_common"],
)
def test_overflow_checks_of_other_models_are_the_same_on_both_paths(tmp_path, monkeypatch, caplog, training) -> None:
    """The same on a foreach optimizer's updates (in-place ``_foreach_`` ops returning nothing: what
    they write is their outputs), activation checkpointing's recomputations (selective and reentrant)
    and the less common ops (complex backward ops read arguments the engine frees before the op
    ends): every call found, each step, with its tensors."""
    options = {"task": "overflow_check", "overflow_nums": -1}
    planted = training if training is _foreach_overflowing_gpt else _overflowing(training)
    python = _dump(tmp_path, monkeypatch, caplog, planted, native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, planted, native=True, **options)
    assert native, "the planted overflow was found"
    _assert_same_dumps(python, native)  # (an in-place call's written input: the tensor before the call on both paths)
    assert_same_saved_tensors(tmp_path / "python", tmp_path / "native", python, native)
