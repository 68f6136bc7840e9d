"""A real filesystem that fills up during the run (an 8 MiB tmpfs; mounting needs root, as CI runs):
the run ends, the loss is the loss of a run without capture, the dump says where it stopped and what
came before reads back. Skipped with the reason where no tmpfs can be mounted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import torchdebug
from examples.gpt import GPTConfig
from tests.store.captured_training import train
from torchdebug.store._reader import load

CONFIG = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
STEPS = 6


@pytest.fixture
def small_filesystem(tmp_path: Path):
    folder = tmp_path / "small"
    folder.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tmpfs is Linux's")
def test_a_tensor_dump_that_fills_its_filesystem_ends_the_run_untouched_and_marked(small_filesystem):
    debugger = torchdebug.Debugger(small_filesystem, task="tensor", tensor_bytes_in_flight=2**20)
    assert train(debugger, CONFIG, batch=2, steps=STEPS) == train(None, CONFIG, batch=2, steps=STEPS)
    dump = load(debugger.rank_dir).ranks[0]
    fault = dump.write_fault
    assert fault is not None and "No space left on device" in fault["error"], "8 MiB should not hold 6 steps of tensors"
    assert 0 < fault["step"] < STEPS
    saved = [record for record in dump.records() if record.tensor is not None]
    assert saved and all(list(dump.load_tensor(record).shape) == record.shape for record in saved)
