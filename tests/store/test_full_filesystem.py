"""A real filesystem that fills up during the run (an 8 MiB tmpfs; mounting needs root, as CI runs):
the run ends, the loss is the loss of a run without capture, the dump says where it stopped and what
came before reads back. Skipped with the reason where no tmpfs can be mounted."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from torchdebug.store._reader import load

CONFIG = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
STEPS = 6


@pytest.fixture
def small_filesystem(tmp_path: Path):
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _losses(debugger: torchdebug.Debugger | None) -> list[float]:
    torchdebug.seed_all(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        if debugger is not None:
            debugger.start(model)
        losses.append(float(train_step(model, optimizer, make_batch(CONFIG, batch=2, seed=step))))
        if debugger is not None:
            debugger.stop()
            debugger.step()
    if debugger is not None:
        debugger.close()
    return losses


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tmpfs is Linux's")
def test_a_tensor_dump_that_fills_its_filesystem_ends_the_run_untouched_and_marked(small_filesystem):
    debugger = torchdebug.Debugger(small_filesystem, task="tensor", tensor_bytes_in_flight=2**20)
    result: list[list[float]] = []
    thread = threading.Thread(target=lambda: result.append(_losses(debugger)), daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the training hung on a full filesystem"
    assert result and result[0] == _losses(None)
    dump = load(debugger.rank_dir).ranks[0]
    fault = dump.write_fault
    assert fault is not None and "No space left on device" in fault["error"], "8 MiB should not hold 6 steps of tensors"
    assert 0 < fault["step"] < STEPS
    saved = [record for record in dump.records() if record.tensor is not None]
    assert saved and all(list(dump.load_tensor(record).shape) == record.shape for record in saved)
