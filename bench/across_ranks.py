"""How ``compare --across-ranks`` scales with the number of ranks: one narrow-GPT rank copied into N.

    python bench/across_ranks.py [--layers 62] [--ranks 4,16,64] [--modes in-process,cli,cli-workers-2]

The narrow GPT of ``bench/scale.py`` (width 32, sequence 16, vocabulary 64, batch 2) at ``--layers``
layers dumps one AdamW step at step 0 as statistics (``scale.capture``, its fp32 dump; 62 layers
give about 60k records). That rank folder is copied into N rank folders of one run, laid out as
the writer lays them out (``worldsize{N}_global_rank{R}``, each with its manifest; the other files
hard-linked), so every rank agrees with every other: the check reads every rank and blames none.

Each mode runs in a process of its own, after importing torch and torchdebug:

* ``in-process``: ``torchdebug.compare(run)``;
* ``cli``: ``torchdebug compare --across-ranks RUN`` (the CLI's ``main``, summary printed to /dev/null);
* ``cli-workers-N``: the same with ``--workers N``.

Printed per N and mode: seconds, peak resident memory of the process (``ru_maxrss``; interpreter
and torch included) and beyond what it held before the check, the largest worker's peak (with
workers), and the result's rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scale import capture, peak_mb, replicate, resident_mb  # noqa: E402

import torchdebug  # noqa: E402
from torchdebug.cli import main as cli_main  # noqa: E402
from torchdebug.compare import compare  # noqa: E402  (its modules loaded before the timed check)


def measure(mode: str, run: Path) -> dict[str, Any]:
    """Run one mode on ``run`` in this process: seconds, peaks, rows."""
    before = resident_mb()
    start = time.perf_counter()
    rows = None
    if mode == "in-process":
        rows = len(compare(run).rows)
    else:
        argv = ["compare", "--across-ranks", str(run)]
        if mode.startswith("cli-workers-"):
            argv += ["--workers", mode.rsplit("-", 1)[1]]
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            status = cli_main(argv)
        assert status == 0, f"exit status {status}"
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "peak_mb": peak_mb(),
        "beyond_mb": max(peak_mb() - before, 0.0),
        "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "rows": rows,
    }


def run_mode(mode: str, run: Path) -> dict[str, Any]:
    """``measure`` in a child process, so its memory is its own."""
    child = [sys.executable, __file__, "--measure", mode, "--run", str(run)]
    out = subprocess.run(child, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=62)
    parser.add_argument("--ranks", default="4,16,64", help="rank counts, comma-separated")
    parser.add_argument("--modes", default="in-process,cli,cli-workers-2")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, Path(args.run))))
        return
    with tempfile.TemporaryDirectory() as temp:
        capture(Path(temp), args.layers, warmup=0)
        source = torchdebug.load(Path(temp) / "fp32")
        (rank_folder,) = (dump.path for dump in source.ranks.values())
        records = len(source.ranks[0].records())
        print(f"{args.layers} layers: {records} records per rank; load average {os.getloadavg()[0]:.1f}")
        for ranks in map(int, args.ranks.split(",")):
            run = replicate(rank_folder, Path(temp) / f"ranks{ranks}" / "run", ranks)
            for mode in args.modes.split(","):
                found = run_mode(mode, run)
                workers = f", largest worker {found['worker_peak_mb']:.0f} MB" if "workers" in mode else ""
                print(
                    f"{ranks:>4} ranks  {mode:<14} {found['seconds']:7.1f} s  {found['seconds'] / ranks:5.2f} s/rank  "
                    f"peak {found['peak_mb']:5.0f} MB ({found['beyond_mb']:4.0f} MB beyond the start){workers}"
                    + (f"  {found['rows']} rows" if found["rows"] is not None else "")
                    + f"  load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            shutil.rmtree(run.parent)


if __name__ == "__main__":
    main()
