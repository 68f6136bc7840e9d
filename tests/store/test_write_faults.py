"""A dump that cannot be written degrades capture, never the training (the fault seam of
``store/_faults.py``): no hang, no exception in the loop, the loss as without capture, every record
written before the fault readable, the dump marked truncated."""

from __future__ import annotations

import contextlib
import errno
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug
from examples.gpt import GPT, GPTConfig
from tests.capture.native_compare import on_the_dispatch_mode
from tests.store.captured_training import train
from torchdebug.cli import main as cli
from torchdebug.errors import DumpError
from torchdebug.store import _layout as layout
from torchdebug.store._faults import failing_writes
from torchdebug.store._reader import load

CONFIG = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab=128)
STEPS = 4
FAULT_STEP = 2


def _train(
    debugger: torchdebug.Debugger | None,
    fault: int | None = errno.ENOSPC,
    raises: bool = False,
    files: str = "*",
    at_fault: Callable[[], None] | None = None,
) -> list[float]:
    """``STEPS`` steps of the GPT captured by ``debugger``, writes to ``files`` failing with
    ``fault`` from ``FAULT_STEP`` (``captured_training.train``)."""
    return train(
        debugger, CONFIG, batch=4, steps=STEPS, fault_step=FAULT_STEP, fault=fault, files=files, at_fault=at_fault, raises=raises
    )


@pytest.fixture(scope="module")
def plain_losses() -> list[float]:
    return _train(None, fault=None)


def _debugger(tmp_path, **options) -> torchdebug.Debugger:
    return torchdebug.Debugger(tmp_path / "dump", tensor_bytes_in_flight=2**20, **options)


@pytest.fixture
def overflowing_forward():
    """Each forward of the GPT also makes an Inf outside its loss (an overflow check records a call a
    step, the training's numbers unchanged)."""

    def overflow(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        if isinstance(module, GPT):
            torch.full((2,), 3e38).mul(10)

    handle = torch.nn.modules.module.register_module_forward_hook(overflow)
    yield
    handle.remove()


@pytest.mark.parametrize("task", ["statistics", "tensor", "checksum", "overflow_check"])
def test_a_full_disk_stops_capture_and_the_training_goes_on_unchanged(tmp_path, plain_losses, task, caplog, request):
    if task == "overflow_check":
        request.getfixturevalue("overflowing_forward")
    debugger = _debugger(tmp_path, task=task, **({"overflow_nums": -1} if task == "overflow_check" else {}))
    assert _train(debugger) == plain_losses  # bit for bit: capture never changes the numbers
    completion = json.loads((debugger.rank_dir / layout.COMPLETE).read_text())
    fault = completion["truncated"]
    assert fault["step"] == FAULT_STEP
    assert "No space left on device" in fault["error"]
    assert fault["path"].startswith(str(debugger.rank_dir))
    warnings = [r for r in caplog.records if "capture stops here" in r.getMessage()]
    assert len(warnings) == 1 and "MiB free" in warnings[0].getMessage()  # said once, with the free space
    dump = load(debugger.rank_dir).ranks[0]
    assert {record.step for record in dump.records()} == set(range(FAULT_STEP))  # everything before the fault, nothing after
    for record in dump.records():
        if record.tensor is not None:  # every tensor a kept record names is readable
            assert list(dump.load_tensor(record).shape) == record.shape
    assert not (debugger.rank_dir / layout.RESERVE).exists()


def test_a_tensor_dump_whose_tensor_files_fail_keeps_its_records_and_waits_for_no_buffer(tmp_path, plain_losses):
    """The hang of issue 47: the tensor writer failed, its buffers were never handed back, and
    capture waited for them forever (1 MiB in flight: a step needs the writer many times). Records
    can still be written: capture keeps them, without tensors."""
    debugger = _debugger(tmp_path, task="tensor")
    assert _train(debugger, fault=errno.EIO, files="*.safetensors*") == plain_losses
    dump = load(debugger.rank_dir).ranks[0]
    assert "Input/output error" in dump.write_fault["error"] and dump.write_fault["step"] == FAULT_STEP
    records = dump.records()
    assert {record.step for record in records} == set(range(STEPS))
    later = [record for record in records if record.step >= FAULT_STEP and record.kind == "tensor"]
    assert later and all(record.tensor is None and record.stats for record in later)
    unsaved = [record for record in later if record.capture_error]  # those of the batch that failed
    assert unsaved and all("writing the dump failed" in record.capture_error for record in unsaved)
    assert all(record.tensor is not None for record in records if record.step < FAULT_STEP and record.kind == "tensor")


def test_a_tensor_folder_that_became_unwritable_never_hangs_the_step(tmp_path, plain_losses):
    """The same hang through the filesystem alone (no seam): a file where the tensors folder goes."""
    debugger = _debugger(tmp_path, task="tensor")

    def block_the_tensor_folder() -> None:
        (debugger.rank_dir / layout.TENSORS).rename(tmp_path / "moved")
        (debugger.rank_dir / layout.TENSORS).write_text("a file where the folder goes")

    assert _train(debugger, fault=None, at_fault=block_the_tensor_folder) == plain_losses
    assert load(debugger.rank_dir).ranks[0].write_fault["step"] == FAULT_STEP


def test_on_write_error_raise_raises_a_dump_error_and_does_not_hang(tmp_path):
    debugger = _debugger(tmp_path, task="tensor", on_write_error="raise")
    with pytest.raises(DumpError, match=r"writing the dump under .* failed: writing .* No space left on device"):
        _train(debugger, raises=True)
    with pytest.raises(DumpError, match="No space left on device"):
        debugger.close()  # the completion marker is written first
    assert "truncated" in json.loads((debugger.rank_dir / layout.COMPLETE).read_text())


def test_a_writer_thread_that_exited_is_a_fault_not_a_wait(tmp_path):
    debugger = _debugger(tmp_path, task="statistics")
    debugger.session.writer._record_jobs.put(None)  # the records thread exits
    _train(debugger, fault=None)
    dump = load(debugger.rank_dir).ranks[0]
    assert "exited" in dump.write_fault["error"]


@pytest.mark.parametrize(
    ("code", "said"), [(errno.ENOSPC, "no space left on device, .* MiB free"), (errno.EROFS, "read-only file system")]
)
def test_a_full_or_read_only_dump_folder_fails_when_the_debugger_is_built_in_one_line(tmp_path, code, said):
    with failing_writes(0, code), pytest.raises(DumpError, match=rf"^dump_path: cannot write to .*: {said}; choose") as raised:
        torchdebug.Debugger(tmp_path / "dump")
    assert "\n" not in str(raised.value) and raised.value.__cause__ is None and raised.value.__suppress_context__


def test_show_check_compare_and_report_say_the_dump_is_truncated_in_one_line(tmp_path, plain_losses, capsys):
    debugger = _debugger(tmp_path, task="statistics")
    _train(debugger)
    reference = _debugger(tmp_path / "b", task="statistics")
    _train(reference, fault=None)
    said = f"rank 0: the dump is truncated at step {FAULT_STEP}"
    assert cli(["show", str(debugger.run_dir)]) == 0
    assert f"warning: {said}" in capsys.readouterr().out
    assert cli(["check", str(debugger.run_dir)]) == 0
    assert said in capsys.readouterr().err
    cli(["compare", str(debugger.run_dir), str(reference.run_dir)])
    assert f"A {said}" in capsys.readouterr().out
    assert cli(["report", str(debugger.run_dir), "-o", str(tmp_path / "report.html")]) == 0
    assert "truncated</strong>: " + said in (tmp_path / "report.html").read_text()


def test_a_graph_dump_that_cannot_be_written_leaves_the_compiled_training_as_it_was(tmp_path):
    """The backend's data dump inside compiled code, writes failing from step 2 on."""
    from torchdebug.compile import CompilerConfig, get_backend

    def train(dump: bool) -> tuple[list[float], Path | None]:
        torchdebug.seed_all(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        config = CompilerConfig(backend="aot_eager")
        if dump:
            config.dump_config.enable_dump = True
            config.dump_config.dump_path = str(tmp_path)
            config.dump_config.task = "tensor"
        backend = get_backend(config)
        compiled = torch.compile(model, backend=backend)
        losses = []
        for step in range(STEPS):
            if dump and step == FAULT_STEP:
                backend.data_dump.flush()  # what came before the fault is on disk
            with failing_writes(0, errno.ENOSPC) if dump and step >= FAULT_STEP else contextlib.nullcontext():
                loss = compiled(torch.randn(4, 8, generator=torch.Generator().manual_seed(step))).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                losses.append(float(loss))
        if dump:
            with failing_writes(0, errno.ENOSPC):
                backend.data_dump.close()
        torch._dynamo.reset()
        return losses, backend.data_dump.rank_dir if dump else None

    plain, _ = train(dump=False)
    losses, rank_dir = train(dump=True)
    assert losses == plain
    dump = load(rank_dir).ranks[0]
    assert "No space left on device" in dump.write_fault["error"] and dump.write_fault["step"] >= FAULT_STEP - 1
    records = dump.records()
    assert {record.step for record in records} == set(range(FAULT_STEP))
    assert all(list(dump.load_tensor(r).shape) == r.shape for r in records if r.tensor is not None and r.step < FAULT_STEP - 1)


def test_a_graph_dumps_flush_returns_once_its_tensor_files_are_written(tmp_path, monkeypatch):
    """``data_dump.flush()`` writes the tensor files captured so far before it returns, on a slow disk
    too (the test above flushes before its writes fail, and once met a step-0 file written late)."""
    from torchdebug.compile import CompilerConfig, get_backend
    from torchdebug.store._tensor_batch import TensorBatch

    write = TensorBatch.write

    def slowly(batch: TensorBatch, path: Path, metadata: dict[str, str]) -> None:
        time.sleep(0.3)
        write(batch, path, metadata)

    monkeypatch.setattr(TensorBatch, "write", slowly)
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.task = "tensor"
    backend = get_backend(config)
    compiled = torch.compile(nn.Linear(8, 1), backend=backend)
    compiled(torch.randn(4, 8)).square().mean().backward()
    backend.data_dump.flush()
    assert list((backend.data_dump.rank_dir / layout.TENSORS).glob("step0-*.safetensors"))
    backend.data_dump.close()
    torch._dynamo.reset()


def _one_rank_cannot_write(rank: int, root: str) -> None:
    """Rank 1's dump folder sits under a file (its node's disk, say): a Debugger on each rank."""
    dump_path = Path(root, "blocked", "dump") if rank == 1 else Path(root, "dump")
    try:
        torchdebug.Debugger(dump_path)
        outcome = "built"
    except DumpError as error:
        outcome = str(error)
    Path(root, f"rank{rank}.txt").write_text(outcome)


def test_a_rank_that_cannot_write_fails_every_rank_at_once_and_none_waits(tmp_path):
    """Ranks check their dump folder before they meet to name the run folder: where one cannot
    write, every rank raises the one-line error naming it, instead of the others waiting in the
    broadcast for a rank that left (the gloo timeout, 30 minutes)."""
    from tests.gloo import spawn

    (tmp_path / "blocked").write_text("a file, not a folder")
    spawn(_one_rank_cannot_write, tmp_path, str(tmp_path))
    own = (tmp_path / "rank1.txt").read_text()
    assert own.startswith("dump_path: cannot write to ") and str(tmp_path / "blocked") in own
    assert (tmp_path / "rank0.txt").read_text() == f"rank 1: {own}"
    assert not (tmp_path / "dump").exists() or not any((tmp_path / "dump").iterdir())  # no run folder made


def _rank0_cannot_make_the_run(rank: int, root: str) -> None:
    from torchdebug.store._writer import join_run

    faults = failing_writes(0, errno.ENOSPC) if rank == 0 else contextlib.nullcontext()
    try:
        with faults:
            join_run(Path(root, "dump"), rank, 2)
        outcome = "joined"
    except DumpError as error:
        outcome = str(error)
    Path(root, f"rank{rank}.txt").write_text(outcome)


def test_rank0_failing_to_make_the_run_folder_fails_every_rank(tmp_path):
    """The graph dump's backend joins the run without the Debugger's check first: rank 0 failing
    to make the folder is every rank's one-line error, not a broadcast the others wait in."""
    from tests.gloo import spawn

    spawn(_rank0_cannot_make_the_run, tmp_path, str(tmp_path))
    own = (tmp_path / "rank0.txt").read_text()
    assert "no space left on device" in own
    assert (tmp_path / "rank1.txt").read_text() == f"rank 0: {own}"


@pytest.mark.parametrize("native", [False, True], ids=["dispatch_mode", "native_path"])
def test_a_tensor_write_that_fails_during_a_call_leaves_its_later_slots_their_statistics(tmp_path, monkeypatch, native):
    """The writer fails while capture is inside a call (its thread, at any moment): the next copy
    finds no buffer (``DumpError``), and the call's slots not yet copied keep their statistics,
    without a tensor and without an error, as the calls after it do (a race seen in CI's loaded runs)."""
    if not native:
        on_the_dispatch_mode(monkeypatch)
    debugger = torchdebug.Debugger(tmp_path / "dump", task="tensor")
    session, writer = debugger.session, debugger.session.writer
    snapshot = session._snapshot
    copies = []

    def fails_after_the_first_output(key, tensor, with_stats=False):
        if writer.takes_tensors:
            copies.append(snapshot(key, tensor, with_stats))
            if len(copies) == 2:  # the input, then the first output
                writer.takes_tensors = False  # what the writer thread does when a write fails
            return copies[-1]
        raise DumpError("tensors are no longer saved: a write failed")  # as the writer's buffer wait does

    monkeypatch.setattr(session, "_snapshot", fails_after_the_first_output)
    values = torch.arange(12.0).reshape(3, 4)
    debugger.start()
    values.max(dim=1)  # two outputs: values, then indices
    debugger.stop()
    debugger.close()
    records = [r for r in load(debugger.rank_dir).ranks[0].records() if r.op == "aten.max.dim" and r.io == "output"]
    assert len(records) == 2 and records[1].tensor is None
    assert records[1].capture_error is None and records[1].stats["max"] == 3
