"""Compare time per record as the record count grows: a narrow GPT at many layers, bf16 autocast vs fp32.

    python bench/scale.py [--layers 4,64,256] [--warmup N] [--repeat 1]

For each layer count L: a GPT of width 32, sequence 16, vocabulary 64 (the example's -inf causal
mask), batch 2, whose records grow like a deep model's while its compute stays small. One AdamW
step is dumped as statistics twice, fp32 and bf16 autocast, after ``--warmup`` plain steps (0: the
first step, where freshly initialised tensors share their statistics: zero biases, LayerNorm
weights of ones, zero optimizer state). ``torchdebug.compare(a, b)`` is then timed in-process.
Each L runs in its own process so that its peak RSS (``resource.getrusage``) is its own. Prints
records, seconds (best of the repeats), µs per record, peak RSS and the µs-per-record ratio to the
first L. Dumps live in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
import torchdebug.compare  # noqa: E402,F401  (imported before the timed compare)
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402


def dump(path: Path, layers: int, warmup: int, bf16: bool) -> Path:
    """The narrow GPT's AdamW step after ``warmup`` plain ones, dumped as statistics at ``path``."""
    torchdebug.seed_all(1234)
    model = GPT(GPTConfig(n_layer=layers, d_model=32, n_head=4, seq_len=16, vocab=64))
    optimizer = torch.optim.AdamW(model.parameters())
    batch = make_batch(model.config, batch=2)
    autocast = torch.bfloat16 if bf16 else None
    for _ in range(warmup):
        train_step(model, optimizer, batch, autocast=autocast)
    with torchdebug.dump(path, model=model, task="statistics"):
        train_step(model, optimizer, batch, autocast=autocast)
    return path


def measure(layers: int, warmup: int, repeat: int) -> dict[str, float]:
    """Build the pair for ``layers`` and time its compare (this process's peak RSS included)."""
    with tempfile.TemporaryDirectory() as temp:
        a = dump(Path(temp) / "bf16", layers, warmup, bf16=True)
        b = dump(Path(temp) / "fp32", layers, warmup, bf16=False)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            result = torchdebug.compare(a, b)
            times.append(time.perf_counter() - start)
    return {
        "layers": layers,
        "records": len(result.rows),
        "seconds": min(times),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "counts": result.counts(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="4,64,256", help="layer counts, comma-separated (default 4,64,256)")
    parser.add_argument("--warmup", type=int, default=0, help="plain steps before the dumped one (default 0)")
    parser.add_argument("--repeat", type=int, default=1, help="timed compares per L (best reported)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one L, JSON out
    args = parser.parse_args()
    counts = [int(part) for part in args.layers.split(",")]
    if args.one:
        print(json.dumps(measure(counts[0], args.warmup, args.repeat)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, warm-up steps {args.warmup}")
    first = None
    for layers in counts:
        child = [sys.executable, __file__, "--one", "--layers", str(layers), "--warmup", str(args.warmup)]
        out = subprocess.run([*child, "--repeat", str(args.repeat)], check=True, capture_output=True, text=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        per_record = row["seconds"] / row["records"] * 1e6
        first = first or per_record
        print(
            f"layers {layers:4d}  records {row['records']:8,d}  compare {row['seconds']:8.2f} s  {per_record:6.1f} µs/record"
            f"  x{per_record / first:4.2f}  peak RSS {row['rss_mb']:6.0f} MB  load {os.getloadavg()[0]:.2f}"
            f"  verdicts {row['counts']}"
        )


if __name__ == "__main__":
    main()
