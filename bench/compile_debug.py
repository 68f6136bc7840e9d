"""Compile time of the GPT example: torchdebug backend vs plain inductor, both with TORCH_COMPILE_DEBUG=1.

    python bench/compile_debug.py [--rounds 2] [--n-layer 4]

One process. ``TORCH_COMPILE_DEBUG=1`` is set before torch is imported, so PyTorch's own debug
tracing is on in both arms; the torchdebug arm adds its per-pass dumps, ``passes.json``, reasons
and ``debug.log``. Both arms compile with the FX graph and AOT autograd caches off
(``torch.compiler.config.force_disable_caches``), as the torchdebug arm must while debugging, and
after one untimed warm-up compile, so C++ kernel builds cached in memory favour neither arm. Arms
alternate each round (ABBA) and the median of each is reported. A compile is timed from
``torch.compile`` to the end of the first forward + backward (Dynamo, AOT, inductor for both graphs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

_DEBUG_DIR = tempfile.mkdtemp(prefix="torchdebug_bench_")
os.environ["TORCH_COMPILE_DEBUG"] = "1"
os.environ["TORCH_COMPILE_DEBUG_DIR"] = _DEBUG_DIR  # keep the debug trees out of the working directory

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.compiler.config  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch  # noqa: E402


def compile_seconds(backend: object, config: GPTConfig) -> float:
    """Seconds to compile and run one forward + backward of a fresh GPT with ``backend``."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(config)
    tokens, targets = make_batch(config, batch=8)
    start = time.perf_counter()
    compiled = torch.compile(model, backend=backend)
    loss = compiled(tokens, targets)
    loss.backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each times both arms twice)")
    parser.add_argument("--n-layer", type=int, default=4)
    args = parser.parse_args()
    config = GPTConfig(n_layer=args.n_layer, d_model=256, n_head=4, seq_len=128)
    arms = {"inductor": "inductor", "torchdebug": torchdebug.get_backend(torchdebug.CompilerConfig())}
    times: dict[str, list[float]] = {name: [] for name in arms}
    with torch.compiler.config.patch(force_disable_caches=True):
        compile_seconds(arms["inductor"], config)  # warm-up: kernel builds, imports
        for _ in range(args.rounds):
            for name in ("inductor", "torchdebug", "torchdebug", "inductor"):
                times[name].append(compile_seconds(arms[name], config))
                print(f"  {name:<10} {times[name][-1]:7.2f} s", flush=True)
    plain, ours = statistics.median(times["inductor"]), statistics.median(times["torchdebug"])
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, GPT n_layer={config.n_layer} d_model={config.d_model} "
        f"seq={config.seq_len} batch=8, fwd+bwd compile"
    )
    print(f"inductor + TORCH_COMPILE_DEBUG=1:   median {plain:.2f} s over {len(times['inductor'])}")
    print(f"torchdebug + TORCH_COMPILE_DEBUG=1: median {ours:.2f} s over {len(times['torchdebug'])}")
    print(f"ratio torchdebug / inductor: {ours / plain:.2f}x (target <= 1.3x); debug trees in {_DEBUG_DIR}")


if __name__ == "__main__":
    main()
