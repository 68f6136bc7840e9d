"""The native path's records reach the store as columns (``RankWriter.submit_columns``): a write that
fails degrades them as it degrades records (``test_write_faults.py``): the training goes on unchanged,
the records written before the fault stay readable, the dump is marked truncated and counts the
records it could not write; ``on_write_error="raise"`` raises."""

from __future__ import annotations

import errno
import json

import pytest

import torchdebug
from examples.gpt import GPTConfig
from tests.store.captured_training import train
from torchdebug.errors import DumpError
from torchdebug.native import build
from torchdebug.store import _layout as layout
from torchdebug.store._reader import load

pytestmark = pytest.mark.skipif(build._cxx_compiler() is None, reason="no C++ compiler to build the observer")

CONFIG = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=8, vocab=32)
STEPS = 3
FAULT_STEP = 1


def _train(debugger: torchdebug.Debugger | None, fault: int | None = errno.ENOSPC, raises: bool = False) -> list[float]:
    return train(debugger, CONFIG, batch=2, steps=STEPS, fault_step=FAULT_STEP, fault=fault, raises=raises)


def _native_debugger(tmp_path, monkeypatch, caplog, **options) -> torchdebug.Debugger:  # noqa: ANN001
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "1")
    caplog.set_level("INFO", logger="torchdebug.debugger")
    return torchdebug.Debugger(tmp_path / "dump", task="statistics", **options)


def _on_the_native_path(caplog) -> bool:  # noqa: ANN001
    return any("op capture on the native path" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("stack", ["all", "none"])
def test_a_full_disk_stops_native_capture_and_the_training_goes_on_unchanged(tmp_path, monkeypatch, caplog, stack):
    plain = _train(None, fault=None)
    debugger = _native_debugger(tmp_path, monkeypatch, caplog, stack=stack)
    assert _train(debugger) == plain
    assert _on_the_native_path(caplog)
    completion = json.loads((debugger.rank_dir / layout.COMPLETE).read_text())
    fault = completion["truncated"]
    assert fault["step"] == FAULT_STEP and "No space left on device" in fault["error"]
    assert fault["unwritten_records"] > 0  # the batch that failed and those after it
    records = load(debugger.rank_dir).ranks[0].records()
    assert {record.step for record in records} == set(range(FAULT_STEP))  # everything before the fault
    read = [r for r in records if r.kind == "tensor" and r.capture_error is None and "unread" not in r.extra]
    assert read and all(record.stats for record in read)


def test_on_write_error_raise_raises_on_the_native_path(tmp_path, monkeypatch, caplog):
    debugger = _native_debugger(tmp_path, monkeypatch, caplog, on_write_error="raise")
    with pytest.raises(DumpError, match="No space left on device"):
        _train(debugger, raises=True)
    assert _on_the_native_path(caplog)
    with pytest.raises(DumpError, match="No space left on device"):
        debugger.close()
    assert "truncated" in json.loads((debugger.rank_dir / layout.COMPLETE).read_text())
