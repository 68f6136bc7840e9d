"""``TorchDebugCallback`` for the Hugging Face ``Trainer``: dump selected training steps.

::

    from torchdebug.integrations.transformers import TorchDebugCallback
    trainer = Trainer(model, args, train_dataset=data, callbacks=[TorchDebugCallback(step=[10])])

Takes the options of :class:`~torchdebug.Debugger` (or ``config=``); ``monitor=`` adds the flight
recorder. What a step holds, where dumps go, compiled models and the monitor's replay:
docs/integrations.md, "The callbacks" and "The flight recorder in a trainer". Needs
``pip install 'torchdebug[transformers]'``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torchdebug.extras import import_extra
from torchdebug.integrations._training import NO_STEP_WARNING, TrainerMonitor, callback_parts

_hf = import_extra("transformers", "transformers", "torchdebug.integrations.transformers")

__all__ = ["TorchDebugCallback"]

logger = logging.getLogger("torchdebug.integrations.transformers")


class TorchDebugCallback(_hf.TrainerCallback):
    """Dumps the selected training steps of ``Trainer.train`` (docs/integrations.md, "The callbacks").

    Args:
        dump_path: folder of the dump (default: ``args.output_dir/torchdebug``).
        config: a ``DebuggerConfig``, a dict, or a JSON/YAML file path; keyword ``options`` override it.
        monitor: ``True`` or a dict of :class:`~torchdebug.Monitor` options: the flight recorder.
    """

    def __init__(self, dump_path: str | Path | None = None, *, config: Any = None, monitor: Any = None, **options: Any) -> None:
        self._monitor, self._dump = callback_parts(dump_path, config, monitor, options)
        self._unwatch: list[Callable[[], None]] = []

    @property
    def run_dir(self) -> Path | None:
        """The run folder of the last training's dump (``None`` before training starts or without one)."""
        return self._dump.run_dir if self._dump is not None else None

    @property
    def events(self) -> list[Any]:
        """What the monitor caught in each training run (:class:`~torchdebug.monitor.MonitorEvent`; none without ``monitor=``)."""
        return self._monitor.events if self._monitor is not None else []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._close(state, interrupted=True)  # what an earlier train() that raised left open (no exception hook)
        if self._dump is not None:
            self._dump.open(args.output_dir or ".")
            if self._dump.config.step is None and state.is_world_process_zero:
                logger.warning(NO_STEP_WARNING)
        if self._monitor is not None and model is not None and not self._unwatch:
            # fp16 on CUDA: accelerate's optimizer steps through a GradScaler (none on the CPU)
            self._monitor.open(args.output_dir or ".", model, scaler=getattr(kwargs.get("optimizer"), "scaler", None))
            self._unwatch = [_watch_model_calls(args, state, self._monitor)]

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._dump is not None:
            self._dump.start(state.global_step, model)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._monitor is not None:
            with self._closed_if_raised(state):
                self._monitor.before_update()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._dump is not None:
            self._dump.stop()
        if self._monitor is not None:
            with self._closed_if_raised(state):
                self._monitor.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close(state)

    @contextlib.contextmanager
    def _closed_if_raised(self, state: Any) -> Iterator[None]:
        """Close everything before an exception of the monitor's (``on_anomaly="raise"``) leaves the
        Trainer, which has no exception hook: capture and the monitor's hooks would stay on."""
        try:
            yield
        except BaseException:
            self._close(state, interrupted=True)
            raise

    def _close(self, state: Any, interrupted: bool = False) -> None:
        if self._monitor is not None:
            self._monitor.close()
        for stop in self._unwatch:
            stop()
        self._unwatch = []
        summary = self._dump.finish(interrupted=interrupted) if self._dump is not None else None
        if summary is not None and state.is_world_process_zero:
            logger.info(summary)


def _model_loss(output: Any) -> Any:
    """The ``loss`` a Trainer's model returns (a ``ModelOutput``/dict key, or the first of a tuple)."""
    if isinstance(output, Mapping):
        return output.get("loss")
    return output[0] if isinstance(output, (tuple, list)) and output else None


def _watch_model_calls(args: Any, state: Any, monitor: TrainerMonitor) -> Callable[[], None]:
    """The model's training calls, seen outside compiled code (with ``torch_compile=True`` the
    Trainer calls the compiled wrapper, whose call stands for the model's: hooks of the model's own
    would run inside the compiled code and break its graph): the first of a step keeps the step's
    random state; each call's inputs become a micro-batch to replay on what was called, its
    ``loss`` the step's loss. Returns what stops it."""

    def before(called: Any) -> None:
        monitor.micro_batch_starts(state.global_step)

    def after(called: Any, call_args: tuple, call_kwargs: dict, output: Any) -> None:
        monitor.micro_batch(state.global_step, _replay(called, call_args, call_kwargs, args.gradient_accumulation_steps))
        loss = _model_loss(output)
        if loss is not None:
            monitor.loss(loss)

    return monitor.observe_model_calls(before, after)


def _replay(model: Any, call_args: tuple, call_kwargs: dict, accumulation: int) -> Callable[[], Any]:
    def run() -> Any:
        loss = _model_loss(model(*call_args, **call_kwargs))
        (loss / accumulation).backward()
        return loss

    return run
