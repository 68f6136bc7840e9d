"""What a process's first captured step costs beyond its later ones: time, peak memory, and whether
capture loaded pandas (issue 48; pyarrow's shim imports it: docs/architecture.md, "Decisions
and their reasons", "Records as Arrow columns").

    python bench/first_step.py [--rounds 3] [--layers 4] [--arms ...]

Each arm runs in a process of its own, on the tiny GPT of ``bench/host_per_op.py``: one plain
step (the optimizer's state made), then two captured steps, each started, stopped and stepped (the
dump flushed after each), and a plain step. Printed per arm, the median of ``--rounds`` processes:
the first captured step's and the second's milliseconds (wall clock), the peak resident size the
captured steps reached beyond the plain step's (MiB), and whether pandas was loaded at the end. A
first step pays what is made once a process (the observer's library loaded, op facts, numpy and
pyarrow paths taken the first time): the figure to watch is its distance from the second.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._args import positive_int  # noqa: E402

ARMS = {
    "structure/op native": dict(task="structure", level="op"),
    "statistics/op native": dict(task="statistics", level="op"),
    "statistics/op dispatch-mode": dict(task="statistics", level="op"),
}
"""Each arm's debugger options; a ``dispatch-mode`` arm runs with ``TORCHDEBUG_NATIVE=0``."""


def child(arm: str, layers: int) -> dict[str, object]:
    """Run ``arm`` in this process and return its figures."""
    import dataclasses

    import torch

    import torchdebug
    from bench.host_per_op import BATCH, CONFIG
    from examples.gpt import GPT, make_batch, train_step

    torch.set_num_threads(1)
    torchdebug.seed_all(1234)
    config = dataclasses.replace(CONFIG, n_layer=layers)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(config, batch=BATCH)
    train_step(model, optimizer, batch)
    plain_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = []
    with tempfile.TemporaryDirectory() as folder:
        debugger = torchdebug.Debugger(Path(folder) / "dump", **ARMS[arm])
        for _ in range(2):
            start = time.perf_counter()
            debugger.start(model=model)
            train_step(model, optimizer, batch)
            debugger.stop()
            debugger.step()
            debugger.flush()
            seconds.append(time.perf_counter() - start)
        debugger.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "first_ms": seconds[0] * 1e3,
        "second_ms": seconds[1] * 1e3,
        "peak_mib": (peak - plain_peak) / 1024,
        "pandas": "pandas" in sys.modules,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=3, help="processes per arm (default 3)")
    parser.add_argument("--layers", type=positive_int, default=4, help="the GPT's layers (default 4)")
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--child", choices=list(ARMS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.layers)))
        return
    print(f"GPT of {args.layers} layers; median of {args.rounds} processes per arm; load average {os.getloadavg()[0]:.2f}")
    print(f"{'arm':30s} {'first ms':>9s} {'second ms':>10s} {'peak MiB':>9s}  pandas loaded")
    for arm in args.arms:
        env = dict(os.environ)
        if arm.endswith("dispatch-mode"):
            env["TORCHDEBUG_NATIVE"] = "0"
        runs = []
        for _ in range(args.rounds):
            command = [sys.executable, __file__, "--child", arm, "--layers", str(args.layers)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        first, second, peak = (statistics.median(run[key] for run in runs) for key in ("first_ms", "second_ms", "peak_mib"))
        loaded = {run["pandas"] for run in runs}
        said = "yes" if loaded == {True} else "no" if loaded == {False} else "in some"
        print(f"{arm:30s} {first:9.1f} {second:10.1f} {peak:9.1f}  {said}")


if __name__ == "__main__":
    main()
