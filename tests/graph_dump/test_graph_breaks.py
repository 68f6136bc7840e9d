"""Graph breaks are ordinary in the graph dump (issue 49, item 1).

A mixture-of-experts layer whose experts run as a Python loop over the experts that were hit
breaks Dynamo's graph on ``nonzero``, ``.item()`` and a data-dependent branch: Dynamo compiles the
layer's ``forward``, each expert's ``forward`` and the code after the breaks as frames of their
own, traced from their own module, and runs one expert's graph once for each expert hit. The dump
still records one training step per step, names every record by its module's full path in the
model, and compares with an eager dump of the same model: whole model or block by block,
``aot_eager`` or inductor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import torchdebug
from tests.backends import ResidualBlock, dump_backend
from tests.graph_dump import training
from torchdebug._torch import frames
from torchdebug.graph_dump._instances import CompiledInstances, compiled_frame

STEPS = 2
VOCAB, WIDTH, HIDDEN, EXPERTS, TOP = 16, 8, 16, 4, 2


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, WIDTH, bias=False)
        self.w3 = nn.Linear(WIDTH, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtureOfExperts(nn.Module):
    """Mixtral's sparse block as transformers writes it for eager experts: a Python loop over the
    experts that were hit."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        x = x.view(-1, width)
        logits = self.gate(x)
        if logits.abs().max() > 30:  # a data-dependent branch
            logits = logits.clamp(-30, 30)
        weights = F.softmax(logits, dim=1, dtype=torch.float)
        weights, selected = torch.topk(weights, TOP, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        mask = F.one_hot(selected, num_classes=EXPERTS).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for index in hit:
            expert = self.experts[index.item()]
            rank, token = torch.where(mask[index].squeeze(0))
            y = expert(x[token]) * weights[token, rank, None]
            out.index_add_(0, token, y.to(x.dtype))
        return out.reshape(batch, length, width)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.moe_norm = nn.LayerNorm(WIDTH)
        self.moe = MixtureOfExperts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(self.norm(x))
        return x + self.moe(self.moe_norm(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _model() -> Model:
    torch.manual_seed(0)
    return Model()


def _train(model: nn.Module, run: nn.Module, step: int) -> None:
    generator = torch.Generator().manual_seed(step)
    tokens, targets = (torch.randint(0, VOCAB, (2, 8), generator=generator) for _ in range(2))
    run(tokens, targets).backward()
    model.zero_grad()


@pytest.fixture(scope="module")
def eager_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return training.eager_dump(tmp_path_factory.mktemp("eager"), _model(), _train, STEPS)


@pytest.mark.parametrize(
    ("backend", "spelling", "root"),
    [
        ("aot_eager", "whole", True),
        ("aot_eager", "whole", False),  # the root found from the compiled module
        ("aot_eager", "method", True),  # block by block
        ("inductor", "whole", True),
        ("inductor", "method", True),
    ],
)
def test_a_loop_over_experts_records_one_step_per_step_with_full_module_paths(
    tmp_path: Path, eager_dump: Path, backend: str, spelling: str, root: bool
) -> None:
    records = training.compiled_dump(tmp_path / "graph", _model(), _train, STEPS, backend=backend, spelling=spelling, root=root)
    assert {r.step for r in records} == set(range(STEPS)), "one step per training step, not per graph run"
    modules = {r.module for r in records}
    assert all(module.startswith("layers.") for module in modules), sorted(m for m in modules if not m.startswith("layers."))
    names = {r.name for r in records if r.step == 1}
    for layer in range(2):
        assert f"forward/layers.{layer}.moe.gate/aten.mm.default#0/output.0" in names
        assert f"forward/layers.{layer}.norm/aten.var_mean.correction#0/output.0" in names or backend == "aot_eager"
        experts = {m for m in modules if m.startswith(f"layers.{layer}.moe.experts.") and m.endswith(".w1")}
        assert len(experts) > 1, "each expert's graph run is named by the expert that ran it"

    result = torchdebug.compare(tmp_path / "graph", eager_dump)
    assert not [row.name for row in result.rows if row.verdict == "error"], result.summary()
    compiled = result.coverage()["a"]
    # inductor's decompositions leave nodes inside eager ops (a layer norm's var_mean), judged with them
    counted = compiled["matched"] + (compiled["inside"] if backend != "aot_eager" else 0)
    assert counted >= 0.9 * compiled["rows"], result.summary()
    assert not compiled["other_modules"], "every compiled module has eager records"


def test_graphs_remember_the_frame_they_were_compiled_from_and_find_its_module_when_they_run() -> None:
    """The seams the naming rests on: the first stack frame of a node names the compiled frame,
    a running graph finds that frame's module on the stack, and the module the user compiled."""
    torch._dynamo.reset()
    model = _model()
    found: list = []
    seen_frames = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> object:
        frame = compiled_frame(gm.graph)
        seen_frames.append(frame)
        instances = CompiledInstances(None)

        def run(*args: object) -> object:
            found.append((instances.running(frame), frames.outermost_compiled_module(frames.running_frame(*frame[:2]))))
            return gm.forward(*args)

        return run

    block = model.layers[1]
    block.compile(backend=backend)
    block(torch.randn(2, 4, WIDTH))
    torch._dynamo.reset()
    assert seen_frames[0].function == "forward" and seen_frames[0].local == "self"
    functions = {frame.function for frame in seen_frames}
    assert any(name.startswith("torch_dynamo_resume_in_forward") for name in functions), functions
    instance, compiled = found[0]
    assert compiled is block and instance is not None and instance.key == id(block) and instance.path == ""
    paths = {instance.path for instance, _ in found if instance is not None}
    assert "moe" in paths and any(path.startswith("moe.experts.") for path in paths), paths


@pytest.mark.parametrize("guarded", [False, True])
def test_a_block_running_a_graph_compiled_for_a_block_with_other_hooks_is_warned_of(
    tmp_path: Path, guarded: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Blocks compiled one by one share graphs: Dynamo, which does not guard on module hooks by
    default, runs the second block with a graph compiled for another (from the second step on, if
    not at once), which has no trace of the forward hook on the second block's submodule, so the
    hook does not run. The dump warns, once, naming both blocks and the hooks; where hooks are
    guarded each set of hooks gets its own graph."""
    torch._dynamo.reset()
    model = nn.Sequential(*(ResidualBlock() for _ in range(3)))
    model[1].inner.register_forward_hook(lambda module, args, output: output * 2)
    backend = dump_backend(tmp_path, backend="aot_eager", model=model)
    for block in model:
        block.compile(backend=backend)
    x = torch.randn(2, 8)
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=not guarded):
        with caplog.at_level("WARNING", logger="torchdebug.graph_dump._capture"):
            for _ in range(2):
                model(x)
    backend.data_dump.close()
    torch._dynamo.reset()
    warned = [record.getMessage() for record in caplog.records if "hooks differ" in record.getMessage()]
    if guarded:
        assert warned == []
    else:
        assert len(warned) == 1 and warned[0].startswith("torchdebug: 1 runs the graph Dynamo compiled for ")
        assert "[('inner', 0, 1, 0, 0)] against none" in warned[0]
