"""Step overhead of the flight recorder (``torchdebug.Monitor``) on the GPT example, in one process.

    python bench/monitor.py [--steps 10] [--block 3] [--warmup 2] [--device cpu|cuda] [--size S|M] [--layers N] [--width D]
                            [--compile]
    python bench/monitor.py --per-call [--instructions]

Modes take turns in blocks of ``--block`` steps (a paused monitor of this eager model removes every
module hook; the optimizer's two step hooks stay, idle): ``plain``; ``monitor`` (the loop's own
``optimizer.step()``, then ``monitor.step(loss=loss)``: the table is read a step late, no
synchronisation); ``monitor+closure``
(``monitor.step(closure)``: the table read once before the optimizer step, so a bad step can be
skipped and replayed). Each monitored block is divided by the plain block of its own round (the
machine's slower minutes slow both), and the median of those ratios printed with their quartiles,
and beside it the best monitored block against the best plain block (other work on a shared
machine only ever adds time: the fastest blocks are the least disturbed).
Targets (issue 25): at most 1.03x a plain step on the CPU GPT S (4 layers,
d_model 256, AdamW), at most 1.02x on CUDA at size M. Then triggers are forced (a predicate) in
each of two fresh runs (the second one timed), and the seconds of the trigger's work — the window dump, and the replay
under op-level statistics capture — are set beside the seconds of a step captured by a
``Debugger`` with the same options: the replay should add only the captured step's own cost. Also
prints the seconds per step spent in the monitor's own code (its hooks and step calls, timed from
inside: the machine's noise barely moves it, where the ratios above move by several percent), that
per watched tensor (issue 48's target: at most 3 µs of host per watched tensor; ``--layers 256
--width 32`` makes a model of many small tensors, where this cost is most of the monitor's), the
monitor's memory (window and device tables) and its watched slots, and the bytes one step's
statistics pass reads: the monitor's extra step time over those bytes is the pace the pass would
need to account for all of it (on a GPU-bound step, where the host's work hides, compare it with
``bench/stats_pass.py``'s measured pace). The spike triggers are off in
the timed runs (the loop trains on one batch again and again: see ``quiet``).

``--compile`` compiles each block in place (``block.compile()``, inductor) before the runs, as
torchtitan does: the monitor's hooks then run as Python beside the compiled blocks.

``--per-call`` times the host's cost a module call on 256 tiny layers instead; with
``--instructions`` it counts it under Valgrind's callgrind (``bench/_callgrind.py``), which the
load of a shared machine does not move: the figure to compare two commits by.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from bench._args import positive_int  # noqa: E402
from bench._callgrind import dump_count, run_counted  # noqa: E402
from bench.overhead import SIZES  # noqa: E402
from examples.gpt import GPT, make_batch  # noqa: E402
from torchdebug._torch.global_hooks import remove_global_hook  # noqa: E402
from torchdebug.monitor import StepSummary  # noqa: E402
from torchdebug.monitor import _watch as watch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed blocks per mode")
    parser.add_argument("--block", type=int, default=3, help="consecutive steps per block")
    parser.add_argument("--warmup", type=int, default=2, help="untimed blocks per mode")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--size", choices=sorted(SIZES), default="S", help="GPT size (default S)")
    parser.add_argument("--layers", type=positive_int, help="blocks, instead of the size's (the watched slots grow with them)")
    parser.add_argument("--width", type=positive_int, help="d_model, instead of the size's (narrow: many small tensors)")
    parser.add_argument("--compile", action="store_true", help="compile each block in place (inductor) first")
    parser.add_argument("--per-call", action="store_true", help="only the monitor's host cost a call on tiny tensors")
    parser.add_argument("--instructions", action="store_true", help="with --per-call: count instructions (callgrind), not time")
    parser.add_argument("--counted", choices=_COUNTED, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torchdebug.seed_all(1234)
    if args.counted is not None:
        _counted_forwards(args.counted)
        return
    if args.instructions and not args.per_call:
        parser.error("--instructions counts the --per-call chain: give both")
    if args.per_call and args.instructions:
        if shutil.which("valgrind") is None:
            parser.error("valgrind is not on the PATH (apt install valgrind)")
        _per_call_instructions()
        return
    if args.per_call:
        _per_call()
        return
    config = dataclasses.replace(SIZES[args.size], **_overrides(args))
    model = GPT(config).to(args.device)
    if args.compile:
        for block in model.layers:
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(config, batch=8, device=args.device)
    cuda = torch.device(args.device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = model(*batch)
        loss.backward()
        return loss

    def own_step() -> torch.Tensor:
        loss = closure()
        optimizer.step()
        return loss

    modes = ("plain", "monitor", "monitor+closure")
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        # the spike triggers off: this loop trains on one batch again and again, and the gradient norm
        # grows about 3x as it learns it by heart, which the trigger rightly flags; NaN/Inf stay on
        quiet = {"loss_spike": 0, "grad_norm_spike": 0}
        monitors = {mode: torchdebug.Monitor(model, optimizer, Path(tmp) / mode, **quiet) for mode in modes[1:]}
        for monitor in monitors.values():
            monitor.pause()
        for round_ in range(args.warmup + args.steps):
            for mode in modes:
                monitor = monitors.get(mode)
                if monitor is not None:
                    monitor.resume()
                sync()
                start = time.perf_counter()
                for _ in range(args.block):
                    if mode == "plain":
                        own_step()
                    elif mode == "monitor":
                        monitor.step(loss=own_step())
                    else:
                        monitor.step(closure)
                sync()
                if round_ >= args.warmup:
                    times[mode].append((time.perf_counter() - start) / args.block)
                if monitor is not None:
                    monitor.pause()
        watched = monitors["monitor"]
        slots, memory = len(watched.ring.slots), watched.memory_bytes()
        own = {mode: _own_seconds(monitors[mode], mode, closure, own_step, sync) for mode in modes[1:]}
        read = _bytes_read(watched, own_step)
        for monitor in monitors.values():
            monitor.close()
        trigger, replayed = _trigger_cost(model, closure, optimizer, Path(tmp) / "fired", sync)
        captured = _captured_step(model, own_step, Path(tmp) / "debugger", sync)
    where = torch.cuda.get_device_name(args.device) if cuda else f"{torch.get_num_threads()} threads"
    shape = f"GPT {args.size}" + "".join(f", {key} {value}" for key, value in _overrides(args).items())
    shape += ", blocks compiled in place" if args.compile else ""
    print(f"torch {torch.__version__}, {shape} on {args.device} ({where}), median of {args.steps} blocks of {args.block}")
    for mode, values in times.items():
        # each block against the plain block of its own round: a slower minute of the machine slows both
        ratios = sorted(v / p for v, p in zip(values, times["plain"]))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(
            f"{mode:16s} {statistics.median(values) * 1000:8.1f} ms/step  {statistics.median(ratios):.3f}x"
            f"  (rounds' quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}; best blocks {min(values) / min(times['plain']):.3f}x)"
        )
    plain = statistics.median(times["plain"])
    for mode, (seconds, least, passes) in own.items():
        print(
            f"{mode:16s} its own code {seconds * 1000:6.2f} ms/step, {seconds / plain:.3f} of a plain step"
            f" (least {least * 1000:.2f} ms, {least / min(times['plain']):.3f} of the fastest plain step)"
        )
        print(
            f"{mode:16s} host per watched tensor {seconds / slots * 1e6:.2f} us (least {least / slots * 1e6:.2f} us):"
            f" {passes / slots * 1e6:.2f} us in the CPU kernel's calls (mostly the pass over the tensors' memory),"
            f" {(seconds - passes) / slots * 1e6:.2f} us the rest (issue 48: at most 3 us in all)"
        )
    print(f"watched slots {slots}, memory {memory / 2**20:.1f} MiB (window {watched.config.window} steps and device tables)")
    extra = statistics.median(times["monitor"]) - plain
    pace = (
        f"; the monitor's extra {extra * 1000:.1f} ms a step is that read at {read / extra / 1e9:.0f} GB/s" if extra > 0 else ""
    )
    print(f"the statistics pass reads {read / 1e6:.1f} MB a step, each watched tensor once{pace} (its pace: bench/stats_pass.py)")
    print(
        f"a trigger: window dump {trigger:.2f} s, replay {replayed:.2f} s; "
        f"a step captured by a Debugger (statistics/op) {captured:.2f} s"
    )


def _own_seconds(monitor: torchdebug.Monitor, mode: str, closure, own_step, sync, steps: int = 12) -> tuple[float, float, float]:  # noqa: ANN001
    """Median and least seconds per step spent in the monitor's own code (its hooks, watches and
    step calls, timed by wrapping them on this instance; figures that the machine's slower minutes
    barely move), and the median seconds of it spent in the CPU kernel's calls: mostly the passes
    over the watched tensors' memory (what the tensors' sizes cost, not their number)."""
    spent = [0.0, 0.0]
    inside = [False, False]

    def timed(method, slot: int = 0):  # noqa: ANN001, ANN202
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if inside[slot]:
                return method(*args, **kwargs)
            inside[slot], start = True, time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[slot] += time.perf_counter() - start
                inside[slot] = False

        return wrapper

    for owner, names in (
        (monitor.watcher, ("_add", "watch_gradients", "watch_parameters", "watch_loss", "enter", "exit", "drop")),
        (monitor.watcher, ("_backward_reached",)),
        (monitor, ("begin_step", "before_update", "end_step")),
    ):
        for name in names:
            setattr(owner, name, timed(getattr(owner, name)))
    kernels = {name: getattr(watch, name) for name in _CPU_KERNEL_CALLS}
    for name, kernel in kernels.items():
        setattr(watch, name, timed(kernel, slot=1))
    native = monitor.watcher._native
    if native is not None:  # the native module's calls: the pass, and its few checks a tensor
        monitor.watcher._native = _Timed(native, timed)
    monitor.resume()
    per_step, pass_per_step = [], []
    try:
        for _ in range(steps):
            spent[0] = spent[1] = 0.0
            if mode == "monitor":
                monitor.step(loss=own_step())
            else:
                monitor.step(closure)
            sync()
            per_step.append(spent[0])
            pass_per_step.append(spent[1])
    finally:
        for name, kernel in kernels.items():
            setattr(watch, name, kernel)
        monitor.watcher._native = native
        monitor.pause()
    return statistics.median(per_step[2:]), min(per_step[2:]), statistics.median(pass_per_step[2:])


class _Timed:
    """The watcher's native module (``native/ring_sums.cpp``), each call timed with the kernel's."""

    def __init__(self, native, timed) -> None:  # noqa: ANN001
        self.output_sums = timed(native.output_sums, slot=1)
        self.group_sums = timed(native.group_sums, slot=1)


_CPU_KERNEL_CALLS = ("cpu_sums_many_into", "cpu_sums_one_into")
"""The monitor's calls of the CPU statistics kernel (a list of tensors; a module's one output)."""


def _chain(modules: int) -> tuple[torch.nn.Sequential, torch.Tensor]:
    """The per-call model: ``modules`` tiny ``Linear(4, 4)`` in a row (2 x 4 inputs: the statistics
    pass costs nothing), and its input."""
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(modules)]), torch.randn(2, 4)


def _watched_chain(model: torch.nn.Module, x: torch.Tensor, folder: str) -> tuple[torchdebug.Monitor, Callable[[], None]]:
    """A monitor of the per-call ``model`` after three steps, and its watched forward (as in a step:
    each run its own, so its calls number from 0 again)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    monitor = torchdebug.Monitor(model, optimizer, folder, loss_spike=0, grad_norm_spike=0)
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        monitor.step(loss=loss)
    watcher = monitor.watcher

    def watched_forward() -> None:
        watcher.next_step(watcher.step)
        model(x)

    return monitor, watched_forward


def _per_call(modules: int = 256, repeats: int = 200) -> None:
    """Host µs the monitor adds per module output, and per parameter and gradient, on the per-call
    chain of ``modules`` layers (:func:`_chain`): its forward watched against the same forward
    unwatched, the best of ``repeats`` each (the least disturbed); then the watcher's own part of
    it, timed from inside."""
    model, x = _chain(modules)

    def least(work) -> float:  # noqa: ANN001
        return min(_seconds(work, lambda: None) for _ in range(repeats))

    plain = least(lambda: model(x))
    with tempfile.TemporaryDirectory() as tmp:
        monitor, watched_forward = _watched_chain(model, x, tmp)
        watcher = monitor.watcher
        watched = least(watched_forward)
        params = len(watcher.parameters())
        parameters = least(watcher.watch_parameters)
        gradients = least(lambda: watcher.watch_gradients(again=True))
        own = [0.0]
        for name in ("enter", "exit"):
            method = getattr(watcher, name)

            def timed(*args, method=method):  # noqa: ANN001, ANN002, ANN202
                start = time.perf_counter()
                try:
                    return method(*args)
                finally:
                    own[0] += time.perf_counter() - start

            setattr(watcher, name, timed)
        inside = []
        for _ in range(repeats):
            own[0] = 0.0
            watched_forward()
            inside.append(own[0])
        monitor.close()
    calls = modules + 1
    native = "native module" if watcher._native is not None else "Python path (no native module)"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {native}; {modules} Linear(4, 4), best of {repeats}")
    added = (watched - plain) / calls * 1e6
    print(f"module output: {added:.2f} us a call added (torch's global hooks, the module tracker, the watcher)")
    print(f"  of it the watcher's enter and exit: {min(inside) / calls * 1e6:.2f} us a call")
    print(f"watch_parameters {parameters / params * 1e6:.2f} us a tensor, watch_gradients {gradients / params * 1e6:.2f}")


_COUNTED = ("plain", "global hooks", "monitor")
"""The per-call chain's forwards counted under callgrind, one process each: unhooked; with an empty
global forward pre-hook and hook (as the monitor's: with kwargs, always called), which send every
module call down torch's slow path; watched."""

_FORWARDS = 20
"""Forwards of the chain counted, after five uncounted."""


def _counted_forwards(mode: str, modules: int = 256) -> None:
    """The child of :func:`_per_call_instructions`: the per-call chain's forwards in ``mode`` (one of
    :data:`_COUNTED`), :data:`_FORWARDS` of them between two marks (``bench/_callgrind.py``)."""
    torch.set_num_threads(1)
    model, x = _chain(modules)
    with tempfile.TemporaryDirectory() as folder:
        forward = lambda: model(x)  # noqa: E731
        if mode == "monitor":
            monitor, forward = _watched_chain(model, x, folder)
        elif mode == "global hooks":
            handles = [register_module_forward_pre_hook(lambda *_: None)]
            handles.append(register_module_forward_hook(lambda *_: None, with_kwargs=True, always_call=True))
        for _ in range(5):
            forward()
        os.getppid()
        for _ in range(_FORWARDS):
            forward()
        os.getppid()
        if mode == "monitor":
            monitor.close()
        elif mode == "global hooks":
            for handle in handles:
                remove_global_hook(handle)


def _per_call_instructions(modules: int = 256) -> None:
    """Instructions a module call adds on the per-call chain, counted by callgrind (a figure the load
    of a shared machine does not move, where :func:`_per_call`'s times move by a third): torch's slow
    path once global hooks are registered, and a watched call (the monitor's hooks, the tracker, the
    watcher and the native call), each over an unhooked call."""
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(2) as pool:
        outs = {mode: Path(folder) / mode.replace(" ", "_") for mode in _COUNTED}
        runs = [
            pool.submit(run_counted, [__file__, "--counted", mode], out, marks=True, what=f"monitor: the {mode!r} chain")
            for mode, out in outs.items()
        ]
        for run in runs:
            run.result()
        found = {mode: out.parent / f"{out.name}.2-01" for mode, out in outs.items()}
        counts = {mode: dump_count(dump.read_text()) if dump.exists() else None for mode, dump in found.items()}
    if None in counts.values():
        raise SystemExit(f"monitor: no count between the marks of the {[m for m, c in counts.items() if c is None]} chains")
    calls = _FORWARDS * (modules + 1)
    added = {mode: (counts[mode] - counts["plain"]) / calls for mode in _COUNTED[1:]}
    print(f"torch {torch.__version__}; {modules} Linear(4, 4), {_FORWARDS} forwards counted; instructions a module call")
    print(f"unhooked: {counts['plain'] / calls:,.0f}")
    print(f"added by global hooks that do nothing (torch's slow path): {added['global hooks']:,.0f}")
    print(f"added by the monitor (its hooks, the tracker, the watcher, the native call): {added['monitor']:,.0f}")


def _overrides(args: argparse.Namespace) -> dict[str, int]:
    """The ``GPTConfig`` fields ``--layers`` and ``--width`` replace (heads: the size's, or fewer
    where the width does not divide by them)."""
    overrides = {}
    if args.layers:
        overrides["n_layer"] = args.layers
    if args.width:
        heads = SIZES[args.size].n_head
        overrides["d_model"], overrides["n_head"] = args.width, max(h for h in range(1, heads + 1) if args.width % h == 0)
    return overrides


def _bytes_read(monitor: torchdebug.Monitor, own_step) -> int:  # noqa: ANN001
    """Bytes of the tensors one monitored step reduces (each once: the statistics pass's reads),
    counted by wrapping, on this instance, the two ways a tensor is reduced: the CPU kernel and
    the device table."""
    read = [0]
    kernels = {name: getattr(watch, name) for name in _CPU_KERNEL_CALLS}
    add_all = monitor.stager.add_all

    def counted_cpu(kernel):  # noqa: ANN001, ANN202
        def counted(tensors, addresses) -> None:  # noqa: ANN001
            for tensor in tensors if isinstance(tensors, list) else [tensors]:
                read[0] += tensor.numel() * tensor.element_size()
            kernel(tensors, addresses)

        return counted

    def counted_device(items: list) -> None:  # noqa: ANN001
        read[0] += sum(item[0].numel() * item[0].element_size() for item in items)
        add_all(items)

    native, seen = monitor.watcher._native, monitor.watcher._seen

    def counted_native(call):  # noqa: ANN001, ANN202
        def counted(tensors, *where) -> bool:  # noqa: ANN001, ANN002
            record = None if isinstance(tensors, list) else seen.get(id(tensors))
            taken = call(tensors, *where)
            if taken and (isinstance(tensors, list) or seen.get(id(tensors)) is not record):  # not a copy of sums
                read[0] += sum(t.numel() * t.element_size() for t in (tensors if isinstance(tensors, list) else [tensors]))
            return taken

        return counted

    for name, kernel in kernels.items():
        setattr(watch, name, counted_cpu(kernel))
    monitor.stager.add_all = counted_device
    if native is not None:
        monitor.watcher._native = _Timed(native, lambda call, slot: counted_native(call))
    monitor.resume()
    try:
        monitor.step(loss=own_step())
    finally:
        monitor.pause()
        for name, kernel in kernels.items():
            setattr(watch, name, kernel)
        monitor.stager.add_all = add_all
        monitor.watcher._native = native
    return read[0]


def _trigger_cost(model: torch.nn.Module, closure, optimizer, folder: Path, sync) -> tuple[float, float]:  # noqa: ANN001
    """Seconds of a forced trigger's window dump and of its replay (the step's own cost excluded):
    triggers at steps 3 and 6, the second timed (the first pays the store's imports, once a process)."""

    def forced(summary: StepSummary) -> str | None:
        return "forced" if summary.step in (3, 6) else None

    options = {"predicate": forced, "max_events": 2, "loss_spike": 0, "grad_norm_spike": 0}
    monitor = torchdebug.Monitor(model, optimizer, folder, replay="off", **options)
    replaying = torchdebug.Monitor(model, optimizer, folder / "replay", **options)
    costs = []
    for current in (monitor, replaying):
        others = [m for m in (monitor, replaying) if m is not current]
        for other in others:
            other.pause()
        steps = [_seconds(lambda current=current: current.step(closure), sync) for _ in range(8)]
        costs.append(steps[6] - statistics.median(steps[4:6] + steps[7:]))
        current.close()
        for other in others:
            other.resume()
    window = costs[0]
    return window, costs[1] - window


def _captured_step(model: torch.nn.Module, own_step, folder: Path, sync) -> float:  # noqa: ANN001
    with torchdebug.Debugger(folder, task="statistics", level="op") as debugger:

        def captured() -> None:
            debugger.start(model)
            own_step()
            debugger.step()

        return min(_seconds(captured, sync) for _ in range(3))


def _seconds(work, sync) -> float:  # noqa: ANN001
    """Seconds of ``work()``, the device synchronised before and after."""
    sync()
    start = time.perf_counter()
    work()
    sync()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
