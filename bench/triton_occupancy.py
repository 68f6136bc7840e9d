"""How many statistics programs an H100 keeps in flight: the Triton kernel compiled for sm_90, no GPU needed.

    python bench/triton_occupancy.py [--variants 1024:4,1024:8,2048:8] [--dtype float32] [--elements 6291456,100663296]
                                     [--directory]

For each ``BLOCK:num_warps`` variant, the statistics kernel (:mod:`torchdebug.native.triton_stats`,
statistics alone and with the fingerprint; ``--directory``: the kernel that reads many tensors'
addresses from a directory) is compiled for sm_90 as Triton would for an aligned tensor, and
``cuobjdump`` (shipped with Triton) reads the registers each thread uses. From them
come the programs an SM holds at once (an H100: 65,536 registers, 64 warps, 32 blocks an SM,
registers given out 256 per warp) and the bytes of one loop turn's loads in flight per SM. A
tensor's launch may hold fewer: it has one program per ``ELEMENTS_PER_PROGRAM`` elements, at most
``MAX_PROGRAMS``, spread over the 132 SMs; the last columns give what a tensor of each of
``--elements`` keeps in flight (GPT M's layer outputs are 6.3 M elements, its attention
probabilities 100.7 M).

Why: the kernel only streams memory, and HBM3 needs many bytes in flight per SM to reach its pace
(3.35 TB/s over 132 SMs at several hundred nanoseconds of latency: some 15–20 KB an SM, more
while warps compute instead of loading). Registers
held by wide accumulators limit the resident programs, hence the bytes in flight. This is a static
screen, not a timing: ``bench/stats_pass.py --device cuda`` measures the pace. Needs Triton
(``pip install triton``); runs on any machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._args import int_pairs, is_power_of_two, positive_ints  # noqa: E402

SMS = 132
"""Streaming multiprocessors of an H100 SXM."""

REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
REGISTER_UNIT = 256
"""Registers are given to a warp in units of this many."""

_DTYPES = ("float32", "bfloat16", "float16", "float64")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", type=int_pairs, default="1024:4,1024:8,2048:8", help="BLOCK:num_warps, comma-separated")
    parser.add_argument("--dtype", default="float32", choices=_DTYPES)
    parser.add_argument("--elements", type=positive_ints, default="6291456,100663296", help="tensor sizes, comma-separated")
    parser.add_argument("--directory", action="store_true", help="the directory kernel (launches of many tensors)")
    args = parser.parse_args()
    if not all(is_power_of_two(block) and is_power_of_two(warps) for block, warps in args.variants):
        parser.error("--variants: BLOCK and num_warps must be powers of two")
    if importlib.util.find_spec("triton") is None:
        parser.error("needs Triton (pip install triton); it compiles for sm_90 without a GPU")
    import triton

    if not _cuobjdump(triton).is_file():
        parser.error(f"needs the cuobjdump that Triton's NVIDIA backend ships, not found at {_cuobjdump(triton)}")

    from torchdebug.native import triton_stats

    dtype = getattr(torch, args.dtype)
    kernel = "directory kernel" if args.directory else "kernel"
    built = f"BLOCK {triton_stats._BLOCK}, {triton_stats.WARPS} warps"
    print(f"Triton {triton.__version__}, sm_90, {args.dtype}, the {kernel}; as built: {built}")
    sizes = args.elements
    columns = ("BLOCK", "warps", "registers", "stack B", "programs/SM", "warps/SM", "KB in flight/SM")
    columns += tuple(f"KB/SM at {size / 1e6:.1f} M" for size in sizes)
    print(f"{'pass':24s} " + " ".join(columns))
    for block, warps in args.variants:
        for hashed in (False, True):
            registers, stack = _resources(triton, triton_stats, dtype, block, warps, hashed, args.directory)
            per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
            programs = min(REGISTERS_PER_SM // (per_warp * warps), WARPS_PER_SM // warps, BLOCKS_PER_SM)
            in_flight = programs * block * dtype.itemsize / 1024  # one loop turn's loads of every resident program
            name = "statistics + fingerprint" if hashed else "statistics"
            cells = [f"{value:{len(column)}d}" for value, column in zip((block, warps, registers, stack, programs), columns)]
            cells += [f"{programs * warps:{len(columns[5])}d}", f"{in_flight:{len(columns[6])}.1f}"]
            for size, column in zip(sizes, columns[7:]):
                spread = min(programs, triton_stats.programs_for(size) / SMS)  # the tensor's programs an SM holds
                cells.append(f"{spread * block * dtype.itemsize / 1024:{len(column)}.1f}")
            print(f"{name:24s} " + " ".join(cells))


def _cuobjdump(triton) -> Path:  # noqa: ANN001
    """The ``cuobjdump`` shipped with Triton's NVIDIA backend."""
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _resources(  # noqa: ANN001
    triton, triton_stats, dtype: torch.dtype, block: int, warps: int, hashed: bool, directory: bool
) -> tuple[int, int]:
    """Registers per thread and stack bytes of the kernel compiled for sm_90 with aligned tensors."""
    compiled = triton_stats.compile_for(dtype, stats=True, hashed=hashed, directory=directory, block=block, warps=warps)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        command = [str(_cuobjdump(triton)), "--dump-resource-usage", cubin.name]
        usage = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    registers, stack = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK"))
    return registers, stack


if __name__ == "__main__":
    main()
