"""The stage ladder: uncompiled, eager, aot_eager, aot_eager_decomp_partition, the user's backend.

``uncompiled`` is the program as written; each later stage compiles a fresh copy of the program
with one more piece of the compiler than the stage before (Dynamo, then AOT autograd, then
inductor's decompositions and partitioner, then code generation), as in PyTorch's troubleshooting
guide. The first stage that raises, or whose outputs or
gradients fail :func:`torchdebug.diagnose._accuracy.check` against the fp64 eager reference, is where
the problem is; the stages before it clear everything they contain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchdebug import progress
from torchdebug._torch.dispatch import TorchDispatchMode
from torchdebug.diagnose import _attention as attention
from torchdebug.diagnose._accuracy import DEFAULT_TOLERANCE, Check, check
from torchdebug.diagnose._program import Outcome, Program

log = logging.getLogger("torchdebug.diagnose")

DEBUG_STAGES = ("eager", "aot_eager", "aot_eager_decomp_partition")


@dataclass(slots=True)
class Stage:
    """One rung: a label and what ``torch.compile`` gets (``None`` backend means plain eager)."""

    label: str
    backend: str | Callable[..., Any] | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StageResult:
    """How one stage did: its run, the verdict on each value, and its wall time."""

    stage: Stage
    run: Outcome
    checks: list[Check]
    seconds: float

    @property
    def failed(self) -> bool:
        return self.run.error is not None or any(not c.passed for c in self.checks)

    @property
    def kind(self) -> str:
        """``"exception"``, ``"accuracy"`` or ``"ok"``."""
        return "exception" if self.run.error is not None else "accuracy" if self.failed else "ok"


def backend_label(backend: str | Callable[..., Any]) -> str:
    """``"inductor"`` for names, the function or class name for callables."""
    if isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", None) or type(backend).__name__


def ladder(backend: str | Callable[..., Any] | None, compile_mode: str | None = None) -> list[Stage]:
    """The stages up to the user's backend (inductor by default, ``reduce-overhead`` on CUDA)."""
    stages = [Stage("uncompiled", None), *(Stage(name, name) for name in DEBUG_STAGES)]
    target = backend if backend is not None else "inductor"
    options = {"mode": compile_mode} if compile_mode is not None else {}
    if isinstance(target, str) and target in DEBUG_STAGES and not options:
        return stages[: 2 + DEBUG_STAGES.index(target)]
    return [*stages, Stage(backend_label(target) + (f" ({compile_mode})" if compile_mode else ""), target, options)]


def default_compile_mode(inputs: tuple[Any, ...], backend: Any) -> str | None:
    """``reduce-overhead`` (CUDA graphs) when inductor runs on CUDA inputs, else inductor's default."""
    on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    return "reduce-overhead" if backend is None and on_cuda else None


def run_stage(program: Program, stage: Stage) -> Outcome:
    """Run the program once under ``stage`` (Dynamo state reset first, so nothing is reused)."""
    torch.compiler.reset()
    fn, inputs = program.instance()
    params = fn if isinstance(fn, nn.Module) else None
    if stage.backend is not None:
        fn = torch.compile(fn, backend=stage.backend, **stage.options)
    return program.run(fn, inputs, params)


@dataclass(slots=True)
class References:
    """The fp64 eager values every stage is judged against, and the eager values in the program's dtype."""

    fp64: Outcome
    eager: Outcome
    random_ops: list[str] = field(default_factory=list)
    """The random ops the program calls (``aten.native_dropout.default``), in first-call order."""


class _RandomOps(TorchDispatchMode):
    """Notes every op that draws random numbers (:func:`torchdebug.diagnose._attention.is_random`)
    from torch's global generators; one passed a generator of its own draws the same in every run."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, None] = {}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # a compiled function the program calls stays compiled

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if kwargs.get("generator") is None and attention.is_random(func, args, kwargs):
            self.seen[str(func)] = None
        return func(*args, **kwargs)


def references(program: Program) -> References:
    """Run the program eagerly in float64 (noting the random ops it calls) and in its own dtypes."""
    fn, inputs = program.instance(float64=True)
    with _RandomOps() as random_ops:
        fp64 = program.run(fn, inputs, fn if isinstance(fn, nn.Module) else None)
    return References(fp64, run_stage(program, Stage("uncompiled", None)), list(random_ops.seen))


def check_outcome(run: Outcome, refs: References, tolerance: float = DEFAULT_TOLERANCE) -> list[Check]:
    """One :class:`Check` per value the fp64 reference has (missing values fail)."""
    checks = []
    for name, expected in refs.fp64.values.items():
        got, eager = run.values.get(name), refs.eager.values.get(name)
        if got is None or eager is None:
            checks.append(Check(name, False, float("inf"), 0.0, tuple(expected.shape), "missing from this stage"))
            continue
        checks.append(check(name, expected, eager, got, tolerance))
    return checks


def climb(
    program: Program,
    stages: list[Stage],
    refs: References,
    tolerance: float = DEFAULT_TOLERANCE,
    shown: progress.Bar | None = None,
) -> list[StageResult]:
    """Run the stages in order and stop at the first that fails (the rest are not run); ``shown``
    names the running stage and advances one unit per stage."""
    results = []
    for stage in stages:
        if shown is not None:
            shown.set_postfix_str(stage.label)
        start = time.perf_counter()
        run = refs.eager if stage.backend is None else run_stage(program, stage)
        checks = check_outcome(run, refs, tolerance) if run.error is None else []
        results.append(StageResult(stage, run, checks, time.perf_counter() - start))
        log.info("stage %s: %s in %.1f s", stage.label, results[-1].kind, results[-1].seconds)
        if shown is not None:
            shown.update()
        if results[-1].failed:
            break
    return results
