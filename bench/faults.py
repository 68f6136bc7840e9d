"""What a dump that cannot be written does to the training: a fault × task table.

    python bench/faults.py [--steps 6] [--fault-step 2]

Trains the small GPT of the tests (2 layers, width 64, sequence 32, batch 4, AdamW) for ``--steps``
steps under a ``Debugger`` of each task (1 MiB of tensors in flight, so a tensor dump needs the
writer many times a step), and from ``--fault-step`` on makes the store's writes fail
(``store/_faults.py``) with each fault: a full disk (ENOSPC), a quota (EDQUOT), a read-only
filesystem (EROFS), tensor files that cannot be written (EIO on ``*.safetensors``), and a records
writer thread that exited. For each pair it prints: whether the loop ran to the end (a hang is cut
at 120 s), whether the losses equal those of a run without capture bit for bit, the records kept
(and the step they end before), and how long the faulting step and the close took against a
captured step without a fault (the time capture took to give up).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from bench._args import positive_int  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from torchdebug.store._faults import failing_writes  # noqa: E402
from torchdebug.store._reader import load  # noqa: E402

CONFIG = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab=128)
TASKS = ("statistics", "tensor", "checksum", "overflow_check")
FAULTS = {
    "full disk (ENOSPC)": (errno.ENOSPC, "*"),
    "quota (EDQUOT)": (errno.EDQUOT, "*"),
    "read-only (EROFS)": (errno.EROFS, "*"),
    "tensor files (EIO)": (errno.EIO, "*.safetensors*"),
    "records thread exited": (None, ""),
}
HANG_SECONDS = 120.0


def run(folder: Path | None, task: str, fault: tuple[int | None, str] | None, steps: int, fault_step: int) -> dict:
    """One training run; ``folder`` None: no capture."""
    torchdebug.seed_all(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = None if folder is None else torchdebug.Debugger(folder, task=task, tensor_bytes_in_flight=2**20)
    out: dict = {"losses": [], "step_seconds": []}

    def loop() -> None:
        for step in range(steps):
            failing = contextlib.nullcontext()
            if debugger is not None and fault is not None and step >= fault_step:
                code, files = fault
                if code is None:
                    if step == fault_step:
                        debugger.session.writer._record_jobs.put(None)  # the records thread exits
                else:
                    failing = failing_writes(0, code, files)
            start = time.perf_counter()
            with failing:
                if debugger is not None:
                    debugger.start(model)
                out["losses"].append(float(train_step(model, optimizer, make_batch(CONFIG, batch=4, seed=step))))
                if debugger is not None:
                    debugger.stop()
                    debugger.step()
            out["step_seconds"].append(time.perf_counter() - start)
        if debugger is not None:
            start = time.perf_counter()
            with failing_writes(0, fault[0], fault[1]) if fault and fault[0] else contextlib.nullcontext():
                debugger.close()
            out["close_seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    thread.join(HANG_SECONDS)
    out["finished"] = not thread.is_alive()
    if debugger is not None and out["finished"]:
        dump = load(debugger.rank_dir).ranks[0]
        records = dump.records()
        out["records"] = len(records)
        out["fault_step"] = (dump.write_fault or {}).get("step")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive_int, default=6)
    parser.add_argument("--fault-step", type=positive_int, default=2)
    args = parser.parse_args()
    plain = run(None, "statistics", None, args.steps, args.fault_step)["losses"]
    print(f"torch {torch.__version__}, {args.steps} steps, faults from step {args.fault_step}")
    header = f"{'fault':<24}{'task':<16}{'ran to the end':<16}{'same loss':<11}{'records kept':<36}{'faulting step':<15}close"
    print(header)
    with tempfile.TemporaryDirectory() as scratch:
        for task in TASKS:
            healthy = run(Path(scratch) / f"{task}-healthy", task, None, args.steps, args.fault_step)
            usual = sorted(healthy["step_seconds"][1:])[len(healthy["step_seconds"][1:]) // 2]
            for name, fault in FAULTS.items():
                got = run(Path(scratch) / f"{task}-{name.split()[0]}", task, fault, args.steps, args.fault_step)
                if not got["finished"]:
                    print(f"{name:<24}{task:<16}{'NO (hung)':<16}")
                    continue
                at = "no fault" if got["fault_step"] is None else f"truncated at step {got['fault_step']}"
                kept = f"{got['records']} of {healthy['records']}, {at}"
                faulting = got["step_seconds"][args.fault_step] / usual
                print(
                    f"{name:<24}{task:<16}{'yes':<16}{'yes' if got['losses'] == plain else 'NO':<11}{kept:<36}"
                    f"{faulting:<15.2f}{got['close_seconds'] * 1e3:.0f} ms"
                )
    print("faulting step: its time over a captured step's without a fault (median); close: Debugger.close() on the failing disk")


if __name__ == "__main__":
    main()
