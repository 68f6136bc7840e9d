"""``torchdebug.diagnose``: the troubleshooting workflow of PyTorch's compiler docs, automated.

1. fp64 and eager references; 2. the stage ladder (:mod:`~torchdebug.diagnose._stages`) up to the
first stage that raises or loses accuracy (inductor runs instrumented, so its node values come with
the stage's run, and right after ``eager``: the stages between run only when it fails and its node
values name no node); 3. the first bad node inside it: node by node against fp64
(:mod:`~torchdebug.diagnose._nodes`) for an inductor accuracy loss, graph-prefix bisection
(:mod:`~torchdebug.diagnose._bisect`) otherwise; 4. ``repro.py`` with the smallest graph around that
node that still fails (:mod:`~torchdebug.diagnose._region`); 5. graph breaks and recompiles.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchdebug import progress
from torchdebug._torch.inductor import config_patched
from torchdebug.diagnose import _inductor_graph as inductor_graph
from torchdebug.diagnose._bisect import Bisector, DynamoRecorder
from torchdebug.diagnose._config import DiagnoseConfig
from torchdebug.diagnose._finding import NodeFinding
from torchdebug.diagnose._graph_breaks import compile_events
from torchdebug.diagnose._instrument import InstrumentedInductor
from torchdebug.diagnose._nodes import first_bad_node
from torchdebug.diagnose._program import Program, first_line
from torchdebug.diagnose._region import reproduce
from torchdebug.diagnose._repro import write_repro
from torchdebug.diagnose._result import DiagnoseResult
from torchdebug.diagnose._stages import References, Stage, StageResult, climb, default_compile_mode, ladder, references
from torchdebug.errors import TorchDebugError
from torchdebug.options import accepts

log = logging.getLogger("torchdebug.diagnose")

FALLBACK_RANDOM = {"fallback_random": True}
"""Inductor config for a program that draws random numbers: inductor calls the ATen random ops
instead of generating its own, so with the same seed a compiled run draws what eager draws (the
knob PyTorch's docs and its compiler bisector use for accuracy debugging)."""


@accepts(DiagnoseConfig)
def diagnose(fn: Callable[..., Any], *example_inputs: Any, config: DiagnoseConfig) -> DiagnoseResult:
    """Find the first compiler stage that breaks ``fn(*example_inputs)``, its node and source line.

    Args:
        fn: a function or ``nn.Module``; it is copied for each stage, never changed.
        example_inputs: its positional inputs.
        config: a :class:`~torchdebug.diagnose._config.DiagnoseConfig`; or give its options as
            keywords (``backend="aot_eager"``, ``train=False``, ...), listed below.

    Returns:
        A :class:`DiagnoseResult`; ``report.stage is None`` when every stage is accurate.
    """
    start = time.perf_counter()
    program = Program(fn, example_inputs, train=config.train)
    with torch.random.fork_rng(devices=_cuda_devices(program.inputs)):  # every run seeds; the caller's RNG is kept
        report = _diagnose(program, config)
    report.seconds = time.perf_counter() - start
    return report


def _diagnose(program: Program, config: DiagnoseConfig) -> DiagnoseResult:
    compile_mode = (
        config.compile_mode if config.compile_mode is not None else default_compile_mode(program.inputs, config.backend)
    )
    stages = ladder(config.backend, compile_mode)
    with progress.bar(len(stages) + 1, "diagnose", unit="stage") as shown:  # the fp64 reference, then each stage
        shown.set_postfix_str("fp64 reference")
        refs = references(program)
        if refs.fp64.error is not None and refs.eager.error is None:
            raise TorchDebugError(
                f"diagnose: the fp64 reference run failed ({type(refs.fp64.error).__name__}: {refs.fp64.error}); "
                "make the program run in float64 (no hard-coded float32 tensors) or pass train=False"
            )
        shown.update()
        notes: list[str] = []
        patches: dict[str, Any] = {}
        if refs.random_ops:
            patches = FALLBACK_RANDOM
            notes.append(
                f"the program draws random numbers ({', '.join(refs.random_ops[:3])}): every run starts from the same seed "
                "and inductor runs with fallback_random=True, so every stage draws eager's numbers "
                "(inductor's own random-number code is not tested)"
            )
        with config_patched(patches):
            report = _climb_and_localize(program, stages, refs, config, notes, shown)
    return report


def _climb_and_localize(
    program: Program, stages: list[Stage], refs: References, config: DiagnoseConfig, notes: list[str], shown: progress.Bar
) -> DiagnoseResult:
    recorder = DynamoRecorder()
    stages[1] = Stage("eager", recorder)  # Dynamo's eager backend, keeping the graphs for later
    target = stages[-1]
    if _is_inductor(target):
        results, finding, skipped = _inductor_first(program, stages, refs, config.accuracy_tolerance, notes, shown)
    else:
        results, finding, skipped = climb(program, stages[:-1], refs, config.accuracy_tolerance, shown), None, []
        if not results[-1].failed:
            results.append(climb(program, [target], refs, config.accuracy_tolerance, shown)[-1])
    if len(results) > 1:
        results[1].stage = Stage("eager", "eager")  # bisection and the repro use the plain backend
    graphs = list(recorder.graphs)
    report = DiagnoseResult(results, compile_events=compile_events(graphs), notes=notes, skipped=skipped)
    failed = report.failed_stage
    if failed is not None and failed.stage.backend is not None:
        shown.set_postfix_str(f"finding the first bad node of {failed.stage.label}")
        if finding is not None and config.repro:
            shown.set_postfix_str(f"cutting the smallest graph around {finding.node} that fails under {failed.stage.label}")
            phase, node = finding.compile_as or "forward", finding.node
            reproduce(finding, lambda gm, inputs: inductor_graph.judge(gm, inputs, node, phase, config.accuracy_tolerance), notes)
        report.finding = finding or _bisect(program, failed, graphs, config.accuracy_tolerance, notes)
        if report.finding is None:
            report.not_localised = notes[-1]
        elif config.repro:
            report.repro_path = _write_repro(report.finding, failed, Path(config.output_dir), config.accuracy_tolerance, notes)
    return report


def _inductor_first(
    program: Program, stages: list[Stage], refs: References, tolerance: float, notes: list[str], shown: progress.Bar
) -> tuple[list[StageResult], NodeFinding | None, list[str]]:
    """``uncompiled`` and ``eager``, then inductor (instrumented); the stages between run only
    when inductor fails and its own node values do not name the node. A node whose compiled value
    is wrong for the graph inductor was given is inductor's fault, whatever the stages before it do;
    and when inductor (which runs all of them) is right, they are not needed."""
    between = stages[2:-1]
    results = climb(program, stages[:2], refs, tolerance, shown)
    if results[-1].failed:
        return results, None, []
    instrumented, last = _last_stage(program, stages[-1], refs, tolerance, notes, shown)
    finding = _node_by_node(instrumented, tolerance, notes) if instrumented is not None else None
    if last.failed and finding is None:
        results += climb(program, between, refs, tolerance, shown)
        if not results[-1].failed:
            results.append(last)
        return results, None, []
    return [*results, last], finding, [stage.label for stage in between]


def _cuda_devices(inputs: tuple[Any, ...]) -> list[int]:
    return sorted({x.device.index or 0 for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda})


def _is_inductor(stage: Stage) -> bool:
    return stage.backend == "inductor" and not stage.options


def _last_stage(
    program: Program, stage: Stage, refs: References, tolerance: float, notes: list[str], shown: progress.Bar
) -> tuple[InstrumentedInductor | None, StageResult]:
    """Inductor, instrumented (its node values kept for localisation, one compile instead of two);
    a pass or an exception is confirmed by plain inductor, because materialising every node could
    hide a bug that needs fusion, or cause an error of its own."""
    instrumented = InstrumentedInductor()
    with instrumented.active():
        result = climb(program, [Stage(stage.label, instrumented)], refs, tolerance, shown)[-1]
    result.stage = stage
    if result.kind == "accuracy":
        return instrumented, result
    shown.set_postfix_str(f"confirming {stage.label} without instrumentation")
    plain = climb(program, [stage], refs, tolerance)[-1]
    if plain.kind == "accuracy":
        notes.append("inductor loses accuracy only with its kernels fused; localised by bisection")
    elif result.kind == "exception" and plain.kind == "ok":
        notes.append(f"instrumenting inductor raised {type(result.run.error).__name__}: {result.run.error}")
    return None, plain


def _node_by_node(instrumented: InstrumentedInductor, tolerance: float, notes: list[str]) -> NodeFinding | None:
    """The first node whose compiled value inductor got wrong; when there is none, a note says so
    (and a failure of the comparison itself becomes a note too)."""
    try:
        found = first_bad_node(instrumented.graphs, tolerance, notes)
    except Exception as error:  # noqa: BLE001 - diagnose reports, it does not crash
        log.warning("node-by-node comparison failed", exc_info=True)
        notes.append(f"node by node, the comparison failed ({type(error).__name__}: {first_line(error)})")
        found = None
    if found is None:
        notes.append("node by node, no compiled value is further from fp64 than eager allows; bisecting the graph instead")
    return found


def _bisect(program: Program, failed: StageResult, graphs: list[Any], tolerance: float, notes: list[str]) -> NodeFinding | None:
    """The first bad node of the failing stage by bisection over the Dynamo graphs. When there is
    none, the last note says why; a failure of the search itself becomes a note too."""
    bisector = Bisector(failed.stage, program.train, tolerance)
    try:
        found = bisector.locate(graphs)
    except Exception as error:  # noqa: BLE001
        log.warning("bisection failed", exc_info=True)
        notes.append(f"no node localised: bisecting the Dynamo graphs failed ({type(error).__name__}: {first_line(error)})")
        return None
    log.info("bisection took %d compiles", bisector.compiles)
    if found is None:
        if not graphs:
            notes.append(f"no node localised: Dynamo captured no graph to bisect under {failed.stage.label}")
        else:
            notes.append(
                f"no node localised: no single Dynamo graph prefix fails under {failed.stage.label}; "
                "the problem needs the whole program"
            )
    return found


def _write_repro(finding: NodeFinding, failed: StageResult, folder: Path, tolerance: float, notes: list[str]) -> Path | None:
    try:
        return write_repro(finding, failed.stage.backend, folder, tolerance)
    except (OSError, ValueError, TypeError) as error:
        notes.append(f"no repro written: {error}")
        return None
