"""The flight recorder: watch every step nearly for free, keep the last K, dump and replay the bad one.

:class:`Monitor` runs the step (``monitor.step(closure)``) or follows it (``monitor.step(loss=loss)``),
judges each step's statistics (:mod:`~torchdebug.monitor._triggers`), agrees with the other ranks,
and on a trigger writes the window (:mod:`~torchdebug.monitor._window`) and replays the step
(:mod:`~torchdebug.monitor._replay`). Guide and options: docs/monitor.md; cost: bench/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchdebug._torch import amp
from torchdebug.dist import broadcast_from_rank0, dist_initialized, rank_and_world_size
from torchdebug.errors import AnomalyError, ConfigError, DumpError
from torchdebug.monitor._config import MonitorConfig
from torchdebug.monitor._replay import RandomState, ReplayOutcome, replay
from torchdebug.monitor._ring import Ring
from torchdebug.monitor._triggers import REASONS, StepSummary, Trigger, Triggers
from torchdebug.monitor._watch import Watcher
from torchdebug.monitor._window import write_window
from torchdebug.records import module_of
from torchdebug.stats_table import StatsStager
from torchdebug.store import check_writable, new_run_name, unwritable

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
    """Every rank that fired at this step, where it began first: after a replay, the ranks whose
    replay found it brought by a collective (another rank's values) come last; otherwise, and within
    each group, those that saw it earliest in the step (forward before the loss, the loss before
    gradients, gradients before parameters; within one, the slot run first) first."""
    window: Path | None = None
    """The window dump (a dump path)."""
    replay: ReplayOutcome | None = None
    no_replay: str | None = None
    """Why the step was not replayed (``None`` when it was)."""
    write_error: str | None = None
    """Why the window dump or the replay's dump is missing or truncated: the first write that
    failed (``None``: both written); the event and ``on_anomaly`` hold either way."""

    @property
    def module(self) -> str | None:
        return module_of(self.slot) if self.slot else None

    def __str__(self) -> str:
        lines = [f"torchdebug monitor, rank {self.rank}: {self.message}"]
        if self.slot and self.slot not in self.message:
            lines.append(f"  first seen in {self.slot}")
        if self.ranks != [self.rank]:
            lines.append(f"  ranks that fired: {self.ranks}, rank {self.ranks[0]} first")
        if self.window is not None:
            lines.append(f"  the last steps: {self.window}")
        lines.append(f"  {self.replay.message}" if self.replay else f"  no replay: {self.no_replay}")
        if self.write_error:
            lines.append(f"  not all written: {self.write_error}")
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
            "no_replay": self.no_replay,
            "write_error": self.write_error,
        }


class Monitor:
    """Watches a model's training steps and records the last ``window`` of them (guide: docs/monitor.md).

    Args:
        model: the model trained (wrappers such as FSDP2, DDP, ``checkpoint_wrapper`` are fine).
        optimizer: its optimizer; gradients are watched before and parameters after its step. Without
            one, gradients are watched when :meth:`step` is called.
        dump_path: folder for the dumps a trigger writes (default ``./monitor``).
        config: a :class:`MonitorConfig` or a dict; keyword ``options`` override it (``window``,
            ``loss_spike``, ``grad_norm_spike``, ``history``, ``scaler_overflows``, ``on_anomaly``,
            ``replay``, ``max_events``).
        predicate: ``predicate(StepSummary) -> reason or None``, a trigger of the user's own.
        scaler: the ``torch.amp.GradScaler`` of fp16 mixed precision (or ``True`` for a loss scaler
            whose scale the monitor cannot read, one that is not a ``GradScaler``): see the module
            docstring.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        dump_path: str | Path | None = None,
        *,
        config: MonitorConfig | dict[str, Any] | None = None,
        predicate: Callable[[StepSummary], str | None] | None = None,
        scaler: torch.amp.GradScaler | bool | None = None,
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
        self.run_name = broadcast_from_rank0(_unique_run_name()) if dist_initialized() else _unique_run_name()
        if not (scaler is None or isinstance(scaler, bool) or all(hasattr(scaler, m) for m in ("unscale_", "step", "update"))):
            raise ConfigError(
                f"scaler: got {scaler!r}, expected a torch.amp.GradScaler, True (a loss scaler the loop runs) or None"
            )
        self.model, self.optimizer = model, optimizer
        self.scaler = None if isinstance(scaler, bool) else scaler
        """The loss scaler that :meth:`step` with a closure unscales and steps through."""
        self.ring = Ring(self.config.window)
        self.stager = StatsStager(finish=False)
        scaled = scaler is not None and scaler is not False
        loss_scale = amp.scale_reader(self.scaler)  # None: a scale it cannot read, so no watch of scaled gradients
        each_backward = not scaled or loss_scale is not None
        self.watcher = Watcher(model, optimizer, self.ring, self.stager, after_each_backward=each_backward, loss_scale=loss_scale)
        self.triggers = Triggers(self.config, self.ring, predicate, scaled=scaled)
        self.events: list[MonitorEvent] = []
        self.anomalies = 0
        """Steps that fired, including those beyond ``max_events``."""
        self._dumped: dict[str, int] = {}
        """Window dumps written, by reason (:data:`~torchdebug.monitor._triggers.REASONS`: each has
        its own ``max_events``, so an early spike does not use up the dump of a later NaN)."""
        self.current_step = 0
        self._judged = -1
        """The last step judged with every row in (at the end of a step)."""
        self._fired: set[int] = set()
        self._agreed: dict[str, int] = {}
        """Of :attr:`_dumped`, those every rank fired together, by the reason they agreed on."""
        self._skipped: int | None = None
        """The step whose optimizer step ``skip`` dropped: so are its later optimizers' steps."""
        self._random_state: RandomState | None = None
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
            self.end_step(loss)
            return None
        self.begin_step()
        result = closure()
        scaled = self.scaler is not None and self.optimizer is not None
        if scaled and not amp.unscaled(self.scaler, self.optimizer):  # a closure that clips unscaled them
            self.scaler.unscale_(self.optimizer)  # the optimizer's pre-hook then watches them if the backward did not
        step_loss = loss if loss is not None else (result if isinstance(result, torch.Tensor) else None)
        try:
            event = self.before_update(step_loss, replay=closure)
            if (event is None or self.config.on_anomaly != "skip") and self.optimizer is not None:
                if scaled:
                    self.scaler.step(self.optimizer)
                else:
                    self.optimizer.step()
        finally:
            if scaled:  # also after a skipped or raised step: unscale_ recorded what it found
                self.scaler.update()
        self.end_step()
        return result

    def start_at(self, step: int) -> None:
        """Number the step under way ``step`` and count on from there, so that events, windows and
        replays carry the steps the loop logs: a run resumed from a checkpoint at step N, or a
        step count that jumps (Lightning's ``global_step`` counts every optimizer's steps). Call it
        as the step starts: what it watched so far is dropped. ``step`` is not below the step
        under way; the window keeps the last ``window`` steps whatever their numbers."""
        if step < self.current_step:
            raise ValueError(f"Monitor.start_at: step {step} is below the step under way, {self.current_step}")
        if self._judged == self.current_step - 1:  # every step before is judged: none to wait for in between
            self._judged = step - 1
        self.ring.forget(self.current_step)
        self.current_step = step
        self.ring.begin(step)
        self.watcher.next_step(step)

    def begin_step(self) -> None:
        """A step starts: keep the random state a replay of it starts from."""
        self._random_state = RandomState.capture()

    def before_update(
        self, loss: torch.Tensor | None = None, replay: Callable[[], Any] | None = None, *, no_replay: str | None = None
    ) -> MonitorEvent | None:
        """The step's gradients are final and the optimizer has not stepped: read the step's table
        (one host read), judge it, agree with the other ranks, and on a trigger dump the window and
        replay the step with ``replay`` (the forward and backward again, returning the loss;
        ``no_replay``: why there is none, for the event). Then ``on_anomaly``: ``skip`` drops the
        gradients (an optimizer skips parameters without one; again at each later call of the step,
        where several optimizers step in turn), ``raise`` raises
        :class:`~torchdebug.errors.AnomalyError`. Returns the event, if any."""
        self.watcher.watch_gradients()
        if loss is not None:
            self.watcher.watch_loss(loss)
        self.stager.flush()
        step = self.current_step
        trigger = None
        for earlier in range(self._judged + 1, step + 1):
            trigger = trigger or self._judge(earlier)
        place = None if trigger is None else self.ring.place(trigger.slot)
        ranks, reason = _ranks_that_fired(place, None if trigger is None else trigger.reason, self.rank)
        if not ranks:
            if self._skipped == step:  # several optimizers step in one training step: skip each
                self._drop_gradients()
            return None
        if trigger is None:
            trigger = Trigger("other_rank", step, None, f"step {step}: rank {ranks[0]} fired")
            self._fired.add(step)
        event = self._fire(trigger, ranks, replay, loss, agreed=reason, no_replay=no_replay)
        if event is not None and self.config.on_anomaly == "skip":
            logger.warning("torchdebug monitor: step %d: optimizer step skipped (gradients dropped)", step)
            self._skipped = step
            self._drop_gradients()
        if event is not None and self.config.on_anomaly == "raise":
            raise AnomalyError(event)
        return event

    def _drop_gradients(self) -> None:
        for p in self.watcher.parameters():
            p.grad = None

    def end_step(self, loss: torch.Tensor | None = None) -> None:
        """The step is over (after the optimizer step): send its table without waiting, judge the
        steps whose rows are in, number what follows as the next step. Raises
        :class:`~torchdebug.errors.AnomalyError` on a trigger with ``on_anomaly="raise"``."""
        self.watcher.watch_gradients()  # no optimizer: the gradients as the step left them
        if loss is not None:
            self.watcher.watch_loss(loss)
        self.stager.send()
        self.stager.deliver(block=False)
        raised = None
        for step in range(self._judged + 1, self.current_step + 1):
            if self.watcher.pending.get(step, 0):
                break  # its rows are still on their way: judged at a later step
            self._judged = step
            trigger = self._judge(step)
            if trigger is not None:
                event = self._fire(trigger, [self.rank])
                raised = raised or (event if self.config.on_anomaly == "raise" else None)
        self.current_step += 1
        self.ring.begin(self.current_step)
        self.watcher.next_step(self.current_step)
        if raised is not None:
            raise AnomalyError(raised)

    def pause(self) -> None:
        """Stop watching (the loss and gradients :meth:`step` hands over left alone) until
        :meth:`resume`: an evaluation loop or a benchmark's plain steps; step numbering goes on with
        the calls of :meth:`step`. The module hooks are removed, but for the global ones once the
        model ran compiled: they stay registered, idle (compiled code guards on them, and hooks
        registered anew at each resume would compile it again each time:
        :meth:`~torchdebug.monitor._watch.Watcher.ran_compiled_code`); the optimizer's step hooks
        stay, idle, until :meth:`close`."""
        self.watcher.stop(keep_hooks=self.watcher.ran_compiled_code())

    def resume(self) -> None:
        self.watcher.start()

    def close(self) -> None:
        """Remove every hook (safe to call twice)."""
        if not self._closed:
            self._closed = True
            self.watcher.close()
            self.stager.flush()

    @property
    def closed(self) -> bool:
        """:meth:`close` was called: nothing is watched any more."""
        return self._closed

    @property
    def overflows(self) -> int:
        """Steps whose gradients overflowed under the loss scaler (``scaler=``), which it skipped."""
        return self.triggers.overflows

    def memory_bytes(self) -> int:
        """Host memory of the window plus the device tables the statistics pass through."""
        return self.ring.memory_bytes() + self.stager.memory_bytes()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- judging ---------------------------------------------------------------------------------
    def _judge(self, step: int) -> Trigger | None:
        """The trigger ``step`` fires, once: a step that fired is not judged again (its late rows,
        the parameters after the update, may be judged before and after the update)."""
        if step in self._fired:
            return None
        trigger = self.triggers.judge(step)
        if trigger is not None:
            self._fired.add(step)
        return trigger

    def _fire(
        self,
        trigger: Trigger,
        ranks: list[int],
        closure: Callable[[], Any] | None = None,
        loss: torch.Tensor | None = None,
        agreed: str | None = None,
        no_replay: str | None = None,
    ) -> MonitorEvent | None:
        """Count the trigger; within ``max_events`` of its reason, dump the window and (with
        ``closure``, judged before the update) replay the step. ``agreed``: every rank fires this
        step (before the update) and counts it under this reason, the first rank's: the cap then
        counts such events alone, the same on every rank (a rank that also fired on its own after an
        update, or for a reason of its own, must not skip a replay whose collectives the others run)."""
        self.anomalies += 1
        slot = self.ring.slots[trigger.slot].name if trigger.slot is not None else None
        reason = agreed or trigger.reason
        counted = (self._agreed if agreed else self._dumped).get(reason, 0)
        if counted >= self.config.max_events:
            limit = self.config.max_events
            logger.info("torchdebug monitor: %s (not dumped: max_events=%d reached for %s)", trigger.message, limit, reason)
            return None
        event = MonitorEvent(trigger.step, trigger.reason, trigger.message, slot, self.rank, ranks)
        window_root = self.dump_root / f"step{trigger.step}-window"
        write_errors = []
        with self._writing(write_errors, "window"):
            run_dir = self._run_dir(window_root)
            fault = write_window(self.ring, run_dir, self.rank, self.world_size, self.config.to_dict(), event.to_dict())
            if fault is not None:
                write_errors.append(f"window: {fault.describe()}")
        outcome = None
        state = self._random_state if trigger.step == self.current_step else None
        replays = closure is not None and state is not None and self.config.replay != "off"
        if replays:
            compiled = self.watcher.ran_compiled()
            with (
                self.watcher.suspended(),  # the replay's calls are not the window's
                amp.unscaling_again(self.scaler, self.optimizer),  # a closure that clips unscales again
            ):
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
                    compiled,
                    self.config.on_write_error,
                )
            if outcome.write_error:
                write_errors.append(f"replay: {outcome.write_error}")
            if agreed:  # every rank replayed: ask where it began
                ranks = _began_first(ranks, outcome)
        if outcome is None:
            no_replay = self._why_not_replayed(closure, no_replay)
        event = MonitorEvent(
            trigger.step,
            trigger.reason,
            trigger.message,
            slot,
            self.rank,
            ranks,
            window_root,
            outcome,
            no_replay,
            "; ".join(write_errors) or None,
        )
        self.events.append(event)
        self._dumped[reason] = self._dumped.get(reason, 0) + 1
        if agreed:
            self._agreed[reason] = self._agreed.get(reason, 0) + 1
        logger.warning("%s", event)
        return event

    def _run_dir(self, root: Path) -> Path:
        run_dir = root / self.run_name
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise unwritable(root, error) from None
        return run_dir

    @contextlib.contextmanager
    def _writing(self, errors: list[str], what: str) -> Iterator[None]:
        """Write a dump of an event: a folder that cannot be written is one more of the event's
        ``errors`` (``on_write_error="raise"``: the DumpError goes on to the caller)."""
        try:
            yield
        except DumpError as error:
            if self.config.on_write_error == "raise":
                raise
            errors.append(f"{what}: {error}")

    def _why_not_replayed(self, closure: Callable[[], Any] | None, reason: str | None) -> str:
        """Why a step that fired was not replayed (``reason``: the caller's, who gave no closure)."""
        if self.config.replay == "off":
            return "replay='off'"
        if closure is None:
            return reason or "pass the forward and backward to Monitor.step(closure) for one"
        return "the step was judged after its optimizer step had changed the parameters it ran with"


_run_names: set[str] = set()
"""The run names this process's monitors have taken."""


def _unique_run_name() -> str:
    """A run name no other monitor of this process has: two monitors built within one second (a
    trainer's second training run) would otherwise write their windows of a step into one folder."""
    name, suffix = new_run_name(), 0
    while (candidate := f"{name}-{suffix}" if suffix else name) in _run_names:
        suffix += 1
    _run_names.add(candidate)
    return candidate


def _ranks_that_fired(place: tuple[int, int] | None, reason: str | None, rank: int) -> tuple[list[int], str | None]:
    """The ranks whose step fired, those that saw it earliest in the step first, and the first one's
    reason (one of :data:`~torchdebug.monitor._triggers.REASONS`): ``place`` is where this rank first
    saw it (:meth:`~torchdebug.monitor._ring.Ring.place`: the stage, then the slot's place in it;
    ``None``: it did not fire) and ``reason`` why; the rank breaks ties. Without torch.distributed
    this rank alone; else one all-gather of four integers per rank."""
    if not dist_initialized():
        return ([rank], reason) if place is not None else ([], None)
    code = REASONS.index(reason) if place is not None and reason in REASONS else 0
    every = _gather([int(place is not None), *(place or (0, 0)), code])
    fired = sorted((stage, index, r, code) for r, (did, stage, index, code) in enumerate(every) if did)
    return [r for _, _, r, _ in fired], (REASONS[fired[0][3]] if fired else None)


def _began_first(ranks: list[int], outcome: ReplayOutcome | None) -> list[int]:
    """``ranks`` with those whose replay found the NaN/Inf brought by a collective (another rank's
    values: FSDP2's all-gather of a shard, tensor parallelism's all-reduce) after those where it
    began (an op of their own, or a parameter, batch or state of their own), each group in its
    order. Two ranks see a NaN in one rank's parameter shard in the same slot; this tells them
    apart. One all-gather of one integer per rank, after the replays every rank ran."""
    if not dist_initialized():
        return ranks
    brought = _gather([int(outcome is not None and outcome.from_another_rank)])
    return sorted(ranks, key=lambda r: brought[r][0])


def _gather(values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (as many on each), by rank: one all-gather, on the device NCCL needs."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor(values, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return torch.stack(every).tolist()
