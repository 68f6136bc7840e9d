"""Structure-change benchmark (issue 46, item 5, the pairs cheap to build on CPU without gloo).

Each pair dumps one training step (forward, backward, SGD) of a 2-layer model twice, A and B, where
the two runs compute the same math with other ops (healthy: no error row and no first divergence is
right) or carry a bug planted on side A (right when the first divergence lands in the planted
module). Prints the localisation table: pair, truth, error rows, first divergence, where it was
planted, right or wrong, and the structure differences compare lists (runs of ops only one side
executes, by verdict: ``pass`` leaves the values equal, ``error`` changed a value). Results are what
compare says today, wrong ones included. ``--noise`` prints the table again, judged with tolerances
from the run itself (issue 46, item 4): B's step dumped once more with its inputs rounded through
bf16 and back is the noise dump (``compare(a, b, noise=c)``); the MoE pair has none and keeps its
dtype tolerances::

    python bench/structure.py            # every pair, statistics dumps
    python bench/structure.py --task tensor --noise
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from tests.compare.moe import MoENet, moe_batch  # noqa: E402
from tests.compare.moe import train_step as moe_step  # noqa: E402

_DIM, _HEADS, _SEQ, _BATCH = 16, 2, 6, 8


@dataclass(frozen=True)
class Variant:
    """How one side computes the block: the same math with other ops, or a planted bug."""

    attention: str = "sdpa"  # or "hand": softmax(q k^T / sqrt(d)) v written out
    norm: str = "layer_norm"  # or "hand": (x - mean) * rsqrt(var + eps) * w + b
    reshape: bool = False  # a reshape round trip a refactor added before the MLP
    reorder: bool = False  # v, k, q projections in another order (independent ops)
    scale: float = 1.0  # the MLP's output times this, in layer 1 (a 1.05 scale bug)
    one_sided: bool = False  # an extra op on this side only: the attention output + 0.01 in layer 0


class _Norm(nn.Module):
    def __init__(self, variant: Variant) -> None:
        super().__init__()
        self.weight, self.bias, self.variant = nn.Parameter(torch.ones(_DIM)), nn.Parameter(torch.zeros(_DIM)), variant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.variant.norm == "layer_norm":
            return F.layer_norm(x, (_DIM,), self.weight, self.bias, 1e-5)
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias


class _Attention(nn.Module):
    def __init__(self, variant: Variant, layer: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(_DIM, _DIM) for _ in range(4))
        self.variant, self.layer = variant, layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.variant.reorder:
            v, k, q = self.v(x), self.k(x), self.q(x)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = (t.view(_BATCH, -1, _HEADS, _DIM // _HEADS).transpose(1, 2) for t in (q, k, v))
        if self.variant.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            y = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(_DIM // _HEADS), dim=-1) @ v
        y = y.transpose(1, 2).reshape(_BATCH, -1, _DIM)
        if self.variant.one_sided and self.layer == 0:
            y = y + 0.01  # planted: an op only this side runs
        return self.out(y)


class _Block(nn.Module):
    def __init__(self, variant: Variant, layer: int) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = _Norm(variant), _Attention(variant, layer), _Norm(variant)
        self.mlp = nn.Sequential(nn.Linear(_DIM, 2 * _DIM), nn.GELU(), nn.Linear(2 * _DIM, _DIM))
        self.variant, self.layer = variant, layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        if self.variant.reshape:
            h = h.reshape(-1, _DIM).reshape(_BATCH, -1, _DIM)
        h = self.mlp(h)
        if self.layer == 1:
            h = h * self.variant.scale  # planted when scale != 1
        return x + h


class _Net(nn.Module):
    def __init__(self, variant: Variant) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(_Block(variant, layer) for layer in range(2))
        self.head = nn.Linear(_DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _dump_steps(path: Path, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: Callable, micro: int, task: str) -> Path:
    """One SGD step over ``x``, in ``micro`` micro-batches (gradient accumulation)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.dump(path, model=model, task=task) as debugger:
        for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
            (loss(model(xb), yb) / micro).backward()
        optimizer.step()
    return debugger.run_dir


def _rounded(x: torch.Tensor, rounded: bool) -> torch.Tensor:
    """``x`` rounded through bf16 and back when ``rounded`` (the noise dump's perturbation)."""
    return x.to(torch.bfloat16).float() if rounded else x


def _dump_block(path: Path, variant: Variant, task: str, rounded: bool = False) -> Path:
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(_BATCH, _SEQ, _DIM, generator=generator), torch.randn(_BATCH, _SEQ, 4, generator=generator)
    return _dump_steps(path, _Net(variant), _rounded(x, rounded), y, F.mse_loss, 1, task)


def _dump_accumulated(path: Path, micro: int, task: str, rounded: bool = False) -> Path:
    """A 2-layer MLP, the batch of 16 in ``micro`` micro-batches."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=generator), torch.randint(0, 4, (16,), generator=generator)
    return _dump_steps(path, model, _rounded(x, rounded), y, F.cross_entropy, micro, task)


def _dump_moe(path: Path, side: int, task: str) -> Path:
    model = MoENet()
    x = moe_batch(model, side)
    with torchdebug.dump(path, model=model, task=task) as debugger:
        moe_step(model, x)
    return debugger.run_dir


@dataclass
class Pair:
    name: str
    truth: str
    make: Callable[[Path, str], tuple[Path, Path]]
    planted: tuple[str, str] | None = None
    """The module and op the first divergence should name (``None``: healthy, none should be named)."""
    options: dict = field(default_factory=dict)
    noise: Callable[[Path, str], Path] | None = None
    """B's step again with its inputs rounded through bf16 (``None``: no noise dump)."""


def _blocks(a: Variant, b: Variant, planted: tuple[str, str] | None = None) -> dict:
    """The ``make``, ``noise`` and ``planted`` of a pair of 2-layer blocks."""
    return {
        "make": lambda root, task: (_dump_block(root / "a", a, task), _dump_block(root / "b", b, task)),
        "noise": lambda root, task: _dump_block(root / "c", b, task, rounded=True),
        "planted": planted,
    }


_ONE_SIDED = ("blocks.0.attn", "aten.add.Tensor")

PAIRS = [
    Pair("sdpa vs hand-written attention", "healthy", **_blocks(Variant(), Variant(attention="hand"))),
    Pair("F.layer_norm vs mean/var/rsqrt", "healthy", **_blocks(Variant(), Variant(norm="hand"))),
    Pair("a reshape added by a refactor", "healthy", **_blocks(Variant(reshape=True), Variant())),
    Pair("independent ops reordered", "healthy", **_blocks(Variant(reorder=True), Variant())),
    Pair(
        "4 micro-batches vs one batch 4x",
        "healthy",
        lambda root, task: (_dump_accumulated(root / "a", 4, task), _dump_accumulated(root / "b", 1, task)),
        noise=lambda root, task: _dump_accumulated(root / "c", 1, task, rounded=True),
    ),
    Pair(
        "MoE: one token's routing flips",
        "routing changed",
        lambda root, task: (_dump_moe(root / "a", -1, task), _dump_moe(root / "b", 1, task)),
        planted=("layer1", "aten.topk.default"),
        options={"tolerances": {"float32": 1e-2}},  # the inputs differ by a nudge of 1e-3, like bf16 round-off
    ),
    Pair("planted: a one-sided op (+0.01)", "bug", **_blocks(Variant(one_sided=True), Variant(), _ONE_SIDED)),
    Pair("planted: 1.05x scale in one module", "bug", **_blocks(Variant(scale=1.05), Variant(), ("blocks.1", "aten.mul.Tensor"))),
]


def _right(pair: Pair, result: torchdebug.compare.CompareResult) -> bool:  # type: ignore[name-defined]
    first = result.first_divergence
    if pair.planted is None:
        return first is None and result.counts()["error"] == 0
    return first is not None and (first.module, first.op) == pair.planted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="statistics", choices=["statistics", "tensor"])
    parser.add_argument("--noise", action="store_true", help="also judge with tolerances measured from a noise dump")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tables: dict[str, list[tuple[str, ...]]] = {"dtype tolerances": []}
    if args.noise:
        tables["tolerances from a noise dump (B's inputs rounded through bf16)"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, pair in enumerate(PAIRS):
            root = Path(tmp) / str(number)
            a, b = pair.make(root, args.task)
            noise = pair.noise(root, args.task) if args.noise and pair.noise is not None else None
            for title, c in zip(tables, (None, noise)):
                tables[title].append(_line(pair, torchdebug.compare(a, b, noise=c, **pair.options)))
    header = ("pair", "truth", "error rows", "beyond tolerance", "first divergence", "planted in", "localised")
    for title, rows in tables.items():
        print(f"torch {torch.__version__}, task={args.task}, CPU, {title}")
        print("| " + " | ".join((*header, "structure differences")) + " |")
        print("|" + "---|" * (len(header) + 1))
        for row in rows:
            print("| " + " | ".join(row) + " |")


def _line(pair: Pair, result: torchdebug.compare.CompareResult) -> tuple[str, ...]:  # type: ignore[name-defined]
    """One line of the table: the pair, its truth and what compare says (rows beyond their tolerance:
    every judged row that is not a plain pass)."""
    first = result.first_divergence
    where = f"{first.module} {first.op} {first.io}.{first.arg}" if first is not None else "none"
    right = "right" if _right(pair, result) else "WRONG"
    beyond = sum(1 for row in result.rows if row.error is not None and row.tolerance is not None and row.error > row.tolerance)
    verdicts = Counter(block.verdict for block in result.structure_differences)
    blocks = ", ".join(f"{n} {verdict}" for verdict, n in sorted(verdicts.items())) or "none"
    planted = " ".join(pair.planted or "-")
    return (pair.name, pair.truth, str(result.counts()["error"]), str(beyond), where, planted, right, blocks)


if __name__ == "__main__":
    main()
