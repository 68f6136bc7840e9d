"""Name FX nodes the way eager capture names op calls, so compiled and eager records line up.

An eager record is ``{phase}/{module}/{op}#{call}/{io}.{arg}`` (``torchdebug.records``). For a node:

- ``module``: the innermost entry of ``node.meta["nn_module_stack"]`` (forward) or
  ``fwd_nn_module_stack`` (backward nodes, copied there by AOT autograd from the forward node with
  the same ``seq_nr``), turned into the eager form: ``L['self'].layers[0].attn`` -> ``layers.0.attn``,
  the compiled module itself -> ``<root>``. Nodes with no stack are ``<root>`` when the graph comes
  from a module (some node's stack starts at ``L['self']``), else ``-``.
- ``op``: ``str(node.target)`` (``aten.addmm.default``), as the dispatcher names it in eager mode.
- ``phase``: ``backward`` for nodes AOT autograd tagged ``partitioner_tag == "is_backward"`` and for
  nodes of a backward graph that inductor created without tags; forward nodes the partitioner
  recomputes in the backward graph keep ``forward`` and are marked ``recomputed``.
- ``fwd``: for backward nodes, the first forward node with the same ``seq_nr`` (AOT autograd's rule).
- ``source``: the innermost frame of ``node.meta["stack_trace"]`` outside torch, ``file:line in function``.

Call indices are counted by :class:`torchdebug.capture.graph.GraphCapture` at run time, so graphs
split by graph breaks keep counting where the previous graph stopped, as eager capture does.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

import torch
import torch.fx

from torchdebug.capture.stacks import format_frame
from torchdebug.records import NO_MODULE

ROOT_MODULE = "<root>"

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_LOCAL = re.compile(r"^[LG]\['[^']*'\]")
_INDEX = re.compile(r"\[(?:'([^']*)'|(\d+))\]")


def eager_module_path(path: str) -> str:
    """``L['self'].layers[0].attn`` -> ``layers.0.attn``; the compiled module itself -> ``<root>``."""
    rest = _LOCAL.sub("", path, count=1)
    rest = _INDEX.sub(lambda m: "." + (m[1] if m[1] is not None else m[2]), rest)
    return rest.strip(".") or ROOT_MODULE


def _stack_path(node: torch.fx.Node, key: str) -> str | None:
    stack = node.meta.get(key)
    if not stack:
        return None
    path, _ = list(stack.values())[-1]
    return str(path)


def is_backward_node(node: torch.fx.Node, graph_phase: str) -> bool:
    """True for gradient computations; forward nodes recomputed in a backward graph are not."""
    tag = node.meta.get("partitioner_tag")
    if tag is not None:
        return tag in ("is_backward", "must_be_in_backward")
    return graph_phase == "backward" and "nn_module_stack" not in node.meta


def graph_is_rooted(graph: torch.fx.Graph) -> bool:
    """Whether the graph was traced from a module (its module stacks start at ``L['self']``)."""
    for node in graph.nodes:
        path = _stack_path(node, "nn_module_stack") or _stack_path(node, "fwd_nn_module_stack")
        if path is not None and path.startswith("L['self']"):
            return True
    return False


def module_of(node: torch.fx.Node, backward: bool, rooted: bool) -> str:
    """The eager module path of a node (see the module docstring)."""
    path = _stack_path(node, "fwd_nn_module_stack" if backward else "nn_module_stack")
    if path is None and backward:
        path = _stack_path(node, "nn_module_stack")
    if path is None:
        return ROOT_MODULE if rooted else NO_MODULE
    return eager_module_path(path)


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
    found = [m for m in map(_FRAME.search, trace.splitlines()) if m and not m["file"].startswith(_TORCH_DIR)]
    if not found:
        return None
    frames = tuple(format_frame(m["file"], int(m["line"]), m["function"]) for m in found)
    inner = found[-1]
    stack_id = hashlib.sha1("\n".join(frames).encode()).hexdigest()[:12]
    return Source(f"{inner['file']}:{inner['line']} in {inner['function']}", stack_id, frames)


def op_name(node: torch.fx.Node) -> str | None:
    """The op of a node as eager capture names it, or ``None`` for nodes that are not op calls
    (placeholders, outputs, ``getitem`` of multi-output ops, Python callables)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return str(node.target)
