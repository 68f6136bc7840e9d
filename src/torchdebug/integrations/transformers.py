"""``TorchDebugCallback`` for the Hugging Face ``Trainer``: dump selected training steps.

::

    from torchdebug.integrations.transformers import TorchDebugCallback
    trainer = Trainer(model, args, train_dataset=data, callbacks=[TorchDebugCallback(step=[10])])

Takes the options of :class:`~torchdebug.Debugger` (or ``config=`` a file, dict or
``DebuggerConfig``). A step runs from ``on_step_begin`` to ``on_step_end``: the forward and backward
of each micro-batch it accumulates, gradient clipping and the optimizer step, with module paths
relative to the model given to the ``Trainer``. Steps are ``state.global_step``; every process
writes its own rank folder of one run (``rank=`` selects ranks) under ``dump_path``, by default
``args.output_dir/torchdebug``. Evaluation and data loading are not captured. The world's process 0
logs where the dump went (logger ``torchdebug.integrations.transformers``); ``callback.run_dir``
holds it too. Needs ``pip install 'torchdebug[transformers]'``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torchdebug.extras import import_extra
from torchdebug.integrations._training import NO_STEP_WARNING, TrainerDump

_hf = import_extra("transformers", "transformers", "torchdebug.integrations.transformers")

__all__ = ["TorchDebugCallback"]

logger = logging.getLogger("torchdebug.integrations.transformers")


class TorchDebugCallback(_hf.TrainerCallback):
    """Dumps the selected training steps of ``Trainer.train`` (see the module docstring).

    Args:
        dump_path: folder of the dump (default: ``args.output_dir/torchdebug``).
        config: a ``DebuggerConfig``, a dict, or a JSON/YAML file path; keyword ``options`` override it.
    """

    def __init__(self, dump_path: str | Path | None = None, *, config: Any = None, **options: Any) -> None:
        self._dump = TrainerDump(dump_path, config, options)

    @property
    def run_dir(self) -> Path | None:
        """The run folder of the last training's dump (``None`` before training starts)."""
        return self._dump.run_dir

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._dump.open(args.output_dir or ".")
        if self._dump.config.step is None and state.is_world_process_zero:
            logger.warning(NO_STEP_WARNING)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._dump.start(state.global_step, model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._dump.stop()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        summary = self._dump.finish()
        if summary is not None and state.is_world_process_zero:
            logger.info(summary)
