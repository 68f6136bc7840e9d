"""Graph dumps of models compiled block by block name records like whole-model compiles (issue 23, item 5).

Blocks compiled one by one run one graph (``torch.compile(block)``) or recompiles of one frame
(``block.compile()``), traced from the block: the records carry the path of the block that ran,
one training step is one step however many blocks ran the graph, and the dump compares with an
eager dump of the same model as well as a dump of the whole model compiled does.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch._dynamo

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch
from tests.graph_dump import training
from torchdebug._torch.nn import strip_wrappers
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump._instances import NO_INSTANCE, CompiledInstances, in_instance
from torchdebug.graph_dump._node_names import eager_module_path, graph_is_rooted, module_of

CONFIG = GPTConfig(n_layer=3, d_model=32, n_head=2, seq_len=8, vocab=64)
STEPS = 2


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def _train(model: torch.nn.Module, run: torch.nn.Module, step: int) -> None:
    tokens, targets = make_batch(CONFIG, batch=2, seed=step)
    run(tokens, targets).backward()
    model.zero_grad()


def _compiled_dump(path: Path, spelling: str, root: bool = True) -> list[torchdebug.records.Record]:
    """Statistics of every node (``aot_eager``): of each block, the blocks compiled one by one
    (``spelling`` ``method`` or ``wrapper``), or of the whole model (``whole``)."""
    return training.compiled_dump(path, _model(), _train, STEPS, spelling=spelling, root=root)


@pytest.fixture(scope="module")
def eager_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return training.eager_dump(tmp_path_factory.mktemp("eager"), _model(), _train, STEPS)


@pytest.fixture(scope="module")
def whole_model(eager_dump: Path, tmp_path_factory: pytest.TempPathFactory) -> torchdebug.compare.CompareResult:
    path = tmp_path_factory.mktemp("whole")
    _compiled_dump(path, "whole")
    return torchdebug.compare(eager_dump, path)


@pytest.mark.parametrize("spelling", ["method", "wrapper"])
def test_per_block_records_carry_the_block_path_count_steps_and_compare_with_eager(
    tmp_path: Path, eager_dump: Path, whole_model: torchdebug.compare.CompareResult, spelling: str
) -> None:
    records = _compiled_dump(tmp_path / "compiled", spelling)
    assert {r.step for r in records} == set(range(STEPS)), "one step per training step, not per block"
    assert not [r.name for r in records if "_orig_mod" in r.name or "_orig_mod" in (r.fwd or "")]
    names = {r.name: r for r in records if r.step == 0}
    for block in range(CONFIG.n_layer):
        qkv = f"layers.{block}.attn.qkv"
        assert f"forward/{qkv}/aten.addmm.default#0/output.0" in names
        assert f"forward/layers.{block}/aten.add.Tensor#0/output.0" in names  # the block's own residual add
        gradient = names[f"backward/{qkv}/aten.mm.default#0/output.0"]
        assert gradient.fwd == f"forward/{qkv}/aten.addmm.default#0", "a backward run names the forward of its own block"
    assert not [r.name for r in records if r.module.startswith("attn") or r.module.startswith("mlp")]

    result = torchdebug.compare(eager_dump, tmp_path / "compiled")
    # the eager slots pair as with the whole model compiled; the embeddings, final norm and loss run
    # outside the compiled blocks, so no compiled dump of the blocks holds them: counted apart
    eager, whole = result.coverage()["a"], whole_model.coverage()["a"]
    assert eager["matched"] >= 0.9 * eager["rows"] and eager["matched"] / eager["rows"] >= whole["matched"] / whole["rows"]
    assert {"tok", "pos", "ln_f", "<root>"} <= set(eager["other_modules"]), result.summary()
    blocks = [m for m in eager["other_modules"] if m.startswith("layers.") and not m.endswith((".weight", ".bias"))]
    assert not blocks, "a block's own ops are compared (its parameters' gradient accumulation runs in eager autograd)"
    assert "modules the other side has no record of are not compared (<root>" in result.summary()
    # no error row, per block or whole model (aot_eager's backward graph transposes an attention's
    # saved tensors in another order than eager autograd: their namesakes are other values)
    for compared in (result, whole_model):
        assert not [row.name for row in compared.rows if row.verdict in ("error", "warning")], compared.summary()
    passed = {row.name for row in result.rows if row.verdict == "pass" and row.step == 1}
    for block in range(CONFIG.n_layer):
        assert f"forward/layers.{block}.mlp.fc/aten.addmm.default#0/output.0" in passed
        assert f"backward/layers.{block}.mlp.fc/aten.mm.default#0/output.0" in passed


def test_without_the_root_model_each_block_run_takes_its_own_call_indices_forward_and_backward(tmp_path: Path) -> None:
    records = _compiled_dump(tmp_path / "compiled", "wrapper", root=False)
    assert {r.step for r in records} == set(range(STEPS))
    first = [r for r in records if r.step == 0 and r.io == "output" and r.arg == "0"]
    forward = [r.call for r in first if r.name.startswith("forward/attn.qkv/aten.addmm.default#")]
    assert forward == list(range(CONFIG.n_layer))  # blocks in call order
    backward = [(r.call, r.fwd) for r in first if r.name.startswith("backward/attn.qkv/aten.mm.default#")]
    # two per block (gradients of the input and of the weight); autograd runs the blocks' backward
    # graphs last block first, and each names the forward call of its own block
    assert sorted(call for call, _ in backward) == list(range(2 * CONFIG.n_layer))
    assert dict(backward) == {
        call: f"forward/attn.qkv/aten.addmm.default#{CONFIG.n_layer - 1 - call // 2}" for call, _ in backward
    }


def test_module_paths_leave_module_wrappers_out() -> None:
    assert eager_module_path("L['self'].layers[0]._orig_mod.attn") == "layers.0.attn"
    assert eager_module_path("L['self']._orig_mod") == "<root>"
    checkpointed = "L['self'].layers[1].__dict__['_modules']['_checkpoint_wrapped_module'].attn"  # checkpoint_wrapper
    assert eager_module_path(checkpointed) == "layers.1.attn"
    assert eager_module_path("L['self'].__dict__['_modules']['_checkpoint_wrapped_module']") == "<root>"
    assert strip_wrappers("layers.1._orig_mod.mlp.fc") == "layers.1.mlp.fc"
    assert in_instance("layers.1", "<root>") == "layers.1" and in_instance("layers.1", "attn.qkv") == "layers.1.attn.qkv"
    assert in_instance("", "attn.qkv") == "attn.qkv"


def test_a_forward_wrapped_by_a_decorator_is_named_as_the_module_itself() -> None:
    """Dynamo names the compiled module ``L['args'][0]`` when a ``*args`` decorator wraps its
    ``forward`` (transformers 5.24 wraps its models' so): paths must not gain a ``0.`` in front."""

    def wrapped(forward):  # noqa: ANN001, ANN202
        @functools.wraps(forward)
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            return forward(*args, **kwargs)

        return wrapper

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 4))

        @wrapped
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.body(x))

    rooted, paths = [], []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> torch.fx.GraphModule:
        rooted.append(graph_is_rooted(gm.graph))
        paths.extend(module_of(node, False, rooted[-1]) for node in gm.graph.nodes if node.op == "call_function")
        return gm

    torch._dynamo.reset()
    torch.compile(Wrapped(), backend=backend)(torch.randn(2, 4))
    torch._dynamo.reset()
    assert rooted == [True] and paths == ["body.0", "<root>"]
    assert eager_module_path("L['args'][0].body[0]") == "body.0" and eager_module_path("L['args'][0]") == "<root>"


def test_compiled_instances_name_the_compiled_module_a_parameter_belongs_to() -> None:
    torch._dynamo.reset()
    model = _model()
    model.layers[0] = torch.compile(model.layers[0], backend="eager")
    model.layers[1].compile(backend="eager")
    instances = CompiledInstances(model)
    assert instances.of(model.layers[0]._orig_mod.mlp.fc.weight).path == "layers.0"
    assert instances.of(model.layers[1].attn.qkv.bias).path == "layers.1"
    assert instances.of(model.layers[2].attn.qkv.bias).path == ""  # not compiled on its own
    assert instances.of(None) == NO_INSTANCE
    weight = model.layers[1].ln1.weight
    assert CompiledInstances(None).of(weight) == (id(weight), "")  # told apart, not named
    torch._dynamo.reset()


def test_a_root_model_that_is_not_a_module_is_a_one_line_error() -> None:
    with pytest.raises(torchdebug.ConfigError, match=r"^model: got str, expected the root torch.nn.Module"):
        get_backend(CompilerConfig(), model="layers")  # type: ignore[arg-type]
