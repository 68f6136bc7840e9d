"""A few captured training steps of the example GPT, run in a thread so that a hang fails the test,
with the store's writes failing from a chosen step (the fault seam of ``store/_faults.py``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import torch

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from torchdebug.store._faults import failing_writes

NO_HANG_SECONDS = 120
"""Far above a step of these models; a writer that waits for a failed writer never returns."""


def train(
    debugger: torchdebug.Debugger | None,
    config: GPTConfig,
    *,
    batch: int,
    steps: int,
    fault_step: int = 0,
    fault: int | None = None,
    files: str = "*",
    at_fault: Callable[[], None] | None = None,
    raises: bool = False,
) -> list[float]:
    """``steps`` steps of the GPT, each captured by ``debugger``; from step ``fault_step`` every
    write of the store to ``files`` fails with ``fault`` (and ``at_fault`` runs before it), the
    close too. Returns the losses; ``raises``: re-raise what the loop raised (else it fails)."""
    torchdebug.seed_all(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses: list[float] = []
    errors: list[BaseException] = []

    def failing() -> contextlib.AbstractContextManager:
        return failing_writes(0, fault, files) if fault else contextlib.nullcontext()

    def loop() -> None:
        try:
            for step in range(steps):
                if debugger is not None and step == fault_step and (fault or at_fault):
                    debugger.flush()  # what came before the fault is on disk
                    if at_fault is not None:
                        at_fault()
                with failing() if step >= fault_step else contextlib.nullcontext():
                    if debugger is not None:
                        debugger.start(model)
                    losses.append(float(train_step(model, optimizer, make_batch(config, batch=batch, seed=step))))
                    if debugger is not None:
                        debugger.stop()
                        debugger.step()
            if debugger is not None:
                with failing():
                    debugger.close()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            errors.append(error)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    thread.join(NO_HANG_SECONDS)
    assert not thread.is_alive(), "the training loop hung on a failed write of the dump"
    if raises:
        assert errors, "on_write_error='raise' raised nothing"
        raise errors[0]
    assert not errors, f"a failed write reached the training loop: {errors[0]!r}"
    return losses
