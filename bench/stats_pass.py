"""Memory throughput of the one-pass statistics kernel, against a plain one-read reduction, in one process.

    python bench/stats_pass.py [--device cpu|cuda] [--sizes 65536,1048576,16777216,134217728] [--dtype float32] [--repeat 10]
                               [--grid 32768:512,8192:2048] [--stages 2,3] [--threads N] [--view transposed]

For each size, one tensor of that many elements is reduced ``--repeat`` times by the path that eager
capture and the flight recorder use (:class:`~torchdebug.stats_table.StatsStager`: the C kernel on
the CPU, the Triton kernel on CUDA, the rows read back once at the end), with and without the
fingerprint in the same pass, and as many times by ``torch.sum`` (one read of the tensor, the pace
of a well-tuned reduction). Prints the GB/s of each and their ratio to ``torch.sum``. ``--grid``
also times the statistics, alone and with the fingerprint, with other launch grids of the Triton
kernel (``ELEMENTS_PER_PROGRAM:MAX_PROGRAMS``, the latter a power of two) on CUDA: one line per grid
and size, to choose them by measure; ``--stages`` likewise with other stages of Triton's software
pipeline over a program's blocks (``triton_stats.STAGES``, 1 by default: the plain loop).

Why it matters: the flight recorder reads every watched tensor once a step, so its device time is
about the bytes it watches divided by this rate (GPT M on CUDA watches about 9.5 GB a step, see
``docs/monitor.md``). Small sizes show the host's cost per tensor (a launch, a native call); big ones
the memory. Each line also gives the nanoseconds an element of the statistics and of statistics with
the fingerprint. ``--threads N`` runs torch (and the C kernel, which uses torch's thread pool) on N
threads: on a CPU that other jobs share, ``--threads 1`` times the kernel on one core without the
waits of a thread pool whose other threads are descheduled. ``--view transposed`` reduces each
tensor as attention's ``k.transpose(-2, -1)`` reads it (blocks of 128 x 64 elements, transposed:
memory order is not the logical order, so the fingerprint's walk has rows of 64 elements, each keyed
by its logical position); the default, ``contiguous``, a flat tensor.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._args import int_pairs, is_power_of_two, positive_int, positive_ints  # noqa: E402
from torchdebug.stats_table import StatsStager  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--sizes", type=positive_ints, default="65536,1048576,16777216,134217728", help="elements, comma-separated"
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    parser.add_argument("--repeat", type=positive_int, default=10, help="passes timed per size and path")
    parser.add_argument(
        "--stages", type=positive_ints, default=[], help="triton_stats.STAGES values to time too, comma-separated (CUDA)"
    )
    parser.add_argument("--threads", type=positive_int, default=None, help="torch's CPU threads (default: torch's own)")
    parser.add_argument(
        "--view", choices=sorted(VIEWS), default="contiguous", help="the layout each tensor is reduced in (default contiguous)"
    )
    parser.add_argument(
        "--grid",
        type=int_pairs,
        default=[],
        help="ELEMENTS_PER_PROGRAM:MAX_PROGRAMS of the Triton kernel to time too, comma-separated",
    )
    args = parser.parse_args()
    if not all(is_power_of_two(programs) for _, programs in args.grid):
        parser.error("--grid: MAX_PROGRAMS must be a power of two")
    if args.view == "transposed" and any(size % TRANSPOSED_BLOCK for size in args.sizes):
        parser.error(f"--view transposed: every size must be a multiple of {TRANSPOSED_BLOCK} elements")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    if device.type == "cpu":
        from torchdebug.native import fused_stats

        library = fused_stats._kernels()
        where += f", fingerprint loops: {library.hashers().decode() if library else 'torch ops'}"
    print(
        f"torch {torch.__version__}, {args.dtype} on {args.device} ({where}), {args.view} tensors,"
        f" best of 3 rounds of {args.repeat} passes"
    )
    print(
        f"{'elements':>12s} {'MB':>8s} {'torch.sum':>10s} {'statistics':>18s} {'statistics+fingerprint':>24s}"
        f" {'ns/element: statistics, +fingerprint':>38s}"
    )
    for size in args.sizes:
        x = VIEWS[args.view](torch.randn(size, device=device).to(dtype))
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
            f" {seconds['stats'] / size * 1e9:16.3f} {seconds['both'] / size * 1e9:7.3f}"
            f" ({seconds['both'] / seconds['stats']:.2f}x)"
        )
        for stages in args.stages:
            with _stages(x, stages):
                pace = x.numel() * x.element_size() / _seconds(statistics, args.repeat, stager, sync) / 1e9
                pace_both = x.numel() * x.element_size() / _seconds(both, args.repeat, stager, sync) / 1e9
            print(
                f"{'':12s} {'':8s} stages {stages}: statistics {pace:7.1f} GB/s ({pace / rate['sum']:.2f}x),"
                f" +fingerprint {pace_both:7.1f} GB/s ({pace_both / rate['sum']:.2f}x,"
                f" {pace / pace_both:.2f}x the statistics' time)"
            )
        for elements, most in args.grid:
            with _grid(x, elements, most) as programs:
                pace = x.numel() * x.element_size() / _seconds(statistics, args.repeat, stager, sync) / 1e9
                pace_both = x.numel() * x.element_size() / _seconds(both, args.repeat, stager, sync) / 1e9
            grid = f"{elements}:{most}"
            print(
                f"{'':12s} {'':8s} grid {grid}: {programs} programs, statistics {pace:7.1f} GB/s ({pace / rate['sum']:.2f}x),"
                f" +fingerprint {pace_both:7.1f} GB/s ({pace_both / rate['sum']:.2f}x,"
                f" {pace / pace_both:.2f}x the statistics' time)"
            )


TRANSPOSED_BLOCK = 128 * 64

VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.view(-1, 128, 64).transpose(-2, -1),
}
"""How ``--view`` lays out each flat tensor before it is reduced."""


@contextlib.contextmanager
def _stages(x: torch.Tensor, stages: int) -> Iterator[None]:
    """The Triton kernel compiled with ``stages`` pipeline stages while the block runs."""
    from torchdebug import stats_table

    kernel = stats_table._kernel_for(x)
    if kernel is None or stats_table._resolves_now(x):
        raise SystemExit(f"--stages: the statistics of a tensor on {x.device} do not take the Triton kernel here")
    saved = kernel.STAGES
    kernel.STAGES = stages
    try:
        yield
    finally:
        kernel.STAGES = saved


@contextlib.contextmanager
def _grid(x: torch.Tensor, elements: int, programs: int) -> Iterator[int]:
    """The Triton kernel launched with ``elements`` per program and at most ``programs`` per tensor
    while the block runs (it yields the programs ``x`` gets); the kernel's own grid after."""
    from torchdebug import stats_table

    kernel = stats_table._kernel_for(x)
    if kernel is None or stats_table._resolves_now(x):
        raise SystemExit(
            f"--grid: the statistics of a tensor on {x.device} do not take the Triton kernel here (CUDA with Triton)"
        )
    saved = kernel.ELEMENTS_PER_PROGRAM, kernel.MAX_PROGRAMS
    kernel.ELEMENTS_PER_PROGRAM, kernel.MAX_PROGRAMS = elements, programs
    try:
        yield kernel.programs_for(x.numel())
    finally:
        kernel.ELEMENTS_PER_PROGRAM, kernel.MAX_PROGRAMS = saved


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
