"""``torchdebug report``: one self-contained HTML page for a debug run, with every name escaped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchdebug.cli import main
from torchdebug.compile import CompilerConfig, GraphPass, get_backend


def test_report_command_writes_a_self_contained_page_that_escapes_names(
    debug_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def add_one_node(gm: torch.fx.GraphModule) -> None:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(output):
            gm.graph.call_function(torch.ops.aten.clone.default, (next(iter(gm.graph.nodes)),))

    backend = get_backend(CompilerConfig(backend="aot_eager"), passes=[GraphPass("<script>alert(1)</script>", add_one_node)])

    def broken(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    torch.compile(broken, backend=backend)(torch.ones(3))
    output = tmp_path / "report.html"
    run_dirs = list(debug_root.glob("run_*"))
    assert main(["report", str(run_dirs[0]), "-o", str(output)]) == 0
    html = output.read_text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "http://" not in html and "https://" not in html.split("<pre>")[0]  # no CDN
    assert "model__0" in html and "model__1" in html
    assert "torch._dynamo.graph_break()" in html
    assert "+1" in html  # node count change of the pass
    assert "wrote" in capsys.readouterr().out


def test_report_command_explains_a_folder_without_debug_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 2
    assert "TORCH_COMPILE_DEBUG=1" in capsys.readouterr().err
