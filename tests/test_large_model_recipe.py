"""The standard large-model recipe together (issue 23, item 6): FSDP2 + activation checkpointing +
per-block compile on 2 gloo ranks, with eager capture and with the graph dump.

Each rank trains a small GPT four times: eager, eager under a `Debugger`, blocks compiled, blocks
compiled with the graph dump. Capture must not change a bit of the step, and the dumps must compare
as a user would compare them: the sharded eager dump against a single process on the whole batch,
the graph dump against the eager dump of the same ranks, and against the single process too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch
from tests import gloo
from torchdebug.compile import CompilerConfig, get_backend

CONFIG = GPTConfig(n_layer=2, d_model=16, n_head=2, seq_len=8, vocab=32)
BATCH = 4
STEPS = 2
RUNS = ("eager", "eager_dump", "compiled", "graph_dump")
WRAPPERS = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod", "__dict__")


def _model(make_backend: Callable[[GPT], Any] | None = None, shard: bool = True) -> tuple[GPT, Any]:
    """The recipe: each block checkpointed, then compiled (with the backend ``make_backend`` builds
    for the root model), then sharded; the root sharded last. Returns the model and the backend."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = GPT(CONFIG)
    backend = make_backend(model) if make_backend is not None else None
    for index, block in enumerate(model.layers):
        block = checkpoint_wrapper(block)
        if backend is not None:
            block.compile(backend=backend)
        model.layers[index] = block
        if shard:
            fully_shard(block)
    if shard:
        fully_shard(model)
    return model, backend


def _train(model: GPT, batch: tuple[torch.Tensor, torch.Tensor], debugger: torchdebug.Debugger | None = None) -> torch.Tensor:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(STEPS):
        if debugger is not None:
            debugger.start(model)
        loss = model(*batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()
    if debugger is not None:
        debugger.close()
    return loss.detach()


def _backend(dump: Path | None) -> Callable[[GPT], Any]:
    """A backend factory: ``aot_eager``, with a statistics graph dump into ``dump`` when given."""

    def make(model: GPT) -> Any:
        config = CompilerConfig(backend="aot_eager")
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            config.dump_config.enable_dump = True
            config.dump_config.dump_path = str(dump)
            config.dump_config.task = "statistics"
        return get_backend(config, model=model)

    return make


def _rank_main(rank: int, root: str) -> None:
    tokens, targets = make_batch(CONFIG, batch=BATCH)
    share = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)  # each rank its half of the global batch
    batch = (tokens[share], targets[share])
    results = {}
    for run in RUNS:
        torch._dynamo.reset()
        compiled = {"compiled": _backend(None), "graph_dump": _backend(Path(root) / run)}.get(run)
        model, backend = _model(compiled)
        debugger = torchdebug.Debugger(Path(root) / run, task="statistics") if run == "eager_dump" else None
        loss = _train(model, batch, debugger)
        if run == "graph_dump":
            backend.data_dump.close()
        results[run] = {"loss": loss, **{name: param.full_tensor() for name, param in model.named_parameters()}}
    if rank == 0:
        torch.save(results, Path(root) / "results.pt")


def _single_process(path: Path) -> None:
    """The same model and steps in one process on the whole batch, checkpointed, not sharded."""
    model, _ = _model(shard=False)
    _train(model, make_batch(CONFIG, batch=BATCH), torchdebug.Debugger(path, task="statistics"))


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, torch.Tensor]]]:
    root = tmp_path_factory.mktemp("recipe")
    gloo.spawn(_rank_main, root, str(root))
    _single_process(root / "single")
    return root, torch.load(root / "results.pt")


@pytest.mark.slow
def test_capture_leaves_the_step_bit_identical(recipe) -> None:
    _, results = recipe
    for plain, captured in (("eager", "eager_dump"), ("compiled", "graph_dump")):
        for name, value in results[plain].items():
            assert torch.equal(results[captured][name], value), (captured, name)


@pytest.mark.slow
def test_records_are_named_like_the_plain_model(recipe) -> None:
    root, _ = recipe
    for run in ("eager_dump", "graph_dump"):
        dump = torchdebug.load(root / run)
        assert sorted(dump.ranks) == [0, 1] and not dump.partial_ranks
        records = dump.ranks[0].records()
        assert not [r.name for r in records if any(w in r.name for w in WRAPPERS)]
        assert {r.step for r in records} == set(range(STEPS))  # one step per training step, however many blocks
        assert {f"layers.{i}.attn.qkv" for i in range(CONFIG.n_layer)} <= {r.module for r in records}
    phases = {r.phase for r in torchdebug.load(root / "eager_dump").ranks[0].records()}
    assert "recompute" in phases


def _compares_cleanly(a: Path, b: Path, matched_side: str | None = None) -> None:
    """Compare ``a`` against ``b``: no error row, no first divergence, and at least 90% of the
    tensor rows of ``matched_side`` (``"a"`` or ``"b"``) matched when given."""
    result = torchdebug.compare(a, b)
    assert result.counts()["error"] == 0 and result.first_divergence is None, result.summary()
    if matched_side is not None:
        coverage = result.coverage()[matched_side]
        assert coverage["matched"] >= 0.9 * coverage["rows"], result.summary()


@pytest.mark.slow
def test_the_sharded_eager_dump_compares_with_a_single_process(recipe) -> None:
    root, _ = recipe
    _compares_cleanly(root / "eager_dump", root / "single", matched_side="b")


@pytest.mark.slow
def test_the_graph_dump_compares_with_the_eager_dump_and_the_single_process(recipe) -> None:
    root, _ = recipe
    _compares_cleanly(root / "graph_dump", root / "eager_dump", matched_side="a")
    _compares_cleanly(root / "graph_dump", root / "single")


def _accumulating_main(rank: int, path: str) -> None:
    """The recipe with the graph dump, each step two micro-batches of the rank's half batch, the
    first without gradient sync: FSDP2 then keeps the first's gradients on the unsharded parameters
    (the sharded ones hold none until the second's reduce-scatter)."""
    torch._dynamo.reset()
    model, backend = _model(_backend(Path(path)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens, targets = make_batch(CONFIG, batch=BATCH)
    for _ in range(STEPS):
        for micro in range(2):
            model.set_requires_gradient_sync(micro == 1)
            share = slice(rank * BATCH // 2 + micro, rank * BATCH // 2 + micro + 1)
            model(tokens[share], targets[share]).backward()
        optimizer.step()
        optimizer.zero_grad()
    backend.data_dump.close()


@pytest.mark.slow
def test_micro_batches_without_gradient_sync_are_one_step_of_the_graph_dump(tmp_path: Path) -> None:
    gloo.spawn(_accumulating_main, tmp_path, str(tmp_path / "dump"))
    run = torchdebug.load(tmp_path / "dump")
    for dump in run.ranks.values():
        records = dump.records()
        assert {record.step for record in records} == set(range(STEPS)), "a step per optimizer step"
        assert any(record.call == 1 and record.phase == "forward" for record in records), "the second micro-batch counts on"
