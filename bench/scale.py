"""How capture, storage, load, compare and the report scale with the record count: a narrow GPT at many layers.

    python bench/scale.py [--layers 4,64,256] [--warmup N] [--repeat 1] [--stages capture,load,compare,report]
    python bench/scale.py --layers 256 --stage capture --folder DUMPS   # the two dumps, kept in DUMPS
    python bench/scale.py --layers 256 --stage compare --folder DUMPS [--profile OUT]

For each layer count L: a GPT of width 32, sequence 16, vocabulary 64 (the example's -inf causal
mask), batch 2, whose records grow like a deep model's while its compute stays small. One AdamW
step is dumped as statistics twice, fp32 and bf16 autocast, after ``--warmup`` plain steps (0: the
first step, where freshly initialised tensors share their statistics: zero biases, LayerNorm
weights of ones, zero optimizer state).

Each stage runs in a process of its own, after importing torch and torchdebug, so its figures are
its own: seconds (best of ``--repeat``), records per second, and peak memory beyond what the
process held when the stage began (``ru_maxrss`` against the resident size just before; the
interpreter, torch and the stage's inputs excluded). Stages:

* ``capture``: the dumped bf16 step (a plain step is timed beside it), and the dump's bytes on disk
  per record;
* ``load``: ``torchdebug.load(dump)`` and its records;
* ``compare``: the in-process ``torchdebug.compare(bf16, fp32)``;
* ``ranks``: the cross-rank check (``torchdebug.compare(run)``) over ``--ranks`` copies of the bf16 dump's rank
  folder (every rank agrees; records counted over all ranks);
* ``report``: that compare's HTML report written, its bytes per row, and the seconds headless
  Chromium takes from navigation to the table's first page (the page's ``rows-ready`` mark; the
  faster of two loads; needs the test extra's selenium and Debian's chromium, see
  ``tests/report/browser.py``; NaN without them).

Last, each stage's growth exponent: the slope of log(seconds) against log(records) over the layer
counts (1.0 is linear). Dumps live in a temporary folder.

``--stage S --folder DUMPS`` runs one stage in this process and prints its figures as JSON: the
``capture`` stage writes the two dumps into ``DUMPS`` (one layer count), the others read them, so a
stage can be run again and again on the same dumps. The compare stage also gives its CPU seconds
(``cpu_seconds``: the process's, all threads). ``--profile OUT`` runs that stage's last run under
cProfile with the cyclic collector paused (as compare pauses it) and writes ``OUT/<stage>-<layers>.prof``
(read it with ``python -m pstats``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pyarrow  # noqa: F401  (imported before any stage: its import is not the stage's memory)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from torchdebug.compare import open_dump  # noqa: E402,F401  (compare's modules, lazy: not in the timed compare)
from torchdebug.store import _layout as layout  # noqa: E402

STAGES = ("capture", "load", "compare", "ranks", "report")


def resident_mb() -> float:
    """This process's resident memory now, in MB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Profiled(AbstractContextManager[None]):
    """cProfile around a stage's last run, with the cyclic collector paused (as compare pauses it);
    the profile is written to ``path`` on exit."""

    def __init__(self, path: Path) -> None:
        import cProfile

        self.path, self.profile = path, cProfile.Profile()

    def __enter__(self) -> None:
        gc.disable()
        self.profile.enable()

    def __exit__(self, *exc: object) -> None:
        self.profile.disable()
        gc.enable()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.profile.dump_stats(str(self.path))


def timed(
    work: Callable[[], Any], repeat: int, around_last: AbstractContextManager[Any] | None = None
) -> tuple[float, float, Any, float]:
    """Best seconds of ``repeat`` runs of ``work``, the peak MB beyond the resident size before, its
    last result, and the best CPU seconds of the process (all threads); ``around_last`` is entered
    around the last run (a profile)."""
    before = resident_mb()
    times, cpu, result = [], [], None
    for run in range(repeat):
        result = None  # the last run's result freed first, so that it is not counted in this run's peak
        with around_last if around_last is not None and run == repeat - 1 else nullcontext():
            start, start_cpu = time.perf_counter(), time.process_time()
            result = work()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return min(times), max(peak_mb() - before, 0.0), result, min(cpu)


def capture(folder: Path, layers: int, warmup: int) -> dict[str, Any]:
    """Dump the narrow GPT's step as statistics, fp32 then bf16, into ``folder``: the bf16 step's
    seconds and memory, a plain step's seconds after it, the bf16 dump's records and bytes on disk."""
    config = GPTConfig(n_layer=layers, d_model=32, n_head=4, seq_len=16, vocab=64)
    for name, autocast in (("fp32", None), ("bf16", torch.bfloat16)):
        torchdebug.seed_all(1234)
        model = GPT(config)
        optimizer = torch.optim.AdamW(model.parameters())
        batch = make_batch(config, batch=2)
        for _ in range(warmup):
            train_step(model, optimizer, batch, autocast=autocast)

        def step() -> None:
            with torchdebug.dump(folder / name, model=model, task="statistics"):  # noqa: B023 (called at once)
                train_step(model, optimizer, batch, autocast=autocast)  # noqa: B023

        seconds, memory, *_ = timed(step, 1)
        plain, *_ = timed(lambda: train_step(model, optimizer, batch, autocast=autocast), 1)  # noqa: B023
    run = torchdebug.load(folder / "bf16")
    records = sum(len(rank.records()) for rank in run.ranks.values())
    on_disk = sum(file.stat().st_size for file in run.path.rglob("*") if file.is_file())
    return {
        "seconds": seconds,
        "plain_seconds": plain,
        "memory_mb": memory,
        "records": records,
        "bytes_per_record": on_disk / records,
    }


def replicate(rank_folder: Path, run: Path, ranks: int) -> Path:
    """``run`` with ``ranks`` copies of ``rank_folder``: files hard-linked, a manifest of its own each."""
    manifest = json.loads((rank_folder / layout.MANIFEST).read_text())
    for rank in range(ranks):
        copy = run / layout.rank_dir_name(ranks, rank)
        shutil.copytree(rank_folder, copy, copy_function=os.link)
        (copy / layout.MANIFEST).unlink()  # a link to the original's: replaced, not written through
        (copy / layout.MANIFEST).write_text(json.dumps({**manifest, "rank": rank, "world_size": ranks}))
    return run


def load(folder: Path, repeat: int) -> dict[str, Any]:
    """Read the bf16 dump's records."""
    seconds, memory, records, _ = timed(lambda: torchdebug.load(folder / "bf16").ranks[0].records(), repeat)
    return {"seconds": seconds, "memory_mb": memory, "records": len(records)}


def compare(folder: Path, repeat: int, profile: AbstractContextManager[Any] | None = None) -> dict[str, Any]:
    """Compare the bf16 dump with the fp32 one in-process."""
    seconds, memory, result, cpu = timed(lambda: torchdebug.compare(folder / "bf16", folder / "fp32"), repeat, profile)
    rows = len(result.rows)
    return {"seconds": seconds, "cpu_seconds": cpu, "memory_mb": memory, "records": rows, "counts": result.counts()}


def ranks(folder: Path, repeat: int, count: int) -> dict[str, Any]:
    """The cross-rank check over ``count`` copies of the bf16 dump's rank (every rank agrees)."""
    dump = torchdebug.load(folder / "bf16")
    (rank_folder,) = dump.path.iterdir()
    run = replicate(rank_folder, folder / "ranks" / "run", count)
    per_rank = len(dump.ranks[0].records())
    seconds, memory, *_ = timed(lambda: torchdebug.compare(run), repeat)
    shutil.rmtree(folder / "ranks")
    return {"seconds": seconds, "memory_mb": memory, "records": count * per_rank}


def report(folder: Path, repeat: int) -> dict[str, Any]:
    """Write the compare's HTML page, then open it in headless Chromium where one can run."""
    from tests.report.browser import browser, missing, open_compare_page

    result = torchdebug.compare(folder / "bf16", folder / "fp32")
    page = folder / "compare.html"
    seconds, memory, *_ = timed(lambda: result.to_html(page), repeat)
    opened = float("nan")
    if missing() is None:
        with browser() as driver:
            opened = min(open_compare_page(driver, page.as_uri()) for _ in range(2))
    return {
        "seconds": seconds,
        "memory_mb": memory,
        "records": len(result.rows),
        "bytes_per_row": page.stat().st_size / len(result.rows),
        "open_seconds": opened,
    }


def run_stage(stage: str, folder: Path, layers: int, warmup: int, repeat: int, ranks: int) -> dict[str, Any]:
    """Run ``stage`` in a child process (so its memory is its own) and return its figures."""
    child = [sys.executable, __file__, "--stage", stage, "--folder", str(folder), "--layers", str(layers)]
    child += ["--warmup", str(warmup), "--repeat", str(repeat), "--ranks", str(ranks)]
    out = subprocess.run(child, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def growth_exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(seconds) against log(records): 1.0 grows linearly, 2.0 quadratically."""
    xs = [math.log(records) for records, _ in points]
    ys = [math.log(seconds) for _, seconds in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else float("nan")


def describe(stage: str, layers: int, row: dict[str, Any]) -> str:
    records, seconds, memory = row["records"], row["seconds"], row["memory_mb"]
    line = (
        f"{stage:8s} layers {layers:4d}  records {records:9,d}  {seconds:8.2f} s  {records / seconds:10,.0f} records/s"
        f"  {seconds / records * 1e6:6.1f} µs/record  peak +{memory:6.0f} MB ({memory * 2**20 / records:6.0f} B/record)"
    )
    if stage == "capture":
        line += f"  plain step {row['plain_seconds']:.3f} s  on disk {row['bytes_per_record']:.0f} B/record"
    if stage == "compare":
        line += f"  CPU {row['cpu_seconds'] / records * 1e6:.1f} µs/row  verdicts {row['counts']}"
    if stage == "report":
        line += f"  page {row['bytes_per_row']:.1f} B/row, opens in {row['open_seconds']:.2f} s"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="4,64,256", help="layer counts, comma-separated (default 4,64,256)")
    parser.add_argument("--warmup", type=int, default=0, help="plain steps before the dumped one (default 0)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per stage and L (best reported)")
    parser.add_argument(
        "--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)} (capture always runs)"
    )
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the cross-rank stage (default 8)")
    parser.add_argument(
        "--stage", choices=STAGES, help="one stage in this process, figures as JSON: capture writes the dumps into --folder"
    )
    parser.add_argument("--folder", type=Path, help="the dumps' folder for --stage (at the first of --layers)")
    parser.add_argument("--profile", type=Path, help="with --stage compare: its last run's cProfile, PROFILE/compare-L.prof")
    args = parser.parse_args()
    if args.stage and args.folder is None:
        parser.error("--stage needs --folder, the dumps' folder")
    counts = [int(part) for part in args.layers.split(",")]
    if args.stage:
        profile = Profiled(args.profile / f"{args.stage}-{counts[0]}.prof") if args.profile else None
        work = {
            "capture": lambda: capture(args.folder, counts[0], args.warmup),
            "load": lambda: load(args.folder, args.repeat),
            "compare": lambda: compare(args.folder, args.repeat, profile),
            "ranks": lambda: ranks(args.folder, args.repeat, args.ranks),
            "report": lambda: report(args.folder, args.repeat),
        }[args.stage]
        print(json.dumps(work()))
        return
    stages = [stage for stage in STAGES if stage == "capture" or stage in args.stages.split(",")]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads,"
        f" warm-up steps {args.warmup}, load {os.getloadavg()[0]:.2f}"
    )
    points: dict[str, list[tuple[int, float]]] = {stage: [] for stage in stages}
    for layers in counts:
        with tempfile.TemporaryDirectory() as temp:
            for stage in stages:
                row = run_stage(stage, Path(temp), layers, args.warmup, args.repeat, args.ranks)
                points[stage].append((row["records"], row["seconds"]))
                print(describe(stage, layers, row), flush=True)
    if len(counts) > 1:
        print(
            "growth exponents (log seconds against log records; 1.0 is linear): "
            + ", ".join(f"{stage} {growth_exponent(points[stage]):.2f}" for stage in stages)
        )


if __name__ == "__main__":
    main()
