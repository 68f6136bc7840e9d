"""The torchdebug demo: dump a small GPT in fp32 and in bf16 autocast, then compare them.

    make demo            # or: python examples/demo.py [--out demo_out]

Writes ``demo_out/{fp32,bf16,bf16_bug}`` (a new run folder each time) and two HTML reports; prints
what was captured, a few records with statistics and source lines, the comparison of the healthy
bf16 run (rounding only, no error) and of a bf16 run with a planted 10% bug, whose first divergent
op and source line compare names.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from torchdebug.cli.show import format_record  # noqa: E402


class WrongKernel(TorchDispatchMode):
    """A kernel bug, the kind compare must find: call ``call`` (from 0) of ``aten.addmm.default``
    returns its result 10% too large. Entered before the dump, so the dump sees the wrong output."""

    def __init__(self, call: int) -> None:
        super().__init__()
        self.call, self.calls = call, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.addmm.default:
            if self.calls == self.call:
                out = out * 1.1
            self.calls += 1
        return out


BUGGY_ADDMM = 10
"""The forward of ``layers.2.mlp.fc``: four addmm calls per block (qkv, proj, fc, out)."""


def dump_step(out: Path, *, bf16: bool, bug: bool = False) -> Path:
    """One training step of the GPT example, dumped with statistics; returns the run folder. Width 128,
    sequence 64, batch 4: on a CPU without native bf16 (AVX2 alone) a bf16 matmul takes torch's slow
    path, and the bf16 steps of width 256, sequence 128, batch 8 took 8 s each (the fp32 one 0.4 s)."""
    torchdebug.seed_all(1234)
    config = GPTConfig(n_layer=4, d_model=128, n_head=4, seq_len=64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = make_batch(config, batch=4)
    with WrongKernel(BUGGY_ADDMM) if bug else contextlib.nullcontext():
        with torchdebug.dump(out, model=model, task="statistics") as debugger:
            loss = train_step(model, optimizer, batch, autocast=torch.bfloat16 if bf16 else None)
    label = ("bf16" if bf16 else "fp32") + (" with a planted bug" if bug else "")
    print(f"{label}: loss {loss.item():.4f}, dumped to {debugger.run_dir}")
    return debugger.run_dir


def show_some(run_dir: Path) -> None:
    dump = torchdebug.load(run_dir).ranks[0]
    records = dump.records()
    phases = collections.Counter(r.phase for r in records)
    calls = {r.call_name for r in records}
    print(f"{len(records)} records from {len(calls)} op calls: " + ", ".join(f"{n} {p}" for p, n in phases.items()))
    print("\nTwo of them (more with: torchdebug show DUMP --name PATTERN):\n")
    for prefix in ("forward/layers.0.attn.qkv/", "backward/layers.0.attn.qkv/"):
        record = next(
            r
            for r in records
            if r.name.startswith(prefix) and r.io == "output" and r.op in ("aten.addmm.default", "aten.mm.default")
        )
        print(format_record(record, dump))
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo_out", help="output folder (default: demo_out)")
    args = parser.parse_args()
    out = Path(args.out)
    fp32 = dump_step(out / "fp32", bf16=False)
    bf16 = dump_step(out / "bf16", bf16=True)
    print()
    show_some(fp32)

    print("Comparing bf16 (A) against fp32 (B): a healthy model shows bf16 rounding, no error\n")
    result = torchdebug.compare(bf16, fp32)
    print(result.summary())
    report = result.to_html(out / "compare.html")
    print(f"HTML report: {report}\n")

    buggy = dump_step(out / "bf16_bug", bf16=True, bug=True)
    print("\nComparing the bf16 run with a planted bug (A) against fp32 (B):\n")
    result = torchdebug.compare(buggy, fp32)
    print(result.summary())
    row = result.first_divergence
    if row is not None:
        print("\nstack of the first divergence (most recent call last):")
        print("\n".join(f"  {frame}" for frame in result.stack(row)))
    report = result.to_html(out / "compare_bug.html")
    print(f"\nHTML report: {report}")
    print(f"Same from the shell: torchdebug compare {buggy} {fp32} -o {out / 'compare_bug'} --format csv,json,html")


if __name__ == "__main__":
    main()
