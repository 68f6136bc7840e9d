"""The flight recorder: watch every step nearly for free, keep the last K, dump and replay the bad one.

::

    monitor = torchdebug.Monitor(model, optimizer, dump_path="monitor", window=32)
    for batch in loader:
        def closure():
            optimizer.zero_grad()
            loss = model(*batch)
            loss.backward()
            return loss
        loss = monitor.step(closure)          # forward+backward watched, judged, then optimizer.step()

or, keeping the loop as it is, ``monitor.step(loss=loss)`` after ``optimizer.step()`` (no replay then).

**Cost.** Each watched tensor is reduced once, in one pass, into the step's device table
(:class:`~torchdebug.stats_table.StatsStager`); the table reaches the host in one non-blocking copy
per step. Without a closure the host reads it a step late (CUDA) and never waits for the device;
with a closure it reads it once before the optimizer step, so that a bad step can be skipped and
replayed on the parameters it ran with. Under torch.distributed the ranks then agree on whether
any fired with one small all-gather per step, so that all of them replay together (a replay runs the
step's collectives).

**On a trigger** (:mod:`~torchdebug.monitor.triggers`) the window of the last ``window`` steps is
written as a dump (:mod:`~torchdebug.monitor.window`) under ``dump_path/step{N}-window``; with a
closure the step is replayed under op-level capture into ``dump_path/step{N}-replay``
(:mod:`~torchdebug.monitor.replay`). :attr:`Monitor.events` lists what fired; ``on_anomaly`` says
whether the optimizer step is then taken, skipped, or :class:`~torchdebug.errors.AnomalyError` raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchdebug.dist import broadcast_from_rank0, dist_initialized, rank_and_world_size
from torchdebug.errors import AnomalyError
from torchdebug.monitor.config import MonitorConfig
from torchdebug.monitor.replay import RandomState, ReplayOutcome, replay
from torchdebug.monitor.ring import Ring
from torchdebug.monitor.triggers import StepSummary, Trigger, Triggers
from torchdebug.monitor.watch import Watcher
from torchdebug.monitor.window import write_window
from torchdebug.stats_table import StatsStager
from torchdebug.store.writer import check_writable, new_run_name

logger = logging.getLogger("torchdebug.monitor")


@dataclass(frozen=True, slots=True)
class MonitorEvent:
    """One trigger: the step, why, where it first showed, and where its dumps are."""

    step: int
    reason: str
    """``nonfinite``, ``loss_spike``, ``grad_norm_spike``, ``predicate``, or ``other_rank`` (another rank fired)."""
    message: str
    slot: str | None
    """The record name of the first watched slot where it showed (``None``: no slot stands out)."""
    rank: int
    ranks: list[int] = field(default_factory=list)
    """Every rank that fired at this step, those that saw it earliest in the step (forward before the
    loss, the loss before gradients, gradients before parameters) first: ``ranks[0]`` saw it first."""
    window: Path | None = None
    """The window dump (a dump path)."""
    replay: ReplayOutcome | None = None

    @property
    def module(self) -> str | None:
        return self.slot.split("/")[1] if self.slot else None

    def __str__(self) -> str:
        lines = [f"torchdebug monitor, rank {self.rank}: {self.message}"]
        if self.slot:
            lines.append(f"  first seen in {self.slot}")
        if self.ranks != [self.rank]:
            lines.append(f"  ranks that fired: {self.ranks}, rank {self.ranks[0]} first")
        if self.window is not None:
            lines.append(f"  the last steps: {self.window}")
        lines.append(
            f"  {self.replay.message}"
            if self.replay
            else "  no replay: pass the forward and backward to Monitor.step(closure) for one"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "reason": self.reason,
            "message": self.message,
            "slot": self.slot,
            "rank": self.rank,
            "ranks": self.ranks,
            "window": str(self.window) if self.window else None,
            "replay": self.replay.to_dict() if self.replay else None,
        }


class Monitor:
    """Watches a model's training steps and records the last ``window`` of them (see the module docstring).

    Args:
        model: the model trained (wrappers such as FSDP2, DDP, ``checkpoint_wrapper`` are fine).
        optimizer: its optimizer; gradients are watched before and parameters after its step. Without
            one, gradients are watched when :meth:`step` is called.
        dump_path: folder for the dumps a trigger writes (default ``./monitor``).
        config: a :class:`MonitorConfig` or a dict; keyword ``options`` override it (``window``,
            ``loss_spike``, ``grad_norm_spike``, ``history``, ``on_anomaly``, ``replay``, ``max_events``).
        predicate: ``predicate(StepSummary) -> reason or None``, a trigger of the user's own.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        dump_path: str | Path | None = None,
        *,
        config: MonitorConfig | dict[str, Any] | None = None,
        predicate: Callable[[StepSummary], str | None] | None = None,
        **options: Any,
    ) -> None:
        if isinstance(config, dict):
            config = MonitorConfig(**config)
        if dump_path is not None:
            options["dump_path"] = str(dump_path)
        self.config = MonitorConfig.build(config, **options)
        self.rank, self.world_size = rank_and_world_size()
        self.dump_root = Path(self.config.dump_path)
        check_writable(self.dump_root)  # fail before training, not at the first trigger
        self.run_name = broadcast_from_rank0(new_run_name()) if dist_initialized() else new_run_name()
        self.model, self.optimizer = model, optimizer
        self.ring = Ring(self.config.window)
        self.stager = StatsStager()
        self.watcher = Watcher(model, optimizer, self.ring, self.stager, self.ring.put)
        self.triggers = Triggers(self.config, self.ring, predicate)
        self.events: list[MonitorEvent] = []
        self.anomalies = 0
        """Steps that fired, including those beyond ``max_events``."""
        self.current_step = 0
        self._judged = -1
        self._closed = False
        self.ring.begin(0)
        self.watcher.start()

    # -- the loop's calls ------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None, *, loss: torch.Tensor | None = None) -> Any:
        """End a training step.

        With ``closure`` (forward and backward, returning the loss, as for ``optimizer.step(closure)``):
        run it watched, judge the step, on a trigger dump the window and replay it, then take the
        optimizer step (unless ``on_anomaly`` says otherwise); returns the closure's result. Without:
        call it after ``optimizer.step()``, with the step's ``loss`` for the loss-spike trigger.
        """
        if self._closed:
            raise RuntimeError("Monitor.step: the monitor is closed")
        if closure is None:
            self._end_of_step(loss)
            return None
        state = RandomState.capture()
        result = closure()
        step_loss = loss if loss is not None else (result if isinstance(result, torch.Tensor) else None)
        self.watcher.watch_gradients()
        if step_loss is not None:
            self.watcher.watch_loss(step_loss)
        self.stager.flush()
        event = self._judge_now(closure, state, step_loss)
        if event is not None and self.config.on_anomaly == "raise":
            raise AnomalyError(event)
        if event is not None and self.config.on_anomaly == "skip":
            logger.warning("torchdebug monitor: step %d: optimizer step skipped", self.current_step)
            for p in self.watcher.parameters():
                p.grad = None
        elif self.optimizer is not None:
            self.optimizer.step()
        self._advance()
        return result

    def close(self) -> None:
        """Remove every hook (safe to call twice)."""
        if not self._closed:
            self._closed = True
            self.watcher.stop()
            self.stager.flush()

    def memory_bytes(self) -> int:
        """Host memory of the window plus the device tables the statistics pass through."""
        return self.ring.memory_bytes() + self.stager.memory_bytes()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- judging ---------------------------------------------------------------------------------
    def _end_of_step(self, loss: torch.Tensor | None) -> None:
        """The loop's own step is over: stage what is left, send the table, judge the steps whose rows are in."""
        self.watcher.watch_gradients()
        if loss is not None:
            self.watcher.watch_loss(loss)
        self.stager.send()
        self.stager.deliver(block=False)
        for step in range(self._judged + 1, self.current_step + 1):
            if self.watcher.pending.get(step, 0):
                break  # its rows are still on their way: judged at a later step
            self._judged = step
            trigger = self.triggers.judge(step)
            if trigger is not None:
                event = self._fire(trigger, [self.rank])
                if event is not None and self.config.on_anomaly == "raise":
                    self._advance()
                    raise AnomalyError(event)
        self._advance()

    def _judge_now(self, closure: Callable[[], Any], state: RandomState, loss: torch.Tensor | None) -> MonitorEvent | None:
        """Judge the current step (every row is in) and agree with the other ranks; dump and replay on a trigger."""
        trigger = None
        for step in range(self._judged + 1, self.current_step + 1):
            trigger = trigger or self.triggers.judge(step)
        self._judged = self.current_step
        stage = None if trigger is None else self.ring.stage(trigger.slot)
        ranks = _ranks_that_fired(stage, self.rank)
        if not ranks:
            return None
        if trigger is None:
            trigger = Trigger("other_rank", self.current_step, None, f"step {self.current_step}: rank {ranks[0]} fired")
        return self._fire(trigger, ranks, closure, state, loss)

    def _fire(
        self,
        trigger: Trigger,
        ranks: list[int],
        closure: Callable[[], Any] | None = None,
        state: RandomState | None = None,
        loss: torch.Tensor | None = None,
    ) -> MonitorEvent | None:
        self.anomalies += 1
        slot = self.ring.slots[trigger.slot].name if trigger.slot is not None else None
        if len(self.events) >= self.config.max_events:
            logger.info("torchdebug monitor: %s (not dumped: max_events=%d reached)", trigger.message, self.config.max_events)
            return None
        event = MonitorEvent(trigger.step, trigger.reason, trigger.message, slot, self.rank, ranks)
        window_root = self.dump_root / f"step{trigger.step}-window"
        run_dir = window_root / self.run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        write_window(self.ring, run_dir, self.rank, self.world_size, self.config.to_dict(), event.to_dict())
        outcome = None
        if closure is not None and state is not None and self.config.replay != "off":
            self.watcher.stop()  # the replay's module calls are not the window's
            try:
                outcome = replay(
                    closure,
                    self.model,
                    self.watcher.parameters(),
                    state,
                    loss,
                    self.dump_root / f"step{trigger.step}-replay",
                    trigger.step,
                    self.config.replay,
                    self.rank,
                )
            finally:
                self.watcher.start()
        event = MonitorEvent(trigger.step, trigger.reason, trigger.message, slot, self.rank, ranks, window_root, outcome)
        self.events.append(event)
        logger.warning("%s", event)
        return event

    def _advance(self) -> None:
        self.current_step += 1
        self.ring.begin(self.current_step)
        self.watcher.next_step(self.current_step)


def _ranks_that_fired(stage: int | None, rank: int) -> list[int]:
    """The ranks whose step fired, those that saw it earliest in the step first: ``stage`` is where
    this rank first saw it (:meth:`~torchdebug.monitor.ring.Ring.stage`; ``None``: it did not fire).
    Without torch.distributed this rank alone; else one all-gather of two integers per rank (on the
    device NCCL needs)."""
    if not dist_initialized():
        return [rank] if stage is not None else []
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([int(stage is not None), stage or 0], device=device)
    flags = [torch.zeros_like(flag) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, flag)
    fired = [(int(stage), r) for r, (did, stage) in enumerate(torch.stack(flags).tolist()) if did]
    return [r for _, r in sorted(fired)]
