"""Host time eager capture adds per aten op, on the tiny GPT, per mode and path (issue 48, items 6 and 2b).

    python bench/host_per_op.py [--rounds 8] [--block 3] [--warmup 2] [--modes ...] [--layers 4]
                                [--dir /dev/shm] [--staged [--foreach]] [--profile structure/op [--top 30]]

The model is the GPT example at its smallest (4 layers, width 32, 4 heads, sequence 16, batch 2,
vocabulary 64, AdamW; one intra-op thread unless ``--threads``: on a shared 2-core machine a second
thread's waits swamp the step), so the model's own work per op is a few microseconds and what
capture adds on the host shows in full. ``--layers`` deepens it (64, 256: real sizes, where what a
step costs per op, not per step, shows). Plain steps and each mode's steps take turns in one
process, in blocks of ``--block`` consecutive steps (each step started, stopped and stepped as in
training, each block ending with ``Debugger.flush()``, so every record written is charged to its
mode). Per mode it prints the median milliseconds per step, its ratio to the plain step, and the
host microseconds added per aten op, ``(captured - plain) / ops``, where ``ops`` is the number of
aten ops one step dispatches (counted once by a counting dispatch mode; the debugger's own ops are
not counted); once by the wall clock, once by the process's CPU time (all its threads, the writer's
included), which moves less with the load of other jobs on a shared machine; and once from the least
CPU time of any block of the mode against the least of the plain blocks, which a busy neighbour on a
shared machine can only raise (the figure to compare two commits by); and the least CPU time of the
training thread alone, the same way: what a launch-bound device waits for, the writer's thread (the
records' encoding and compression, on a core of its own where the host has one) left out; a block's
flush waits for the writer, its time on the writer's thread. A second table splits the training
thread's time by phase of a step (``Debugger.start``; the step itself, where the callbacks run;
``Debugger.stop`` with ``Debugger.step``: the drain, the walk and the records' columns), each the
median over the mode's steps less the plain steps' median, per aten op: what moving a phase off the
training thread could spare a launch-bound device. ``dispatch-mode`` is an empty
``TorchDispatchMode`` that only calls each op: the floor of any Python dispatch-mode capture.
``structure/op native``, ``statistics/op native``, ``statistics+checksum/op native`` and
``checksum/op native`` (and ``statistics/mix native``, ``statistics/module native``, ``tensor/op
native`` and ``overflow_check/op native``, not run by default) are those modes on the native
observer (the default path; a native arm that fell back is marked so); the other arms are held on
the dispatch mode (``statistics/module``: on Python's module records) with the C kernels still on
(``debugger.why_not_native`` answers for them while their debugger is built).
Below the table, the step time of each checksum mode over the mode without the checksum on the
same path (``statistics+checksum/op`` over ``statistics/op``: issue 48's target is 1.10x).
Timings are printed, never asserted: the machine's load moves them (the first line gives the load
average).

A third table gives Python's cyclic garbage collector per mode (``gc.callbacks`` around the timed
blocks): its milliseconds per step and its full collections (the oldest generation's: a pass over
every object of the process) per 100 steps; what capture keeps alive through a step's young
collections brings these on.

``--staged`` has the native arms keep every CPU tensor as an accelerator's
(``NativeObserver.defer_cpu``): their values staged before an op writes their memory and once
``STAGE_AFTER_BYTES`` of them are held (``NativeStepCapture.stage_kept``), the path an
accelerator's tensors take with ``DEVICE_STATISTICS``, run on the CPU. ``--foreach`` gives AdamW
the multi-tensor updates torch picks by default on an accelerator (on the CPU it updates parameter
by parameter): a step's in-place writes, before each of which a staging runs, are then a few ops of
many tensors each, as on a GPU, instead of several hundred of one or two.

``--profile MODE`` runs ``--block`` steps of that mode under cProfile after the timing and prints
the ``--top`` functions by their own time, then by cumulative time: where the host time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import functools
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
import torchdebug.debugger as debugger_module  # noqa: E402
from bench._args import positive_int  # noqa: E402
from bench.overhead import MODES, _EmptyMode  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from torchdebug.capture.native_capture import NativeOpCapture  # noqa: E402
from torchdebug.native.build import DISABLE_ENV  # noqa: E402
from torchdebug.native.observer import NativeObserver, load_observer  # noqa: E402

CONFIG = GPTConfig(n_layer=4, d_model=32, n_head=4, seq_len=16, vocab=64)
BATCH = 2

PATH_MODES = {
    f"{mode} native": MODES[mode]
    for mode in (
        "structure/op",
        "statistics/op",
        "statistics+checksum/op",
        "checksum/op",
        "statistics/mix",
        "statistics/module",
        "tensor/op",
        "overflow_check/op",
    )
}
"""The native path's tasks with their dispatch-mode configs (stacks on), built on the native path."""

ALL_MODES = {**MODES, **PATH_MODES}

DEFAULT_MODES = (
    "dispatch-mode",
    "structure/op",
    "structure/op native",
    "statistics/op",
    "statistics/op native",
    "statistics+checksum/op",
    "statistics+checksum/op native",
    "statistics/module",
    "checksum/op",
)

CHECKSUM_OVER = {f"statistics+checksum/op{path}": f"statistics/op{path}" for path in ("", " native")}
"""Each checksum mode and the mode it adds the fingerprint to: their step times' ratio is printed."""


class _CountingMode(_EmptyMode):
    """Calls each op and counts it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(step: Callable[[], object]) -> int:
    """The aten ops one call of ``step`` dispatches."""
    with _CountingMode() as counter:
        step()
    return counter.ops


@contextmanager
def native_path(mode: str) -> Iterator[None]:
    """The native path for a native arm (``TORCHDEBUG_NATIVE`` unset), the dispatch mode for the others
    (read when a debugger is built): ``TORCHDEBUG_NATIVE=0`` would turn the C kernels off too."""
    before = os.environ.pop(DISABLE_ENV, None)
    chooser = debugger_module.why_not_native
    if not mode.endswith(" native"):
        debugger_module.why_not_native = lambda config, model: "the bench's dispatch-mode arm"
    try:
        yield
    finally:
        debugger_module.why_not_native = chooser
        if before is not None:
            os.environ[DISABLE_ENV] = before


def run_block(
    mode: str,
    debugger: torchdebug.Debugger | None,
    model: torch.nn.Module,
    step: Callable[[], object],
    block: int,
    mark: Callable[[], object] | None = None,
) -> None:
    """``block`` steps of ``mode`` (plain, the empty dispatch mode, or a debugger's capture);
    ``mark``, if given, is called before each step's start and after its start, step and stop."""
    with native_path(mode):
        _run_steps(mode, debugger, model, step, block, mark or (lambda: None))


def _run_steps(
    mode: str,
    debugger: torchdebug.Debugger | None,
    model: torch.nn.Module,
    step: Callable[[], object],
    block: int,
    mark: Callable[[], object],
) -> None:
    for _ in range(block):
        mark()
        if debugger is not None:
            debugger.start(model=model)
        mark()
        if mode == "dispatch-mode":
            with _EmptyMode():
                step()
        else:
            step()
        mark()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        mark()
    if debugger is not None:
        debugger.flush()


@contextmanager
def staged(observer: NativeObserver | None, mode: str) -> Iterator[None]:
    """A native arm's every CPU tensor kept as an accelerator's meanwhile (``--staged``: ``observer``)."""
    if observer is None or not mode.endswith(" native"):
        yield
        return
    observer.defer_cpu(True)
    try:
        yield
    finally:
        observer.defer_cpu(False)


PHASES = ("start", "step", "stop")
"""A step's phases on the training thread, between the marks ``run_block`` makes: ``Debugger.start``,
the step, ``Debugger.stop`` and ``Debugger.step``."""


def phase_times(marks: list[float]) -> dict[str, list[float]]:
    """Each step's time in each of :data:`PHASES` from the clock's readings at its four marks, in
    order (``run_block``'s: before the start, after the start, the step and the stop)."""
    if len(marks) % 4:
        raise ValueError(f"{len(marks)} marks: each step makes 4")
    steps = [marks[at : at + 4] for at in range(0, len(marks), 4)]
    return {phase: [step[index + 1] - step[index] for step in steps] for index, phase in enumerate(PHASES)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=8, help="timed blocks per mode (default 8)")
    parser.add_argument("--block", type=positive_int, default=3, help="consecutive steps per block (default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed blocks per mode (default 2)")
    parser.add_argument("--modes", nargs="*", default=list(DEFAULT_MODES), choices=[m for m in ALL_MODES if m != "plain"])
    parser.add_argument("--dir", type=Path, default=None, help="where the dumps go (default: a temporary folder)")
    parser.add_argument(
        "--profile", choices=[m for m in ALL_MODES if m != "plain"], help="profile this mode's steps after the timing"
    )
    parser.add_argument("--top", type=positive_int, default=30, help="functions listed by --profile (default 30)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch's intra-op threads (default 1)")
    parser.add_argument("--layers", type=positive_int, default=CONFIG.n_layer, help=f"layers (default {CONFIG.n_layer})")
    parser.add_argument(
        "--staged",
        action="store_true",
        help="native arms keep every CPU tensor as an accelerator's, staged (DEVICE_STATISTICS's path)",
    )
    parser.add_argument(
        "--foreach", action="store_true", help="AdamW's multi-tensor updates, as torch picks them on an accelerator"
    )
    args = parser.parse_args()
    observer = load_observer() if args.staged else None
    if args.staged and observer is None:
        parser.error("--staged needs the native observer, which cannot be built here")
    torch.set_num_threads(args.threads)
    torchdebug.seed_all(1234)
    config = dataclasses.replace(CONFIG, n_layer=args.layers)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=args.foreach)
    batch = make_batch(config, batch=BATCH)

    def step() -> None:
        train_step(model, optimizer, batch)

    step()  # the optimizer's state exists from here on: every later step runs the same ops
    ops = ops_per_step(step)
    modes = ["plain", *args.modes]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu_times: dict[str, list[float]] = {mode: [] for mode in modes}
    thread_times: dict[str, list[float]] = {mode: [] for mode in modes}
    phases: dict[str, dict[str, list[float]]] = {mode: {phase: [] for phase in PHASES} for mode in modes}
    collections = {mode: Collections() for mode in modes}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        debuggers = {
            mode: torchdebug.Debugger(Path(tmp) / mode.replace("/", "_").replace(" ", "_"), **ALL_MODES[mode])
            for mode in {*modes, args.profile}
            if mode is not None and ALL_MODES[mode] is not None
        }
        for round_ in range(args.warmup + args.rounds):
            for mode in modes:
                marks: list[float] = []
                start, cpu_start, thread_start = time.perf_counter(), time.process_time(), time.thread_time()
                with collections[mode] if round_ >= args.warmup else contextlib.nullcontext(), staged(observer, mode):
                    run_block(mode, debuggers.get(mode), model, step, args.block, functools.partial(_mark, marks))
                if round_ >= args.warmup:
                    for phase, seconds in phase_times(marks).items():
                        phases[mode][phase] += seconds
                    times[mode].append((time.perf_counter() - start) / args.block)
                    cpu_times[mode].append((time.process_time() - cpu_start) / args.block)
                    thread_times[mode].append((time.thread_time() - thread_start) / args.block)
        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}; "
            f"GPT of {args.layers} layers: {ops} aten ops a step; median of {args.rounds} blocks of {args.block} steps per mode"
        )
        fell_back = {mode for mode in modes if mode.endswith(" native") and not isinstance(debuggers[mode]._ops, NativeOpCapture)}  # noqa: SLF001
        labels = {mode: f"{mode} (fell back)" if mode in fell_back else mode for mode in modes}
        width = max(map(len, labels.values()))
        heads = f"{'wall (perf_counter)':>28s}   {'cpu (process_time)':>28s}   {'least cpu':>9s} {'training thread':>15s}"
        print(f"{'':{width}s} {heads}")
        print(f"{'mode':{width}s}" + f" {'ms/step':>9s} {'x plain':>8s} {'µs/op':>8s}  " * 2 + f" {'µs/op':>9s} {'µs/op':>15s}")
        plain, cpu_plain = statistics.median(times["plain"]), statistics.median(cpu_times["plain"])
        for mode in modes:
            least = (min(cpu_times[mode]) - min(cpu_times["plain"])) / ops * 1e6
            thread = (min(thread_times[mode]) - min(thread_times["plain"])) / ops * 1e6
            columns = _columns(times[mode], plain, ops) + _columns(cpu_times[mode], cpu_plain, ops)
            print(f"{labels[mode]:{width}s}{columns} {least:9.1f} {thread:15.1f}")
        print_phases(phases, labels, ops)
        print(f"\n{'collector (gc)':{width}s} {'ms/step':>9s} {'full per 100 steps':>19s}")
        for mode in modes:
            print(f"{labels[mode]:{width}s} {collections[mode].per_step(args.rounds * args.block)}")
        for mode, base in CHECKSUM_OVER.items():
            if mode in times and base in times:
                wall = statistics.median(times[mode]) / statistics.median(times[base])
                cpu = statistics.median(cpu_times[mode]) / statistics.median(cpu_times[base])
                print(f"{mode} over {base}: {wall:.3f}x wall, {cpu:.3f}x cpu (issue 48's target: 1.10x)")
        if args.profile is not None:
            with staged(observer, args.profile):
                profile(args.profile, debuggers.get(args.profile), model, step, args.block, args.top)
        for debugger in debuggers.values():
            debugger.close()


def _mark(marks: list[float]) -> None:
    marks.append(time.thread_time())


def print_phases(phases: dict[str, dict[str, list[float]]], labels: dict[str, str], ops: int) -> None:
    """The training thread's µs per aten op added in each phase of a step (median steps, less the
    plain steps' median), and their sum."""
    width = max(map(len, labels.values()))
    print(f"\n{'training thread, µs/op added':{width}s}" + "".join(f" {phase:>8s}" for phase in (*PHASES, "sum")))
    plain = {phase: statistics.median(seconds) for phase, seconds in phases["plain"].items()}
    for mode, by_phase in phases.items():
        if mode == "plain":
            continue
        added = [(statistics.median(by_phase[phase]) - plain[phase]) / ops * 1e6 for phase in PHASES]
        print(f"{labels[mode]:{width}s}" + "".join(f" {value:8.2f}" for value in (*added, sum(added))))


_OLDEST = len(gc.get_count()) - 1
"""The collector's oldest generation: a collection of it is a full one."""


class Collections:
    """Python's cyclic garbage collector while it is entered (``gc.callbacks``): the seconds its
    collections took and how many were full (of the oldest generation)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __enter__(self) -> None:
        gc.callbacks.append(self._called)

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._called)

    def _called(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info["generation"] == _OLDEST

    def per_step(self, steps: int) -> str:
        """Milliseconds a step and full collections per 100 steps, over ``steps`` steps."""
        return f"{self.seconds / steps * 1000:9.2f} {self.full / steps * 100:19.1f}"


def _columns(seconds: list[float], plain: float, ops: int) -> str:
    """Milliseconds per step, the ratio to the plain step and microseconds added per op (medians)."""
    median = statistics.median(seconds)
    return f" {median * 1000:9.2f} {median / plain:7.2f}x {(median - plain) / ops * 1e6:8.1f}  "


def profile(
    mode: str, debugger: torchdebug.Debugger | None, model: torch.nn.Module, step: Callable[[], object], block: int, top: int
) -> None:
    """Print where ``block`` steps of ``mode`` spend their host time, by own and by cumulative time."""
    profiler = cProfile.Profile()
    profiler.runcall(run_block, mode, debugger, model, step, block)
    for order in ("tottime", "cumulative"):
        print(f"\n{mode}: {block} steps under cProfile, top {top} by {order}")
        pstats.Stats(profiler).sort_stats(order).print_stats(top)


if __name__ == "__main__":
    main()
