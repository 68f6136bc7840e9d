"""The flight recorder on a disk that cannot take its dumps: the event is kept with the write error,
``on_anomaly`` still applies, and training goes on unless ``on_write_error="raise"``."""

from __future__ import annotations

import errno

import pytest
import torch
from torch import nn

import torchdebug
from torchdebug.errors import DumpError
from torchdebug.store._faults import failing_writes

NAN_STEP = 6


def _run(monitor: torchdebug.Monitor, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 10) -> list[torch.Tensor]:
    """``steps`` closure steps; the loss is NaN at ``NAN_STEP``; the first layer's weight after each step."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    weights = []
    for step in range(steps):

        def closure(step: int = step) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(x).pow(2).mean() * (float("nan") if step == NAN_STEP else 1.0)
            loss.backward()
            return loss

        monitor.step(closure)
        weights.append(model[0].weight.detach().clone())
    return weights


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torchdebug.seed_all(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


@pytest.mark.parametrize("written", [0, 3000], ids=["nothing-written", "window-cut-short"])
def test_a_window_and_replay_that_cannot_be_written_keep_the_event_and_skip_the_step(tmp_path, written):
    model, optimizer = _model()
    monitor = torchdebug.Monitor(model, optimizer, dump_path=tmp_path, window=4, on_anomaly="skip")
    try:
        with failing_writes(written, errno.ENOSPC):
            weights = _run(monitor, model, optimizer)
    finally:
        monitor.close()
    (event,) = monitor.events
    assert (event.step, event.reason) == (NAN_STEP, "nonfinite")
    assert event.write_error is not None and "no space left on device" in event.write_error.lower()
    assert "window: " in event.write_error and "replay: " in event.write_error and "not all written" in str(event)
    assert event.replay is not None and event.replay.reproduced  # replayed uncaptured: it still says whether it reproduces
    assert event.replay.write_error is not None and "Its dump is missing or truncated" in event.replay.message
    assert torch.equal(weights[NAN_STEP], weights[NAN_STEP - 1])  # on_anomaly="skip" was applied
    assert all(torch.isfinite(w).all() for w in weights)


def test_a_replay_whose_dump_fails_keeps_the_event_and_says_why(tmp_path):
    model, optimizer = _model()
    monitor = torchdebug.Monitor(model, optimizer, dump_path=tmp_path, window=4, on_anomaly="skip")
    try:
        with failing_writes(0, errno.EIO, files="records.arrows"):  # the window's records and the replay's
            _run(monitor, model, optimizer)
    finally:
        monitor.close()
    (event,) = monitor.events
    assert event.replay is not None and event.replay.write_error is not None
    assert "replay: " in event.write_error and "Input/output error" in event.replay.write_error
    assert "Its dump is missing or truncated" in event.replay.message


def test_on_write_error_raise_raises_out_of_monitor_step(tmp_path):
    model, optimizer = _model()
    monitor = torchdebug.Monitor(model, optimizer, dump_path=tmp_path, window=4, on_write_error="raise")
    try:
        with failing_writes(0, errno.ENOSPC), pytest.raises(DumpError, match="(?i)no space left on device"):
            _run(monitor, model, optimizer)
    finally:
        monitor.close()


def test_a_monitor_on_a_full_disk_fails_when_built_in_one_line(tmp_path):
    model, optimizer = _model()
    with failing_writes(0, errno.ENOSPC), pytest.raises(DumpError, match=r"^dump_path: cannot write to .*: no space left"):
        torchdebug.Monitor(model, optimizer, dump_path=tmp_path / "monitor")
