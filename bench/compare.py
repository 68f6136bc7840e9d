"""Speed of ``torchdebug.compare`` on the GPT example: bf16 autocast against fp32, one training step.

    python bench/compare.py [--repeat 3] [--threads N] [--keep DIR]

Builds four dumps in a temporary folder (statistics and tensor, fp32 and bf16 autocast; 4 layers,
d_model 256, 4 heads, seq 128, batch 8, AdamW, CPU, fixed seed), then times the in-process compare
of the statistics pair and of the tensor pair. Prints rows, seconds (median of the repeats), rows/s,
GB/s (bytes of both dumps' tensor files per second, the measure msprobe documents) and the load
average (timings taken while other processes share the cores are slower). msprobe's
in-process compare on this machine, for the same kind of pairs: 0.29 s (statistics, 2011 rows) and
5.1 s (tensor, 724 + 933 MB).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402


def dump(path: Path, task: str, bf16: bool) -> Path:
    """One AdamW step of the benchmark GPT, dumped at ``path``."""
    torchdebug.seed_all(1234)
    model = GPT(GPTConfig(n_layer=4, d_model=256, n_head=4, seq_len=128))
    optimizer = torch.optim.AdamW(model.parameters())
    batch = make_batch(model.config, batch=8)
    with torchdebug.dump(path, model=model, task=task):
        train_step(model, optimizer, batch, autocast=torch.bfloat16 if bf16 else None)
    return path


def tensor_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed compares per pair (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="compare threads (default: all cores)")
    parser.add_argument("--keep", type=Path, help="build the dumps here and keep them (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        root = args.keep or Path(temp)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; dumps in {root}")
        for task in ("statistics", "tensor"):
            a, b = root / f"{task}_bf16", root / f"{task}_fp32"
            if not (a.exists() and b.exists()):
                dump(a, task, bf16=True)
                dump(b, task, bf16=False)
            torchdebug.compare(a, b, threads=args.threads)  # warm: imports, page cache
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                result = torchdebug.compare(a, b, threads=args.threads)
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            size = tensor_bytes(a) + tensor_bytes(b)
            rate = f", {size / seconds / 1e9:.2f} GB/s over {size / 1e6:.0f} MB" if size else ""
            print(
                f"{task:10s} rows {len(result.rows):5d}  {seconds:6.3f} s (runs {', '.join(f'{t:.3f}' for t in times)})"
                f"  {len(result.rows) / seconds:8.0f} rows/s{rate}  verdicts {result.counts()}"
                f"  load {os.getloadavg()[0]:.2f}"
            )


if __name__ == "__main__":
    main()
