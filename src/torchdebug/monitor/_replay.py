"""Replaying the anomalous step once under full op-level capture.

The loop hands :meth:`~torchdebug.Monitor.step` its forward and backward as a closure; before
running it the monitor keeps torch's random number generator states (CPU and every initialised
CUDA device: a few small host tensors, no device synchronisation). When the step fires a trigger,
before the optimizer step, the parameters are still those the step ran with, so the replay runs
the same closure on the same parameters, batch and random state under a
:class:`~torchdebug.Debugger` (op level, the task asked for), names the op that made a NaN/Inf
(:func:`torchdebug.nonfinite.find_origin`) and says whether the replay gave the same loss, bit for
bit. The step's own gradients, and the model's buffers as the step left them (BatchNorm's running
statistics, which each run of the forward moves again), are put back afterwards, so what the loop
does next sees the step as it was. When the step ran compiled code of the model (compiled blocks,
the model compiled whole, a compiled function calling it), the closure runs twice: once as it ran,
which decides whether the step reproduces, and once with that code run eagerly
(``torch.compiler.set_stance("force_eager")``) under capture, so the dump names the model's own ops
and source lines, not a generated kernel's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchdebug.debugger import Debugger
from torchdebug.errors import DumpError
from torchdebug.nonfinite import ORIGIN, find_origin
from torchdebug.records import COLLECTIVES
from torchdebug.store import load


@dataclass(frozen=True, slots=True)
class RandomState:
    """torch's generator states before a step: the CPU's and each initialised CUDA device's."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor]

    @classmethod
    def capture(cls) -> RandomState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        return cls(torch.get_rng_state(), cuda)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda:
            torch.cuda.set_rng_state_all(self.cuda)


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What the replay of an anomalous step found."""

    dump: Path
    """The replay's dump (a dump path: ``torchdebug show``/``check``/``compare`` read it)."""
    reproduced: bool
    """The replay's loss equals the step's, bit for bit."""
    loss: float | None
    replay_loss: float | None
    origin: str | None
    """The op that made the first NaN/Inf, with its phase, module and source line (``None``: none made)."""
    eager_loss: float | None = None
    """When the step ran compiled code of the model: the loss of the captured replay, which ran it eagerly."""
    from_another_rank: bool = False
    """The first NaN/Inf came out of a collective: another rank's values brought it here (that
    rank's own replay names where it began)."""
    write_error: str | None = None
    """The replay's dump is truncated: its first write that failed (``None``: all written)."""

    @property
    def message(self) -> str:
        eager = ""
        if self.eager_loss is not None:
            eager = f" The op-level replay ran the compiled code eagerly: loss {self.eager_loss}"
            if _finite(self.eager_loss) and not _finite(self.loss):
                eager += ", finite where the compiled step's was not: compiled code made it (torchdebug diagnose finds where)."
            else:
                eager += "."
        if self.write_error:
            eager += f" Its dump is missing or truncated ({self.write_error}): the ops after that are not in it."
        if self.reproduced:
            found = f"; first NaN/Inf made by {self.origin}" if self.origin else ""
            return f"replay reproduced the step bit for bit (loss {self.loss}){found}; its op-level dump: {self.dump}.{eager}"
        return (
            f"replay did NOT reproduce the step: loss {self.replay_loss} where the step gave {self.loss}. The step is not "
            "deterministic (nondeterministic kernels, uninitialised memory, a collective's order) or the hardware erred; "
            "dump two runs of it with task='checksum' and compare them to find the first op whose bits differ. "
            f"Replay dump: {self.dump}.{eager}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dump": str(self.dump),
            "reproduced": self.reproduced,
            "loss": self.loss,
            "replay_loss": self.replay_loss,
            "origin": self.origin,
            "eager_loss": self.eager_loss,
            "from_another_rank": self.from_another_rank,
            "write_error": self.write_error,
        }


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two losses hold the same bits (one host read each; run only when a trigger fired)."""
    if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8)))


def replay(
    closure: Callable[[], Any],
    model: nn.Module,
    parameters: list[torch.Tensor],
    state: RandomState,
    loss: torch.Tensor | None,
    dump_path: Path,
    step: int,
    task: str,
    rank: int,
    compiled: bool,
    on_write_error: str = "continue",
) -> ReplayOutcome:
    """Run ``closure`` again from ``state`` under op-level capture into ``dump_path`` (see the module
    docstring); ``compiled``: the step ran compiled code of the model, which the capture runs eagerly.
    A dump folder that cannot be written (``on_write_error="continue"``) still runs the closure
    again, uncaptured, for the reproduction; the outcome says why nothing was dumped."""
    grads = [p.grad for p in parameters]
    buffers = [  # an inference tensor cannot be written outside inference mode: the step left it as it was
        (buffer, buffer.detach().clone())
        for buffer in model.buffers()
        if buffer.__class__ is torch.Tensor and not buffer.is_inference()
    ]
    debugger, unwritable = None, None
    try:
        replayed = _run(closure, parameters, state) if compiled else None  # the compiled code again, as it ran
        try:
            debugger = Debugger(dump_path, task=task, level="op", on_write_error=on_write_error)
            debugger.start_at(step)
        except DumpError as error:
            if on_write_error == "raise":
                raise
            unwritable = str(error)
        try:
            with torch.compiler.set_stance("force_eager") if compiled else contextlib.nullcontext():
                if debugger is not None:
                    debugger.start(model)
                captured = _run(closure, parameters, state)
                if debugger is not None:
                    debugger.stop()
        finally:
            if debugger is not None:
                debugger.close()
    finally:
        for p, grad in zip(parameters, grads):
            p.grad = grad
        with torch.no_grad():
            for buffer, kept in buffers:
                buffer.copy_(kept)
    if not compiled:
        replayed = captured
    origin = find_origin(load(debugger.run_dir).ranks[rank].records()) if debugger is not None else None
    if debugger is not None and debugger.write_fault is not None:
        unwritable = debugger.write_fault.describe()
    return ReplayOutcome(
        dump=Path(dump_path),
        reproduced=same_bits(loss, replayed),
        loss=_value(loss),
        replay_loss=_value(replayed),
        origin=str(origin) if origin is not None else None,
        eager_loss=_value(captured) if compiled else None,
        from_another_rank=origin is not None and origin.kind == ORIGIN and origin.record.op.startswith(COLLECTIVES),
        write_error=unwritable,
    )


def _run(closure: Callable[[], Any], parameters: list[torch.Tensor], state: RandomState) -> torch.Tensor | None:
    """The closure from the step's start: no gradients yet, the step's random state; its loss."""
    for p in parameters:
        p.grad = None
    state.restore()
    result = closure()
    return result if isinstance(result, torch.Tensor) else None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _value(loss: torch.Tensor | None) -> float | None:
    return float(loss.detach().float().mean()) if loss is not None else None
