"""Progress bars: on a terminal only, on process 0 only, never with quiet, never imported eagerly."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import threading

import pytest
import torch

import torchdebug
from tests.terminal import Terminal, on_terminal
from torchdebug import progress
from torchdebug.store._tensor_batch import TensorBatch


def test_a_bar_is_drawn_on_a_terminal(monkeypatch):
    screen = on_terminal(monkeypatch)
    assert list(progress.track(range(3), "counting")) == [0, 1, 2]
    assert "torchdebug: counting" in screen.getvalue()


def test_nothing_is_drawn_when_stderr_is_not_a_terminal(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    assert list(progress.track(range(3), "counting")) == [0, 1, 2]
    assert screen.getvalue() == ""


def test_nothing_is_drawn_once_bars_are_turned_off(monkeypatch):
    screen = on_terminal(monkeypatch)
    previous = progress.set_enabled(False)
    try:
        with progress.bar(10, "counting") as shown:
            shown.update(10)
            shown.set_postfix_str("still silent")
    finally:
        progress.set_enabled(previous)
    assert previous is True
    assert screen.getvalue() == ""


def test_only_process_0_of_a_distributed_job_draws(monkeypatch):
    on_terminal(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    assert not progress.enabled()
    monkeypatch.setenv("RANK", "0")
    assert progress.enabled()


def test_log_lines_go_above_a_running_bar(monkeypatch):
    screen = on_terminal(monkeypatch)
    import logging

    logger = logging.getLogger("torchdebug.test_progress")
    handler = progress.LogHandler()
    logger.addHandler(handler)
    try:
        with progress.bar(2, "working") as shown:
            logger.warning("half way")
            shown.update(2)
    finally:
        logger.removeHandler(handler)
    assert "half way\n" in screen.getvalue()


def test_import_torchdebug_imports_no_progress_library():
    code = "import sys, torchdebug, torchdebug.progress; print('tqdm' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_waiting_for_tensor_files_shows_the_bytes_left(tmp_path, monkeypatch):
    screen = on_terminal(monkeypatch)
    drawn = threading.Event()
    monkeypatch.setattr(
        screen, "write", lambda text: (drawn.set() if "writing tensor files" in text else None, Terminal.write(screen, text))[1]
    )
    write = TensorBatch.write

    def held_write(self, path, metadata):  # the disk is busy until the bar is drawn
        drawn.wait(timeout=30)
        write(self, path, metadata)

    monkeypatch.setattr(TensorBatch, "write", held_write)
    with torchdebug.dump(tmp_path / "dump", task="tensor"):
        torch.ones(1024).exp()
    assert drawn.is_set()
    run = torchdebug.load(tmp_path / "dump").ranks[0]
    sums = [run.load_tensor(r).sum().item() for r in run.records() if r.tensor and r.io == "output"]
    assert sums == pytest.approx([1024.0, 1024 * math.e])  # ones, then exp: every file written


def test_diagnose_names_each_stage_of_its_ladder_on_the_bar(monkeypatch, tmp_path):
    screen = on_terminal(monkeypatch)
    report = torchdebug.diagnose(lambda x: x.sin() * 2, torch.randn(8), backend="aot_eager", train=False, output_dir=tmp_path)
    assert report.ok
    drawn = screen.getvalue()
    assert "torchdebug: diagnose" in drawn
    assert all(stage in drawn for stage in ("fp64 reference", "uncompiled", "eager", "aot_eager"))
