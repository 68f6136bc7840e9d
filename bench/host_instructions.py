"""Instructions eager capture adds per aten op, counted by Valgrind's callgrind: a figure the load of
a shared machine does not move (issue 48).

    python bench/host_instructions.py [--modes "statistics/op native" ...] [--blocks 2] [--jobs 2] [--spans]

Time on a shared virtual machine moves by a third from one minute to the next; instructions do not.
For plain steps and each mode, two processes run the tiny GPT of ``bench/host_per_op.py`` under
``valgrind --tool=callgrind`` (blocks of 3 steps, each ended by ``Debugger.flush()``, as there): one
runs a warm-up block then ``--blocks`` blocks, the other a warm-up block then twice as many. Their
difference is ``--blocks`` blocks of steady steps, imports and first calls left out; the mode's
instructions less the plain steps', over the aten ops of those steps, is what capture adds per op
(all threads: the writer's and Arrow's included). Columns split it by where the instructions run
(inclusive counts of these functions, from ``callgrind_annotate``):

- ``callback``: the observer's RecordFunction callbacks (``on_enter``, ``on_exit``), of which
  ``sums`` the statistics kernels (``td_stats_*``, wherever they run), ``stacks`` the Python frames (``python_frames``)
  and ``values`` the JSON texts of non-tensor arguments (``json_value``);
- ``native``: what Python calls through ctypes (the drain, the C++ walk);
- ``writer``: the records file's encoding and compression (``IpcFormatWriter::WriteRecordBatch``);
- ``rest``: the remainder (Python: start, stop, module hooks; numpy and pyarrow; torch's own
  RecordFunction and the boxing of each op's arguments).

``--spans`` runs one more process per mode (and plain), which marks the spans of each counted step
with a call Valgrind dumps its counts before (``os.getppid``): the training thread's instructions per
aten op in ``Debugger.start``, in the step (over the plain step's) and in ``Debugger.stop`` with
``Debugger.step`` (the other threads', the writer's, are in the totals only).

Needs ``valgrind`` on the ``PATH``; about three minutes a process. Counts are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from bench._args import positive_int  # noqa: E402
from bench._callgrind import MARK, dump_count, run_counted  # noqa: E402
from bench.host_per_op import ALL_MODES, BATCH, CONFIG, ops_per_step, run_block  # noqa: E402
from examples.gpt import GPT, make_batch, train_step  # noqa: E402

BLOCK = 3
"""Steps per block, each block ended by a flush (``host_per_op.py``'s default)."""

PARTS = {
    "callback": (r"\(anonymous namespace\)::on_(enter|exit)\(",),
    "sums": (r"^td_stats_",),
    "stacks": (r"\(anonymous namespace\)::python_frames\(",),
    "values": (r"\(anonymous namespace\)::json_value\(",),
    "native": (r"^ffi_call$",),
    "writer": (r"^arrow::ipc::internal::IpcFormatWriter::WriteRecordBatch\(",),
}
"""Each column's functions, by their names in ``callgrind_annotate``'s inclusive listing."""

_LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(?:\S*?:)?(.*?)(?:\s+\[[^\]]*\])?$")


SPANS = ("start", "step", "stop")
"""What the dumps of a ``--spans`` process hold, in turn from its second: ``run_block`` marks a step
four times, the last dump of each step holding what ran from its stop to the next step's start."""


def _child(mode: str, blocks: int, spans: bool) -> None:
    """Run a warm-up block then ``blocks`` blocks of ``mode`` (under callgrind, started by the parent);
    ``spans``: mark the spans of those blocks' steps."""
    torch.set_num_threads(1)
    torchdebug.seed_all(1234)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(CONFIG, batch=BATCH)
    with tempfile.TemporaryDirectory() as folder:
        options = ALL_MODES[mode]
        debugger = torchdebug.Debugger(Path(folder) / "dump", **options) if options is not None else None
        for block in range(1 + blocks):
            mark = os.getppid if spans and block > 0 else None
            run_block(mode, debugger, model, lambda: train_step(model, optimizer, batch), BLOCK, mark)
        if debugger is not None:
            debugger.close()


def _run_child(mode: str, blocks: int, out: Path, *, spans: bool = False) -> None:
    """Run a child process of ``mode`` under callgrind, its counts into ``out`` (``spans``: dumped at its marks)."""
    arguments = [__file__, "--child", mode, "--blocks", str(blocks), *(["--spans"] if spans else [])]
    run_counted(arguments, out, marks=spans, what=f"host_instructions: the {mode!r} process")


def _name(mode: str) -> str:
    return mode.replace("/", "_").replace(" ", "_")


def _counted(mode: str, blocks: int, folder: Path) -> tuple[int, dict[str, int]]:
    """The instructions of a child process running ``blocks`` blocks after its warm-up, in all and by :data:`PARTS`."""
    out = folder / f"{_name(mode)}.{blocks}.out"
    _run_child(mode, blocks, out)
    listing = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)], check=True, capture_output=True, text=True
    ).stdout
    return parts_of(listing)


def parts_of(listing: str) -> tuple[int, dict[str, int]]:
    """The program's instructions and those of each of :data:`PARTS`, from ``callgrind_annotate
    --inclusive=yes``'s listing (a recursive call's line, ``name'2``, is inside its first's)."""
    total = int(re.search(r"^([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", listing, re.MULTILINE).group(1).replace(",", ""))
    parts = dict.fromkeys(PARTS, 0)
    for line in listing.splitlines():
        match = _LINE.match(line)
        if match is None or match.group(2).endswith("'2"):
            continue
        for part, patterns in PARTS.items():
            if any(re.search(pattern, match.group(2)) for pattern in patterns):
                parts[part] += int(match.group(1).replace(",", ""))
    return total, parts


def _spanned(mode: str, blocks: int, folder: Path) -> dict[str, list[int]]:
    """The training thread's instructions in each of :data:`SPANS` of each counted step of a child
    process running ``blocks`` blocks after its warm-up."""
    folder.mkdir()
    out = folder / f"{_name(mode)}.spans.out"
    _run_child(mode, blocks, out, spans=True)
    dumps = {int(path.name[len(out.name) + 1 : -3]): path.read_text() for path in folder.glob(f"{out.name}.*-01")}
    return spans_of(dumps, BLOCK * blocks)


def spans_of(dumps: dict[int, str], steps: int) -> dict[str, list[int]]:
    """Each of :data:`SPANS` of ``steps`` steps, one count a step, from callgrind's dumps of one
    thread by their number (the first holds what ran before the first mark)."""
    found = {number: dump_count(text) for number, text in dumps.items()}
    counts = {number: count for number, count in found.items() if count is not None}
    if sorted(counts)[: 4 * steps] != list(range(1, 1 + 4 * steps)):
        raise SystemExit(f"host_instructions: {len(counts)} dumps for {steps} steps of 4 marks (was {MARK} called elsewhere?)")
    return {span: [counts[2 + 4 * step + index] for step in range(steps)] for index, span in enumerate(SPANS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = [mode for mode in ALL_MODES if mode != "plain"]
    parser.add_argument("--modes", nargs="*", default=["structure/op native", "statistics/op native"], choices=choices)
    parser.add_argument("--blocks", type=positive_int, default=2, help="blocks of 3 steps counted (default 2)")
    parser.add_argument("--jobs", type=positive_int, default=2, help="processes under callgrind at once (default 2)")
    parser.add_argument("--spans", action="store_true", help="the training thread's count in start, step and stop")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.blocks, args.spans)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        parser.error("valgrind and callgrind_annotate are not on the PATH (apt install valgrind)")
    torch.set_num_threads(1)
    torchdebug.seed_all(1234)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(CONFIG, batch=BATCH)
    train_step(model, optimizer, batch)
    ops = ops_per_step(lambda: train_step(model, optimizer, batch)) * BLOCK * args.blocks
    modes = ["plain", *args.modes]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(args.jobs) as pool:
        runs = {(mode, n): pool.submit(_counted, mode, n, Path(folder)) for mode in modes for n in (args.blocks, 2 * args.blocks)}
        spanned = {mode: pool.submit(_spanned, mode, args.blocks, Path(folder) / _name(mode)) for mode in modes if args.spans}
        spans = {mode: future.result() for mode, future in spanned.items()}
        counted = {}
        for mode in modes:
            (short, short_parts), (long, long_parts) = runs[mode, args.blocks].result(), runs[mode, 2 * args.blocks].result()
            counted[mode] = (long - short, {part: long_parts[part] - short_parts[part] for part in PARTS})
    plain, plain_parts = counted["plain"]
    per_step = ops // (BLOCK * args.blocks)
    print(f"torch {torch.__version__}; tiny GPT, {per_step} aten ops a step; {args.blocks} blocks of {BLOCK} steps counted")
    print(f"plain: {plain / ops:,.0f} instructions per aten op")
    print(f"{'instructions added per aten op':32s} {'total':>8s} " + " ".join(f"{part:>8s}" for part in [*PARTS, "rest"]))
    for mode in args.modes:
        total, parts = counted[mode]
        added = {part: (parts[part] - plain_parts[part]) / ops for part in PARTS}
        added["rest"] = (total - plain) / ops - added["callback"] - added["native"] - added["writer"]
        print(f"{mode:32s} {(total - plain) / ops:8,.0f} " + " ".join(f"{value:8,.0f}" for value in added.values()))
    if spans:
        plain_step = statistics.median(spans["plain"]["step"])
        print(f"training thread, instructions per aten op (median step)  {'start':>8s} {'step+':>8s} {'stop':>8s}")
        for mode in args.modes:
            start, step, stop = (statistics.median(spans[mode][span]) for span in SPANS)
            print(f"{mode:55s} {start / per_step:8,.0f} {(step - plain_step) / per_step:8,.0f} {stop / per_step:8,.0f}")


if __name__ == "__main__":
    main()
