"""``torchdebug.diagnose``: the troubleshooting workflow of PyTorch's compiler docs, automated.

1. fp64 and eager references; 2. the stage ladder (:mod:`~torchdebug.diagnose.stages`) up to the
first stage that raises or loses accuracy; 3. the first bad node inside it: node by node against
fp64 (:mod:`~torchdebug.diagnose.nodes`) for an inductor accuracy loss, graph-prefix bisection
(:mod:`~torchdebug.diagnose.bisect`) otherwise; 4. ``repro.py`` with that node alone; 5. graph
breaks and recompiles.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchdebug.diagnose.accuracy import DEFAULT_TOLERANCE
from torchdebug.diagnose.bisect import Bisector, capture_dynamo_graphs
from torchdebug.diagnose.finding import NodeFinding
from torchdebug.diagnose.graph_breaks import compile_events
from torchdebug.diagnose.instrument import InstrumentedInductor
from torchdebug.diagnose.nodes import first_divergence
from torchdebug.diagnose.program import Program
from torchdebug.diagnose.report import DiagnoseReport
from torchdebug.diagnose.repro import write_repro
from torchdebug.diagnose.stages import StageResult, climb, default_mode, ladder, references
from torchdebug.errors import TorchDebugError

log = logging.getLogger("torchdebug.diagnose")


def diagnose(
    fn: Callable[..., Any],
    *example_inputs: Any,
    backend: str | Callable[..., Any] | None = None,
    train: bool = True,
    mode: str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    output_dir: str | Path = "torchdebug_diagnose",
    repro: bool = True,
) -> DiagnoseReport:
    """Find the first compiler stage that breaks ``fn(*example_inputs)``, its node and source line.

    Args:
        fn: a function or ``nn.Module``; it is copied for each stage, never changed.
        example_inputs: its positional inputs.
        backend: the ``torch.compile`` backend under test (name or callable); ``None`` is inductor
            (with ``mode="reduce-overhead"`` when the inputs are on CUDA).
        train: also run backward and check the gradients of parameters and floating inputs.
        mode: ``torch.compile`` mode for the last stage.
        tolerance: the ``tol`` of ``torch._dynamo.utils.same`` (PyTorch's minifier uses 1e-3).
        output_dir: where ``repro.py`` and its inputs go.
        repro: write the repro (on by default).

    Returns:
        A :class:`DiagnoseReport`; ``report.stage is None`` when every stage is accurate.
    """
    start = time.perf_counter()
    program = Program(fn, example_inputs, train=train)
    refs = references(program)
    if refs.fp64.error is not None and refs.eager.error is None:
        raise TorchDebugError(
            f"diagnose: the fp64 reference run failed ({type(refs.fp64.error).__name__}: {refs.fp64.error}); "
            "make the program run in float64 (no hard-coded float32 tensors) or pass train=False"
        )
    stages = ladder(backend, mode if mode is not None else default_mode(program.inputs, backend))
    results = climb(program, stages, refs, tolerance)
    graphs = capture_dynamo_graphs(program)
    report = DiagnoseReport(results, compile_events=compile_events(graphs))
    failed = report.failed_stage
    if failed is not None and failed.stage.backend is not None:
        report.finding = _localize(program, failed, graphs, tolerance, report.notes)
        if report.finding is not None and repro:
            report.repro_path = _write_repro(report.finding, failed, Path(output_dir), tolerance, report.notes)
    report.seconds = time.perf_counter() - start
    return report


def _is_inductor(result: StageResult) -> bool:
    return result.stage.backend == "inductor" and not result.stage.options


def _localize(program: Program, failed: StageResult, graphs: list[Any], tol: float, notes: list[str]) -> NodeFinding | None:
    """The first bad node of the failing stage (see the module docstring for which method)."""
    if failed.kind == "accuracy" and _is_inductor(failed):
        instrumented = InstrumentedInductor()
        with instrumented.active():
            torch.compiler.reset()
            fn, inputs = program.instance()
            params = fn if isinstance(fn, torch.nn.Module) else None
            run = program.run(torch.compile(fn, backend=instrumented), inputs, params)
        if run.error is not None:
            notes.append(f"the instrumented inductor run raised {type(run.error).__name__}: {run.error}")
        found = first_divergence(instrumented.graphs, tol)
        if found is not None:
            return found
        notes.append("node by node, inductor's kernels match fp64 (fusion may hide the problem); bisecting the graph instead")
    bisector = Bisector(failed.stage, program.train, tol)
    found = bisector.locate(graphs)
    log.info("bisection took %d compiles", bisector.compiles)
    if found is None:
        notes.append(f"no single Dynamo graph prefix fails under {failed.stage.label}; the problem needs the whole program")
    return found


def _write_repro(finding: NodeFinding, failed: StageResult, folder: Path, tol: float, notes: list[str]) -> Path | None:
    try:
        return write_repro(finding, failed.stage.backend, folder, tol)
    except (OSError, ValueError, TypeError) as error:
        notes.append(f"no repro written: {error}")
        return None
