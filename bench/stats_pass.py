"""Memory throughput of the one-pass statistics kernel, against a plain one-read reduction, in one process.

    python bench/stats_pass.py [--device cpu|cuda] [--sizes 65536,1048576,16777216,134217728] [--dtype float32] [--repeat 10]

For each size, one tensor of that many elements is reduced ``--repeat`` times by the path that eager
capture and the flight recorder use (:class:`~torchdebug.stats_table.StatsStager`: the C kernel on
the CPU, the Triton kernel on CUDA, the rows read back once at the end), with and without the
fingerprint in the same pass, and as many times by ``torch.sum`` (one read of the tensor, the pace
of a well-tuned reduction). Prints the GB/s of each and their ratio to ``torch.sum``.

Why it matters: the flight recorder reads every watched tensor once a step, so its device time is
about the bytes it watches divided by this rate (GPT M on CUDA watches about 9.5 GB a step, see
``docs/monitor.md``). Small sizes show the host's cost per tensor (a launch, a native call); big ones
the memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torchdebug.stats_table import StatsStager  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--sizes", default="65536,1048576,16777216,134217728", help="elements, comma-separated")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    parser.add_argument("--repeat", type=int, default=10, help="passes timed per size and path")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {args.dtype} on {args.device} ({where}), best of 3 rounds of {args.repeat} passes")
    print(f"{'elements':>12s} {'MB':>8s} {'torch.sum':>10s} {'statistics':>18s} {'statistics+fingerprint':>24s}")
    for size in (int(float(s)) for s in args.sizes.split(",")):
        x = torch.randn(size, device=device).to(dtype)
        stager = StatsStager()

        def statistics(x: torch.Tensor = x, stager: StatsStager = stager) -> None:
            stager.add_all([(x, _ignore)])

        def both(x: torch.Tensor = x, stager: StatsStager = stager) -> None:
            stager.add_all([(x, _ignore, _ignore)])

        def plain(x: torch.Tensor = x) -> None:
            x.sum()

        works = {"sum": plain, "stats": statistics, "both": both}
        seconds = {name: _seconds(work, args.repeat, stager, sync) for name, work in works.items()}
        rate = {name: x.numel() * x.element_size() / value / 1e9 for name, value in seconds.items()}
        print(
            f"{size:12d} {x.numel() * x.element_size() / 1e6:8.1f} {rate['sum']:7.1f} GB/s"
            f" {rate['stats']:7.1f} GB/s ({rate['stats'] / rate['sum']:.2f}x)"
            f" {rate['both']:11.1f} GB/s ({rate['both'] / rate['sum']:.2f}x)"
        )


def _ignore(value: object) -> None:
    """A sink that drops what it is handed (the bench times the pass, not what follows it)."""


def _seconds(work: Callable[[], None], repeat: int, stager: StatsStager, sync: Callable[[], None]) -> float:
    """Seconds per pass of ``work``: the best of three rounds of ``repeat`` passes, each round ending
    with the one read of the stager's rows (and the device synchronised); one untimed pass first."""
    work()
    stager.flush()
    best = float("inf")
    for _ in range(3):
        sync()
        start = time.perf_counter()
        for _ in range(repeat):
            work()
        stager.flush()
        sync()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best


if __name__ == "__main__":
    main()
