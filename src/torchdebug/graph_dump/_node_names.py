"""Name FX nodes the way eager capture names op calls, so compiled and eager records line up.

An eager record is ``{phase}/{module}/{op}#{call}/{io}.{arg}`` (``torchdebug.records``); this module
gives a node its module (:func:`module_of`), op (:func:`op_name`, :func:`replaced_ops`), phase
(:func:`is_backward_node`) and source (:func:`source_of`). Call indices are counted at run time by
:class:`~torchdebug.graph_dump._capture.GraphCapture`, so graphs split by graph breaks keep counting
where the previous one stopped. The rules, and where names differ from eager: docs/graph_dump.md,
"Records and names".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchdebug._torch.dispatch import OpOverload
from torchdebug._torch.nn import strip_wrappers
from torchdebug.capture.stacks import SKIP_DIRS, TRACE_FRAME, format_frame, stack_id
from torchdebug.records import NO_MODULE

ROOT_MODULE = "<root>"

_ROOTS = ("L['self']", "L['args'][0]")
"""How Dynamo names the compiled module in the frame it traces: ``self`` of its ``forward``, or the
first positional argument when ``forward`` is wrapped by a decorator taking ``*args`` (as
transformers 5.24 wraps its models' ``forward``)."""

_LOCAL = re.compile(r"^(?:L\['args'\]\[0\]|[LG]\['[^']*'\])")
_INDEX = re.compile(r"\[(?:'([^']*)'|(\d+))\]")
_MODULES_DICT = re.compile(r"\.__dict__\._modules\.")
"""A child reached through the parent's ``__dict__['_modules']`` (how Dynamo names a module that a
wrapper's ``forward`` takes from its attributes)."""


def eager_module_path(path: str) -> str:
    """``L['self'].layers[0].attn`` (``L['args'][0]`` where a decorator wraps ``forward``) ->
    ``layers.0.attn``; the compiled module itself -> ``<root>``;
    module wrappers left out (``layers.0._orig_mod.attn``, checkpoint_wrapper's
    ``layers.0.__dict__['_modules']['_checkpoint_wrapped_module'].attn`` -> ``layers.0.attn``)."""
    rest = _LOCAL.sub("", path, count=1)
    rest = _INDEX.sub(lambda m: "." + (m[1] if m[1] is not None else m[2]), rest)
    rest = _MODULES_DICT.sub(".", rest)
    return strip_wrappers(rest.strip(".")) or ROOT_MODULE


def module_stack_path(node: torch.fx.Node, key: str) -> str | None:
    """The innermost entry of ``node.meta[key]`` (``nn_module_stack`` or ``fwd_nn_module_stack``)."""
    stack = node.meta.get(key)
    if not stack:
        return None
    path, _ = list(stack.values())[-1]
    return str(path)


def is_backward_node(node: torch.fx.Node, graph_phase: str) -> bool:
    """True for gradient computations: nodes AOT autograd tagged ``partitioner_tag == "is_backward"``,
    in a backward graph those tagged ``"must_be_in_backward"`` (elsewhere that tag marks
    functionalization's ``copy_`` back into a graph input, a forward op), and nodes of a backward
    graph that inductor created without tags; forward nodes the partitioner recomputes in a
    backward graph are not."""
    tag = node.meta.get("partitioner_tag")
    if tag is not None:
        return tag == "is_backward" or (tag == "must_be_in_backward" and graph_phase == "backward")
    return graph_phase == "backward" and "nn_module_stack" not in node.meta


def graph_is_rooted(graph: torch.fx.Graph) -> bool:
    """Whether the graph was traced from a module (its module stacks start at one of :data:`_ROOTS`)."""
    for node in graph.nodes:
        path = module_stack_path(node, "nn_module_stack") or module_stack_path(node, "fwd_nn_module_stack")
        if path is not None and path.startswith(_ROOTS):
            return True
    return False


def module_of(node: torch.fx.Node, backward: bool, rooted: bool) -> str:
    """The eager module path of a node: the innermost entry of ``node.meta["nn_module_stack"]``
    (forward) or ``fwd_nn_module_stack`` (backward nodes, copied there by AOT autograd from the forward
    node with the same ``seq_nr``), in the eager form (:func:`eager_module_path`). Nodes with no stack
    are ``<root>`` when the graph comes from a module (``rooted``: some node's stack starts at it),
    else ``-``. A graph traced from a submodule is relative to it: its runs put the path of the
    instance that ran in front (``torchdebug.graph_dump._instances``)."""
    path = module_stack_path(node, "fwd_nn_module_stack" if backward else "nn_module_stack")
    if path is None and backward:
        path = module_stack_path(node, "nn_module_stack")
    if path is None and (written := _written_back(node)) is not None:
        return module_of(written, backward, rooted)
    if path is None:
        return ROOT_MODULE if rooted else NO_MODULE
    return eager_module_path(path)


def _written_back(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node whose value a ``copy_`` writes back into a graph input (functionalization's epilogue:
    a BatchNorm's running statistics, an input updated in place), which has no module stack of its
    own: the write belongs to the module that made the value, as does the eager op that wrote in place."""
    if node.target is not torch.ops.aten.copy_.default or len(node.args) < 2:
        return None
    into, written = node.args[0], node.args[1]
    if not isinstance(into, torch.fx.Node) or into.op != "placeholder" or not isinstance(written, torch.fx.Node):
        return None
    return written if written.op == "call_function" and written.target is not torch.ops.aten.copy_.default else None


@dataclass(frozen=True, slots=True)
class Source:
    """Where a node came from in user code: innermost frame outside torch, and the user frames."""

    source: str
    stack_id: str
    frames: tuple[str, ...]


def source_of(node: torch.fx.Node) -> Source | None:
    """The user frames of ``node.meta["stack_trace"]`` (frames inside torch are dropped)."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    found = [m for m in map(TRACE_FRAME.search, trace.splitlines()) if m and not m["file"].startswith(SKIP_DIRS)]
    if not found:
        return None
    frames = tuple(format_frame(m["file"], int(m["line"]), m["function"]) for m in found)
    inner = found[-1]
    return Source(f"{inner['file']}:{inner['line']} in {inner['function']}", stack_id(frames), frames)


_STAND_INS: dict[str, frozenset[str]] = {
    "aten.reshape.default": frozenset({"aten.view.default", "aten._unsafe_view.default"}),
    "aten.permute.default": frozenset({"aten.t.default", "aten.transpose.int", "aten.numpy_T.default"}),
    "aten.expand.default": frozenset({"aten.expand_as.default", "aten.broadcast_to.default"}),
    "aten.full.default": frozenset(
        {"aten.ones.default", "aten.zeros.default", "aten.new_ones.default", "aten.new_zeros.default", "aten.new_full.default"}
    ),
    "prims.iota.default": frozenset({"aten.arange.default", "aten.arange.start", "aten.arange.start_step"}),
}
"""Ops a decomposition uses to stand for a whole view or factory op, and the ops they stand for
(see :func:`replaced_ops`). Other pairs are fragments as often as stand-ins: after inductor's
passes an ``unsqueeze`` can be the one node left tagged with ``nll_loss_backward``."""


def replaced_ops(graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
    """Nodes that alone stand for an op the compiler's decompositions replaced, with that op's name.

    AOT autograd records in ``node.meta["original_aten"]`` the op each node was decomposed from,
    and ``seq_nr`` tells the calls of that op apart. Where a call of op O became one node of
    another op that holds O's value (``t`` -> ``permute``, ``view`` -> ``reshape``), that node
    computes O's output, so it is named O and lines up with the eager record. Only view and factory
    stand-ins for view and factory ops (``_STAND_INS``) are renamed: after inductor's passes a
    decomposition can leave a single node tagged (one ``div`` of a layer-norm backward), and such a
    node may be a fragment of O, not its output. A call whose ``seq_nr`` other calls of O share
    keeps its own nodes' names: which stand-in is which call's is not recorded.

    A stand-in holds O's value only where its dtype and shape are those of the value leaving the
    call's nodes (what the nodes that are not O's read, or the graph's output). A float ``arange``
    becomes an int64 ``iota``, then a ``mul``, an ``add`` and a ``convert_element_type`` to float:
    the ``iota`` is the first of four nodes, not the ``arange``'s value, and keeps its name (compare
    then lists it ``inside`` the eager ``arange``). Named ``arange``, it was paired with the eager
    float ``arange`` and, through it, the eager float ``mul`` with an int64 one: a false error.
    """
    groups: dict[tuple[str, Any], list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        original = node.meta.get("original_aten")
        if isinstance(original, OpOverload):  # by name: graph copies (the FX graph cache) hold copies of the op objects
            groups.setdefault((str(original), node.meta.get("seq_nr")), []).append(node)
    replaced = {}
    for (name, seq_nr), nodes in groups.items():
        stand_ins = [node for node in nodes if name in _STAND_INS.get(str(node.target), ())]
        if len(stand_ins) == 1 and seq_nr is not None and _holds_the_value(stand_ins[0], nodes):
            replaced[stand_ins[0]] = name
    return replaced


def _holds_the_value(stand_in: torch.fx.Node, nodes: list[torch.fx.Node]) -> bool:
    """Whether ``stand_in`` has the dtype and shape of every value that leaves ``nodes`` (one call's
    nodes): those read by other nodes or by the graph's output."""
    members = set(nodes)
    leaving = [node for node in nodes if node is stand_in or any(user not in members for user in node.users)]
    return all(_dtype_and_shape(node) == _dtype_and_shape(stand_in) for node in leaving)


def _dtype_and_shape(node: torch.fx.Node) -> tuple[Any, Any]:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None, None
    return value.dtype, tuple(value.shape)


def op_name(node: torch.fx.Node) -> str | None:
    """The op of a node as eager capture names it, or ``None`` for nodes that are not op calls
    (placeholders, outputs, ``getitem`` of multi-output ops, Python callables)."""
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return None
    return str(node.target)


def output_nodes(node: torch.fx.Node) -> Iterator[tuple[str, torch.fx.Node | None, Any]]:
    """``(arg, node holding the value, fake value)`` for each output of ``node``."""
    value = node.meta.get("val")
    if not isinstance(value, (tuple, list)):
        yield "0", node, value
        return
    getitems = {
        user.args[1]: user
        for user in node.users
        if user.op == "call_function" and getattr(user.target, "__name__", "") == "getitem"
    }
    for index, item in enumerate(value):
        yield str(index), getitems.get(index), item
