"""``TorchDebugCallback`` for PyTorch Lightning: dump selected training steps, no hook points to find.

::

    from torchdebug.integrations.lightning import TorchDebugCallback
    trainer = L.Trainer(callbacks=[TorchDebugCallback(step=[10], task="statistics")])

Takes the options of :class:`~torchdebug.Debugger` (or ``config=`` a file, dict or
``DebuggerConfig``). Each selected step holds what a plain loop's step holds: the forward and the
backward (also inside the closure that ``optimizer.step()`` runs under automatic optimisation),
gradient clipping and the optimizer step, with module paths relative to the ``LightningModule``.
Steps are ``trainer.global_step``; every rank writes its own folder of one run (``rank=`` selects
ranks) under ``dump_path``, by default ``trainer.log_dir/torchdebug``. Validation and data loading
are not captured. Global rank 0 logs where the dump went; ``callback.run_dir`` holds it too.
Needs ``pip install 'torchdebug[lightning]'`` (the ``lightning`` package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchdebug.extras import import_extra
from torchdebug.integrations._training import NO_STEP_WARNING, TrainerDump

_pl = import_extra("lightning.pytorch", "lightning", "torchdebug.integrations.lightning")
_rank_zero = import_extra("lightning.pytorch.utilities.rank_zero", "lightning", "torchdebug.integrations.lightning")

__all__ = ["TorchDebugCallback"]


class TorchDebugCallback(_pl.Callback):
    """Dumps the selected training steps of ``Trainer.fit`` (see the module docstring).

    Args:
        dump_path: folder of the dump (default: ``trainer.log_dir/torchdebug``).
        config: a ``DebuggerConfig``, a dict, or a JSON/YAML file path; keyword ``options`` override it.
    """

    def __init__(self, dump_path: str | Path | None = None, *, config: Any = None, **options: Any) -> None:
        super().__init__()
        self._dump = TrainerDump(dump_path, config, options)

    @property
    def run_dir(self) -> Path | None:
        """The run folder of the last fit's dump (``None`` before training starts)."""
        return self._dump.run_dir

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        log_dir = trainer.log_dir  # a collective under DDP: every rank asks
        self._dump.open(log_dir or trainer.default_root_dir)
        if self._dump.config.step is None:
            _rank_zero.rank_zero_warn(NO_STEP_WARNING)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._dump.start(trainer.global_step, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._dump.stop()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._close()

    def _close(self) -> None:
        summary = self._dump.finish()
        if summary is not None:
            _rank_zero.rank_zero_info(summary)
