"""Instructions eager capture adds per aten op, counted by Valgrind's callgrind: a figure the load of
a shared machine does not move (issue 48).

    python bench/host_instructions.py [--modes "statistics/op native" ...] [--blocks 2] [--jobs 2]

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

Needs ``valgrind`` on the ``PATH``; about three minutes a process. Counts are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from bench._args import positive_int  # noqa: E402
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


def _child(mode: str, blocks: int) -> None:
    """Run a warm-up block then ``blocks`` blocks of ``mode`` (under callgrind, started by the parent)."""
    torch.set_num_threads(1)
    torchdebug.seed_all(1234)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(CONFIG, batch=BATCH)
    with tempfile.TemporaryDirectory() as folder:
        options = ALL_MODES[mode]
        debugger = torchdebug.Debugger(Path(folder) / "dump", **options) if options is not None else None
        for _ in range(1 + blocks):
            run_block(mode, debugger, model, lambda: train_step(model, optimizer, batch), BLOCK)
        if debugger is not None:
            debugger.close()


def _counted(mode: str, blocks: int, folder: Path) -> tuple[int, dict[str, int]]:
    """The instructions of a child process running ``blocks`` blocks after its warm-up, in all and by :data:`PARTS`."""
    out = folder / f"{mode.replace('/', '_').replace(' ', '_')}.{blocks}.out"
    command = ["valgrind", "--tool=callgrind", "--cache-sim=no", f"--callgrind-out-file={out}"]
    command += [sys.executable, __file__, "--child", mode, "--blocks", str(blocks)]
    # One hash seed: with Python's random one, a dict's order, and so the instructions, move between runs.
    run = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if run.returncode != 0:  # one line: the child's last words
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"host_instructions: the {mode!r} process under callgrind failed ({run.returncode}): {last}")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = [mode for mode in ALL_MODES if mode != "plain"]
    parser.add_argument("--modes", nargs="*", default=["structure/op native", "statistics/op native"], choices=choices)
    parser.add_argument("--blocks", type=positive_int, default=2, help="blocks of 3 steps counted (default 2)")
    parser.add_argument("--jobs", type=positive_int, default=2, help="processes under callgrind at once (default 2)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.blocks)
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


if __name__ == "__main__":
    main()
