"""The torch.compile backend: AOT autograd and inductor with torchdebug's pass pipeline and dumps.

``get_backend(config)`` returns a callable for ``torch.compile(model, backend=...)``. Each call
(one per Dynamo graph) picks the backend, builds the :class:`~torchdebug.compile._pipeline.Pipeline`,
and, when there is something to dump, opens ``model__<N>`` in the dump tree
(:mod:`torchdebug.compile._debug_dir` documents the files). While dumping it turns PyTorch's compile
caches off for the duration of the compile (``torchdebug._torch.dynamo.caches_disabled``, scoped),
because a cache hit skips the passes and their dumps (pytorch/pytorch#152374).

With the data dump on, each compiled graph run is named by the module instance that runs it: the
dump finds the frame the graph was compiled from on the stack (``torchdebug.graph_dump._instances``);
a graph without stack traces falls back to the first parameter it reads, handed to the dump before
every run. Paths are those of the root model given to ``get_backend(config, model=model)``, else of
the outermost compiled module.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch import nn

from torchdebug._torch import dynamo as _dynamo
from torchdebug._torch.inductor import (
    CUDAGRAPHS,
    CustomGraphPass,
    compile_fx,
    compile_fx_inner,
    config_patched,
    custom_pass_patch,
    debug_dir_patch,
    mode_patches,
    select_decomp_table,
)
from torchdebug.compile._config import CompilerConfig
from torchdebug.compile._debug_dir import DumpTree, ModelDump, PhaseDump, current_phase, dump_tree, run_folder
from torchdebug.compile._pipeline import GraphPass, PassStage, Pipeline, observing_inductor_passes, run_passes
from torchdebug.errors import ConfigError
from torchdebug.graph_dump import DataDumpPass, GraphCapture, ModelContext

log = logging.getLogger("torchdebug.compile._backend")


class _PhaseMarker(CustomGraphPass):
    """Opens (first in ``joint_custom_pre_pass``) and closes (last in ``joint_custom_post_pass``)
    the phase of inductor's joint-graph passes: ``joint`` for a training graph (it has tangent
    inputs), ``inference`` otherwise, whose phase then goes on into post-grad passes."""

    def __init__(self, model: ModelDump, opening: bool) -> None:
        self.model, self.opening = model, opening

    def __call__(self, graph: torch.fx.Graph) -> None:
        gm = graph.owning_module
        assert isinstance(gm, torch.fx.GraphModule), "inductor passes a GraphModule-owned graph"
        if self.opening:
            training = any(n.name.startswith("tangents") for n in graph.find_nodes(op="placeholder"))
            phase = PhaseDump(self.model, "joint" if training else "inference")
            phase.dump_entry(gm)
            current_phase.set(phase)
            return
        phase = current_phase.get()
        if phase is not None:
            phase.observed_by_us = True
            if phase.aot_phase == "joint":
                phase.finish()
                current_phase.set(None)

    def uuid(self) -> Any:
        return ("torchdebug._PhaseMarker", self.opening)  # marks phases, never changes the graph


def _open_aot_phase() -> str | None:
    """The AOT graph kind of the compile phase open now, for the data dump (``None``: none open)."""
    phase = current_phase.get()
    return phase.aot_phase if phase is not None else None


class TorchDebugBackend:
    """A ``torch.compile`` backend configured by a :class:`CompilerConfig` (read at each compile)."""

    def __init__(self, config: CompilerConfig, passes: Sequence[GraphPass] = (), model: nn.Module | None = None) -> None:
        self.config = config
        self.passes = tuple(passes)
        self.model = model
        """The root model, whose compiled blocks name the data dump's records (``None``: not known)."""
        self._warned_no_cudagraphs = False
        self.data_dump: GraphCapture | None = None
        """The records of ``config.dump_config`` (created at the first compile with ``enable_dump``);
        ``data_dump.flush()`` writes what was captured so far, ``data_dump.close()`` ends the dump."""
        self._dumped_graphs = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> TorchDebugBackend:
        """The backend itself: one backend is one dump. Lightning wraps ``torch.compile`` and deep-copies
        its arguments to compile the model again in ``Fabric.setup``; a copy would write a second dump
        (and a backend that holds its dump's lock cannot be copied at all)."""
        return self

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graph_dump = self.config.debug.graph_dump
        tree = dump_tree(graph_dump.type, graph_dump.path)
        model = tree.new_model(graph_dump.type) if tree is not None else None
        data_dump = self._data_dump_pass()
        with self._scope(tree), self._caches_off(data_dump is not None):
            token = current_phase.set(None)
            start = time.perf_counter()
            try:
                if model is not None:
                    self._record_dynamo_graph(gm, model)
                pipeline = Pipeline.build(self.config, self.passes, data_dump)
                compiled = self._compile(gm, example_inputs, pipeline, model)
            finally:
                current_phase.reset(token)
            if model is not None:
                model.summary["backend_seconds"] = round(time.perf_counter() - start, 6)
                model.write_summary()
        if data_dump is not None:
            compiled = self._naming_instances(compiled, data_dump.model.name, example_inputs)
        return compiled

    def _naming_instances(self, compiled: Callable[..., Any], model: str, example_inputs: list[Any]) -> Callable[..., Any]:
        """``compiled`` handing the data dump its first parameter input before each run: the
        instance running it where the graph's frame cannot tell (none to hand: ``compiled`` itself)."""
        index = next((i for i, value in enumerate(example_inputs) if isinstance(value, nn.Parameter)), None)
        capture = self.data_dump
        if index is None or capture is None:
            return compiled
        return _dynamo.calls_with(compiled, lambda args: capture.enter(model, args[index]))

    def _data_dump_pass(self) -> DataDumpPass | None:
        """The data-dump pass for the next Dynamo graph (``model__<N>`` in this backend's order)."""
        dump_config = self.config.dump_config
        if not dump_config.enable_dump:
            return None
        settings = dump_config.settings()
        if self.data_dump is None:
            if "task" not in dump_config.assigned and not dump_config.dump_config_path:
                warnings.warn(
                    "dump_config.task now defaults to 'statistics' (it was 'tensor'); set dump_config.task = 'tensor' "
                    "to dump the tensors",
                    FutureWarning,
                    stacklevel=2,
                )
            self.data_dump = GraphCapture(settings, self.model)
        model = ModelContext(f"model__{self._dumped_graphs}")
        self._dumped_graphs += 1
        return DataDumpPass(settings, self.data_dump, model, _open_aot_phase)

    @staticmethod
    def _caches_off(off: bool) -> contextlib.AbstractContextManager[Any]:
        """Compile caches off while instrumenting: a cached graph would report to sinks this process
        never registered (the backward graph, compiled later, has no cache id and is never cached)."""
        return _dynamo.caches_disabled() if off else contextlib.nullcontext()

    @contextlib.contextmanager
    def _scope(self, tree: DumpTree | None) -> Iterator[None]:
        """While dumping: debug.log, caches off, inductor's passes observed; all restored on exit."""
        if tree is None:
            yield
            return
        with contextlib.ExitStack() as stack:
            stack.enter_context(tree.logging_to_file())
            stack.enter_context(_dynamo.caches_disabled())
            stack.enter_context(observing_inductor_passes())
            if tree.debug and dist.is_available() and dist.is_initialized():
                # keep PyTorch's own per-graph folders in the rank-suffixed run folder too
                stack.enter_context(config_patched(debug_dir_patch(str(run_folder()))))
            yield

    def _record_dynamo_graph(self, gm: torch.fx.GraphModule, model: ModelDump) -> None:
        compile_id = _dynamo.compile_id(gm)
        config = self.config
        model.summary.update(
            model=model.name,
            compile_id=compile_id,
            backend=config.backend,
            compile_mode=config.compile_mode,
            config=config.to_dict(),
        )
        model.write_graph("dynamo_out_graph", gm, model.graph_kinds())
        if not model.tree.debug:
            return
        stack = []
        graph_break = _dynamo.graph_break_reason(gm)
        if graph_break is not None:
            reason, stack = graph_break
            model.tree.add_graph_break({"model": model.name, "compile_id": compile_id, "reason": reason, "user_stack": stack})
            where = f"{stack[-1]['file']}:{stack[-1]['line']}" if stack else "an unknown line"
            log.info("%s ends at a graph break at %s: %s", model.name, where, reason.splitlines()[0])
        recompile = _dynamo.recompile_reason()
        if recompile is not None:
            frames = stack or _dynamo.user_frames(gm)
            model.tree.add_recompile({"model": model.name, "compile_id": compile_id, "reason": recompile, "user_stack": frames})
            log.info("%s is a recompile (%s): %s", model.name, compile_id, recompile)

    def _compile(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], pipeline: Pipeline, model: ModelDump | None
    ) -> Callable[..., Any]:
        backend = self.config.backend
        if backend == "eager":
            return gm.forward
        if backend == "aot_eager" or self.config.debug.run_eagerly:
            return self._compile_aot_eager(gm, example_inputs, pipeline, model, inductor_graph=backend == "inductor")
        return self._compile_inductor(gm, example_inputs, pipeline, model)

    def _compile_inductor(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], pipeline: Pipeline, model: ModelDump | None
    ) -> Callable[..., Any]:
        patches = mode_patches(self.config.compile_mode)
        if patches.get(CUDAGRAPHS) and not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
            del patches[CUDAGRAPHS]
            if not self._warned_no_cudagraphs:
                self._warned_no_cudagraphs = True
                log.warning(
                    "compile_mode %r: this graph has no CUDA tensors, so it runs without CUDA graphs "
                    "(inductor code only); CUDA graphs need the model and inputs on a CUDA device",
                    self.config.compile_mode,
                )
        if pipeline.pre:
            patches.update(custom_pass_patch("post_grad_custom_pre_pass", PassStage(pipeline.pre), first=True))
        if pipeline.post:
            patches.update(custom_pass_patch("post_grad_custom_post_pass", PassStage(pipeline.post), first=False))
        if model is not None:
            patches.update(custom_pass_patch("joint_custom_pre_pass", _PhaseMarker(model, True), first=True))
            patches.update(custom_pass_patch("joint_custom_post_pass", _PhaseMarker(model, False), first=False))
        inner_compile: Callable[..., Any] = compile_fx_inner
        if model is not None or pipeline:
            inner_compile = functools.partial(self._inner_compile, model=model, pipeline=pipeline)
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches or None)

    def _inner_compile(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        model: ModelDump | None,
        pipeline: Pipeline,
        **kwargs: Any,
    ) -> Any:
        """Inductor's ``inner_compile`` seam: one AOT graph in, its compiled code out, dumped on the way."""
        aot_phase = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") else "forward"
        with self._scope(model.tree if model is not None else None):  # backward compiles after the backend returned
            phase = current_phase.get()
            if phase is None or phase.model is not model or phase.aot_phase != aot_phase or phase.finished:
                phase = PhaseDump(model, aot_phase)
                phase.dump_entry(gm)
            token = current_phase.set(phase)
            try:
                compiled = compile_fx_inner(gm, example_inputs, **kwargs)
            finally:
                current_phase.reset(token)
            phase.finish(getattr(compiled, "source_code", None))
        return pipeline.compiled(compiled)

    def _compile_aot_eager(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: list[Any],
        pipeline: Pipeline,
        model: ModelDump | None,
        *,
        inductor_graph: bool,
    ) -> Callable[..., Any]:
        """AOT autograd, the pipeline on each graph, then eager execution of the result.

        With ``inductor_graph`` (``debug.run_eagerly`` with ``backend="inductor"``) the graphs are traced
        with inductor's decompositions, so they are the graphs inductor would have compiled.
        """
        passes = (*pipeline.pre, *pipeline.post)

        def phase_compiler(aot_phase: str) -> Callable[..., Any]:
            def compiler(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
                with self._scope(model.tree if model is not None else None):
                    phase = PhaseDump(model, aot_phase)
                    phase.dump_entry(graph)
                    run_passes(graph, passes, phase)
                    phase.finish()
                compiled = _dynamo.make_boxed_func(graph.forward)
                return pipeline.compiled(compiled)

            return compiler

        options: dict[str, Any] = {
            "fw_compiler": phase_compiler("forward"),
            "bw_compiler": phase_compiler("backward"),
            "inference_compiler": phase_compiler("inference"),
            "partition_fn": _dynamo.min_cut_rematerialization_partition,
            "keep_inference_input_mutations": True,
        }
        if inductor_graph:
            options["decompositions"] = select_decomp_table()
        return _dynamo.aot_autograd(**options)(gm, example_inputs)


def get_backend(
    config: CompilerConfig | None = None, *, passes: Sequence[GraphPass] = (), model: nn.Module | None = None
) -> TorchDebugBackend:
    """A backend for ``torch.compile(model, backend=get_backend(config))``.

    ``passes`` are extra :class:`~torchdebug.compile._pipeline.GraphPass` es run on every AOT graph
    after inductor's post-grad passes (or right after AOT autograd in ``aot_eager`` /
    ``run_eagerly``), each one dumped while ``TORCH_COMPILE_DEBUG=1``. ``model``: the root model
    when its blocks are compiled one by one (``block.compile(backend=backend)``), so that the data
    dump names each block's records by its path in the model (``layers.1.attn``), as eager dumps do.
    """
    if model is not None and not isinstance(model, nn.Module):
        raise ConfigError(f"model: got {type(model).__name__}, expected the root torch.nn.Module whose blocks are compiled")
    return TorchDebugBackend(config if config is not None else CompilerConfig(), passes, model)


@functools.cache
def _default_backend() -> TorchDebugBackend:
    return get_backend()


def torchdebug_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """``backend="torchdebug"`` (the ``torch_dynamo_backends`` entry point): default options."""
    return _default_backend()(gm, example_inputs)
