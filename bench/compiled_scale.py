"""How an eager-against-compiled compare scales: the narrow GPT compiled block by block, at many layers.

    python bench/compiled_scale.py [--layers 4,64,256] [--plant]

For each layer count L: the narrow GPT of ``bench/scale.py`` (width 32, sequence 16, vocabulary 64,
batch 2), one SGD step dumped as statistics twice from the same seed: A with every block compiled
(``aot_eager``, the torchdebug backend's graph dump), B eager (``Debugger``). ``--plant`` makes the
MLP of the middle block scale its output by 1.05 on the compiled side only (its class swapped for a
subclass, so Dynamo compiles that block apart): the compare should name that block's ``mul``.

The capture and the compare each run in a process of their own (the compare after importing torch
and torchdebug), so the compare's figures are its own: seconds, CPU microseconds per row (the
process's, all threads), peak memory beyond the resident size before, the verdict counts and the
first divergence. Last, the compare's growth exponent over the layer counts (1.0 is linear). The
alignment rules only a compiled dump reaches (``docs/compare.md``, "Matching") run here, which
``bench/scale.py``'s eager pair never does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from bench._args import positive_ints  # noqa: E402
from bench.scale import growth_exponent, timed  # noqa: E402
from examples.gpt import GPT, MLP, GPTConfig, make_batch, train_step  # noqa: E402

STAGES = ("capture", "compare")


class ScaledMLP(MLP):
    """The planted bug: the MLP's output scaled by 1.05."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 1.05


def config_of(layers: int) -> GPTConfig:
    return GPTConfig(n_layer=layers, d_model=32, n_head=4, seq_len=16, vocab=64)


def capture(folder: Path, layers: int, plant: bool) -> dict[str, Any]:
    """Dump the compiled step into ``folder/compiled`` and the eager one into ``folder/eager``."""
    from tests.backends import graph_and_eager_dumps

    config = config_of(layers)
    batch = make_batch(config, batch=2)

    def compiled_model() -> torch.nn.Module:
        model = GPT(config)
        if plant:
            model.layers[layers // 2].mlp.__class__ = ScaledMLP
        return model

    def compile_blocks(model: torch.nn.Module, backend: Any) -> torch.nn.Module:
        for block in model.layers:
            block.compile(backend=backend)
        return model

    optimizers: dict[int, torch.optim.Optimizer] = {}

    def step(model: torch.nn.Module) -> None:
        optimizer = optimizers.setdefault(id(model), torch.optim.SGD(model.parameters(), lr=0.1))
        train_step(model, optimizer, batch)

    def dumps() -> None:
        graph_and_eager_dumps(folder, compiled_model, lambda: GPT(config), step, compile=compile_blocks)

    seconds, *_ = timed(dumps, 1)
    return {"seconds": seconds}


def compare(folder: Path) -> dict[str, Any]:
    """Compare the compiled dump (A) with the eager one (B) in-process."""
    seconds, memory, result, cpu = timed(lambda: torchdebug.compare(folder / "compiled", folder / "eager"), 1)
    first = result.first_divergence
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "memory_mb": memory,
        "rows": len(result.rows),
        "counts": result.counts(),
        "first_divergence": first.name if first is not None else None,
    }


def run_stage(stage: str, folder: Path, layers: int, plant: bool) -> dict[str, Any]:
    """Run ``stage`` in a child process and return its figures."""
    child = [sys.executable, __file__, "--stage", stage, "--folder", str(folder), "--layers", str(layers)]
    out = subprocess.run([*child, *(["--plant"] if plant else [])], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=positive_ints, default=[4, 64, 256], help="layer counts (default 4,64,256)")
    parser.add_argument("--plant", action="store_true", help="scale the middle block's MLP output by 1.05, compiled side only")
    parser.add_argument("--stage", choices=STAGES, help="one stage in this process, figures as JSON")
    parser.add_argument("--folder", type=Path, help="the dumps' folder for --stage")
    args = parser.parse_args()
    if args.stage and args.folder is None:
        parser.error("--stage needs --folder, the dumps' folder")
    if args.stage:
        layers = args.layers[0]
        row = capture(args.folder, layers, args.plant) if args.stage == "capture" else compare(args.folder)
        print(json.dumps(row))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}, planted: {args.plant}")
    points = []
    for layers in args.layers:
        with tempfile.TemporaryDirectory() as temp:
            captured = run_stage("capture", Path(temp), layers, args.plant)
            row = run_stage("compare", Path(temp), layers, args.plant)
        points.append((row["rows"], row["seconds"]))
        print(
            f"layers {layers:4d}  capture {captured['seconds']:6.1f} s  compare: rows {row['rows']:8,d}"
            f"  {row['seconds']:6.2f} s  CPU {row['cpu_seconds'] / row['rows'] * 1e6:5.1f} µs/row"
            f"  peak +{row['memory_mb']:5.0f} MB  verdicts {row['counts']}  first divergence {row['first_divergence']}",
            flush=True,
        )
    if len(points) > 1:
        print(f"compare growth exponent (log seconds against log rows; 1.0 is linear): {growth_exponent(points):.2f}")


if __name__ == "__main__":
    main()
