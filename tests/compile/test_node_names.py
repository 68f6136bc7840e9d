"""Eager-style names of FX nodes: ops the compiler decomposed one-to-one keep the eager op's name."""

from __future__ import annotations

import copy

import torch
import torch.fx

from torchdebug.graph_dump import _node_names as node_names

aten = torch.ops.aten


def _graph(*calls: tuple[str, object, object, int | None]) -> tuple[torch.fx.Graph, dict[str, torch.fx.Node]]:
    """A graph of ``(name, target, original_aten, seq_nr)`` calls, each on the placeholder ``x``."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nodes = {}
    for name, target, original, seq_nr in calls:
        node = graph.call_function(target, (x,))
        node.name = name
        node.meta.update(original_aten=original, seq_nr=seq_nr)
        nodes[name] = node
    graph.output(tuple(nodes.values()))
    return graph, nodes


def test_a_node_that_alone_replaced_an_op_takes_that_ops_name():
    graph, nodes = _graph(
        ("permute", aten.permute.default, aten.t.default, 3),
        ("reshape", aten.reshape.default, aten.view.default, 4),
        ("mm", aten.mm.default, aten.mm.default, 5),  # not decomposed
    )
    assert node_names.replaced_ops(graph) == {nodes["permute"]: "aten.t.default", nodes["reshape"]: "aten.view.default"}


def test_an_op_decomposed_into_several_nodes_keeps_their_own_names():
    layer_norm = aten.native_layer_norm.default
    graph, _ = _graph(  # graphs from inductor's cache hold a copy of the op object per node
        ("var_mean", aten.var_mean.correction, copy.copy(layer_norm), 7),
        ("rsqrt", aten.rsqrt.default, copy.copy(layer_norm), 7),
        ("mul", aten.mul.Tensor, copy.copy(layer_norm), 7),
        ("embedding", aten.embedding.default, copy.copy(aten.embedding.default), 8),  # not decomposed
    )
    assert node_names.replaced_ops(graph) == {}


def test_calls_that_share_a_sequence_number_or_have_none_keep_their_own_names():
    graph, nodes = _graph(
        ("permute", aten.permute.default, aten.t.default, 9),
        ("permute_1", aten.permute.default, aten.t.default, 9),  # two t calls in one backward
        ("reshape", aten.reshape.default, aten.view.default, None),
        ("permute_2", aten.permute.default, aten.transpose.int, 10),
    )
    assert node_names.replaced_ops(graph) == {nodes["permute_2"]: "aten.transpose.int"}


def test_a_lone_node_left_of_a_bigger_decomposition_is_not_taken_for_the_whole_op():
    graph, _ = _graph(  # what inductor's passes left tagged in the GPT example's graphs
        ("div_4", aten.div.Tensor, aten.native_layer_norm_backward.default, 178),
        ("unsqueeze", aten.unsqueeze.default, aten.nll_loss_backward.default, 190),
        ("full_default_1", aten.full.default, aten.masked_fill.Scalar, 149),
    )
    assert node_names.replaced_ops(graph) == {}
