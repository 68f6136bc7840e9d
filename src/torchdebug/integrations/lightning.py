"""``TorchDebugCallback`` for PyTorch Lightning: dump selected training steps, no hook points to find.

::

    from torchdebug.integrations.lightning import TorchDebugCallback
    trainer = L.Trainer(callbacks=[TorchDebugCallback(step=[10], task="statistics")])

Takes the options of :class:`~torchdebug.Debugger` (or ``config=``); ``monitor=`` adds the flight
recorder. What a step holds (the closure ``optimizer.step()`` runs included), where dumps go, manual
optimization and the monitor's replay: docs/integrations.md, "The callbacks" and "The flight recorder
in a trainer". Needs ``pip install 'torchdebug[lightning]'`` (the ``lightning`` package).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchdebug.extras import import_extra
from torchdebug.integrations._training import NO_STEP_WARNING, callback_parts

_pl = import_extra("lightning.pytorch", "lightning", "torchdebug.integrations.lightning")
_rank_zero = import_extra("lightning.pytorch.utilities.rank_zero", "lightning", "torchdebug.integrations.lightning")

__all__ = ["TorchDebugCallback"]

MANUAL_OPTIMIZATION = "manual optimization: training_step runs the optimizer step itself, so it cannot run again before that step"
"""Why a step of a LightningModule that sets ``automatic_optimization = False`` is not replayed."""


class TorchDebugCallback(_pl.Callback):
    """Dumps the selected training steps of ``Trainer.fit`` (docs/integrations.md, "The callbacks").

    Args:
        dump_path: folder of the dump (default: ``trainer.log_dir/torchdebug``).
        config: a ``DebuggerConfig``, a dict, or a JSON/YAML file path; keyword ``options`` override it.
        monitor: ``True`` or a dict of :class:`~torchdebug.Monitor` options: the flight recorder.
    """

    def __init__(self, dump_path: str | Path | None = None, *, config: Any = None, monitor: Any = None, **options: Any) -> None:
        super().__init__()
        self._monitor, self._dump = callback_parts(dump_path, config, monitor, options)

    @property
    def run_dir(self) -> Path | None:
        """The run folder of the last fit's dump (``None`` before training starts or without one)."""
        return self._dump.run_dir if self._dump is not None else None

    @property
    def events(self) -> list[Any]:
        """What the monitor caught in each training run (:class:`~torchdebug.monitor.MonitorEvent`; none without ``monitor=``)."""
        return self._monitor.events if self._monitor is not None else []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        log_dir = trainer.log_dir or trainer.default_root_dir  # a collective under DDP: every rank asks
        if self._dump is not None:
            self._dump.open(log_dir)
            if self._dump.config.step is None:
                _rank_zero.rank_zero_warn(NO_STEP_WARNING)
        if self._monitor is not None:  # precision "16-mixed" runs a GradScaler
            self._monitor.open(log_dir, pl_module, scaler=getattr(trainer.precision_plugin, "scaler", None))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._dump is not None:
            self._dump.start(trainer.global_step, pl_module)
        if self._monitor is not None:
            manual = not pl_module.automatic_optimization
            self._monitor.no_replay = MANUAL_OPTIMIZATION if manual else None
            self._monitor.micro_batch(trainer.global_step, None if manual else _replay(trainer, batch, batch_idx))

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._monitor is not None:
            self._monitor.loss(loss)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._monitor is not None:
            self._monitor.before_update()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._dump is not None:
            self._dump.stop()
        if self._monitor is not None:
            self._monitor.end_step(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(interrupted=True)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._close()

    def _close(self, interrupted: bool = False) -> None:
        if self._monitor is not None:
            self._monitor.close()
        summary = self._dump.finish(interrupted=interrupted) if self._dump is not None else None
        if summary is not None:
            _rank_zero.rank_zero_info(summary)


def _replay(trainer: Any, batch: Any, batch_idx: int) -> Callable[[], Any]:
    """A micro-batch's forward and backward again, as automatic optimisation runs them: the
    strategy's ``training_step`` (its precision context), the loss divided over the accumulated
    batches, its backward. Returns that loss."""

    def run() -> Any:
        output = trainer.strategy.training_step(batch, batch_idx)
        loss = (output["loss"] if isinstance(output, Mapping) else output) / trainer.accumulate_grad_batches
        loss.backward()
        return loss

    return run
