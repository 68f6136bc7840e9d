"""Tensor snapshots on their way to disk: the bound on bytes in flight, waiting for the writer,
and (on CUDA) transfers on a side stream without a host synchronisation."""

import errno
import gc
import logging
import os
import threading
import time

import pytest
import torch

import torchdebug
from torchdebug.config import DebuggerConfig
from torchdebug.errors import ConfigError
from torchdebug.store import _layout as layout
from torchdebug.store._reader import load
from torchdebug.store._tensor_batch import BLOCK, PAD_PREFIX, TensorBatch
from torchdebug.store._writer import BATCH_BYTES, RankWriter, create_run_dir

MIB = 2**20


def _writer(tmp_path, bytes_in_flight: int) -> RankWriter:
    run = create_run_dir(tmp_path, "run")
    manifest = {"rank": 0, "world_size": 1, "config": {"task": "tensor"}}
    return RankWriter(run / layout.rank_dir_name(1, 0), manifest, bytes_in_flight=bytes_in_flight)


def _gate_writes(monkeypatch) -> threading.Event:
    """Make every tensor file write wait until the returned event is set."""
    gate = threading.Event()
    original = TensorBatch.write
    monkeypatch.setattr(TensorBatch, "write", lambda self, *args: (gate.wait(30), original(self, *args)))
    return gate


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _submit(writer: RankWriter, batch: TensorBatch, key: str, tensor: torch.Tensor) -> None:
    batch.add(key, tensor)
    writer.submit(0, [], batch, [{"key": key}])


def _saved_keys(rank_dir) -> list[str]:
    from safetensors import safe_open

    keys = []
    for path in sorted((rank_dir / "tensors").iterdir()):
        with safe_open(str(path), "pt") as handle:
            keys += [key for key in handle.keys() if not key.startswith(PAD_PREFIX)]
    return keys


@pytest.mark.parametrize("value", [100, MIB - 1, "256MiB", 1.5 * MIB, True])
def test_tensor_bytes_in_flight_rejects_anything_but_an_integer_of_at_least_one_mib(value):
    with pytest.raises(ConfigError, match=r"^tensor_bytes_in_flight: got .*, expected an integer >= 1048576$"):
        DebuggerConfig(tensor_bytes_in_flight=value)


def test_tensor_bytes_in_flight_is_in_the_schema_and_the_manifest(tmp_path):
    assert DebuggerConfig.json_schema()["properties"]["tensor_bytes_in_flight"]["minimum"] == MIB
    dbg = torchdebug.Debugger(tmp_path, task="tensor", tensor_bytes_in_flight=3 * MIB)
    dbg.close()
    assert load(tmp_path).ranks[0].manifest["config"]["tensor_bytes_in_flight"] == 3 * MIB


def test_batch_buffers_are_powers_of_two_of_which_two_fit_under_the_bound(tmp_path):
    assert _writer(tmp_path / "a", 3 * MIB).batch_bytes == MIB
    assert _writer(tmp_path / "b", 4 * MIB).batch_bytes == 2 * MIB
    assert _writer(tmp_path / "c", 10 * BATCH_BYTES).batch_bytes == BATCH_BYTES


def test_capture_waits_for_the_writer_once_the_buffers_reach_the_bound(tmp_path, monkeypatch):
    gate = _gate_writes(monkeypatch)
    writer = _writer(tmp_path, MIB)  # two buffers of 512 KiB
    first, second = writer.tensor_batch(64), writer.tensor_batch(64)
    _submit(writer, first, "a", torch.full((4,), 1.0))
    _submit(writer, second, "b", torch.full((4,), 2.0))
    got: list[TensorBatch] = []
    taker = threading.Thread(target=lambda: got.append(writer.tensor_batch(64)))
    taker.start()
    _wait_until(lambda: writer.transfers.waits == 1, "capture did not wait for a buffer")
    assert not got and writer.transfers.host_bytes == MIB, "no third buffer was allocated"
    gate.set()
    taker.join(30)
    assert got[0] in (first, second) and not got[0].entries, "a written buffer is reused, empty"
    assert writer.transfers.host_peak_bytes == MIB
    writer.close()
    assert sorted(_saved_keys(writer.rank_dir)) == ["a", "b"]


def test_a_tensor_larger_than_the_bound_waits_for_the_others_and_is_written_alone(tmp_path, monkeypatch):
    gate = _gate_writes(monkeypatch)
    writer = _writer(tmp_path, MIB)
    _submit(writer, writer.tensor_batch(64), "small", torch.ones(4))
    big = torch.arange(2 * MIB // 4, dtype=torch.float32)  # 2 MiB
    got: list[TensorBatch] = []
    taker = threading.Thread(target=lambda: got.append(writer.tensor_batch(big.numel() * 4 + 64)))
    taker.start()
    _wait_until(lambda: writer.transfers.waits == 1, "the large batch did not wait for the small one")
    gate.set()
    taker.join(30)
    (batch,) = got
    assert writer.transfers.host_bytes == batch.size, "the idle small buffer was freed to make room"
    _submit(writer, batch, "big", big)
    writer.close()
    dump = load(tmp_path).ranks[0]
    assert dump.completion["tensor_transfer"]["host_peak_bytes"] == batch.size > MIB
    assert sorted(_saved_keys(writer.rank_dir)) == ["big", "small"]


def test_a_tiny_bound_loses_nothing_and_writes_every_distinct_tensor_once(tmp_path, caplog):
    torch.manual_seed(0)
    x = torch.randn(16384)  # 64 KiB per tensor, 8 per buffer
    expected = []
    with torchdebug.Debugger(tmp_path, task="tensor", tensor_bytes_in_flight=MIB) as dbg:
        dbg.start()
        y = x
        for _ in range(40):  # each output is the next op's input: saved once, referenced twice
            y = torch.sin(y) * 1.5
            expected.append(y.clone())
        dbg.stop()
        with caplog.at_level(logging.INFO, logger="torchdebug.store._writer"):
            dbg.close()
    dump = load(tmp_path).ranks[0]
    report = dump.completion["tensor_transfer"]
    assert report["bytes_in_flight"] == MIB and 0 < report["host_peak_bytes"] <= MIB
    assert report["pinned"] is False and report["device_peak_bytes"] == 0
    assert "batch buffers peaked at" in caplog.text
    outputs = [r for r in dump.records() if r.op == "aten.mul.Tensor" and r.io == "output"]
    assert len(outputs) == 40
    for record, value in zip(outputs, expected):
        assert torch.equal(dump.load_tensor(record), value)
    keys = _saved_keys(dump.path)
    referenced = {r.tensor["key"] for r in dump.records() if r.tensor}
    assert len(keys) == len(set(keys)) == len(referenced) and len({r.tensor["file"] for r in outputs}) > 4


def _filled_batch() -> TensorBatch:
    batch = TensorBatch(64 * 1024)
    batch.add("a", torch.arange(1000, dtype=torch.float32))
    batch.add("b", torch.ones(3, dtype=torch.bool))
    batch.add("c", torch.arange(7, dtype=torch.int64))
    return batch


def test_tensor_files_end_their_header_and_their_data_on_whole_blocks(tmp_path):
    from safetensors.torch import load_file

    path = tmp_path / "t.safetensors"
    _filled_batch().write(path, {"step": "0"})
    raw = path.read_bytes()
    header_bytes = int.from_bytes(raw[:8], "little")
    assert (8 + header_bytes) % BLOCK == 0 and len(raw) % BLOCK == 0
    loaded = load_file(str(path))
    assert loaded["a"].tolist() == list(range(1000)) and loaded["c"].tolist() == list(range(7))


def test_a_batchs_entries_are_left_alone_by_the_collector_once_it_has_looked_at_them() -> None:
    """Each entry (key, dtype, shape, span) holds plain values only, so the collector stops tracking
    it (its shape at the first pass, the entry at the next: before it reaches the oldest generation):
    ``task="tensor"`` holds thousands a step until the batch is written, which would otherwise bring
    on full collections of the process."""
    batch = _filled_batch()
    gc.collect()
    gc.collect()
    assert batch.entries and not any(gc.is_tracked(entry) or gc.is_tracked(entry[2]) for entry in batch.entries)


@pytest.mark.parametrize("refused", ["open", "write"])
def test_where_direct_writes_are_refused_the_same_file_is_written_through_the_page_cache(tmp_path, monkeypatch, refused):
    _filled_batch().write(tmp_path / "default.safetensors", {})
    real = getattr(os, refused)

    def refuse(*args):
        if refused == "write" or args[1] & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(*args)

    monkeypatch.setattr(os, refused, refuse)
    _filled_batch().write(tmp_path / "refused.safetensors", {})
    monkeypatch.undo()
    assert (tmp_path / "refused.safetensors").read_bytes() == (tmp_path / "default.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default.safetensors", "refused.safetensors"]


# -- CUDA: skipped without a device ------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_snapshots_take_no_host_sync_and_keep_the_value_they_had_at_capture(tmp_path):
    from safetensors.torch import load_file

    batch = TensorBatch(4 * MIB, pin_memory=True)
    x = torch.randn(256, 1024, device="cuda")
    strided = torch.randn(512, 256, device="cuda").t()  # not contiguous
    expected_x, expected_strided = x.cpu(), strided.cpu()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch.add("x", x)
        x.mul_(2)  # queued right after the snapshot: must not reach the file
        batch.add("strided", strided)
        strided.zero_()
        batch.seal()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert batch.staged_bytes == (x.numel() + strided.numel()) * 4
    batch.write(tmp_path / "t.safetensors", {})
    saved = load_file(str(tmp_path / "t.safetensors"))
    assert torch.equal(saved["x"], expected_x) and torch.equal(saved["strided"], expected_strided)


@pytest.mark.gpu
def test_a_cuda_tensor_dump_takes_no_host_sync_per_op_and_saves_the_values_at_capture(tmp_path):
    torch.manual_seed(0)
    a = torch.randn(128, 64, device="cuda")
    ones = torch.ones(128, 8, device="cuda")
    expected_mul = (a * 2).cpu()
    dbg = torchdebug.Debugger(tmp_path, task="tensor", tensor_bytes_in_flight=MIB)
    dbg.start()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = a * 2
        y.add_(1)  # in place right after its snapshot
        torch.mm(a.t(), ones)  # a non-contiguous input
    finally:
        torch.cuda.set_sync_debug_mode(0)
    dbg.stop()  # the flush reads the staged statistics: one host read per flush, outside the mode
    dbg.close()
    dump = load(tmp_path).ranks[0]
    by_slot = {(r.op, r.io, r.arg): r for r in dump.records()}
    assert torch.equal(dump.load_tensor(by_slot[("aten.mul.Tensor", "output", "0")]), expected_mul)
    assert torch.equal(dump.load_tensor(by_slot[("aten.mm.default", "input", "0")]), a.t().cpu())
    report = dump.completion["tensor_transfer"]
    assert report["pinned"] is True and 0 < report["device_peak_bytes"] <= report["bytes_in_flight"]


@pytest.mark.gpu
def test_pinned_buffers_for_large_tensors_are_rounded_to_the_allocators_block_size(tmp_path):
    """A tensor larger than the reusable batch gets a buffer of its own, rounded up to a power of
    two (the pinned allocator's block) rather than to the tensor's size."""
    writer = _writer(tmp_path, 32 * MIB)
    assert writer.batch_bytes == 16 * MIB  # two reusable buffers fit under the bound
    assert writer.tensor_batch(17 * MIB).size == 32 * MIB
    writer.close()
