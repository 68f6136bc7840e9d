"""Render an FX graph as txt, a runnable Python repro, JSON or Graphviz dot.

Used by the compile backend for its per-pass dumps and reusable by any feature that needs to show a
graph (graph-mode data dumps, diagnose). Every format names nodes exactly as FX does, so a node
named in one dump can be found in the others and in the records of a data dump.

Node metadata read: ``val`` / ``tensor_meta`` (shape, dtype, stride, device), ``stack_trace``
(user source line), ``nn_module_stack`` or, on backward nodes, ``fwd_nn_module_stack`` (module
path), ``seq_nr`` and ``custom`` (``torch.fx.traceback.annotate`` marks).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import types
from pathlib import Path
from typing import Any

import torch
import torch.fx

from torchdebug._torch.dispatch import OpOverload, OpOverloadPacket
from torchdebug.capture.stacks import TRACE_FRAME
from torchdebug.graph_dump import module_stack_path

log = logging.getLogger("torchdebug.compile.graph_render")

FORMATS = ("txt", "py", "json", "dot")

_ASSIGNMENT = re.compile(r"^    (?P<name>\w+) = ")


def source_location(node: torch.fx.Node) -> dict[str, Any] | None:
    """The innermost user frame of ``node.meta["stack_trace"]``: file, line, function and code."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = trace.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        match = TRACE_FRAME.search(lines[index])
        if match:
            code = lines[index + 1].strip() if index + 1 < len(lines) else ""
            return {
                "file": match["file"],
                "line": int(match["line"]),
                "function": match["function"],
                "code": code,
            }
    return None


def module_path(node: torch.fx.Node) -> str | None:
    """The innermost module owning ``node`` (``L['self'].layers.0.attn``), forward or backward."""
    return module_stack_path(node, "nn_module_stack") or module_stack_path(node, "fwd_nn_module_stack")


def _size_hint(size: Any) -> int:
    """A concrete int for a possibly symbolic size (the value it was traced with)."""
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        if hint is None:
            raise ValueError(f"symbolic size {size} has no hint; the repro needs a concrete value")
        return int(hint)
    return int(size)


def tensor_meta(value: Any) -> dict[str, Any] | None:
    """Shape, stride, dtype and device of a (fake) tensor value, symbolic sizes as strings."""
    if isinstance(value, torch.Tensor):
        return {
            "shape": [s if isinstance(s, int) else str(s) for s in value.shape],
            "stride": [s if isinstance(s, int) else str(s) for s in value.stride()],
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
        }
    return None


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The readable listing PyTorch prints: shapes, strides, devices and ``# File:`` comments."""
    return gm.print_readable(print_output=False, include_stride=True, include_device=True)


def _node_comment(node: torch.fx.Node) -> str | None:
    where = source_location(node)
    if where is None:
        return None
    return f'    # File "{where["file"]}", line {where["line"]}, in {where["function"]}: {where["code"]}'


def _import_line(name: str, value: Any) -> str:
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}"
    if isinstance(value, float):
        return f"{name} = float({str(value)!r})"
    if value is type(None):
        return f"{name} = type(None)"
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{name} = _load({module!r}, {qualname!r})"
    return f"{name} = None  # torchdebug: {value!r} cannot be imported; define it to run this repro"


def _input_expression(node: torch.fx.Node) -> str:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        shape = tuple(_size_hint(s) for s in value.shape)
        stride = tuple(_size_hint(s) for s in value.stride())
        return f"_random({shape}, {stride}, {value.dtype}, {str(value.device)!r})"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return repr(value.node.hint)
    if isinstance(value, (int, float, bool)) or value is None:
        return repr(value)
    return f"None  # torchdebug: no example value for {type(value).__name__}"


def _attribute_lines(gm: torch.fx.GraphModule) -> list[str]:
    lines = []
    for node in gm.graph.find_nodes(op="get_attr"):
        value = getattr(gm, str(node.target), None)
        if isinstance(value, torch.Tensor):
            data = value.detach()
            if data.numel() <= 64:
                expression = f"torch.tensor({data.cpu().tolist()!r}, dtype={data.dtype}).to({str(data.device)!r})"
            else:
                expression = f"_random({tuple(data.shape)}, {tuple(data.stride())}, {data.dtype}, {str(data.device)!r})"
            lines.append(f"GRAPH_ATTRIBUTES.{node.target} = {expression}")
        else:
            lines.append(f"# torchdebug: attribute {node.target!r} ({type(value).__name__}) is not reproduced")
    return lines


_PY_PRELUDE = '''
import importlib
import types

import torch


def _load(module, qualname):
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _random(shape, stride, dtype, device):
    """A tensor with this exact shape, stride, dtype and device, filled with seeded random values."""
    numel = 0 if 0 in shape else 1 + sum((size - 1) * step for size, step in zip(shape, stride))
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.randn(numel, dtype=dtype, device=device)
    elif dtype == torch.bool:
        base = torch.randint(0, 2, (numel,), device=device).bool()
    else:
        base = torch.randint(0, 8, (numel,), dtype=dtype, device=device)
    return base.as_strided(shape, stride)
'''


def graph_python(gm: torch.fx.GraphModule, title: str, *, main: bool = True) -> str:
    """A standalone script: the graph as Python, one ``# File ..., line ...`` comment per node,
    inputs of the traced shapes, dtypes and strides; run it to print the outputs.

    ``main=False`` leaves out the ``if __name__ == "__main__":`` block, for callers (the
    diagnose repro) that append their own."""
    code = gm.graph.python_code(root_module="self")
    nodes = {node.name: node for node in gm.graph.nodes}
    body = []
    for line in code.src.strip("\n").splitlines():
        match = _ASSIGNMENT.match(line)
        comment = _node_comment(nodes[match["name"]]) if match and match["name"] in nodes else None
        if comment:
            body.append(comment)
        body.append(line)
    imports = [_import_line(name, value) for name, value in code.globals.items() if name != "torch"]
    inputs = [f"        {_input_expression(n)},  # {n.name}" for n in gm.graph.find_nodes(op="placeholder")]
    parts = [
        f'"""{title}: an FX graph written by torchdebug. Run it with `python <this file>`."""',
        _PY_PRELUDE,
        *imports,
        "",
        "GRAPH_ATTRIBUTES = types.SimpleNamespace()",
        *_attribute_lines(gm),
        "",
        "",
        *body,
        "",
        "",
        "def make_inputs():",
        '    """Seeded random inputs with the shapes, dtypes and strides the graph was traced with."""',
        "    torch.manual_seed(0)",
        "    return [",
        *inputs,
        "    ]",
        "",
    ]
    if main:
        parts += [
            "",
            'if __name__ == "__main__":',
            "    outputs = forward(GRAPH_ATTRIBUTES, *make_inputs())",
            "    print(outputs)",
            "",
        ]
    return "\n".join(parts)


def target_name(node: torch.fx.Node) -> str:
    """``aten.mul.Tensor`` for ATen ops, ``module.qualname`` for Python callables, else the string."""
    target = node.target
    if isinstance(target, str) or isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__qualname__', repr(target))}".lstrip(".")


def _node_record(node: torch.fx.Node) -> dict[str, Any]:
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):
        meta: Any = [tensor_meta(v) for v in value]
    else:
        meta = tensor_meta(value)
    custom = node.meta.get("custom")
    return {
        "name": node.name,
        "op": node.op,
        "target": target_name(node),
        "args": repr(node.args),
        "kwargs": repr(node.kwargs),
        "tensor": meta,
        "module_path": module_path(node),
        "source": source_location(node),
        "seq_nr": node.meta.get("seq_nr"),
        "custom": custom if isinstance(custom, dict) else None,
        "inputs": [n.name for n in node.all_input_nodes],
        "users": [n.name for n in node.users],
    }


def graph_json(gm: torch.fx.GraphModule, title: str) -> str:
    """One JSON object: ``{"graph": title, "nodes": [...]}``, one entry per node in graph order."""
    document = {"graph": title, "nodes": [_node_record(node) for node in gm.graph.nodes]}
    return json.dumps(document, indent=1, default=str) + "\n"


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def graph_dot(gm: torch.fx.GraphModule, title: str) -> str:
    """A Graphviz digraph: one box per node (name, target, shape and dtype), one edge per use."""
    lines = [f"digraph {_dot_quote(title)} {{", "  node [shape=box, fontname=monospace];"]
    for node in gm.graph.nodes:
        meta = tensor_meta(node.meta.get("val"))
        label = f"{node.name}\n{node.op}: {node.target}"
        if meta:
            label += f"\n{meta['dtype']}{meta['shape']}"
        lines.append(f"  {_dot_quote(node.name)} [label={_dot_quote(label)}];")
    for node in gm.graph.nodes:
        for source in node.all_input_nodes:
            lines.append(f"  {_dot_quote(source.name)} -> {_dot_quote(node.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(gm: torch.fx.GraphModule, kind: str, title: str) -> str:
    """The graph in one of :data:`FORMATS`."""
    if kind == "txt":
        return graph_text(gm)
    if kind == "py":
        return graph_python(gm, title)
    if kind == "json":
        return graph_json(gm, title)
    if kind == "dot":
        return graph_dot(gm, title)
    raise ValueError(f"graph dump type: got {kind!r}, expected one of {', '.join(map(repr, FORMATS))}")


def write_graph(gm: torch.fx.GraphModule, stem: Path, kind: str, title: str) -> list[Path]:
    """Write ``<stem>.<kind>`` (and ``<stem>.svg`` for dot when Graphviz is installed); return the paths."""
    path = stem.with_name(f"{stem.name}.{kind}")
    path.write_text(render(gm, kind, title))
    written = [path]
    if kind == "dot" and shutil.which("dot"):
        svg = stem.with_name(f"{stem.name}.svg")
        result = subprocess.run(["dot", "-Tsvg", str(path), "-o", str(svg)], capture_output=True, text=True)
        if result.returncode == 0:
            written.append(svg)
        else:
            log.warning("Graphviz could not draw %s: %s", path, result.stderr.strip())
    return written
