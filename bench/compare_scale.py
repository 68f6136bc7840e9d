"""Compare throughput against the number of worker processes: GPT example, bf16 autocast vs fp32.

    python bench/compare_scale.py [--workers 1,2,4] [--repeat 3] [--keep DIR]

Builds one tensor dump pair in a temporary folder (GPT 4 layers, d_model 256, 4 heads, seq 128,
batch 8, one AdamW step on the CPU, fixed seed; task=tensor; fp32 and bf16 autocast), then times
``torchdebug.compare(a, b, workers=N)`` for each N: one process for N = 1, N spawned processes
otherwise (their start-up, torch import included, is part of the time). Prints seconds (median of
the repeats), rows/s and GB/s (bytes of both dumps' tensor files per second), and checks that every
N gives the in-process rows. The statistics-only compare of the same pair is timed too: it is the
start-up, reading and matching without tensor metrics, so ``net GB/s`` (tensor bytes over the
difference) is the tensor throughput itself. Other jobs on the machine skew the numbers: the load
average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import dump, tensor_bytes  # noqa: E402  (bench/compare.py: the same dump pair)

import torchdebug  # noqa: E402


def _workers(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=_workers, default=[1, 2, 4], help="worker counts to time (default 1,2,4)")
    parser.add_argument("--repeat", type=int, default=3, help="timed compares per count (median reported)")
    parser.add_argument("--keep", type=Path, help="build the dumps here and keep them (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        root = args.keep or Path(temp)
        a, b = root / "tensor_bf16", root / "tensor_fp32"
        if not (a.exists() and b.exists()):
            dump(a, "tensor", bf16=True)
            dump(b, "tensor", bf16=False)
        size = tensor_bytes(a) + tensor_bytes(b)
        print(f"torch {torch.__version__}, {os.cpu_count()} cores; tensor dumps {size / 1e6:.0f} MB in {root}")
        expected = torchdebug.compare(a, b)  # warm: imports, page cache
        rows = [row.to_dict() for row in expected.rows]
        for workers in args.workers:
            seconds = {}
            for tensors in (False, True):
                times = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    result = torchdebug.compare(a, b, workers=workers, tensors=tensors)
                    times.append(time.perf_counter() - start)
                seconds[tensors] = statistics.median(times)
            assert [row.to_dict() for row in result.rows] == rows, f"workers={workers}: rows differ from one process"
            total, net = seconds[True], seconds[True] - seconds[False]
            print(
                f"workers {workers}: rows {len(rows)}  {total:6.3f} s (statistics only {seconds[False]:.3f} s)"
                f"  {len(rows) / total:6.0f} rows/s  {size / total / 1e9:.2f} GB/s  net {size / max(net, 1e-9) / 1e9:.2f} GB/s"
                f"  load average {os.getloadavg()[0]:.2f}"
            )


if __name__ == "__main__":
    main()
