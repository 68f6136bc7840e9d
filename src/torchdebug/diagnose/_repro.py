"""Write ``repro.py``: the culprit node (or the failing subgraph) alone, with its real inputs.

The script is standalone (torch and safetensors only): the graph as Python (the compile package's
runnable graph writer, one ``# File ...`` comment per node), the non-default Dynamo/inductor config
of the diagnosed run (how PyTorch's minifier repros pin config), and a ``main`` that loads the inputs
from ``repro_inputs.safetensors`` next to it, runs the graph compiled with the failing backend, in
eager and in fp64 eager, forward (and backward when the problem needs it), and judges the results
with ``torch._dynamo.utils.same``. Exit status 1 and ``REPRO: ...`` on stdout when the problem shows,
0 when it does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from torchdebug._torch.dynamo import generate_config_string
from torchdebug.compile import graph_dump
from torchdebug.diagnose._finding import NodeFinding

INPUTS_FILE = "repro_inputs.safetensors"

_MAIN = '''
# ---- written by torchdebug diagnose -------------------------------------------------------------
import functools
import pathlib
import sys
import traceback

from safetensors.torch import load_file

{config}
BACKEND = {backend}
INPUT_NAMES = {names!r}
TRAIN = {train!r}
TOLERANCE = {tolerance!r}


def load_inputs(float64=False):
    tensors = load_file(str(pathlib.Path(__file__).with_name({inputs_file!r})))
    inputs = []
    for name in INPUT_NAMES:
        value = tensors[name]
        if value.is_floating_point():
            value = value.double() if float64 else value
            value.requires_grad_(TRAIN)
        inputs.append(value)
    return inputs


def run(fn, inputs):
    """Outputs, then (with TRAIN) the gradients of sum(output * fixed weights) for every input."""
    outputs = fn(*inputs)
    outputs = [o for o in (outputs if isinstance(outputs, (tuple, list)) else [outputs]) if isinstance(o, torch.Tensor)]
    values = [o.detach() for o in outputs]
    if TRAIN:
        generator = torch.Generator().manual_seed(0)
        loss = sum((o * torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.dtype)).sum()
                   for o in outputs if o.requires_grad)
        loss.backward()
        values += [x.grad for x in inputs if isinstance(x, torch.Tensor) and x.grad is not None]
    return values


def main():
    graph = functools.partial(forward, GRAPH_ATTRIBUTES)
    expected = run(graph, load_inputs())
    fp64 = run(graph, load_inputs(float64=True))
    try:
        got = run(torch.compile(graph, backend=BACKEND), load_inputs())
    except Exception:
        traceback.print_exc()
        print("REPRO: the compiled graph raised (traceback above)")
        return 1
    from torch._dynamo.utils import same

    for index, (ref, res, ref64) in enumerate(zip(expected, got, fp64)):
        if not same(ref, res, ref64, tol=TOLERANCE, equal_nan=True):
            error = (res.double() - ref64).pow(2).mean().sqrt().item()
            print(f"REPRO: value {{index}} of the compiled graph is wrong: rmse {{error:.4g}} against fp64")
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


def write_repro(finding: NodeFinding, backend: Any, folder: Path, tolerance: float) -> Path:
    """Write ``repro.py`` and ``repro_inputs.safetensors`` into ``folder``; return the script's path."""
    if finding.subgraph is None:
        raise ValueError(f"diagnose: finding {finding.node!r} has no subgraph to write a repro from")
    folder.mkdir(parents=True, exist_ok=True)
    names = [node.name for node in finding.subgraph.graph.find_nodes(op="placeholder")]
    tensors = {name: finding.inputs[name].detach().contiguous().clone() for name in names}
    save_file(tensors, str(folder / INPUTS_FILE))
    title = f"torchdebug diagnose: {finding.describe()}"
    script = graph_dump.graph_python(finding.subgraph, title.replace('"""', "'''"), main=False)
    main = _MAIN.format(
        config=generate_config_string(),
        backend=_backend_expression(backend),
        names=names,
        train=finding.train,
        tolerance=tolerance,
        inputs_file=INPUTS_FILE,
    )
    path = folder / "repro.py"
    path.write_text(script + main)
    return path
