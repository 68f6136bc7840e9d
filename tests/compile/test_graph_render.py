"""Graph dump formats: a runnable py repro, JSON with node facts, dot with or without Graphviz."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchdebug.compile import CompilerConfig, GraphPass, get_backend, graph_render


class TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x).relu()
        return y.sum(dim=0) * 2


def capture_aot_forward(model: torch.nn.Module, *inputs: torch.Tensor, dynamic: bool = False) -> torch.fx.GraphModule:
    """The AOT forward graph of ``model`` as torchdebug's pipeline sees it (aot_eager, no codegen)."""
    seen: list[torch.fx.GraphModule] = []
    keep = GraphPass("keep", lambda gm: seen.append(gm), phases=frozenset({"forward", "inference"}))
    compiled = torch.compile(model, backend=get_backend(CompilerConfig(backend="aot_eager"), passes=[keep]), dynamic=dynamic)
    compiled(*inputs)
    return seen[0]


def test_python_dump_runs_standalone_and_reproduces_the_graph_outputs(tmp_path: Path) -> None:
    gm = capture_aot_forward(TwoLayer(), torch.randn(3, 6))
    (path,) = graph_render.write_graph(gm, tmp_path / "forward", "py", "forward")
    run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "tensor(" in run.stdout
    script = runpy.run_path(str(path))
    inputs = script["make_inputs"]()
    expected = gm(*inputs)
    actual = script["forward"](script["GRAPH_ATTRIBUTES"], *inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


def test_python_dump_comments_every_node_with_its_source_line() -> None:
    gm = capture_aot_forward(TwoLayer(), torch.randn(3, 6))
    source = graph_render.graph_python(gm, "forward")
    this_file = Path(__file__).name
    for node in [n for n in gm.graph.nodes if n.op == "call_function"]:
        if node.meta.get("stack_trace"):
            line = next(i for i, text in enumerate(source.splitlines()) if text.startswith(f"    {node.name} = "))
            comment = source.splitlines()[line - 1]
            assert comment.startswith("    # File ") and this_file in comment and ", line " in comment
    assert 'if __name__ == "__main__":' in source


def test_python_dump_recreates_input_strides() -> None:
    def transpose_add(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    gm = capture_aot_forward(transpose_add, torch.randn(4, 3).t())
    script: dict = {}
    exec(compile(graph_render.graph_python(gm, "g"), "g.py", "exec"), script)  # noqa: S102 - our own output
    (x,) = script["make_inputs"]()
    assert x.shape == (3, 4) and x.stride() == (1, 3) and x.dtype == torch.float32


def test_python_dump_of_a_dynamic_graph_uses_the_traced_sizes() -> None:
    gm = capture_aot_forward(TwoLayer(), torch.randn(5, 6), dynamic=True)
    script: dict = {}
    exec(compile(graph_render.graph_python(gm, "g"), "g.py", "exec"), script)  # noqa: S102 - our own output
    inputs = script["make_inputs"]()
    assert 5 in [i for i in inputs if isinstance(i, int)]
    script["forward"](script["GRAPH_ATTRIBUTES"], *inputs)


def test_json_dump_lists_nodes_with_shapes_module_paths_sources_and_users() -> None:
    gm = capture_aot_forward(TwoLayer(), torch.randn(3, 6))
    document = json.loads(graph_render.graph_json(gm, "forward"))
    nodes = {node["name"]: node for node in document["nodes"]}
    addmm = next(node for node in nodes.values() if node["target"] == "aten.addmm.default")
    assert addmm["tensor"] == {"shape": [3, 4], "stride": [4, 1], "dtype": "float32", "device": "cpu"}
    assert addmm["module_path"].endswith("proj")
    assert addmm["source"]["file"] == __file__ and addmm["source"]["code"] == "y = self.proj(x).relu()"
    assert addmm["users"] and all(user in nodes for user in addmm["users"])
    assert document["graph"] == "forward"


def test_dot_dump_without_graphviz_writes_only_the_dot_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gm = capture_aot_forward(TwoLayer(), torch.randn(3, 6))
    monkeypatch.setattr(graph_render.shutil, "which", lambda name: None)
    written = graph_render.write_graph(gm, tmp_path / "g", "dot", 'graph "quoted"')
    assert written == [tmp_path / "g.dot"]
    text = written[0].read_text()
    assert text.startswith('digraph "graph \\"quoted\\"" {') and "->" in text


def test_render_rejects_unknown_format() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ValueError, match="graph dump type: got 'svg'"):
        graph_render.render(gm, "svg", "g")


def test_the_old_module_path_still_gives_its_names_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match=r"^torchdebug\.compile\.graph_dump\.render moved to .*graph_render\.render"):
        from torchdebug.compile.graph_dump import render
    assert render is graph_render.render
