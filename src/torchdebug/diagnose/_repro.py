"""Write ``repro.py``: the culprit node alone (or the smallest failing region or prefix around it),
with its real inputs.

The script is standalone (torch and safetensors only): the graph as Python (the compile package's
runnable graph writer, one ``# File ...`` comment per node), the non-default Dynamo/inductor config
of the diagnosed run (how PyTorch's minifier repros pin config) and the custom passes installed in
inductor's config when they can be imported, and a ``main`` that loads the inputs from
``repro_inputs.safetensors`` next to it (with the strides the run gave them), runs the graph
compiled with the failing backend, in eager and in fp64 eager, forward (and backward when the
problem needs it), and judges each result with ``torch._dynamo.utils.same``. It prints what
diagnose found first; then exit status 1 and ``REPRO: <which value> ... rmse ...`` (or the
traceback) when the problem shows, 0 when it does not.
"""

from __future__ import annotations

import inspect
import operator
from pathlib import Path
from typing import Any

import torch
import torch.fx
from safetensors.torch import save_file

from torchdebug._torch.dynamo import generate_config_string
from torchdebug._torch.inductor import CUSTOM_PASS_SLOTS, installed_passes
from torchdebug.compile import graph_render
from torchdebug.diagnose._finding import NodeFinding
from torchdebug.diagnose._inductor_graph import judged_outputs

INPUTS_FILE = "repro_inputs.safetensors"

_MAIN = '''
# ---- written by torchdebug diagnose -------------------------------------------------------------
import functools
import pathlib
import sys
import traceback

from safetensors.torch import load_file

{config}
{passes}
BACKEND = {backend}
INPUT_NAMES = {names!r}
INPUT_STRIDES = {strides!r}
OUTPUT_NAMES = {outputs!r}
JUDGED = {judged!r}
COMPILE_AS = {compile_as!r}  # None: torch.compile(backend=BACKEND); else inductor's compile_fx_inner, as this phase
TRAIN = {train!r}
TOLERANCE = {tolerance!r}
FOUND = {found!r}


def load_inputs(float64=False):
    """The values the diagnosed run fed this graph, with their strides (and in float64 for the reference)."""
    tensors = load_file(str(pathlib.Path(__file__).with_name({inputs_file!r})))
    inputs = []
    for name in INPUT_NAMES:
        value = tensors[name]
        if value.stride() != INPUT_STRIDES[name]:
            try:
                value = torch.empty_strided(value.shape, INPUT_STRIDES[name], dtype=value.dtype).copy_(value)
            except RuntimeError:
                pass  # an overlapping layout (an expanded tensor) cannot be written: keep it contiguous
        if value.is_floating_point():
            value = value.double() if float64 else value
            value.requires_grad_(TRAIN)
        inputs.append(value)
    return inputs


def run(fn, inputs):
    """Name -> value: the outputs, then (with TRAIN) the gradients of sum(output * fixed weights)
    for every input."""
    outputs = fn(*inputs)
    outputs = [o for o in (outputs if isinstance(outputs, (tuple, list)) else [outputs]) if isinstance(o, torch.Tensor)]
    values = {{name: o.detach() for name, o in zip(OUTPUT_NAMES, outputs)}}
    if TRAIN:
        generator = torch.Generator().manual_seed(0)
        loss = sum((o * torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.dtype)).sum()
                   for o in outputs if o.requires_grad)
        loss.backward()
        values.update({{f"gradient of {{name}}": x.grad for name, x in zip(INPUT_NAMES, inputs)
                       if isinstance(x, torch.Tensor) and x.grad is not None}})
    return values


def compile_graph(graph, inputs):
    """The graph compiled as diagnose found it failing: with torch.compile, or (a graph cut from one
    AOT autograd handed inductor) retraced by make_fx and compiled by inductor's compile_fx_inner,
    as PyTorch's after-AOT minifier does."""
    if COMPILE_AS is None:
        return torch.compile(graph, backend=BACKEND)
    from torch._inductor.compile_fx import compile_fx_inner
    from torch.fx.experimental.proxy_tensor import make_fx

    compiled = compile_fx_inner(
        make_fx(graph)(*inputs), list(inputs), is_backward=COMPILE_AS == "backward", is_inference=COMPILE_AS == "inference"
    )
    return lambda *args: compiled(list(args))


def widened(graph, inputs):
    """The graph run with every floating tensor and dtype argument in float64 (a graph that creates
    float32 buffers, full(..., dtype=torch.float32), would otherwise mix dtypes)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def wide(value):
        if isinstance(value, (list, tuple)):
            return type(value)(wide(v) for v in value)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.double()
        return torch.float64 if isinstance(value, torch.dtype) and value.is_floating_point else value

    class Widened(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            return target(*wide(args), **{{k: wide(v) for k, v in kwargs.items()}})

    with torch.no_grad():
        gm = make_fx(graph)(*inputs)
        return lambda *args: Widened(gm).run(*args)


def rmse(a, b):
    return (a.double() - b.double()).abs().pow(2).mean().sqrt().item() if a.numel() else 0.0


COMPILER = repr(BACKEND) if COMPILE_AS is None else f"inductor (compile_fx_inner, as a {{COMPILE_AS}} graph)"


def main():
    print(f"torchdebug diagnose found: {{FOUND}}")
    graph = functools.partial(forward, GRAPH_ATTRIBUTES)
    expected = run(graph, load_inputs())
    fp64 = run(graph if COMPILE_AS is None else widened(graph, load_inputs()), load_inputs(float64=True))
    try:
        got = run(compile_graph(graph, load_inputs()), load_inputs())
    except Exception:
        traceback.print_exc()
        print(f"REPRO: the graph compiled with {{COMPILER}} raised (traceback above)")
        return 1
    from torch._dynamo.utils import same

    for name, ref in expected.items():
        if JUDGED is not None and name not in JUDGED:
            continue
        res, ref64 = got.get(name), fp64[name]
        if res is None:
            print(f"REPRO: the compiled graph did not return {{name}}")
            return 1
        if not same(ref, res, ref64, tol=TOLERANCE, equal_nan=True):
            print(
                f"REPRO: {{name}} of the graph compiled with {{COMPILER}} is wrong: rmse {{rmse(res, ref64):.4g}} "
                f"against fp64, where eager's is {{rmse(ref, ref64):.4g}}"
            )
            return 1
    print("no problem: the compiled graph matches eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _backend_expression(backend: Any) -> str:
    if backend is None or isinstance(backend, str):
        return repr(backend or "inductor")
    module, qualname = getattr(backend, "__module__", None), getattr(backend, "__qualname__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        return f"_load({module!r}, {qualname!r})"
    return f"None  # torchdebug: set this to your backend ({type(backend).__name__} cannot be imported)"


def _pass_expression(graph_pass: Any) -> str | None:
    """``_load(module, name)`` for an importable function, ``_load(module, class)()`` for an
    instance of an importable class built without arguments; ``None`` otherwise."""
    target = graph_pass if inspect.isfunction(graph_pass) else type(graph_pass)
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "<")
    if not module or module == "__main__" or "<" in qualname:
        return None
    if target is graph_pass:
        return f"_load({module!r}, {qualname!r})"
    try:
        inspect.signature(target).bind()
    except (TypeError, ValueError):
        return None
    return f"_load({module!r}, {qualname!r})()"


def _passes_lines() -> str:
    """The custom passes installed in inductor's config slots, as assignments (which
    ``generate_config_string`` leaves out): a bug planted by a pass shows in the repro too."""
    lines = []
    for slot in CUSTOM_PASS_SLOTS:
        passes = installed_passes(slot)
        if not passes:
            continue
        expressions = [_pass_expression(p) for p in passes]
        if any(e is None for e in expressions):
            lines.append(f"# torchdebug: inductor's {slot} holds a pass this script cannot import; set it here")
            continue
        value = expressions[0] if len(expressions) == 1 else f"[{', '.join(expressions)}]  # a list: torch 2.13 and newer"  # type: ignore[arg-type]  # no None (checked above)
        lines.append(f"torch._inductor.config.{slot} = {value}")
    return "\n".join(lines)


def _output_names(gm: torch.fx.GraphModule) -> list[str]:
    """The name of each tensor the graph returns (``getitem`` outputs by the op they read)."""
    outputs = gm.graph.find_nodes(op="output")[0].args[0]
    names = []
    for node in outputs if isinstance(outputs, (tuple, list)) else [outputs]:
        if isinstance(node, torch.fx.Node) and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            names.append(f"{node.args[0].name} output {node.args[1]}")
        else:
            names.append(getattr(node, "name", str(node)))
    return names


def write_repro(finding: NodeFinding, backend: Any, folder: Path, tolerance: float) -> Path:
    """Write ``repro.py`` and ``repro_inputs.safetensors`` into ``folder``; return the script's path."""
    if finding.subgraph is None:
        raise ValueError(f"diagnose: finding {finding.node!r} has no subgraph to write a repro from")
    folder.mkdir(parents=True, exist_ok=True)
    names = [node.name for node in finding.subgraph.graph.find_nodes(op="placeholder")]
    tensors = {name: finding.inputs[name].detach().contiguous().clone() for name in names}
    save_file(tensors, str(folder / INPUTS_FILE))
    title = f"torchdebug diagnose: {finding.describe()}; this graph: {finding.scope}"
    outputs = _output_names(finding.subgraph)
    script = graph_render.graph_python(finding.subgraph, title.replace('"""', "'''"), main=False)
    main = _MAIN.format(
        config=generate_config_string(),
        passes=_passes_lines(),
        backend=_backend_expression(backend),
        names=names,
        strides={name: tuple(finding.inputs[name].stride()) for name in names},
        outputs=outputs,
        judged=None
        if finding.compile_as is None
        else [_output_names(finding.subgraph)[i] for i in judged_outputs(finding.subgraph, finding.node)],
        compile_as=finding.compile_as,
        train=finding.train,
        tolerance=tolerance,
        found=f"{finding.describe()}; this graph: {finding.scope}",
        inputs_file=INPUTS_FILE,
    )
    path = folder / "repro.py"
    path.write_text(script + main)
    return path
