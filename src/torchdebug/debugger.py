"""The user-facing eager dump: :class:`Debugger` and the :func:`dump` context manager.

::

    dbg = torchdebug.Debugger(dump_path="dump", task="statistics")   # or config="cfg.json"
    for step, batch in enumerate(loader):
        dbg.start(model)          # model optional: names modules, enables module-level records
        loss = train_step(model, batch)
        dbg.stop(); dbg.step()

The run folder is created (and proven writable) when the debugger is built, before any training
happens. Records are flushed at every ``stop``/``step`` and in batches in between; tensor files
(``task="tensor"``) are written in the background while the next step runs, and are all on disk
after :meth:`Debugger.flush` or :meth:`Debugger.close`. The completion marker is written by
:meth:`Debugger.close`, a ``with`` block's end, or at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchdebug._torch.nn import compiled_modules, unwrap_compiled
from torchdebug.capture.eager import OpCapture
from torchdebug.capture.filters import phase_and_io_filter
from torchdebug.capture.modules import CallObservers, ModuleRecorder, ModuleTracker
from torchdebug.capture.native_capture import NativeOpCapture, why_not_native
from torchdebug.capture.native_modules import NativeModuleRecorder
from torchdebug.capture.session import CaptureSession
from torchdebug.config import DebuggerConfig
from torchdebug.dist import rank_and_world_size
from torchdebug.errors import ConfigError, DumpError
from torchdebug.native.observer import load_observer
from torchdebug.store import RankWriter, WriteFault, check_writable_on_every_rank, join_run, rank_dir_name, run_manifest

logger = logging.getLogger("torchdebug.debugger")


def resolve_config(dump_path: str | Path | None, config: Any, options: dict[str, Any]) -> DebuggerConfig:
    """The one config of a dump from the ways a caller may give it: a ``dump_path``, a
    :class:`DebuggerConfig`, a dict or a JSON/YAML file, and keyword ``options`` that win."""
    if dump_path is not None:
        options = {"dump_path": str(dump_path), **options}
    if config is None:
        return DebuggerConfig.from_dict(options)
    if isinstance(config, DebuggerConfig):
        return DebuggerConfig.from_dict({**config.to_dict(), **options})
    if isinstance(config, dict):
        return DebuggerConfig.from_dict({**config, **options})
    if isinstance(config, (str, Path)):
        return DebuggerConfig.from_file(config, **options)
    raise ConfigError(f"config: got {type(config).__name__}, expected a DebuggerConfig, a dict or a JSON/YAML file path")


class Debugger:
    """Dumps the ops (and optionally modules) of selected steps of an eager run.

    Args:
        dump_path: folder of the dump (each debugger writes a new run folder inside it).
        config: a :class:`DebuggerConfig`, a dict, or a JSON/YAML file path; keyword ``options``
            override it. See ``torchdebug config schema`` for every option.
    """

    def __init__(self, dump_path: str | Path | None = None, *, config: Any = None, **options: Any) -> None:
        self.config = resolve_config(dump_path, config, options)
        self.rank, self.world_size = rank_and_world_size()
        self.enabled = self.config.rank is None or self.rank in self.config.rank
        dump_root = Path(self.config.dump_path)
        check_writable_on_every_rank(dump_root)  # before any work: fail early, every rank together
        self.run_dir = join_run(dump_root, self.rank, self.world_size)
        self.rank_dir = self.run_dir / rank_dir_name(self.world_size, self.rank)
        self.current_step = 0
        self.last_step = max(self.config.step) if self.config.step else None
        """The last step selected for capture (``None``: every step), taken once: a range of steps
        is a set of every step in it."""
        self._active = False
        self._written = 0
        """The writer's ``mark()`` at the last ``stop``: the records the next ``stop`` waits for."""
        self._closed = not self.enabled
        if not self.enabled:
            return
        manifest = run_manifest(self.run_dir.name, self.rank, self.world_size, self.config.to_dict())
        writer = RankWriter(
            self.rank_dir,
            manifest,
            bytes_in_flight=self.config.tensor_bytes_in_flight,
            on_write_error=self.config.on_write_error,
        )
        self.session = CaptureSession(self.config, writer, self.rank)
        self._phases, self._ios = phase_and_io_filter(self.config.data_mode)
        self._tracker: ModuleTracker | None = None
        self._model: nn.Module | None = None
        self._eager = ExitStack()
        """Holds ``set_stance("force_eager")`` while a step is captured with ``compiled_code="eager"``."""
        self._told_compiled = False
        self._ops: OpCapture | NativeOpCapture | None = None
        self._modules: ModuleRecorder | None = None
        atexit.register(self._close_at_exit)

    @property
    def write_fault(self) -> WriteFault | None:
        """The first write of this dump that failed (capture stopped there), or ``None``."""
        return self.session.writer.fault if self.enabled else None

    # -- the three calls around a training step -------------------------------------------------
    def start(self, model: nn.Module | None = None) -> None:
        """Begin capturing the current step (no-op for steps or ranks not selected, and once a
        write of the dump failed: see ``on_write_error``)."""
        if self._closed or self._active:
            return
        if self.config.step is not None and self.current_step not in self.config.step:
            return
        if not self.session.writer.takes_records:
            self.session.writer.drain()  # raises with on_write_error="raise"
            self._release_hooks()  # capture stopped for the rest of the run: nothing left to keep them for
            return
        level = self.config.level
        if self._tracker is None or (model is not None and self._modules is None and level != "op"):
            self._build(model)
        assert self._tracker is not None
        if self.config.compiled_code == "eager":
            self._eager.enter_context(torch.compiler.set_stance("force_eager"))
        self._tracker.start()
        if self._modules is not None:
            self._modules.start()
        if self._ops is not None:
            self._ops.start()
        self._active = True

    def _build(self, model: nn.Module | None) -> None:
        if model is not None:
            model = self._model = unwrap_compiled(model)  # names relative to the model, not to torch.compile's wrapper
        self._tracker = ModuleTracker(model, hook_ops=True)
        level = self.config.level
        native = self._native_capture(model)
        if native is not None and level != "op":  # module records in the observer's rows (capture/native_modules.py)
            self._modules = native.modules = NativeModuleRecorder(self.session, self._phases, self._ios, model, native.observer)
            self._modules.alone = level == "module"
            self._tracker.recorder = CallObservers(native.rows, self._modules)
        elif level in ("module", "mix"):
            self._modules = ModuleRecorder(self.session, self._phases, self._ios, model)
            self._tracker.recorder = self._modules
        if level in ("op", "mix"):
            self._ops = native or self._python_ops()
        else:
            self._ops = native  # level module: the observer holds the module records' rows, and no op

    def _python_ops(self) -> OpCapture:
        """The op capture through the dispatch mode."""
        assert self._tracker is not None
        return OpCapture(
            self.session,
            self._tracker,
            phases=self._phases,
            ios=self._ios,
            names=self.config.list,
            call_range=self.config.range,
            stack=self.config.stack,
        )

    def _native_capture(self, model: nn.Module | None) -> NativeOpCapture | None:
        """The capture on the native path where it applies (``capture/native_capture.py``; at level
        ``module``, of module calls only), else ``None``; one log line says which path records the
        ops (or the module calls), and why."""
        what, other = ("module records", "Python") if self.config.level == "module" else ("op capture", "the dispatch mode")
        why = why_not_native(self.config, model)
        observer = load_observer() if why is None else None
        if why is None and observer is None:
            why = "the native observer could not be built"
        if why is not None:
            logger.info("torchdebug: %s through %s: %s", what, other, why)
            return None
        logger.info("torchdebug: %s on the native path", what)
        assert self._tracker is not None
        return NativeOpCapture(
            self.session,
            self._tracker,
            observer,
            model,
            phases=self._phases,
            ios=self._ios,
            names=self.config.list,
            call_range=self.config.range,
            stack=self.config.stack,
            ops=self.config.level != "module",
        )

    def stop(self) -> None:
        """Stop capturing and hand the records captured so far to the writer thread, which
        compresses and writes them while the next step runs; those of the stop before are on disk
        when this returns (``flush()`` and ``close()`` wait for all)."""
        if not self._active:
            return
        if self._ops is not None:
            self._ops.stop()
        if self._modules is not None:
            self._modules.stop()
        later = self.last_step is None or self.last_step > self.current_step
        ran_compiled = self._ran_compiled() if later or not self._told_compiled else None
        if self._tracker is not None:
            # Compiled code guards on the global hooks' registration (see GlobalForwardHooks): kept
            # while steps remain to capture, each captured step does not compile that code again.
            # Without a model: when ops ran but no module call was seen outside compiled code.
            as_run = self.config.compiled_code == "as_run"
            unseen = as_run and self._model is None and self._captured_with_dynamo() and not self._tracker.entered
            self._tracker.stop(keep_hooks=later and (ran_compiled is not None or unseen))
        self._eager.close()
        self._active = False
        self.session.flush(wait=True, until=self._written)
        self._written = self.session.writer.mark()
        if ran_compiled is not None and not self._told_compiled:
            self._tell_compiled(ran_compiled)

    def _ran_compiled(self) -> str | None:
        """Where the step being captured ran the model's modules inside compiled code, which this
        capture does not see into (``compiled_code="as_run"``): in modules compiled in the model,
        or in compiled code when ops were captured while none of its modules below the root ran
        outside compiled code (the model compiled whole, or a compiled function calling it); else
        ``None``."""
        model, tracker = self._model, self._tracker
        if self.config.compiled_code != "as_run" or model is None or tracker is None:
            return None
        blocks = [path or "the model" for path, _ in compiled_modules(model)]
        if blocks:
            return f"compiled modules ({', '.join(blocks[:3])}{', ...' if len(blocks) > 3 else ''})"
        if self._captured_with_dynamo() and not tracker.inner_entered and next(model.children(), None) is not None:
            return "compiled code"
        return None

    def _captured_with_dynamo(self) -> bool:
        """Ops were captured in the step, and Dynamo is loaded (without it nothing was compiled)."""
        return self.session.seq > 0 and "torch._dynamo" in sys.modules

    def _tell_compiled(self, where: str) -> None:
        """Warn, once, that the step just captured ran the model's modules inside ``where``."""
        self._told_compiled = True
        logger.warning(
            "torchdebug: step %d ran the model's modules inside %s: this dump holds only the ops that compiled code "
            "calls through aten (with inductor, extern kernels such as mm; not what its fused kernels compute), filed "
            "under the compiled module, or the module that called the compiled code. For every op of the model eagerly, "
            "with its module path and source line, pass compiled_code='eager'; for what the compiled kernels compute, "
            "node by node, use the torchdebug backend's data dump (docs/graph_dump.md).",
            self.current_step,
            where,
        )

    def flush(self) -> None:
        """Wait until everything captured so far, records and tensor files, is on disk (``stop``
        waits for the records of the stop before only: the rest is written while the next step runs)."""
        self.session.flush(wait=True, tensors=True)

    def start_at(self, step: int) -> None:
        """Number the next captured step ``step`` instead of the step after the last one (a replay
        of a training run's step ``step``); only before anything of the current step is captured."""
        if self._active:
            raise RuntimeError("Debugger.start_at: a step is being captured; call it before start()")
        self.current_step = step
        if not self._closed:
            self.session.step = step

    def step(self) -> None:
        """Mark the end of a training step: stop (``stop()``), and number what follows as the next step."""
        self.stop()
        self.current_step += 1
        if self._closed:
            return
        self.session.next_step()
        if self._ops is not None:
            self._ops.next_step()
        if self._modules is not None:
            self._modules.next_step()

    def close(self, *, interrupted: bool = False) -> None:
        """Stop, flush and write the completion marker, whose ``status`` says ``interrupted`` when
        an exception stopped the run (every record captured before it is kept either way). Safe to
        call twice."""
        if self._closed:
            return
        try:
            try:
                self.stop()
            finally:  # a flush that raised leaves no hook registered for the rest of the process
                self._release_hooks()
            self.session.flush()
        finally:  # the completion marker says how the run ended, a failed write included
            self._closed = True
            atexit.unregister(self._close_at_exit)
            status = "interrupted" if interrupted else "complete"
            self.session.writer.close(status, steps=self.current_step, **self.session.memory_info())

    def _release_hooks(self) -> None:
        """Take out the global hooks that :meth:`stop` kept for steps still to capture."""
        if self._tracker is not None:
            self._tracker.stop()

    def _close_at_exit(self) -> None:
        try:
            self.close(interrupted=self._active)
        except DumpError as error:  # on_write_error="raise": said, not raised, at the interpreter's exit
            logger.warning("torchdebug: %s", error)

    def __enter__(self) -> Debugger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(interrupted=exc_type is not None)


@contextmanager
def dump(
    dump_path: str | Path = "./dump", *, model: nn.Module | None = None, config: Any = None, **options: Any
) -> Iterator[Debugger]:
    """Capture everything run inside the block into a new run under ``dump_path``.

    ``with torchdebug.dump("dump", task="tensor", model=model): loss = step(model, batch)``
    """
    debugger = Debugger(dump_path, config=config, **options)
    debugger.start(model)
    try:
        yield debugger
    except BaseException:
        debugger.close(interrupted=True)
        raise
    debugger.close()
