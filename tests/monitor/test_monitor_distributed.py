"""The flight recorder on 2 gloo ranks, DDP, the large-model recipe (FSDP2, checkpointed and
compiled blocks) and tensor parallelism in one spawn: a NaN made on one rank reaches both through
the gradients' all-reduce, the parameters' all-gather or the activations' all-reduce; both ranks
fire, dump their window and replay together, and the event names the rank that saw it first.
FSDP2 with tensor parallelism (4 ranks, a 2 × 2 mesh) has a spawn of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch
from tests import gloo
from torchdebug.monitor import StepSummary
from torchdebug.stats._schema import STAT_KEYS

CONFIG = GPTConfig(n_layer=2, d_model=16, n_head=2, seq_len=8, vocab=32)


def _closure(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, rank: int):
    """The step's forward and backward on this rank's own batch."""

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(*make_batch(CONFIG, batch=2, seed=10 * step + rank))
        loss.backward()
        return loss

    return closure


_FSDP_GRADIENT = "backward/layers.1.mlp.fc/module#0/parameter_grad.weight"


def _clipping(closure, model: torch.nn.Module, weight: torch.Tensor, unclipped: list[float]):
    """``closure``, then the gradients clipped far below their norm; ``unclipped`` gets the norm of
    ``weight``'s gradient before (of this rank's shard, for a DTensor)."""

    def clipped() -> torch.Tensor:
        loss = closure()
        grad = weight.grad.to_local() if isinstance(weight.grad, DTensor) else weight.grad
        unclipped.append(torch.linalg.vector_norm(grad.double()).item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        return loss

    return clipped


_DDP_GRADIENT = "backward/module.layers.1.mlp.fc/module#0/parameter_grad.weight"


def _ddp_main(rank: int, root: str, compiled: bool = False) -> None:
    """DDP over the GPT, or (``compiled``) over ``torch.compile`` of it, as nanoGPT does."""
    torchdebug.seed_all(0)
    inner = GPT(CONFIG)
    model = DistributedDataParallel(torch.compile(inner, backend="aot_eager") if compiled else inner)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = torchdebug.Monitor(model, optimizer, dump_path=root, window=4)
    weight = inner.layers[1].mlp.fc.weight
    unclipped = []
    for step in range(8):
        if step == 5 and rank == 1:
            with torch.no_grad():
                inner.layers[0].mlp.fc.weight[0, 0] = float("nan")

        monitor.step(_clipping(_closure(model, optimizer, step, rank), model, weight, unclipped))
        if step == 4:  # the last clean step, before it leaves the window
            index = next(i for i, slot in enumerate(monitor.ring.slots) if slot.name == _DDP_GRADIENT)
            watched = monitor.ring.row(4)[index, STAT_KEYS.index("norm")]
    monitor.close()
    (event,) = monitor.events
    Path(root, f"event{rank}.json").write_text(json.dumps(event.to_dict()))
    Path(root, f"norms{rank}.json").write_text(json.dumps({"watched": watched, "unclipped": unclipped[4]}))
    dist.barrier()


def _budget_main(rank: int, root: str) -> None:
    """DDP; rank 0's predicate fires at step 2 (rank 1 fires with it, for another rank's reason),
    then a NaN on rank 1 at step 5: each reason has its own ``max_events``, which the ranks count
    alike."""
    torchdebug.seed_all(0)
    model = DistributedDataParallel(GPT(CONFIG))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def predicate(summary: StepSummary) -> str | None:
        return "rank 0's own reason" if rank == 0 and summary.step == 2 else None

    monitor = torchdebug.Monitor(model, optimizer, dump_path=root, window=4, predicate=predicate)
    for step in range(7):
        if step == 5 and rank == 1:
            with torch.no_grad():
                model.module.layers[0].mlp.fc.weight[0, 0] = float("nan")
        monitor.step(_closure(model, optimizer, step, rank))
    monitor.close()
    events = [event.to_dict() for event in monitor.events]
    Path(root, f"events{rank}.json").write_text(json.dumps(events))
    dist.barrier()


def _rank_main(rank: int, root: str) -> None:
    _ddp_main(rank, str(Path(root, "ddp")))
    _budget_main(rank, str(Path(root, "budget")))
    _ddp_main(rank, str(Path(root, "ddp_compiled")), compiled=True)
    _fsdp_main(rank, str(Path(root, "fsdp")))
    _tp_main(rank, str(Path(root, "tp")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs' folders (``ddp``, ``ddp_compiled``, ``fsdp``, ``tp``), from one spawn."""
    root = tmp_path_factory.mktemp("monitor_ranks")
    gloo.spawn(_rank_main, root, str(root))
    return root


@pytest.mark.slow
def test_both_ranks_fire_and_replay_and_the_rank_that_saw_it_first_is_named(runs: Path) -> None:
    tmp_path = runs / "ddp"
    events = [json.loads((tmp_path / f"event{rank}.json").read_text()) for rank in (0, 1)]
    assert [e["ranks"] for e in events] == [[1, 0], [1, 0]]  # rank 1 saw it in the forward, rank 0 in its gradients
    assert events[1]["slot"] == "forward/module.layers.0.mlp.fc/module#0/output.0"
    assert events[0]["slot"].startswith("backward/") and "parameter_grad" in events[0]["slot"]
    assert all(e["step"] == 5 and e["reason"] == "nonfinite" for e in events)
    window = torchdebug.load(events[0]["window"])
    assert sorted(window.ranks) == [0, 1]  # one run folder, both ranks
    assert sorted({r.step for r in window.ranks[1].records()}) == [2, 3, 4, 5]
    assert all(e["replay"]["reproduced"] for e in events)
    assert "layers.0.mlp.fc" in events[1]["replay"]["origin"]
    # the closure clips: the gradients are watched once DDP's all-reduce has written them back, before
    # clipping, the same on both ranks (each rank's own gradient differs: its own batch)
    norms = [json.loads((tmp_path / f"norms{rank}.json").read_text()) for rank in (0, 1)]
    assert norms[0]["unclipped"] == norms[1]["unclipped"] > 1e-2
    assert all(n["watched"] == pytest.approx(n["unclipped"], rel=1e-6) for n in norms)


@pytest.mark.slow
def test_ddp_over_a_model_compiled_whole_fires_replays_and_watches_gradients_before_clipping(runs: Path) -> None:
    """``DDP(torch.compile(model))``: the compiled model's call stands for the model (DDP's child,
    ``module``), so rank 1 sees the NaN in its output, both ranks replay (the compiled code run
    eagerly under capture: rank 1 names the op at its source line), and the gradients are watched
    once DDP's all-reduce has written them back, before clipping."""
    tmp_path = runs / "ddp_compiled"
    events = [json.loads((tmp_path / f"event{rank}.json").read_text()) for rank in (0, 1)]
    assert [e["ranks"] for e in events] == [[1, 0], [1, 0]] and all(e["step"] == 5 for e in events)
    assert events[1]["slot"] == "forward/module/module#0/output.0"
    assert all(e["replay"]["reproduced"] and e["replay"]["eager_loss"] is not None for e in events)
    assert "module.layers.0.mlp.fc" in events[1]["replay"]["origin"] and "examples/gpt.py" in events[1]["replay"]["origin"]
    assert events[0]["replay"]["from_another_rank"]
    norms = [json.loads((tmp_path / f"norms{rank}.json").read_text()) for rank in (0, 1)]
    assert norms[0]["unclipped"] == norms[1]["unclipped"] > 1e-2
    assert all(n["watched"] == pytest.approx(n["unclipped"], rel=1e-6) for n in norms)


@pytest.mark.slow
def test_the_ranks_count_each_reasons_dumps_alike_so_a_nan_after_another_event_is_replayed_on_both(runs: Path) -> None:
    """Rank 0's predicate at step 2 uses up that reason's one dump on both ranks (rank 1 fired with
    it); the NaN at step 5 is another reason's, so both ranks dump and replay it together."""
    events = [json.loads((runs / "budget" / f"events{rank}.json").read_text()) for rank in (0, 1)]
    assert [[(e["step"], e["reason"]) for e in mine] for mine in events] == [
        [(2, "predicate"), (5, "nonfinite")],
        [(2, "other_rank"), (5, "nonfinite")],
    ]
    assert all(mine[1]["ranks"] == [1, 0] and mine[1]["replay"]["reproduced"] for mine in events)
    assert "layers.0.mlp.fc" in events[1][1]["replay"]["origin"]


def _fsdp_main(rank: int, root: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    torchdebug.seed_all(0)
    model = GPT(CONFIG)
    for index, block in enumerate(model.layers):
        block = checkpoint_wrapper(block)
        block.compile(backend="aot_eager")
        fully_shard(block)
        model.layers[index] = block
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = torchdebug.Monitor(model, optimizer, dump_path=root, window=4)
    weight = model.layers[1].mlp.fc.weight
    unclipped = []
    for step in range(6):
        if step == 4 and rank == 1:
            with torch.no_grad():
                weight.to_local()[0, 0] = float("nan")  # this rank's shard

        monitor.step(_clipping(_closure(model, optimizer, step, rank), model, weight, unclipped))
    monitor.close()
    (event,) = monitor.events
    Path(root, f"event{rank}.json").write_text(json.dumps(event.to_dict()))
    names = {slot.name for slot in monitor.ring.slots}
    Path(root, f"slots{rank}.json").write_text(json.dumps(sorted(names)))
    index = next(i for i, slot in enumerate(monitor.ring.slots) if slot.name == _FSDP_GRADIENT)
    watched = monitor.ring.row(3)[index, STAT_KEYS.index("norm")]
    Path(root, f"norms{rank}.json").write_text(json.dumps({"watched": watched, "unclipped": unclipped[3]}))
    dist.barrier()


@pytest.mark.slow
def test_fsdp2_checkpointed_compiled_blocks_are_watched_by_shard(runs: Path) -> None:
    """The large-model recipe: FSDP2 parameters and gradients are watched through each rank's shard;
    a NaN in rank 1's shard reaches both ranks' forward through the all-gather, and the replays name
    rank 1 first."""
    tmp_path = runs / "fsdp"
    events = [json.loads((tmp_path / f"event{rank}.json").read_text()) for rank in (0, 1)]
    assert all(e["step"] == 4 and e["reason"] == "nonfinite" for e in events)
    assert all(e["slot"] == "forward/layers.1/module#0/output.0" for e in events)
    # both ranks show it in the same slot; the replays tell where it began: rank 1's shard went into
    # FSDP2's copy-in holding it, rank 0 got it from the all-gather
    assert [e["ranks"] for e in events] == [[1, 0], [1, 0]]
    replays = [e["replay"] for e in events]
    assert all(r["reproduced"] for r in replays) and [r["from_another_rank"] for r in replays] == [True, False]
    assert replays[0]["origin"].startswith("step 4: forward/layers.1/c10d._allgather_base_.default#0 ")
    assert replays[1]["origin"].startswith("step 4: forward/layers.1/fsdp.all_gather_copy_in.default#0 ")
    assert "NaN already in input.0." in replays[1]["origin"]
    slots = json.loads((tmp_path / "slots0.json").read_text())
    assert _FSDP_GRADIENT in slots
    assert "optimizer/layers.1.mlp.fc/module#0/parameter.weight" in slots
    # the closure clips: the gradient shards are watched as FSDP2's reduce-scatter left them, before
    for rank in (0, 1):
        norms = json.loads((tmp_path / f"norms{rank}.json").read_text())
        assert norms["watched"] == pytest.approx(norms["unclipped"], rel=1e-6) and norms["unclipped"] > 1e-2


_TP_OUTPUT = "forward/layers.0.mlp/module#0/output.0"


def _tp_main(rank: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torchdebug.seed_all(0)
    model = GPT(CONFIG)
    mesh = init_device_mesh("cpu", (2,))
    for block in model.layers:
        parallelize_module(block.mlp, mesh, {"fc": ColwiseParallel(), "out": RowwiseParallel()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = torchdebug.Monitor(model, optimizer, dump_path=root, window=4)
    for step in range(6):
        if step == 4 and rank == 1:
            with torch.no_grad():
                model.layers[1].mlp.fc.weight.to_local()[0, 0] = float("nan")  # this rank's shard

        monitor.step(_closure(model, optimizer, step, rank=0))  # one batch for both ranks, as tensor parallelism has
    monitor.close()
    (event,) = monitor.events
    index = next(i for i, slot in enumerate(monitor.ring.slots) if slot.name == _TP_OUTPUT)
    healthy = monitor.ring.row(3)[index].tolist()
    Path(root, f"event{rank}.json").write_text(json.dumps({"event": event.to_dict(), "healthy": healthy}))
    dist.barrier()


@pytest.mark.slow
def test_tensor_parallel_outputs_are_read_once_their_all_reduce_is_in(runs: Path) -> None:
    """RowwiseParallel hands its output's all-reduce out unwaited (an AsyncCollectiveTensor): the
    monitor waits for it, so both ranks watch the same reduced output (not their own partial sums,
    nor a buffer still being written), and a NaN in rank 1's shard of ``fc`` is seen in rank 0's
    ``mlp.out`` output, through its all-reduce (read after the layer's own hooks), after rank 1 saw it
    in its ``fc`` output: rank 1 is named first."""
    results = [json.loads((runs / "tp" / f"event{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0]["healthy"] == results[1]["healthy"]  # the reduced output, bit for bit
    events = [result["event"] for result in results]
    assert all(e["step"] == 4 and e["reason"] == "nonfinite" for e in events)
    assert events[1]["slot"] == "forward/layers.1.mlp.fc/module#0/output.0"
    assert events[0]["slot"] == "forward/layers.1.mlp.out/module#0/output.0"
    assert [e["ranks"] for e in events] == [[1, 0], [1, 0]]
    assert all(e["replay"]["reproduced"] for e in events)


def _fsdp_tp_main(rank: int, root: str) -> None:
    """FSDP2 over ``dp`` and tensor parallelism over ``tp`` on a 2 × 2 mesh: ranks 1 and 3 hold the
    same tensor-parallel half, each one half of it under FSDP2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torchdebug.seed_all(0)
    model = GPT(CONFIG)
    for block in model.layers:
        parallelize_module(block.mlp, mesh["tp"], {"fc": ColwiseParallel(), "out": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = torchdebug.Monitor(model, optimizer, dump_path=root, window=4)
    for step in range(6):
        if step == 4 and rank == 3:
            with torch.no_grad():
                model.layers[1].mlp.fc.weight.to_local()[0, 0] = float("nan")  # rank 3's piece of rank 1's and 3's half
        monitor.step(_closure(model, optimizer, step, mesh["dp"].get_local_rank()))
    monitor.close()
    (event,) = monitor.events
    Path(root, f"event{rank}.json").write_text(json.dumps(event.to_dict()))
    dist.barrier()


@pytest.mark.slow
def test_fsdp2_with_tensor_parallelism_names_where_the_nan_began_on_every_rank(tmp_path: Path) -> None:
    """FSDP2 with tensor parallelism, 4 ranks: the NaN in rank 3's shard reaches rank 1 through
    FSDP2's all-gather and ranks 0 and 2 through the MLP's all-reduce. Each replay names its own
    entry (not a view of a buffer FSDP2 handed out again, full of what the NaN step left there), and
    the ranks are named from where it began."""
    gloo.spawn(_fsdp_tp_main, tmp_path, str(tmp_path), world_size=4)
    events = [json.loads((tmp_path / f"event{rank}.json").read_text()) for rank in range(4)]
    assert [e["ranks"] for e in events] == [[3, 1, 0, 2]] * 4
    assert all(e["step"] == 4 and e["replay"]["reproduced"] for e in events)
    origins = [e["replay"]["origin"].split(" (phase")[0] for e in events]
    assert origins == [
        "step 4: forward/layers.1.mlp.out/_c10d_functional.all_reduce.default#0",
        "step 4: forward/layers.1/c10d._allgather_base_.default#0",
        "step 4: forward/layers.1.mlp.out/_c10d_functional.all_reduce.default#0",
        "step 4: forward/layers.1/fsdp.all_gather_copy_in.default#0",
    ]
    assert "NaN already in input.0." in events[3]["replay"]["origin"]
