"""A graph dump on two gloo ranks: one run folder, a rank folder each."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdebug
from tests import gloo
from tests.backends import dump_backend
from torchdebug.compare import compare


def _rank_main(rank: int, path: str) -> None:
    backend = dump_backend(Path(path), run_eagerly=True)  # the folders are the point, not inductor's code
    torch.compile(lambda x: (x * (rank + 1)).exp(), backend=backend)(torch.ones(3))
    backend.data_dump.close()


@pytest.mark.slow
def test_every_rank_of_a_graph_dump_writes_into_one_run_folder(tmp_path: Path) -> None:
    gloo.spawn(_rank_main, tmp_path, str(tmp_path / "dump"))
    (run_dir,) = (tmp_path / "dump").iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["worldsize2_global_rank0", "worldsize2_global_rank1"]
    run = torchdebug.load(tmp_path / "dump")
    assert sorted(run.ranks) == [0, 1] and not run.partial_ranks
    for rank, dump in run.ranks.items():
        exp = [r for r in dump.records() if r.op == "aten.exp.default" and r.io == "output"]
        assert exp and exp[0].stats["max"] == pytest.approx(torch.tensor(float(rank + 1)).exp().item())


def _tensor_parallel_main(rank: int, path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from examples.gpt import GPT, GPTConfig, make_batch

    config = GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=8, vocab=32)
    torch.manual_seed(0)
    model = GPT(config)
    parallelize_module(model.layers[0].mlp, init_device_mesh("cpu", (2,)), {"fc": ColwiseParallel(), "out": RowwiseParallel()})
    with torchdebug.dump(Path(path, "eager"), task="statistics"):
        model(*make_batch(config, batch=2)).backward()
    model.zero_grad()
    backend = dump_backend(Path(path, "compiled"))
    torch.compile(model, backend=backend)(*make_batch(config, batch=2)).backward()
    backend.data_dump.close()


@pytest.mark.slow
def test_a_compiled_all_reduce_is_read_once_waited_for(tmp_path: Path) -> None:
    """Tensor parallelism under inductor: the all-reduce's output holds the reduced value (the same
    on both ranks, that of its wait), not the buffer read before the collective completed; and the
    eager dump of the same step compares with it without an error."""
    gloo.spawn(_tensor_parallel_main, tmp_path, str(tmp_path / "dump"))
    run = torchdebug.load(tmp_path / "dump" / "compiled")
    reduced = []
    for rank in (0, 1):
        records = {r.name.removeprefix("forward/layers.0.mlp.out/"): r for r in run.ranks[rank].records() if r.phase == "forward"}
        output = records["_c10d_functional.all_reduce.default#0/output.0"]
        assert output.stats == records["_c10d_functional.wait_tensor.default#0/output.0"].stats, rank
        assert output.stats != records["_c10d_functional.all_reduce.default#0/input.0"].stats, rank  # this rank's summand
        reduced.append(output.stats)
    assert reduced[0] == reduced[1]

    # eager against compiled: the DTensor records (global shapes) meet the graph's local tensors, and
    # the bias RowwiseParallel splits (divided by the mesh size inside the op) is a `div` node there
    result = compare(tmp_path / "dump" / "eager", tmp_path / "dump" / "compiled")
    assert result.first_divergence is None
    assert not [row.name for row in result.rows if row.verdict in ("error", "warning")]


class _SequenceParallelNet(torch.nn.Module):
    """An embedding, a pre-norm MLP block and a head, laid out as torchtitan lays out a transformer:
    a vocabulary-sharded embedding, sequence-parallel norms, the MLP split by columns (its input
    gathered along the sequence) then rows (its output scattered along it)."""

    def __init__(self, vocab: int = 32, width: int = 16) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.ln = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.out = torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        x = x + self.out(torch.nn.functional.gelu(self.fc(self.ln(x))))
        return self.head(self.norm(x)).float().square().mean()


def _sequence_parallel_main(rank: int, path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    torch.manual_seed(0)
    model = _SequenceParallelNet()
    plan = {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "ln": SequenceParallel(),
        "fc": ColwiseParallel(input_layouts=Shard(1)),  # gathers the sequence
        "out": RowwiseParallel(output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    parallelize_module(model, init_device_mesh("cpu", (2,)), plan)
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    with torchdebug.dump(Path(path, "eager"), task="statistics"):
        model(tokens).backward()
    model.zero_grad()
    backend = dump_backend(Path(path, "compiled"))
    torch.compile(model, backend=backend)(tokens).backward()
    backend.data_dump.close()


@pytest.mark.slow
def test_sequence_parallelism_eager_against_compiled_compares_clean(tmp_path: Path) -> None:
    """Sequence parallelism under inductor against eager: a DTensor call pairs with the graph's call
    of the same local shapes (not another with the same global ones: a linear's two backward ``mm``),
    and the vocabulary-sharded embedding's global indices are not compared with the local indices the
    graph computes from them (nor followed upstream as one value): nothing differs."""
    gloo.spawn(_sequence_parallel_main, tmp_path, str(tmp_path / "dump"))
    result = compare(tmp_path / "dump" / "eager", tmp_path / "dump" / "compiled")
    assert result.first_divergence is None
    assert not [row.name for row in result.rows if row.verdict in ("error", "warning")]
    assert {(row.rank, row.name) for row in result.rows if row.verdict == "incomparable"} == {
        (rank, "forward/emb/aten.embedding.default#0/input.1") for rank in (0, 1)
    }
    backward_mm = [row for row in result.rows if row.name.startswith("backward/head/aten.mm.default#") and row.match == "exact"]
    assert len(backward_mm) == 2 * 2 * 3  # both calls paired by name on both ranks, every slot
