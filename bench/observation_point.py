"""Where a native capture path should observe ops: host time per aten op of each observation point,
on the tiny GPT of ``bench/host_per_op.py`` (issue 48, item 1).

    python bench/observation_point.py [--rounds 8] [--block 3] [--warmup 2] [--threads 1] [--device cpu]

Points, each against a plain step in the same process (blocks of ``--block`` steps take turns, in
an order that rotates each round: on a loaded two-core machine the block after another point's
paid up to 1 µs/op more, whichever point it was):

- ``dispatch-mode``: an empty Python ``TorchDispatchMode`` (the floor of today's capture);
- ``rf-empty``: ``at::RecordFunction`` thread-local callbacks that return at once;
- ``rf-empty+values``: the same asking for inputs and outputs (the dispatcher boxes every op's
  arguments and captures its results);
- ``rf-record``: the native observer (``torchdebug.native.observer``): the ops a dispatch mode sees,
  with sequence numbers, backward marks, module context and each tensor's dtype, shape, version and
  id in columns, drained once per block;
- ``rf-record+values``: the same recording each op's non-tensor arguments and results as JSON text
  (value slots: what capture records);
- ``rf-record+stats``: the observer taking the sums of each CPU float tensor with ``stats.c``'s
  kernel in the callback (what ``statistics`` capture needs of a CPU tensor; none on CUDA);
- ``rf-record+stats+kept``: the same keeping the other tensors for the flush (what the native
  path's ``statistics`` runs: ``NativeObserver.keep_unsummed``, handed over at the drain);
- ``rf-record+stacks``: the observer taking each forward op's Python frames
  (``torch::CapturedTraceback::gather``), symbolized at the drain (what ``stack="all"`` runs);
- ``fallback-empty`` / ``fallback-record``: a boxed dispatcher fallback on ``DispatchKey::Fake``
  (below autograd) that passes every op on / also records its op and slot rows.

Per point: median milliseconds per step, the ratio to the plain step, and host microseconds added
per aten op, ``(point - plain) / ops``, where ``ops`` is what a counting dispatch mode counts in one
step (the denominator of ``host_per_op.py``); by the wall clock, by the process's CPU time, and from
the least CPU time of any block against the least plain block (what a busy neighbour moves least).
Also the rows the observer records per step. Timings are printed, never asserted: the first line gives
the load average. On ``--device cuda`` the step is not synchronised: host time is what is measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._args import positive_int  # noqa: E402
from bench.host_per_op import BATCH, CONFIG, ops_per_step  # noqa: E402
from bench.overhead import _EmptyMode  # noqa: E402
from examples.gpt import GPT, make_batch, train_step  # noqa: E402
from torchdebug import seed_all  # noqa: E402
from torchdebug.native.observer import EMPTY, EMPTY_WITH_VALUES, RECORD, NativeObserver, load_observer  # noqa: E402

POINTS = (
    "plain",
    "dispatch-mode",
    "rf-empty",
    "rf-empty+values",
    "rf-record",
    "rf-record+values",
    "rf-record+stats",
    "rf-record+stats+kept",
    "rf-record+stacks",
    "fallback-empty",
    "fallback-record",
)


def run_block(point: str, observer: NativeObserver, step: Callable[[], object], block: int) -> int:
    """``block`` steps observed at ``point``; the rows recorded (drained at the end)."""
    for _ in range(block):
        if point == "plain":
            step()
        elif point == "dispatch-mode":
            with _EmptyMode():
                step()
        elif point.startswith("rf-"):
            level = {"rf-empty": EMPTY, "rf-empty+values": EMPTY_WITH_VALUES}.get(point, RECORD)
            observer.use_stats(point.startswith("rf-record+stats"))
            observer.keep_unsummed(point == "rf-record+stats+kept")
            observer.want_stacks(point == "rf-record+stacks")
            observer.want_values(point == "rf-record+values")
            observer.start(level)
            step()
            observer.stop()
        else:
            if not observer.start_fallback(point == "fallback-record"):
                raise SystemExit("DispatchKey::Fake already has a fallback in this torch: no fallback measurement")
            step()
            observer.stop_fallback()
    ops = observer.drain()
    observer.stacks()  # the new ones symbolized, as a flush does
    return len(ops.op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=8, help="timed blocks per point (default 8)")
    parser.add_argument("--block", type=positive_int, default=3, help="consecutive steps per block (default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed blocks per point (default 2)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch's intra-op threads (default 1)")
    parser.add_argument("--device", default="cpu", help="where the model runs (default cpu)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    observer = load_observer()
    if observer is None:
        raise SystemExit("the native observer cannot be built here (see the warning above)")
    print(f"observer loaded in {time.perf_counter() - start:.1f} s (a cold build compiles it)")
    seed_all(1234)
    model = GPT(CONFIG).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(CONFIG, batch=BATCH, device=args.device)

    def step() -> None:
        train_step(model, optimizer, batch)

    step()  # the optimizer's state exists from here on: every later step runs the same ops
    ops = ops_per_step(step)
    times: dict[str, list[float]] = {point: [] for point in POINTS}
    cpu_times: dict[str, list[float]] = {point: [] for point in POINTS}
    rows: dict[str, int] = {}
    for round_ in range(args.warmup + args.rounds):
        shift = round_ % len(POINTS)
        for point in POINTS[shift:] + POINTS[:shift]:  # each point takes each place in turn
            wall, cpu = time.perf_counter(), time.process_time()
            recorded = run_block(point, observer, step, args.block)
            if round_ >= args.warmup:
                times[point].append((time.perf_counter() - wall) / args.block)
                cpu_times[point].append((time.process_time() - cpu) / args.block)
                rows[point] = recorded // args.block
    print(
        f"torch {torch.__version__} on {args.device}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}; "
        f"tiny GPT: {ops} aten ops a step (a counting dispatch mode); median of {args.rounds} blocks of {args.block} steps"
    )
    print(f"{'':22s} {'wall (perf_counter)':>28s}   {'cpu (process_time)':>28s}   {'least cpu':>9s}")
    print(f"{'point':22s}" + f" {'ms/step':>9s} {'x plain':>8s} {'µs/op':>8s}  " * 2 + f" {'µs/op':>9s} {'rows/step':>9s}")
    plain, cpu_plain = statistics.median(times["plain"]), statistics.median(cpu_times["plain"])
    for point in POINTS:
        columns = _columns(times[point], plain, ops) + _columns(cpu_times[point], cpu_plain, ops)
        least = (min(cpu_times[point]) - min(cpu_times["plain"])) / ops * 1e6
        print(f"{point:22s}{columns} {least:9.1f} {rows[point]:9d}")


def _columns(seconds: list[float], plain: float, ops: int) -> str:
    """Milliseconds per step, the ratio to the plain step and microseconds added per op (medians)."""
    median = statistics.median(seconds)
    return f" {median * 1000:9.2f} {median / plain:7.2f}x {(median - plain) / ops * 1e6:8.1f}  "


if __name__ == "__main__":
    main()
