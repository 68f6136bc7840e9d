"""Structure-change benchmark (issue 46, item 5): pairs with the same math and other ops, on CPU.

Each pair dumps one training step (forward, backward, SGD) of a 2-layer model twice, A and B, where
the two runs compute the same math with other ops (healthy: no error row and no first divergence is
right) or carry a bug planted on side A (right when the first divergence lands in the planted
module, at the planted op). The sharded pairs run A on 2 gloo processes (one spawn for all of
them) against one process on the whole batch and compare rank 0: tensor parallelism with
``parallelize_module`` (a vocabulary-parallel embedding on plain local tensors, Megatron's layout),
tensor and sequence parallelism (torchtitan's plan, a DTensor vocabulary-parallel embedding), FSDP2
with half the batch on each rank. The compiled pairs dump B, and A where their name says so, as a
graph dump of aot_eager's graphs (forward and backward; the SGD step runs outside them), so eager
against compiled and compiled against compiled pairs are aligned by the graph dump's value ids.
Prints the localisation table: pair, truth, error rows, first
divergence, where it was planted, right or wrong, and the structure differences compare lists (runs
of ops only one side executes, by verdict: ``pass`` leaves the values equal, ``error`` changed a
value). Results are what compare says today, wrong ones included. ``--noise`` prints the table
again, judged with tolerances from the run itself (issue 46, item 4): B's step dumped once more
with its inputs rounded through bf16 and back is the noise dump (``compare(a, b, noise=c)``); the
MoE and sharded pairs have none and keep their dtype tolerances::

    python bench/structure.py            # every pair, statistics dumps
    python bench/structure.py --task tensor --noise
    python bench/structure.py --other-python .venv-torch2.11.0/bin/python   # + the pair across torch releases
"""

from __future__ import annotations

import argparse
import functools
import math
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from tests.capture.test_subclasses import ScaledInt8  # noqa: E402
from tests.compare.moe import MoENet, moe_batch  # noqa: E402
from tests.compare.moe import train_step as moe_step  # noqa: E402
from tests.compare.vocab_shards import VocabShard  # noqa: E402
from torchdebug.compile import CompilerConfig, get_backend  # noqa: E402

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
    attention_scale: float = 1.0  # the attention's heads times this, in layer 1 (a 1.05 scale bug)
    weights: str = "trained"  # or the blocks' linear weights frozen, int8 times a scale: "subclass" (ScaledInt8, converted
    # on every use) or "plain" (the same values converted once): bit for bit the same step


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
        batch, seq = x.shape[:2]  # local heads under tensor parallelism: q, k and v hold this rank's columns
        q, k, v = (t.view(batch, seq, -1, _DIM // _HEADS).transpose(1, 2) for t in (q, k, v))
        if self.variant.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            y = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(_DIM // _HEADS), dim=-1) @ v
        if self.layer == 1:
            y = y * self.variant.attention_scale  # planted when attention_scale != 1 (on each rank's local heads)
        y = y.transpose(1, 2).reshape(batch, seq, -1)
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
            h = h.reshape(-1, _DIM).reshape(h.shape)
        h = self.mlp(h)
        if self.layer == 1:
            h = h * self.variant.scale  # planted when scale != 1
        return x + h


def _quantize(linear: nn.Linear, subclass: bool) -> None:
    """``linear``'s weight frozen as int8 times a scale: a ScaledInt8 (converted on use) or its plain value."""
    weight = linear.weight.detach()
    scale = weight.abs().max() / 127
    data = (weight / scale).round().to(torch.int8)
    del linear.weight
    linear.register_buffer("weight", ScaledInt8(data, scale) if subclass else data.float() * scale)


class _Net(nn.Module):
    def __init__(self, variant: Variant) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(_Block(variant, layer) for layer in range(2))
        self.head = nn.Linear(_DIM, 4)
        if variant.weights != "trained":
            for linear in (m for m in self.blocks.modules() if isinstance(m, nn.Linear)):
                _quantize(linear, variant.weights == "subclass")

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


def _dump_compiled_block(path: Path, variant: Variant, task: str, rounded: bool = False) -> Path:
    """The blocks' step with the model compiled: a graph dump of every node of aot_eager's graphs
    (forward and backward; the SGD step runs outside them)."""
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(_BATCH, _SEQ, _DIM, generator=generator), torch.randn(_BATCH, _SEQ, 4, generator=generator)
    model = _Net(variant)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch._dynamo.reset()
    path.mkdir(parents=True)
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = task
    backend = get_backend(config, model=model)
    F.mse_loss(torch.compile(model, backend=backend)(_rounded(x, rounded)), y).backward()
    optimizer.step()
    backend.data_dump.close()
    torch._dynamo.reset()
    return path


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


_VOCAB = 16


class _TokenNet(_Net):
    """The 2-layer blocks behind a token embedding: the model the sharded pairs split over ranks."""

    def __init__(self, variant: Variant) -> None:
        super().__init__(variant)
        self.embed = nn.Embedding(_VOCAB, _DIM)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(self.embed(ids))


@dataclass(frozen=True)
class Sharded:
    """How the 2 gloo ranks run the token model, and the bug planted there."""

    parallel: str  # "tp" (ColwiseParallel/RowwiseParallel, a vocabulary-parallel embedding on local
    # tensors), "tp+sp" (sequence parallel: torchtitan's plan) or "fsdp" (fully_shard, half the batch each)
    variant: Variant = Variant()
    vocab_offset: int = 0  # added to each rank's first id (a wrong shard offset)
    partial_mlp: bool = False  # layer 1's MLP output left as the ranks' partial sums (a missing all-reduce)
    divide_grad: bool = False  # blocks.1.mlp.0.weight's gradient divided by the world size again
    decay_all: bool = False  # weight decay on the norms, biases and embedding too, not on the weights alone


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, _VOCAB, (_BATCH, _SEQ), generator=generator), torch.randn(_BATCH, _SEQ, 4, generator=generator)


def _sgd(model: nn.Module, decay_all: bool = False) -> torch.optim.Optimizer:
    """SGD with weight decay on the weights of the linear layers (``decay_all``: on every parameter)."""
    weights = [p for name, p in model.named_parameters() if name.endswith("weight") and p.dim() == 2 and "embed" not in name]
    rest = [p for p in model.parameters() if all(p is not w for w in weights)]
    decay = (0.1, 0.1 if decay_all else 0.0)
    return torch.optim.SGD([{"params": weights, "weight_decay": decay[0]}, {"params": rest, "weight_decay": decay[1]}], lr=0.1)


def _dump_token_step(path: Path, model: nn.Module, ids: torch.Tensor, y: torch.Tensor, task: str, plan: Sharded) -> None:
    optimizer = _sgd(model, plan.decay_all)
    with torchdebug.dump(path, model=model, task=task):
        F.mse_loss(model(ids), y).backward()
        if plan.divide_grad:
            model.blocks[1].mlp[0].weight.grad.div_(torch.distributed.get_world_size())  # planted
        optimizer.step()


def _tensor_parallel(model: _TokenNet, plan: Sharded) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    sequence = plan.parallel == "tp+sp"
    between = Shard(1) if sequence else Replicate()  # what the residual stream holds between the blocks
    for layer, block in enumerate(model.blocks):
        styles = {f"attn.{name}": ColwiseParallel() for name in ("q", "k", "v")}
        styles["attn.out"] = RowwiseParallel(output_layouts=between)
        styles["mlp.0"] = ColwiseParallel()
        styles["mlp.2"] = RowwiseParallel(output_layouts=Partial() if plan.partial_mlp and layer == 1 else between)
        if sequence:
            gathered = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
            styles.update(
                norm1=SequenceParallel(),
                norm2=SequenceParallel(),
                attn=PrepareModuleInput(**gathered),
                mlp=PrepareModuleInput(**gathered),
            )
        parallelize_module(block, mesh, styles)
    if sequence:
        parallelize_module(
            model,
            mesh,
            {
                "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            },
        )
    else:
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        model.embed = VocabShard(model.embed.weight, rank, world, plan.vocab_offset)


def _sharded_rank(rank: int, root: str, task: str, plans: list[Sharded]) -> None:
    """Dump each plan's step on this gloo rank (``root/<index>``)."""
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    ids, y = _batch()
    for index, plan in enumerate(plans):
        model = _TokenNet(plan.variant)
        if plan.parallel == "fsdp":
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            ids_rank, y_rank = ids.chunk(2)[rank], y.chunk(2)[rank]
        else:
            _tensor_parallel(model, plan)
            ids_rank, y_rank = ids, y
        _dump_token_step(Path(root) / str(index), model, ids_rank, y_rank, task, plan)


@functools.cache
def _sharded_dumps(root: Path, task: str) -> Path:
    """Every sharded plan dumped on 2 gloo ranks (one spawn), and one process on the global batch (``single``)."""
    from tests import gloo

    root.mkdir(parents=True, exist_ok=True)
    gloo.spawn(_sharded_rank, root, str(root), task, SHARDED)
    ids, y = _batch()
    _dump_token_step(root / "single", _TokenNet(Variant()), ids, y, task, Sharded("single"))
    return root


def _sharded(plan: Sharded, planted: tuple[str, str | None] | None = None) -> dict:
    """The ``make`` and ``planted`` of a pair: ``plan`` on 2 gloo ranks against one process."""
    SHARDED.append(plan)
    index = len(SHARDED) - 1

    def make(root: Path, task: str) -> tuple[Path, Path]:
        dumps = _sharded_dumps(root.parent / "sharded", task)
        return dumps / str(index), dumps / "single"

    return {"make": make, "planted": planted}


SHARDED: list[Sharded] = []
"""The plans the sharded pairs dump, in one spawn of the gloo ranks."""


@dataclass
class Pair:
    name: str
    truth: str
    make: Callable[[Path, str], tuple[Path, Path]]
    planted: tuple[str, str | None] | None = None
    """The module and op the first divergence should name (``None``: healthy, none should be named;
    an op ``None``: any op of that module, where the bug is an op missing)."""
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


def _compiled_blocks(a: Variant, b: Variant, a_compiled: bool, planted: tuple[str, str] | None = None) -> dict:
    """:func:`_blocks` with B compiled, and A too where ``a_compiled`` (else A eager)."""
    dump_a = _dump_compiled_block if a_compiled else _dump_block
    return {
        "make": lambda root, task: (dump_a(root / "a", a, task), _dump_compiled_block(root / "b", b, task)),
        "noise": lambda root, task: _dump_compiled_block(root / "c", b, task, rounded=True),
        "planted": planted,
    }


_ONE_SIDED = ("blocks.0.attn", "aten.add.Tensor")

PAIRS = [
    Pair("sdpa vs hand-written attention", "healthy", **_blocks(Variant(), Variant(attention="hand"))),
    Pair("F.layer_norm vs mean/var/rsqrt", "healthy", **_blocks(Variant(), Variant(norm="hand"))),
    Pair("a reshape added by a refactor", "healthy", **_blocks(Variant(reshape=True), Variant())),
    Pair("independent ops reordered", "healthy", **_blocks(Variant(reorder=True), Variant())),
    Pair(
        "int8 weights: a subclass vs its plain twin", "healthy", **_blocks(Variant(weights="subclass"), Variant(weights="plain"))
    ),
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
    Pair("eager vs compiled (aot_eager graphs)", "healthy", **_compiled_blocks(Variant(), Variant(), False)),
    Pair("compiled: independent ops reordered", "healthy", **_compiled_blocks(Variant(reorder=True), Variant(), True)),
    Pair(
        "planted, compiled: 1.05x scale in one module",
        "bug",
        **_compiled_blocks(Variant(scale=1.05), Variant(), True, ("blocks.1", "aten.mul.Tensor")),
    ),
    Pair(
        "planted, eager vs compiled: a one-sided op (+0.01)",
        "bug",
        **_compiled_blocks(Variant(one_sided=True), Variant(), False, _ONE_SIDED),
    ),
    Pair("tensor parallel (2 ranks) vs one process", "healthy", **_sharded(Sharded("tp"))),
    Pair("tensor + sequence parallel vs one process", "healthy", **_sharded(Sharded("tp+sp"))),
    Pair("FSDP2 (2 ranks, half batch each) vs one process", "healthy", **_sharded(Sharded("fsdp"))),
    Pair("planted TP: a wrong vocabulary shard offset", "bug", **_sharded(Sharded("tp", vocab_offset=1), ("embed", None))),
    Pair("planted TP: a missing all-reduce", "bug", **_sharded(Sharded("tp", partial_mlp=True), ("blocks.1.mlp.2", None))),
    Pair(
        "planted TP+SP: 1.05x on the local heads",
        "bug",
        **_sharded(Sharded("tp+sp", Variant(attention_scale=1.05)), ("blocks.1.attn", "aten.mul.Tensor")),
    ),
    Pair(
        "planted FSDP2: a gradient divided twice", "bug", **_sharded(Sharded("fsdp", divide_grad=True), ("-", "aten.div_.Tensor"))
    ),
    Pair(
        "planted FSDP2: weight decay on the wrong parameters",
        "bug",
        **_sharded(Sharded("fsdp", decay_all=True), ("-", "aten.add.Tensor")),
    ),
]


def _other_release(python: Path, path: Path, task: str) -> Path:
    """The healthy blocks' step dumped by ``python`` (another torch release) into ``path``."""
    command = [str(python), __file__, "--dump-block", str(path), "--task", task]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"--other-python {python}: the dump failed: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _across_releases(python: Path) -> Pair:
    """The pair 'the same model on two torch releases': A here, B by ``python``."""
    command = [str(python), "-c", "import torch; print(torch.__version__)"]
    try:
        version = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise SystemExit(f"--other-python {python}: cannot run it ({error.strerror})") from None
    if version.returncode != 0 or not version.stdout.strip():
        raise SystemExit(f"--other-python {python}: cannot import torch there")
    return Pair(
        f"the same model on torch {torch.__version__} vs {version.stdout.strip()}",
        "healthy",
        lambda root, task: (_dump_block(root / "a", Variant(), task), _other_release(python, root / "b", task)),
        noise=lambda root, task: _dump_block(root / "c", Variant(), task, rounded=True),
    )


def _right(pair: Pair, result: torchdebug.compare.CompareResult) -> bool:  # type: ignore[name-defined]
    first = result.first_divergence
    if pair.planted is None:
        return first is None and result.counts()["error"] == 0
    module, op = pair.planted
    return first is not None and first.module == module and op in (None, first.op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="statistics", choices=["statistics", "tensor"])
    parser.add_argument("--noise", action="store_true", help="also judge with tolerances measured from a noise dump")
    parser.add_argument(
        "--other-python", type=Path, help="a Python with another torch release: adds the pair of the same model on both"
    )
    parser.add_argument("--dump-block", type=Path, help=argparse.SUPPRESS)  # --other-python's side B, in that Python
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.dump_block is not None:
        print(_dump_block(args.dump_block, Variant(), args.task))
        return
    pairs = PAIRS + ([_across_releases(args.other_python)] if args.other_python else [])
    tables: dict[str, list[tuple[str, ...]]] = {"dtype tolerances": []}
    if args.noise:
        tables["tolerances from a noise dump (B's inputs rounded through bf16)"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, pair in enumerate(pairs):
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
    beyond = sum(
        1 for row in result.rows if row.difference is not None and row.tolerance is not None and row.difference > row.tolerance
    )
    verdicts = Counter(block.verdict for block in result.structure_differences)
    blocks = ", ".join(f"{n} {verdict}" for verdict, n in sorted(verdicts.items())) or "none"
    planted = " ".join(part or "(any op)" for part in pair.planted) if pair.planted else "-"
    return (pair.name, pair.truth, str(result.counts()["error"]), str(beyond), where, planted, right, blocks)


if __name__ == "__main__":
    main()
