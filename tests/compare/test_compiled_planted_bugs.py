"""A bug planted on the compiled side of an eager-against-compiled compare (issue 46): named at the
planted op, and nothing after it blamed, with inductor's graphs (run eagerly, as the dump backend
runs them) as with ``aot_eager``'s."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug
from tests.backends import ResidualBlock, graph_and_eager_dumps


def _masked_softmax(h: torch.Tensor) -> torch.Tensor:
    """A causal attention's masked fill and softmax, each on a line of its own (as the GPT example)."""
    mask = torch.ones(h.shape, dtype=torch.bool).tril()
    h = h.masked_fill(~mask, float("-inf"))
    return torch.softmax(h, dim=-1)


def _layer_norm(h: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(h, h.shape[-1:])


_NORMS = {
    "tanh": nn.Tanh,
    "layer_norm": lambda: nn.LayerNorm(16),
    "batch_norm": lambda: nn.BatchNorm1d(16),
    "gelu": nn.GELU,
}
"""The op between the two layers, by name: it makes the modules' ``norm``."""

_CALLS = {"gelu_call": torch.nn.functional.gelu, "masked_softmax_call": _masked_softmax, "layer_norm_call": _layer_norm}
"""The op between the two layers called in the model's own forward, in the scale's module."""


class _Scaled(nn.Module):
    """Two linear layers with ``norm`` between them; ``scale`` multiplies the first layer's output
    (the planted bug), before ``norm`` or (``scale_after``) after it."""

    def __init__(self, scale: float, norm: str = "tanh", scale_after: bool = True) -> None:
        super().__init__()
        self.scale, self.scale_after, self.call = scale, scale_after, _CALLS.get(norm)
        self.fc1, self.norm, self.fc2 = nn.Linear(8, 16), _NORMS.get(norm, nn.Identity)(), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.scale_after:
            h = self.call(h) if self.call is not None else self.norm(h)
        if self.scale != 1.0:
            h = h * self.scale
        if not self.scale_after:
            h = self.call(h) if self.call is not None else self.norm(h)
        return self.fc2(h).pow(2).mean()


def _step(model: nn.Module) -> None:
    """Forward, backward and a plain SGD update (the same parameters through a compiled wrapper)."""
    model(torch.randn(6, 8, generator=torch.Generator().manual_seed(1))).backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= 0.1 * parameter.grad
            parameter.grad = None


def _compare(
    tmp_path: Path, backend_name: str, scale: float, norm: str = "tanh", scale_after: bool = True, steps: int = 1
) -> torchdebug.CompareResult:
    """A graph dump of ``_Scaled(scale, norm, scale_after)``'s steps against an eager dump of the healthy one's."""
    pair = graph_and_eager_dumps(
        tmp_path,
        lambda: _Scaled(scale, norm, scale_after),
        lambda: _Scaled(1.0, norm, scale_after),
        _step,
        backend=backend_name,
        steps=steps,
    )
    return torchdebug.compare(*pair)


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_a_planted_scale_is_the_one_error_and_the_weight_gradients_after_it_inherit(tmp_path: Path, backend_name: str) -> None:
    """Inductor's backward holds the weight gradients' transposes as nodes of the eager ``t`` calls,
    so those calls' inputs have no partner: their outputs, which the bug changed, were blamed ('its
    inputs differ by only 0'). The scale, filed inside the loss's ``ones_like``, is one-sided."""
    result = _compare(tmp_path, backend_name, 1.05)
    first = result.first_divergence
    assert first is not None and first.name == "forward/<root>/aten.mul.Tensor#0/output.0"
    assert first.match == "only_a" and "only A runs this op" in first.message
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]


@pytest.mark.parametrize(
    ("norm", "backend_name"),
    [("layer_norm", "aot_eager"), ("layer_norm", "inductor"), ("batch_norm", "inductor"), ("gelu", "inductor")],
)
def test_a_planted_scale_before_a_decomposed_op_of_another_module_is_named(tmp_path: Path, norm: str, backend_name: str) -> None:
    """The eager norm reads the first layer's output; the compiled norm's nodes read it scaled. The
    norm's input is paired with what those nodes read (was: with the first layer's output, so the
    norm was blamed, 'its inputs differ by only 0', and the scale filed inside an eager op of the
    loss). With inductor the scale is judged after the value it changed: that blame stands."""
    result = _compare(tmp_path, backend_name, 1.05, norm, scale_after=False)
    first = result.first_divergence
    assert first is not None and first.name == "forward/<root>/aten.mul.Tensor#0/output.0" and first.match == "only_a"
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_a_planted_scale_after_a_decomposed_op_of_its_module_is_named(tmp_path: Path, backend_name: str) -> None:
    """Inductor's GELU is nodes of one module with the scale after them: the eager GELU's output is
    paired with the node that made a value agreeing with it, not with the scaled value that the next
    layer reads (was: the GELU blamed, and the scale filed inside it)."""
    result = _compare(tmp_path, backend_name, 1.05, "gelu_call")
    first = result.first_divergence
    assert first is not None and first.op == "aten.mul.Tensor" and first.match == "only_a"
    assert "only A runs this op" in first.message
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]


def test_a_scale_after_a_batch_norm_is_the_only_error_in_every_step(tmp_path: Path) -> None:
    """In the second step what differs upstream (the first step's update) moves the norm's output a
    little, so no compiled value agrees with eager's: the norm's output is paired with the nearest
    value on the scale's way, not with the scaled one (was: the norm blamed in step 1)."""
    result = _compare(tmp_path, "aot_eager", 1.05, "batch_norm", steps=2)
    errors = [(row.step, row.name) for row in result.rows if row.verdict == "error"]
    assert errors == [(0, "forward/<root>/aten.mul.Tensor#0/output.0"), (1, "forward/<root>/aten.mul.Tensor#0/output.0")]


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.pow(2).mean()


def _scaled_forward(module: nn.Module, *args: torch.Tensor) -> torch.Tensor:
    return module._old_forward(*args) * 1.05


def _replace_forward(model: _Blocks, style: str) -> _Blocks:
    """``blocks.1.inner``'s forward replaced on the instance, scaling its output by 1.05: by a closure
    over the bound forward, or as accelerate's hooks replace it (a ``functools.partial``)."""
    inner = model.blocks[1].inner
    if style == "closure":
        bound = inner.forward
        inner.forward = lambda x: bound(x) * 1.05
    else:
        inner._old_forward = inner.forward
        inner.forward = functools.update_wrapper(functools.partial(_scaled_forward, inner), inner._old_forward)
    return model


@pytest.mark.parametrize("style", ["closure", "partial"])
def test_a_forward_replaced_on_an_instance_names_the_modules_it_reaches_where_they_sit(tmp_path: Path, style: str) -> None:
    """Dynamo names a module that the replaced forward reaches by the way it got there
    (``blocks.1.inner._old_forward.__self__.fc1``): the graph dump follows that way on the running
    block and names the module where it sits in the model, so its calls pair with eager's and the
    scale is named (was: ``fc2`` blamed, its eager calls one-sided)."""

    def compile_blocks(model: nn.Module, backend: object) -> nn.Module:
        for block in model.blocks:
            block.compile(backend=backend)
        return model

    pair = graph_and_eager_dumps(tmp_path, lambda: _replace_forward(_Blocks(), style), _Blocks, _step, compile=compile_blocks)
    modules = {record.module for record in torchdebug.load(pair[0]).ranks[0].records()}
    assert {"blocks.1.inner.fc1", "blocks.1.inner.fc2"} <= modules and not any("__" in module for module in modules)
    result = torchdebug.compare(*pair)
    first = result.first_divergence
    assert first is not None and first.name == "forward/blocks.1.inner/aten.mul.Tensor#0/output.0"
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_a_batch_norms_running_statistics_written_back_are_the_norms(tmp_path: Path, backend_name: str) -> None:
    """Functionalization writes a BatchNorm's new running statistics back into its buffers by
    ``copy_`` nodes that have no module: they are the norm's, as eager's update in place is (were
    the root's, and the second step filed them inside the eager update's ``sub_`` of the norm's
    weight: 2 false errors on a healthy pair with ``aot_eager``)."""
    healthy = _compare(tmp_path / "healthy", backend_name, 1.0, "batch_norm", steps=2)
    assert healthy.counts()["error"] == 0
    written = {
        row.record_a.module for row in healthy.rows if row.record_a is not None and row.record_a.op == "aten.copy_.default"
    }
    assert written == {"norm"}
    planted = _compare(tmp_path / "planted", backend_name, 1.05, "batch_norm", scale_after=False, steps=2)
    errors = [(row.step, row.name) for row in planted.rows if row.verdict == "error"]
    assert errors == [(0, "forward/<root>/aten.mul.Tensor#0/output.0"), (1, "forward/<root>/aten.mul.Tensor#0/output.0")]


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
def test_a_planted_scale_before_a_masked_fill_of_its_module_is_named(tmp_path: Path, backend_name: str) -> None:
    """Inductor folds the scale into the masked fill's ``where``, in the scale's module: the eager
    masked fill's input is paired with what the ``where`` reads, the scaled value, made on another
    line than the ``where``'s (was: with the value before the scale, so the softmax was blamed,
    'its inputs were not compared')."""
    result = _compare(tmp_path, backend_name, 1.05, "masked_softmax_call", scale_after=False)
    first = result.first_divergence
    assert first is not None and first.name == "forward/<root>/aten.mul.Tensor#0/output.0" and first.match == "only_a"
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]


@pytest.mark.parametrize("backend_name", ["aot_eager", "inductor"])
@pytest.mark.parametrize("call", ["masked_softmax_call", "layer_norm_call", "gelu_call"])
def test_a_healthy_pair_with_decomposed_ops_in_one_module_has_no_error(tmp_path: Path, call: str, backend_name: str) -> None:
    """No scale: a decomposed op's own nodes (a LayerNorm's centred input, the masked scores a
    softmax reads) are never taken for a value changed on the way into it."""
    result = _compare(tmp_path, backend_name, 1.0, call, scale_after=False, steps=2)
    assert result.first_divergence is None and not [row.name for row in result.rows if row.verdict == "error"]
