"""Host memory a capture adds to a step: the peak resident size of captured steps beyond plain ones.

    python bench/capture_memory.py [--workloads chain,gpt] [--task statistics] [--steps 4] [--sweep-after MIB]

Each arm runs in a process of its own (a fresh heap): two plain steps, then ``--steps`` more steps
either plain (``plain``), captured on the native path (``native``) or captured through the dispatch
mode (``dispatch-mode``, the native kernels still on), each captured step stopped, stepped and
flushed. Printed: the peak resident size (``ru_maxrss``) those steps reached beyond the plain steps'
peak, and the resident size after them beyond before them, in MiB. Workloads:

* ``chain``: 32 links of three 8 MiB float32 temporaries each (``relu``, ``mul``, ``add``, then
  ``sin``), under ``no_grad``: a step's temporaries, freed as it goes;
* ``gpt``: the example GPT S (4 layers, width 256, sequence 128, batch 8) trained by AdamW.

The native path holds each recorded tensor weakly until the drain, or until a sweep
(``torchdebug.capture.native_records.SWEEP_AFTER_BYTES``) lets go of the freed ones: this bench is
what shows whether the freed memory is used again within a step (``--sweep-after``: that threshold
in MiB instead, -1 for no sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._args import positive_int  # noqa: E402

ARMS = ("plain", "native", "dispatch-mode")
WORKLOADS = ("chain", "gpt")


def _chain() -> tuple[torch.nn.Module | None, Callable[[], None]]:
    x0 = torch.randn(2048, 1024)

    def step() -> None:
        with torch.no_grad():
            x = x0
            for _ in range(32):
                x = (x.relu() + x * 0.5).sin()

    return None, step


def _gpt() -> tuple[torch.nn.Module | None, Callable[[], None]]:
    from examples.gpt import GPT, GPTConfig, make_batch, train_step

    torch.manual_seed(0)
    config = GPTConfig(n_layer=4, d_model=256, n_head=4, seq_len=128)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(config, batch=8)
    return model, lambda: train_step(model, optimizer, batch)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB on Linux)


def _resident_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_arm(arm: str, workload: str, task: str, steps: int, sweep_after: int | None) -> dict[str, float]:
    """One arm in this process: MiB of peak and resident size added by its steps (see the module docstring)."""
    import torchdebug
    import torchdebug.debugger
    from torchdebug.capture import native_records

    if sweep_after is not None:
        native_records.SWEEP_AFTER_BYTES = sweep_after if sweep_after < 0 else sweep_after << 20

    if arm == "dispatch-mode":
        torchdebug.debugger.why_not_native = lambda config, model: "the bench holds it on the dispatch mode"
    model, step = {"chain": _chain, "gpt": _gpt}[workload]()
    for _ in range(2):
        step()
    with tempfile.TemporaryDirectory() as folder:
        debugger = torchdebug.Debugger(folder, task=task) if arm != "plain" else None
        if debugger is not None:  # one captured step first: capture's own first allocations are not the figure
            debugger.start(model)
            step()
            debugger.stop()
            debugger.step()
            debugger.flush()
        peak, resident = _peak_mib(), _resident_mib()
        for _ in range(steps):
            if debugger is None:
                step()
                continue
            debugger.start(model)
            step()
            debugger.stop()
            debugger.step()
            debugger.flush()
        figures = {"peak_mib": _peak_mib() - peak, "resident_mib": _resident_mib() - resident}
        if debugger is not None:
            debugger.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--task", default="statistics", choices=("structure", "statistics"))
    parser.add_argument("--steps", type=positive_int, default=4)
    parser.add_argument("--sweep-after", type=int, help="MiB of CPU tensors between sweeps (-1: none; default: the library's)")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # a child process's one arm
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    unknown = [name for name in workloads if name not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: {', '.join(unknown)} unknown; allowed: {', '.join(WORKLOADS)}")
    if args.arm is not None:
        print(json.dumps(run_arm(args.arm, workloads[0], args.task, args.steps, args.sweep_after)))
        return
    sweeps = "the library's" if args.sweep_after is None else f"{args.sweep_after} MiB"
    print(f"torch {torch.__version__}, task {args.task}, {args.steps} steps after the first, sweeps {sweeps}")
    print("MiB beyond the plain steps'")
    print(f"{'workload':<10}{'arm':<15}{'peak +MiB':>12}{'resident +MiB':>16}")
    for workload in workloads:
        for arm in ARMS:
            command = [sys.executable, __file__, "--arm", arm, "--workloads", workload]
            command += ["--task", args.task, "--steps", str(args.steps)]
            command += [] if args.sweep_after is None else ["--sweep-after", str(args.sweep_after)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            figures = json.loads(output.strip().splitlines()[-1])
            print(f"{workload:<10}{arm:<15}{figures['peak_mib']:>12.0f}{figures['resident_mib']:>16.0f}")


if __name__ == "__main__":
    main()
