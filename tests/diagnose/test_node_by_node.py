"""Node by node on graphs with fused attention, multi-output ops, random ops and ops that cannot be
recomputed: the wrong node is named, or the notes say why none is, and nothing raises.

The graphs are ATen graphs traced with ``make_fx`` (what inductor receives, without compiling it);
the "compiled" values are those of an interpretation of the graph in which one node is made wrong,
as a planted inductor bug would make it. Every other value is what eager computes, so no assertion
depends on which kernel computes a float.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from tests.diagnose.llama import tiny_llama
from torchdebug._torch.dispatch import op_schema
from torchdebug.diagnose import _attention as attention
from torchdebug.diagnose._instrument import AotGraph
from torchdebug.diagnose._nodes import first_bad_node

SDPA_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
SDPA_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def compiled_values(gm: torch.fx.GraphModule, args: tuple[Any, ...], plant: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """Every tensor node's value, as the instrumented inductor hands them back, with ``plant[name]``
    applied to that node's result (and so seen by every node after it)."""
    values: dict[str, Any] = {}

    class Planted(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.name in plant:
                result = plant[n.name](result)
            if isinstance(result, torch.Tensor):
                values[n.name] = result.detach().clone()
            return result

    Planted(gm).run(*args)
    return values


def node_of(gm: torch.fx.GraphModule, target: Any) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.target is target)


@pytest.fixture(scope="module")
def llama_step() -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    """One training step of the tiny Llama (forward, then gradients of every weight) as one ATen
    graph: fused QKV, complex RoPE, CPU SDPA forward and backward, ReLU-GLU."""
    model, tokens = tiny_llama()
    names = [name for name, _ in model.named_parameters()]

    def step(tokens: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = torch.func.functional_call(model, dict(zip(names, weights)), (tokens,))
        return out, *torch.autograd.grad(out.square().sum(), weights)

    args = (tokens, *(p.detach().clone().requires_grad_() for p in model.parameters()))
    return make_fx(step)(*args), args


def _diagnose(gm: torch.fx.GraphModule, args: tuple[Any, ...], plant: dict[str, Callable[[Any], Any]], notes: list[str]) -> Any:
    graph = AotGraph("model__0", "forward", gm, compiled_values(gm, args, plant))
    return first_bad_node([graph], notes=notes)


def test_a_wrong_relu_after_cpu_sdpa_and_complex_rope_is_named(llama_step: Any) -> None:
    gm, args = llama_step
    assert any(n.target is SDPA_CPU for n in gm.graph.nodes) and any(n.target is SDPA_CPU_BACKWARD for n in gm.graph.nodes)
    relu = node_of(gm, torch.ops.aten.relu.default)
    notes: list[str] = []
    found = _diagnose(gm, args, {relu.name: lambda t: t + 1}, notes)
    assert found is not None and found.node == relu.name and found.target == "aten.relu.default"
    assert notes == []  # every node before it was recomputed and judged, the SDPA op included


def test_a_correct_graph_has_no_bad_node_and_nothing_unjudged(llama_step: Any) -> None:
    gm, args = llama_step
    notes: list[str] = []
    assert _diagnose(gm, args, {}, notes) is None
    assert notes == []


def test_a_wrong_attention_output_names_the_sdpa_op_against_attention_in_float64(llama_step: Any) -> None:
    gm, args = llama_step
    sdpa = node_of(gm, SDPA_CPU)
    found = _diagnose(gm, args, {sdpa.name: lambda r: (r[0] * 1.01, *r[1:])}, [])
    assert found is not None and found.node == sdpa.name
    assert found.detail.startswith("output 0 ")
    assert found.subgraph is not None and len(found.subgraph.graph.find_nodes(op="output")[0].args[0]) == 2  # both results


def test_a_wrong_logsumexp_is_not_blamed_on_the_forward_kernel_but_on_the_backward_that_reads_it(llama_step: Any) -> None:
    gm, args = llama_step
    sdpa, backward = node_of(gm, SDPA_CPU), node_of(gm, SDPA_CPU_BACKWARD)
    found = _diagnose(gm, args, {sdpa.name: lambda r: (r[0], r[1] + 1)}, [])  # kernel bookkeeping: not compared
    assert found is not None and found.node == backward.name  # its float64 side is autograd of attention


def test_a_wrong_attention_gradient_names_the_sdpa_backward_op(llama_step: Any) -> None:
    gm, args = llama_step
    backward = node_of(gm, SDPA_CPU_BACKWARD)
    found = _diagnose(gm, args, {backward.name: lambda r: (r[0], r[1] * 1.01, r[2])}, [])
    assert found is not None and found.node == backward.name and found.detail.startswith("output 1 ")


def _native_dropout_then_relu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Dropout as AOT autograd traces it for training: one random op with two results."""
    return torch.relu(torch.ops.aten.native_dropout(x @ w, 0.5, True)[0]) * 2


def _functional_dropout_then_relu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Dropout as it is traced without autograd: an in-place ``bernoulli_`` mask."""
    return torch.relu(F.dropout(x @ w, p=0.5, training=True)) * 2


@pytest.fixture(scope="module")
def dropout_graph() -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    args = (torch.randn(4, 8), torch.randn(8, 8))
    return make_fx(_native_dropout_then_relu)(*args), args


@pytest.mark.parametrize(
    ("program", "random_op"),
    [
        (_native_dropout_then_relu, torch.ops.aten.native_dropout.default),
        (_functional_dropout_then_relu, torch.ops.aten.bernoulli_.float),
    ],
)
def test_a_wrong_relu_after_dropout_is_named_and_the_dropout_is_skipped_with_a_note(program: Any, random_op: Any) -> None:
    args = (torch.randn(4, 8), torch.randn(8, 8))
    gm = make_fx(program)(*args)
    dropout, relu = node_of(gm, random_op), node_of(gm, torch.ops.aten.relu.default)
    notes: list[str] = []
    found = _diagnose(gm, args, {relu.name: lambda t: t - 1}, notes)
    assert found is not None and found.node == relu.name
    assert len(notes) == 1 and dropout.name in notes[0] and "random" in notes[0]


def test_a_random_op_whose_compiled_value_is_missing_is_reported_not_raised(dropout_graph: Any) -> None:
    gm, args = dropout_graph
    dropout = node_of(gm, torch.ops.aten.native_dropout.default)
    relu = node_of(gm, torch.ops.aten.relu.default)
    values = compiled_values(gm, args, {relu.name: lambda t: t - 1})
    for user in dropout.users:  # the compiled code kept neither result of the dropout
        del values[user.name]
    for name in [n.name for n in gm.graph.nodes if n.target is operator.getitem]:
        values.pop(name, None)
    notes: list[str] = []
    found = first_bad_node([AotGraph("model__0", "forward", gm, values)], notes=notes)
    # the relu reads the lost dropout, so it takes its compiled value and cannot be judged
    assert found is None
    assert any(dropout.name in note and "neither be recomputed nor read" in note for note in notes), notes


@torch.library.custom_op("torchdebug_tests::float32_only", mutates_args=())
def float32_only(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise RuntimeError(f"float32_only: no kernel for {x.dtype}")
    return x * 3


@float32_only.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_an_op_without_a_float64_kernel_is_skipped_with_a_note_and_later_nodes_are_judged() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(float32_only(x.sin())) + 1

    args = (torch.randn(16),)
    gm = make_fx(program)(*args)
    relu = node_of(gm, torch.ops.aten.relu.default)
    notes: list[str] = []
    found = _diagnose(gm, args, {relu.name: lambda t: t + 1}, notes)
    assert found is not None and found.node == relu.name
    assert len(notes) == 1 and "could not be recomputed" in notes[0] and "no kernel for torch.float64" in notes[0]


def _attention_arguments(op: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor) -> dict[str, Any]:
    """Every argument of an SDPA kernel op by name: causal, no dropout, no mask, default scale."""
    given = {"query": q, "key": k, "value": v, "grad_out": grad, "grad_out_": grad, "is_causal": True, "dropout_p": 0.0}
    given |= {"compute_log_sumexp": True, "grad_input_mask": [True, True, True, False], "max_q": q.size(-2), "max_k": k.size(-2)}
    return {a.name: given.get(a.name) for a in op_schema(op).arguments}


@pytest.mark.parametrize("name", sorted(attention.FORWARD))
def test_every_sdpa_kernel_is_read_by_argument_name_and_compared_with_attention_in_float64(name: str) -> None:
    q, k, v, grad = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(4))
    expected, logsumexp = SDPA_CPU(q, k, v, 0.0, True)  # the CPU kernel runs in float64
    expected_grads = SDPA_CPU_BACKWARD(grad, q, k, v, expected, logsumexp, 0.0, True)
    for op, want in (
        (getattr(torch.ops.aten, name).default, [expected]),
        (getattr(torch.ops.aten, f"{name}_backward").default, expected_grads),
    ):
        kwargs = _attention_arguments(op, q, k, v, grad)
        assert not attention.is_random(op, (), kwargs) and attention.is_random(op, (), {**kwargs, "dropout_p": 0.1})
        eager = tuple(torch.zeros(()) for _ in op_schema(op).returns)  # the kernel's own results (CUDA only)
        wide, compared = attention.reference(op, (), kwargs, eager)
        assert compared == set(range(len(want)))
        for index, value in enumerate(want):
            assert torch.allclose(wide[index], value, rtol=1e-10, atol=1e-12), (op, index)


def test_attention_in_float64_applies_a_boolean_mask_and_repeats_grouped_heads() -> None:
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    k, v = torch.randn(1, 2, 5, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8, dtype=torch.float64)
    mask = torch.rand(3, 5) > 0.3
    mask[:, 0] = True
    kwargs = {"query": q, "key": k, "value": v, "attn_mask": mask, "scale": 0.5}
    wide, _ = attention.reference(SDPA_CPU, (), kwargs, (torch.zeros(()), torch.zeros(())))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5, enable_gqa=True)
    assert torch.allclose(wide[0], expected, rtol=1e-10, atol=1e-12)
    assert math.isfinite(wide[0].sum().item())


def test_an_uninitialised_allocation_is_never_judged() -> None:
    # F.dropout traced without autograd fills an empty_like with bernoulli_: whatever the memory held
    # before is no error (it failed at random in the suite when that memory held huge numbers)
    args = (torch.randn(4, 8), torch.randn(8, 8))
    gm = make_fx(_functional_dropout_then_relu)(*args)
    empty, relu = node_of(gm, torch.ops.aten.empty_like.default), node_of(gm, torch.ops.aten.relu.default)
    found = _diagnose(gm, args, {empty.name: lambda t: torch.full_like(t, 3e38), relu.name: lambda t: t - 1}, [])
    assert found is not None and found.node == relu.name
