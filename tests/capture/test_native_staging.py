"""Kept tensors staged before the drain (``NativeStepCapture.stage_kept``): the tensors whose values the
observer's callback does not read (other dtypes; an accelerator's) have their statistics and
fingerprints staged before an op writes their memory and once ``STAGE_AFTER_BYTES`` of them are
held, not copied before the write and held to the drain. Record for record the dispatch mode's
dump, with every CPU tensor kept as an accelerator's would be (``NativeObserver.defer_cpu``), staged
at every op (``STAGE_AFTER_BYTES = 0``) or only before writes (-1), read at once or delivered at the
flush as an accelerator's are; a tensor kept by several slots, read once a staging; a float16
model's tensors, kept on any machine; a fault while staging; a hook that stages nothing (each
tensor is copied before the write, as without one); where Triton is installed, a step whose staged
tensors take the Triton kernel in its interpreter; and, on a GPU, a CUDA model with
``DEVICE_STATISTICS`` on."""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import torchdebug
from tests.capture.native_compare import gpt_training
from tests.capture.test_native_capture import (
    Training,
    _assert_same_dumps,
    _bits_dtypes,
    _checkpointed_training,
    _compiled_gpt,
    _dump,
    _less_common_training,
    _quantized_training,
    _written_between_reads,
)
from tests.test_stats_table import _assert_same_stats as assert_same_stats
from tests.triton_interpreter import interpreter_skip, run_in_interpreter
from torchdebug import stats_table
from torchdebug.capture import native_capture, native_records
from torchdebug.native.observer import NativeObserver, load_observer
from torchdebug.records import STATS_NOT_TAKEN
from torchdebug.stats import NO_STATISTICS


@pytest.fixture
def staged(monkeypatch) -> Iterator[Callable[[int], list[int]]]:
    """Keep every CPU tensor (as an accelerator's): ``staged(after_bytes)`` sets ``STAGE_AFTER_BYTES``
    and returns the list that gets the number of tensors each staging took."""
    observer = load_observer()
    assert observer is not None
    counts: list[int] = []
    stage = native_records.NativeStepCapture.stage_kept

    def counted(self, *args: Any) -> None:
        before = observer._staged
        stage(self, *args)
        counts.append(observer._staged - before)

    def set_bytes(after_bytes: int) -> list[int]:
        monkeypatch.setattr(native_capture, "STAGE_AFTER_BYTES", after_bytes)
        monkeypatch.setattr(native_records.NativeStepCapture, "stage_kept", counted)
        return counts

    observer.defer_cpu(True)
    try:
        yield set_bytes
    finally:
        observer.defer_cpu(False)


@pytest.mark.parametrize("after_bytes", [0, -1], ids=["every_op", "before_writes"])
@pytest.mark.parametrize(
    "options",
    [{"task": "statistics"}, {"task": "statistics", "checksum": True}, {"task": "checksum"}],
    ids=["statistics", "statistics+checksum", "checksum"],
)
def test_the_example_gpt_with_every_tensor_staged_dumps_the_dispatch_modes_records(
    tmp_path, monkeypatch, caplog, staged, after_bytes, options
) -> None:
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, **options)
    counts = staged(after_bytes)
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, **options)
    _assert_same_dumps(python, native)
    assert all(record.capture_error is None for record in native)
    assert sum(counts) > len(native) / 2  # most tensors staged before the drain (the rest: handed there)
    if after_bytes == 0:  # at each op, its inputs and the tensors the op before it made
        assert len(counts) > len(native) / 2
    else:  # before the in-place writes of the backward's accumulations and the optimizer (2 steps: 393)
        assert 0 < len(counts) < len(native) / 4


@pytest.mark.parametrize("after_bytes", [0, -1], ids=["every_op", "before_writes"])
@pytest.mark.parametrize(
    "options", [{"task": "statistics"}, {"task": "statistics", "checksum": True}], ids=["statistics", "statistics+checksum"]
)
def test_statistics_delivered_at_the_flush_as_an_accelerators_are_the_dispatch_modes(
    tmp_path, monkeypatch, caplog, staged, after_bytes, options
) -> None:
    """The stager reads every tensor through its device table (as an accelerator's, the values
    delivered at the flush): the drain has them delivered before it makes its records."""
    monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, **options)
    staged(after_bytes)
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, **options)
    _assert_same_dumps(python, native)
    assert all(record.stats is not None and record.capture_error is None for record in native)


@pytest.mark.parametrize(
    "training",
    [_written_between_reads, _less_common_training, _checkpointed_training("non_reentrant"), _quantized_training],
    ids=["written_between_reads", "less_common", "checkpointed", "subclass_parameters"],
)
def test_in_place_writes_and_less_common_ops_with_every_tensor_staged_before_writes(
    tmp_path, monkeypatch, caplog, staged, training: Training
) -> None:
    options = {"task": "statistics", "checksum": True}
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, **options)
    counts = staged(-1)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, **options)
    _assert_same_dumps(python, native)
    assert counts and sum(counts) > 0


@pytest.mark.parametrize("after_bytes", [0, -1], ids=["every_op", "before_writes"])
def test_a_tensor_kept_by_several_slots_is_read_once_a_staging(tmp_path, monkeypatch, caplog, staged, after_bytes) -> None:
    """An op's output kept, then kept again as the next op's input at the same version: a staging
    hands it over once (the observer gives the later entries its id), and its slots share what that
    gave (on an accelerator, one pass of the kernel and one row instead of one a slot); the dump
    stays the dispatch mode's."""
    options = {"task": "statistics", "checksum": True}
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, **options)
    handed = staged(after_bytes)
    observer = load_observer()
    assert observer is not None
    looked = observer.stage_looked()
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, **options)
    looked = observer.stage_looked() - looked
    _assert_same_dumps(python, native)
    if after_bytes < 0:  # (staged at every op instead, a staging holds one op's few tensors: little is shared)
        assert sum(handed) < 0.8 * looked  # (about 60 % handed, on 2026-12-04)


@pytest.mark.parametrize("spelling", ["method", "checkpointed method"])
def test_compiled_code_with_every_tensor_staged_before_writes_dumps_the_dispatch_modes_records(
    tmp_path, monkeypatch, caplog, staged, spelling
) -> None:
    """Inductor's kernels write compiled code's buffers with no op (an extern kernel's output with
    its activation fused in, a donated buffer): a tensor kept inside compiled code is staged as its
    op ends, not only before a write an op shows (before, it was read with what a kernel wrote later)."""
    training = _compiled_gpt(spelling, "inductor")
    python = _dump(tmp_path, monkeypatch, caplog, training, native=False, steps=3, task="statistics", stack="none")
    staged(-1)
    native = _dump(tmp_path, monkeypatch, caplog, training, native=True, steps=3, task="statistics", stack="none")
    _assert_same_dumps(python, native, joins=True)  # (inductor's buffers: see test_native_capture.py)


def test_a_kept_tensor_whose_memory_is_freed_under_it_is_not_read(tmp_path, staged) -> None:
    """A storage resized to 0 bytes with no op under a kept tensor (as FSDP2's reshard frees its
    all-gather buffers, staged before at its own reshards but not at ``FSDPModule.reshard()``): the
    tensor is not read (its record says it changed before the flush; before, the read went through
    the freed pointer), and the step goes on."""
    staged(-1)
    x = torch.randn(64)
    with torchdebug.dump(tmp_path, task="statistics"):
        y = x.neg()
        y.untyped_storage().resize_(0)
        x.exp()
    records = {record.name: record for record in torchdebug.load(tmp_path).ranks[0].records()}
    freed = records["forward/-/aten.neg.default#0/output.0"]
    assert freed.stats is None and "changed" in freed.capture_error
    assert records["forward/-/aten.exp.default#0/input.0"].stats["max"] == x.max().item()


def test_a_hook_that_stages_nothing_leaves_each_tensor_copied_before_the_write(tmp_path, monkeypatch, caplog, staged) -> None:
    """The observer copies what the hook left on memory the op writes, as where nothing stages."""
    options = {"task": "statistics", "checksum": True}
    python = _dump(tmp_path, monkeypatch, caplog, _written_between_reads, native=False, steps=1, **options)
    staged(-1)
    monkeypatch.setattr(native_records.NativeStepCapture, "stage_kept", lambda self, *args: None)
    native = _dump(tmp_path, monkeypatch, caplog, _written_between_reads, native=True, steps=1, **options)
    _assert_same_dumps(python, native)


class _Half(nn.Module):
    """A float16 model on the CPU: the callback reads no float16 tensor (``stats.c`` sums none)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(8, 8).half(), nn.Linear(8, 1).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x).relu_()).float().sum()


def _half_training() -> tuple[nn.Module, Callable[[], None]]:
    model = _Half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).half()

    def step() -> None:
        model(x).backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, step


def test_a_dtype_with_no_statistics_staged_before_the_drain_says_why(tmp_path, monkeypatch, caplog, staged) -> None:
    """A packed fp4 and a ``bits8`` tensor staged at their ops, long before the drain (which takes
    what the stagings landed by array): no statistics, and the reason a dtype without them gives,
    as the dispatch mode says it (not that they were not taken)."""
    python = _dump(tmp_path, monkeypatch, caplog, _bits_dtypes, native=False, task="statistics")
    counts = staged(0)
    native = _dump(tmp_path, monkeypatch, caplog, _bits_dtypes, native=True, task="statistics")
    _assert_same_dumps(python, native)
    bits = [record for record in native if record.dtype in ("float4_e2m1fn_x2", "bits8")]
    assert {record.dtype for record in bits} == {"float4_e2m1fn_x2", "bits8"} and sum(counts) > len(bits)
    assert {(record.stats, record.capture_error) for record in bits} == {(None, NO_STATISTICS)}


def test_a_float16_models_kept_tensors_are_staged_before_writes(tmp_path, monkeypatch, caplog) -> None:
    counts: list[int] = []
    stage = native_records.NativeStepCapture.stage_kept
    monkeypatch.setattr(
        native_records.NativeStepCapture, "stage_kept", lambda self, *args: counts.append(1) or stage(self, *args)
    )
    python = _dump(tmp_path, monkeypatch, caplog, _half_training, native=False, task="statistics")
    native = _dump(tmp_path, monkeypatch, caplog, _half_training, native=True, task="statistics")
    _assert_same_dumps(python, native)
    assert {record.dtype for record in native} >= {"float16"} and all(record.stats is not None for record in native)
    assert counts  # relu_ and the optimizer's in-place updates write kept tensors


def test_a_fault_while_staging_costs_those_statistics_and_the_step_goes_on(tmp_path, monkeypatch, caplog, staged) -> None:
    """Staging the statistics of 2-d float32 tensors fails (as device memory running out would): their
    slots say so, every other record keeps the statistics of a run without the fault, said once."""
    staged(0)
    clean = _dump(tmp_path / "clean", monkeypatch, caplog, gpt_training, native=True, task="statistics")
    session_stage, session_landed = native_capture.CaptureSession.stage_stats, native_capture.CaptureSession.stage_landed

    def planted(tensors: list[torch.Tensor]) -> None:
        if any(tensor.dtype == torch.float32 and tensor.dim() == 2 for tensor in tensors):
            raise RuntimeError("planted")

    def failing(self, items: list[tuple]) -> None:
        planted([item[0] for item in items])
        session_stage(self, items)

    def failing_landed(self, tensors: list[torch.Tensor], *rest: Any) -> None:
        planted(tensors)
        session_landed(self, tensors, *rest)

    monkeypatch.setattr(native_capture.CaptureSession, "stage_stats", failing)
    monkeypatch.setattr(native_capture.CaptureSession, "stage_landed", failing_landed)
    records = _dump(tmp_path / "faulted", monkeypatch, caplog, gpt_training, native=True, task="statistics")
    assert [record.name for record in records] == [record.name for record in clean]
    lost = [record for record, kept in zip(records, clean) if record.stats != kept.stats]
    assert lost and all(record.stats is None and record.capture_error == STATS_NOT_TAKEN for record in lost)
    assert len(lost) < len(records) / 2
    said = [record for record in caplog.records if "could not take the statistics of kept tensors" in record.getMessage()]
    assert len(said) == 1  # once a capture


@pytest.mark.gpu
@pytest.mark.parametrize(
    "options",
    [{"task": "statistics"}, {"task": "statistics", "checksum": True}, {"task": "checksum"}],
    ids=["statistics", "statistics+checksum", "checksum"],
)
def test_a_cuda_models_statistics_on_the_native_path_are_the_dispatch_modes(tmp_path, monkeypatch, caplog, options) -> None:
    """With ``DEVICE_STATISTICS`` on, a CUDA model's tensors are kept and staged through the stager's
    Triton kernel (its backward's from the autograd engine's device thread): the dispatch mode's
    dump, record for record, bit for bit."""
    monkeypatch.setattr(native_capture, "DEVICE_STATISTICS", True)
    python = _dump(tmp_path, monkeypatch, caplog, lambda: gpt_training("cuda"), native=False, **options)
    native = _dump(tmp_path, monkeypatch, caplog, lambda: gpt_training("cuda"), native=True, **options)
    _assert_same_dumps(python, native)
    assert {record.device for record in native} >= {"cuda:0"}
    assert all(record.capture_error is None for record in native)
    if options["task"] == "statistics":
        assert all(record.stats is not None for record in native)


def test_what_a_staging_holds_until_the_drain_is_no_object_of_the_collectors(tmp_path, staged) -> None:
    """What the stagings of a step took is held to the drain in dicts of numbers, not in an object a
    tensor, which would outlive the step's young collections and, with every tensor of a step staged
    (an accelerator's), bring on a full collection of the process every few steps."""
    counts = staged(-1)
    with torchdebug.dump(tmp_path / "dump", task="statistics", checksum=True):
        made = [torch.full((16,), float(i)) for i in range(300)]
        before = {id(thing) for thing in gc.get_objects()}
        made[0].add_(1)  # a write into a kept tensor's memory: what is kept is staged first
        held = [thing for thing in gc.get_objects() if id(thing) not in before]
    assert sum(counts) >= 300
    assert len(held) < 20, collections.Counter(type(thing).__name__ for thing in held).most_common(5)


def test_a_staging_of_more_tensors_than_a_part_takes_them_part_by_part(tmp_path, monkeypatch, caplog, staged) -> None:
    """A staging of more tensors than ``_STAGED_TOGETHER`` takes them in parts (the objects made for
    each alive only meanwhile): the same records, tensors read as one across parts shared."""
    python = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=False, task="statistics", checksum=True)
    counts = staged(-1)
    monkeypatch.setattr(native_records, "_STAGED_TOGETHER", 7)
    handed: list[int] = []  # the tensors each call of the observer handed over
    hand = NativeObserver.stage_kept

    def handing(self: NativeObserver, most: int, first_part: bool) -> tuple[int, list[torch.Tensor]]:
        first, tensors = hand(self, most, first_part)
        handed.append(len(tensors))
        return first, tensors

    monkeypatch.setattr(NativeObserver, "stage_kept", handing)
    native = _dump(tmp_path, monkeypatch, caplog, gpt_training, native=True, task="statistics", checksum=True)
    _assert_same_dumps(python, native)
    assert max(counts) > 7 and max(handed) == 7  # a staging of more, handed over 7 at a time
    assert sum(handed) == sum(counts) and len(handed) > len(counts)


def test_each_staging_looks_at_the_tensors_kept_since_the_last_not_at_every_one_of_the_step(tmp_path, staged) -> None:
    """A staging before each write looks at the entries kept since the one before (and those it left
    then), so a step's stagings look at each kept entry about once: at every entry of the step each,
    a step of n writes took n² looks (107 ms of a 48-layer tiny GPT's step, 2026-12-04). So do the
    checks before each write for a kept entry on the memory it writes (1.4 billion looks in the
    tiny GPT's 48-layer steps, before 2026-12-04's evening)."""
    counts = staged(-1)
    observer = load_observer()
    before, before_writes = observer.stage_looked(), observer.write_looked()
    with torchdebug.dump(tmp_path / "dump", task="statistics"):
        x = torch.ones(4)
        for _ in range(400):
            y = x * 2
            y.add_(1)  # a write into a kept tensor's memory: what is kept is staged first
    kept = sum(counts)
    assert len(counts) >= 400 and kept >= 800
    assert observer.stage_looked() - before < 3 * kept
    assert observer.write_looked() - before_writes < 3 * kept


_KERNEL_SCRIPT = """
import json, sys, tempfile
import torch
import torchdebug
from torchdebug import stats_table
from torchdebug.native.observer import load_observer

launches = []
if sys.argv[1] == "kernel":  # every tensor kept as an accelerator's, its sums through the Triton kernel
    load_observer().defer_cpu(True)
    stats_table._resolves_now = lambda tensor: False
    kernel = stats_table._triton()
    launch, launch_listed = kernel.launch, kernel.launch_listed
    def counted(tensors, *rest, **options):
        launches.append(len(tensors))
        launch(tensors, *rest, **options)
    def counted_listed(addresses, *rest, **options):
        launches.append(len(addresses))
        launch_listed(addresses, *rest, **options)
    kernel.launch, kernel.launch_listed = counted, counted_listed
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
debugger = torchdebug.Debugger(dump_path=tempfile.mkdtemp(), task="statistics", checksum=sys.argv[2] == "checksum")
for _ in range(2):
    debugger.start(model)
    model(torch.randn(8, 16)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    debugger.stop()
    debugger.step()
debugger.close()
records = torchdebug.load(debugger.run_dir).ranks[0].records()
print(json.dumps({"stats": {f"{r.step} {r.name}": r.stats for r in records if r.stats},
                  "checksums": {f"{r.step} {r.name}": r.checksum for r in records if r.kind == "tensor"},
                  "errors": [r.capture_error for r in records if r.capture_error], "launches": launches}))
"""


@pytest.mark.parametrize("checksum", ["checksum", "statistics"])
def test_a_step_staged_through_the_triton_kernel_in_its_interpreter_is_the_callbacks_capture(checksum: str) -> None:
    """The path ``DEVICE_STATISTICS`` turns on for an accelerator's tensors, run in Triton's interpreter
    on the CPU: every tensor kept, staged before writes, reduced by the Triton kernel (several a
    launch; statistics alone, listed by array: ``StatsStager.add_landed``) into the stager's table
    and landed as sums at the flush; its records are those of the callback's own statistics and
    fingerprints."""
    reason = interpreter_skip()
    if reason:
        pytest.skip(reason)
    runs = {}
    for arm in ("callback", "kernel"):
        runs[arm] = run_in_interpreter(_KERNEL_SCRIPT, arm, checksum)
    callback, kernel = runs["callback"], runs["kernel"]
    assert callback["stats"].keys() == kernel["stats"].keys() and len(callback["stats"]) > 100
    for name, want in callback["stats"].items():
        assert_same_stats(kernel["stats"][name], want, name)
    assert kernel["checksums"] == callback["checksums"] and not kernel["errors"]
    assert (None not in callback["checksums"].values()) == (checksum == "checksum")
    assert not callback["launches"] and max(kernel["launches"]) > 4  # (more than SLOTS: a directory's)
