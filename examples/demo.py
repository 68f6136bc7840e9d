"""The torchdebug demo: dump one training step of a small GPT and show what was captured.

    make demo            # or: python examples/demo.py [--out demo_out]

Writes ``demo_out/`` (a new run folder each time) and prints where the records are, how many
there are per phase, and a few of them with statistics and source lines.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from torchdebug.cli.show import format_record  # noqa: E402


def dump_step(out: Path, task: str) -> Path:
    """One training step of the GPT example dumped with ``task``; returns the run folder."""
    torchdebug.seed_all(1234)
    config = GPTConfig(n_layer=4, d_model=256, n_head=4, seq_len=128)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = make_batch(config, batch=8)
    with torchdebug.dump(out, model=model, task=task) as debugger:
        loss = train_step(model, optimizer, batch)
    print(f"loss {loss.item():.4f}; dumped to {debugger.run_dir}")
    return debugger.run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo_out", help="dump path (default: demo_out)")
    args = parser.parse_args()
    run_dir = dump_step(Path(args.out) / "fp32", task="statistics")

    run = torchdebug.load(run_dir)
    dump = run.ranks[0]
    records = dump.records()
    phases = collections.Counter(r.phase for r in records)
    ops = {r.call_name for r in records}
    print(f"{len(records)} records from {len(ops)} op calls: " + ", ".join(f"{n} {p}" for p, n in phases.items()))
    print("\nA few of them (also: torchdebug show DUMP --name PATTERN):\n")
    wanted = ("forward/layers.0.attn.qkv/", "backward/layers.0.attn.qkv/")
    for prefix in wanted:
        record = next(r for r in records if r.name.startswith(prefix) and r.io == "output" and r.op in ("aten.addmm.default", "aten.mm.default"))
        print(format_record(record, dump))
        print()
    print(f"Try: torchdebug show {run_dir} --name 're:layers\\.0\\.mlp.*output'")


if __name__ == "__main__":
    main()
