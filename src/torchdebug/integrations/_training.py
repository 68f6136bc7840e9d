"""What the trainer callbacks share: a :class:`~torchdebug.Debugger` driven by a trainer's step count.

The options are checked when the callback is built, so a typo fails before training starts. The
debugger itself is built when training starts, after the trainer has initialised torch.distributed,
so that every rank writes into one run folder. A trainer's step is an optimizer step (its
``global_step``): the debugger counts the same steps, so ``step=[5]`` dumps the step the trainer
logs as step 5, also after resuming from a checkpoint, and the micro-batches of gradient
accumulation belong to the step they accumulate into.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from torchdebug.debugger import Debugger, resolve_config

NO_STEP_WARNING = "torchdebug: no step selected, so every training step is dumped; pass step=[N] or step='a-b' to dump a few"


class TrainerDump:
    """One debugger per training run, started and stopped around the trainer's steps."""

    def __init__(self, dump_path: str | Path | None, config: Any, options: dict[str, Any]) -> None:
        self.config = resolve_config(dump_path, config, options)
        self._dump_path_set = dump_path is not None or "dump_path" in self.config.assigned
        self.debugger: Debugger | None = None
        self.run_dir: Path | None = None
        """The run folder of the last dump (also after it is closed)."""
        self._unreported = False

    def open(self, trainer_dir: str | Path) -> None:
        """Build the debugger; without a ``dump_path`` option, it writes under ``trainer_dir/torchdebug``."""
        if self.debugger is not None:
            return
        dump_path = None if self._dump_path_set else Path(trainer_dir) / "torchdebug"
        self.debugger = Debugger(dump_path, config=self.config)
        self.run_dir = self.debugger.run_dir
        self._unreported = True

    def start(self, step: int, model: nn.Module) -> None:
        """Capture what runs until :meth:`stop` as part of the trainer's step ``step``."""
        debugger = self.debugger
        if debugger is None:
            return
        if self.config.step is not None and step > max(self.config.step):
            self.close()  # every selected step is dumped: nothing stays hooked for the rest of training
            return
        while debugger.current_step < step:
            debugger.step()
        debugger.start(model)

    def stop(self) -> None:
        if self.debugger is not None:
            self.debugger.stop()

    def close(self) -> None:
        """Stop and close the debugger (once; writes the completion marker)."""
        debugger, self.debugger = self.debugger, None
        if debugger is not None:
            debugger.close()

    def finish(self) -> str | None:
        """Close, and the line for the trainer's log saying which steps went where (once per run)."""
        self.close()
        if not self._unreported:
            return None
        self._unreported = False
        return f"torchdebug: dump written to {self.run_dir} (compare it: torchdebug compare {self.run_dir} REFERENCE)"
