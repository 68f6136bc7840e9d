"""Tensor-dump throughput of eager capture against the two speeds that bound it, measured here.

    python bench/tensor_dump.py [--device cpu|cuda] [--tensor-mib 16] [--ops 32] [--steps 3]
                                [--bytes-in-flight-mib 256] [--dir PATH]

1. Transfer bandwidth: on ``cuda``, device to pinned host memory (``copy_(non_blocking=True)`` of a
   ``--tensor-mib`` tensor, timed between two synchronisations); on ``cpu``, the copy into a reused
   host buffer that a CPU snapshot is (one ``memmove``).
2. Disk write bandwidth: the dump's bytes written by the writer's own code (``TensorBatch.write``
   of full batch buffers: ``O_DIRECT`` where the file system takes it, one temporary file renamed
   each) into ``--dir``, then every file fsynced: what the disk sustains, not what the page cache
   takes in. Measured before and after the capture; the mean is used.
3. Capture: a step of ``--ops`` elementwise ops on a ``--tensor-mib`` tensor, each output a new
   tensor, dumped with ``task="tensor"``, every step; one untimed step first. Throughput is the
   bytes of tensor files written by the timed steps over the wall time from the first ``start`` to
   the moment the last tensor file is written (``Debugger.flush``) and, as in 2., every file
   fsynced: bytes put on the disk per second of captured step.

Prints the ratio of the capture throughput to the slower of the two bandwidths (issue 17's target:
at least 0.7), the dump's own rate (bytes over the time capture adds to the plain step: the step's
ops count against the throughput above, and on a CPU they cost about as much as the copies), and
the transfer report of ``complete.json`` (peak buffer bytes, waits for the writer).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import torchdebug
from torchdebug.store import _layout as layout
from torchdebug.store._tensor_batch import TensorBatch
from torchdebug.store._writer import batch_bytes_for

GB = 1e9


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def transfer_bandwidth(device: str, nbytes: int, repeats: int = 5) -> float:
    """Bytes per second of the snapshot copy: device to pinned host on CUDA, memmove on the CPU."""
    source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device == "cuda")
    times = []
    for _ in range(repeats + 1):  # the first copy faults the target's pages in: not timed
        _sync(device)
        start = time.perf_counter()
        if device == "cuda":
            target.copy_(source, non_blocking=True)
            torch.cuda.synchronize()
        else:
            ctypes.memmove(target.data_ptr(), source.data_ptr(), nbytes)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times[1:])


def disk_bandwidth(folder: Path, total: int, file_bytes: int) -> float:
    """Bytes per second of writing ``total`` bytes as the tensor writer does (see the module docstring)."""
    batch = TensorBatch(file_bytes)
    batch.add("data", torch.randint(0, 255, (batch.capacity,), dtype=torch.uint8))
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"disk-{number}.safetensors" for number in range(-(-total // batch.used))]
    start = time.perf_counter()
    for path in paths:
        batch.write(path, {})
    _fsync(paths)
    seconds = time.perf_counter() - start
    shutil.rmtree(folder)
    return len(paths) * batch.used / seconds


def _fsync(paths: list[Path]) -> None:
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _tensor_files(rank_dir: Path) -> set[Path]:
    folder = rank_dir / layout.TENSORS
    return set(folder.iterdir()) if folder.exists() else set()


def capture_throughput(args: argparse.Namespace, folder: Path) -> tuple[float, float, float, dict]:
    """(bytes dumped per second of captured step, captured and plain step seconds, the rank's
    transfer report)."""
    numel = args.tensor_mib * 2**20 // 4
    x = torch.randn(numel, device=args.device)

    def step() -> None:
        y = x
        for _ in range(args.ops):
            y = y * 1.0001

    _sync(args.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    _sync(args.device)
    plain = (time.perf_counter() - start) / args.steps

    dbg = torchdebug.Debugger(folder, task="tensor", tensor_bytes_in_flight=args.bytes_in_flight_mib * 2**20)
    dbg.start()
    step()  # untimed: builds the capture and the buffers
    dbg.step()
    dbg.flush()
    _fsync(sorted(_tensor_files(dbg.rank_dir)))
    before = _tensor_files(dbg.rank_dir)
    _sync(args.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        dbg.start()
        step()
        dbg.step()
    dbg.flush()
    new = sorted(_tensor_files(dbg.rank_dir) - before)
    _fsync(new)
    seconds = time.perf_counter() - start
    dbg.close()
    report = json.loads((dbg.rank_dir / layout.COMPLETE).read_text())["tensor_transfer"]
    dumped = sum(path.stat().st_size for path in new)
    shutil.rmtree(dbg.run_dir)
    return dumped / seconds, seconds / args.steps, plain, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tensor-mib", type=int, default=16, help="size of each dumped tensor (float32)")
    parser.add_argument("--ops", type=int, default=32, help="ops per step, one new tensor each")
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--bytes-in-flight-mib", type=int, default=256, help="tensor_bytes_in_flight, in MiB")
    parser.add_argument("--dir", type=Path, default=None, help="folder on the disk to measure (default: a temporary one)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="torchdebug_tensor_dump_", dir=args.dir))
    step_bytes = args.ops * args.tensor_mib * 2**20
    file_bytes = batch_bytes_for(args.bytes_in_flight_mib * 2**20)
    print(f"torch {torch.__version__} on {args.device}, {torch.get_num_threads()} threads, dump under {root}")
    print(f"step: {args.ops} ops on a {args.tensor_mib} MiB float32 tensor, {step_bytes / 2**20:.0f} MiB of new tensors")
    try:
        transfer = transfer_bandwidth(args.device, args.tensor_mib * 2**20)
        disk_before = disk_bandwidth(root / "disk", step_bytes * args.steps, file_bytes)
        throughput, captured, plain, report = capture_throughput(args, root / "dump")
        disk_after = disk_bandwidth(root / "disk", step_bytes * args.steps, file_bytes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    disk = (disk_before + disk_after) / 2
    bound = min(transfer, disk)
    what = "device to pinned host" if args.device == "cuda" else "host memcpy (the CPU snapshot copy)"
    print(f"transfer bandwidth, {what}: {transfer / GB:.2f} GB/s")
    print(f"disk write bandwidth: {disk / GB:.2f} GB/s (before {disk_before / GB:.2f}, after {disk_after / GB:.2f})")
    print(f"step: plain {plain * 1e3:.1f} ms, captured {captured * 1e3:.1f} ms (files written and fsynced)")
    print(f"capture: {throughput / GB:.2f} GB/s dumped per second of captured step")
    print(f"  (the dump alone: {step_bytes / max(captured - plain, 1e-9) / GB:.2f} GB/s over the time it adds to the step)")
    print(f"ratio to the slower bound ({'transfer' if transfer < disk else 'disk'}): {throughput / bound:.2f} (target >= 0.70)")
    mib = 2**20
    print(
        f"buffers: peak {report['host_peak_bytes'] / mib:.0f} MiB of {report['bytes_in_flight'] / mib:.0f} MiB "
        f"({'pinned' if report['pinned'] else 'not pinned'}), device copies peak {report['device_peak_bytes'] / mib:.0f} MiB, "
        f"capture waited {report['waits']} times ({report['wait_seconds']:.2f} s)"
    )


if __name__ == "__main__":
    main()
