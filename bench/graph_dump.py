"""Step time of the compiled GPT training step with a statistics dump of every node vs without.

    python bench/graph_dump.py [--steps 10] [--n-layer 1] [--d-model 256] [--device cpu|cuda]

One process, two compiled copies of the same model (inductor through the torchdebug backend; one
with ``dump_config.enable_dump`` and ``task="statistics"``, every node selected). After two untimed
warm-up steps each, the arms alternate step by step (ABBA) and the median step time of each is
reported with their ratio (target: at most 1.15). A step is forward, backward and AdamW.
Compile times are printed too: the statistics of fused values are compiled into inductor's loops.
On ``--device cuda`` each step is timed between two ``torch.cuda.synchronize()`` calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from torchdebug.compile import CompilerConfig, get_backend  # noqa: E402


def _arm(config: GPTConfig, dump: bool, device: str) -> tuple[object, torch.nn.Module, torch.optim.Optimizer, float]:
    torch.manual_seed(0)
    model = GPT(config).to(device)
    options = CompilerConfig()
    if dump:
        options.dump_config.enable_dump = True
        options.dump_config.dump_path = tempfile.mkdtemp(prefix="torchdebug_graph_dump_")
        options.dump_config.task = "statistics"
    backend = get_backend(options)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    start = time.perf_counter()
    for seed in range(2):
        train_step(compiled, optimizer, make_batch(config, seed=seed, device=device))
    return backend, compiled, optimizer, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--n-layer", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    args = parser.parse_args()
    sync = torch.cuda.synchronize if torch.device(args.device).type == "cuda" else (lambda: None)
    config = GPTConfig(n_layer=args.n_layer, d_model=args.d_model, n_head=4, seq_len=args.seq_len, vocab=512)
    arms = {"plain": _arm(config, False, args.device), "dump": _arm(config, True, args.device)}
    times: dict[str, list[float]] = {"plain": [], "dump": []}
    for step in range(args.steps):
        order = ("plain", "dump", "dump", "plain")[step % 2 * 2 :][:2]
        for name in order:
            _, compiled, optimizer, _ = arms[name]
            batch = make_batch(config, seed=step, device=args.device)
            sync()
            start = time.perf_counter()
            train_step(compiled, optimizer, batch)
            sync()
            times[name].append(time.perf_counter() - start)
    backend = arms["dump"][0]
    backend.data_dump.close()
    records = sum(1 for _ in open(backend.data_dump.rank_dir / "records.jsonl"))
    plain, dump = statistics.median(times["plain"]), statistics.median(times["dump"])
    model = f"GPT n_layer={args.n_layer} d_model={args.d_model} seq_len={args.seq_len}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {model} on {args.device}")
    print(f"compile + 2 warm-up steps: plain {arms['plain'][3]:.1f} s, dump {arms['dump'][3]:.1f} s")
    print(
        f"median step: plain {plain * 1e3:.1f} ms, dump {dump * 1e3:.1f} ms, ratio {dump / plain:.3f} ({records} records written)"
    )


if __name__ == "__main__":
    main()
