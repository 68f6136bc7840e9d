"""What the trainer callbacks share: a :class:`~torchdebug.Debugger` driven by a trainer's step count.

The options are checked when the callback is built, so a typo fails before training starts. The
debugger itself is built when training starts, after the trainer has initialised torch.distributed,
so that every rank writes into one run folder. A trainer's step is an optimizer step (its
``global_step``): the debugger counts the same steps, so ``step=[5]`` dumps the step the trainer
logs as step 5, also after resuming from a checkpoint, and the micro-batches of gradient
accumulation belong to the step they accumulate into.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from torchdebug.debugger import Debugger, resolve_config
from torchdebug.errors import ConfigError
from torchdebug.monitor import ModelCallEnd, Monitor, MonitorConfig
from torchdebug.store import WriteFault

NO_STEP_WARNING = "torchdebug: no step selected, so every training step is dumped; pass step=[N] or step='a-b' to dump a few"


class TrainerDump:
    """One debugger per training run, started and stopped around the trainer's steps."""

    def __init__(self, dump_path: str | Path | None, config: Any, options: dict[str, Any]) -> None:
        self.config = resolve_config(dump_path, config, options)
        self._dump_path_set = dump_path is not None or "dump_path" in self.config.assigned
        self.debugger: Debugger | None = None
        self.run_dir: Path | None = None
        """The run folder of the last dump (also after it is closed)."""
        self.write_fault: WriteFault | None = None
        """The first write of the last dump that failed (capture stopped there), once it is closed."""
        self._unreported = False

    def open(self, trainer_dir: str | Path) -> None:
        """Build the debugger; without a ``dump_path`` option, it writes under ``trainer_dir/torchdebug``."""
        if self.debugger is not None:
            return
        dump_path = None if self._dump_path_set else Path(trainer_dir) / "torchdebug"
        self.debugger = Debugger(dump_path, config=self.config)
        self.run_dir = self.debugger.run_dir
        self.write_fault = None
        self._unreported = True

    def start(self, step: int, model: nn.Module) -> None:
        """Capture what runs until :meth:`stop` as part of the trainer's step ``step``."""
        debugger = self.debugger
        if debugger is None:
            return
        if debugger.last_step is not None and step > debugger.last_step:
            self.close()  # every selected step is dumped: nothing stays hooked for the rest of training
            return
        while debugger.current_step < step:
            debugger.step()
        debugger.start(model)

    def stop(self) -> None:
        if self.debugger is not None:
            self.debugger.stop()

    def close(self, *, interrupted: bool = False) -> None:
        """Stop and close the debugger (once; writes the completion marker: ``interrupted``, when
        an exception stopped training)."""
        debugger, self.debugger = self.debugger, None
        if debugger is not None:
            debugger.close(interrupted=interrupted)
            self.write_fault = debugger.write_fault

    def finish(self, *, interrupted: bool = False) -> str | None:
        """Close, and the line for the trainer's log saying which steps went where (once per run)."""
        self.close(interrupted=interrupted)
        if not self._unreported:
            return None
        self._unreported = False
        if self.write_fault is not None:
            return f"torchdebug: dump written to {self.run_dir}, truncated: {self.write_fault.describe()}; capture stopped there"
        return f"torchdebug: dump written to {self.run_dir} (compare it: torchdebug compare {self.run_dir} REFERENCE)"


class TrainerMonitor:
    """A :class:`~torchdebug.Monitor` driven by a trainer's hooks (``monitor=`` of the callbacks).

    A trainer runs the forward and backward itself, so the callback hands the monitor, for each
    micro-batch of a step, a callable that runs that micro-batch's forward and backward again; on a
    trigger before the optimizer step, the replay runs them all on the same parameters and random
    state. The monitor's dumps go under ``dump_path``, by default ``<trainer's folder>/torchdebug-monitor``.
    """

    def __init__(self, dump_path: str | Path | None, monitor: Any) -> None:
        if isinstance(monitor, dict):
            self.config = MonitorConfig(**monitor)
        elif isinstance(monitor, MonitorConfig):
            self.config = monitor
        elif monitor is True:
            self.config = MonitorConfig()
        else:
            raise ConfigError(f"monitor: got {monitor!r}, expected True, a dict of Monitor options or a MonitorConfig")
        if dump_path is not None:
            self.config.dump_path = str(dump_path)
        self._dump_path_set = dump_path is not None or "dump_path" in self.config.assigned
        self.monitor: Any = None
        self._earlier_events: list[Any] = []
        """The events of the monitors of earlier training runs (one monitor per run)."""
        self.no_replay: str | None = None
        """Why the trainer's steps cannot be replayed, if so (the callback says)."""
        self._step: int | None = None
        self._replays: list[Callable[[], Any]] = []
        self._loss: Any = None
        self.replaying = False
        """A replay is running: the trainer's hooks it reaches are not the step's."""

    @property
    def events(self) -> list[Any]:
        """What the monitor caught, in every training run so far (empty before training starts)."""
        return self._earlier_events + (self.monitor.events if self.monitor is not None else [])

    def open(self, trainer_dir: str | Path, model: nn.Module, scaler: Any = None) -> None:
        """Start watching ``model`` for a training run (a monitor of its own for each run: the last
        run's was closed at its end); ``scaler``: the loss scaler (fp16) the trainer steps through,
        if any, whose overflows the monitor then counts instead of firing, and whose scale it
        divides the gradients by, watched as the backward leaves them (the monitor never steps it)."""
        if self.monitor is not None and not self.monitor.closed:
            return
        if self.monitor is not None:  # a training run after the one it watched: a monitor of its own
            self._earlier_events += self.monitor.events
        dump_path = None if self._dump_path_set else Path(trainer_dir) / "torchdebug-monitor"
        self.monitor = Monitor(model, None, dump_path, config=self.config, scaler=scaler)
        self._step, self._replays, self._loss = None, [], None

    def micro_batch_starts(self, step: int) -> None:
        """A micro-batch of optimizer step ``step`` starts: the step's first keeps the random state
        its replay starts from, and numbers the monitor's step as the trainer does (a run resumed
        from a checkpoint starts at its step; under manual optimization Lightning counts every
        optimizer's steps), so that events and dumps carry the steps the trainer logs."""
        if self.monitor is None or self.replaying:
            return
        if step != self._step:
            self._step, self._replays, self._loss = step, [], None
            if step > self.monitor.current_step:  # never back: a trainer's odd count must not stop training
                self.monitor.start_at(step)
            self.monitor.begin_step()

    def micro_batch(self, step: int, replay: Callable[[], Any] | None) -> None:
        """A micro-batch of optimizer step ``step`` (started, or starting now); ``replay`` runs its
        forward and backward again and returns its loss (``None``: it cannot, :attr:`no_replay` says why)."""
        if self.monitor is None or self.replaying:
            return
        self.micro_batch_starts(step)
        if replay is not None:
            self._replays.append(replay)

    def observe_model_calls(self, before: Callable[[nn.Module], None], after: ModelCallEnd) -> Callable[[], None]:
        """The model's training calls, as :meth:`~torchdebug.monitor._watch.Watcher.observe_model_calls`
        sees them (outside compiled code); returns what stops it."""
        assert self.monitor is not None, "open() first"
        return self.monitor.watcher.observe_model_calls(before, after)

    def loss(self, loss: Any) -> None:
        """The loss of the micro-batch under way (the last one is the step's)."""
        if self.monitor is not None and not self.replaying:
            self._loss = loss.detach()

    def before_update(self) -> None:
        """The gradients are final, the optimizer has not stepped: judge, and replay on a trigger."""
        if self.monitor is None or self.replaying:
            return
        replays = list(self._replays)

        def replay() -> Any:
            self.replaying = True
            try:
                loss = None
                for one in replays:
                    loss = one()
                return loss
            finally:
                self.replaying = False

        self.monitor.before_update(self._loss, replay=replay if replays else None, no_replay=self.no_replay)

    def end_step(self, step: int | None = None) -> None:
        """The optimizer has stepped (``step``: the trainer's step count now; a step still under way,
        one more micro-batch to accumulate, is left open): watch the parameters it left, end the
        monitor's step."""
        if self.monitor is not None and self._step is not None and step != self._step:
            self.monitor.watcher.watch_parameters()
            self.monitor.end_step()
            self._step = None

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()


def callback_parts(
    dump_path: str | Path | None, config: Any, monitor: Any, options: dict[str, Any]
) -> tuple[TrainerMonitor | None, TrainerDump | None]:
    """What a callback's arguments ask for, both checked now: the flight recorder (``monitor=``:
    ``None``/``False`` none) and the dump (unless ``monitor=`` alone was given)."""
    watch = None if monitor is None or monitor is False else TrainerMonitor(dump_path, monitor)
    dumps = watch is None or config is not None or bool(options)
    return watch, TrainerDump(dump_path, config, options) if dumps else None
