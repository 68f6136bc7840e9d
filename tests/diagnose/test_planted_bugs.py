"""Each of PyTorch's planted compiler bugs, and one of ours in a backward graph, is localised to
the right stage, node and source line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import torchdebug.diagnose as td
from tests.diagnose.llama import tiny_llama
from tests.diagnose.models import ReluNet, TanhNet, line_of

MODELS = str(Path(__file__).with_name("models.py"))
LLAMA = str(Path(__file__).resolve().parents[2] / "examples" / "llama.py")


def _source_line(report: td.DiagnoseResult) -> tuple[str, int]:
    assert report.source is not None, report.summary()
    where = report.source.split(" in ")[0]
    path, line = where.rsplit(":", 1)
    return path, int(line)


def _assert_relu(report: td.DiagnoseResult, stage: str, kind: str) -> None:
    assert report.stage == stage, report.summary()
    assert report.kind == kind, report.summary()
    assert report.finding is not None and "relu" in report.node and "relu" in report.finding.target
    assert report.module == "<root>"
    assert _source_line(report) == (MODELS, line_of("RELU LINE"))
    assert report.user_frame == report.source


def _run_repro(report: td.DiagnoseResult) -> subprocess.CompletedProcess[str]:
    assert report.repro_path is not None and report.repro_path.is_file()
    assert (report.repro_path.parent / "repro_inputs.safetensors").is_file()
    return subprocess.run([sys.executable, str(report.repro_path)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("backend", "kind", "message"),
    [
        ("relu_accuracy_error_TESTING_ONLY", "accuracy", "rmse"),
        ("relu_compile_error_TESTING_ONLY", "exception", "ReluCompileError"),
        ("relu_runtime_error_TESTING_ONLY", "exception", "ReluRuntimeError"),
    ],
)
def test_dynamo_planted_bug_is_localised_to_the_backend_and_the_relu_line(
    backend: str, kind: str, message: str, tmp_path: Path
) -> None:
    report = td.diagnose(ReluNet(), torch.randn(4, 8), backend=backend, output_dir=tmp_path)
    _assert_relu(report, backend, kind)
    assert [s.stage.label for s in report.stages[:-1]] == ["uncompiled", "eager", "aot_eager", "aot_eager_decomp_partition"]
    assert message in report.finding.detail
    assert "relu" in report.summary()
    result = _run_repro(report)
    assert result.returncode == 1 and "REPRO:" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow  # an inductor compile and a repro subprocess: about 15-25 s on 2 cores
def test_inductor_accuracy_bug_inside_a_fused_cpp_kernel_is_localised_and_reproduced(tmp_path: Path) -> None:
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}):
        report = td.diagnose(ReluNet(), torch.randn(4, 8), output_dir=tmp_path)
    _assert_relu(report, "inductor", "accuracy")
    assert report.finding.phase == "forward" and report.finding.target == "aten.relu.default"
    assert {c.name for c in report.failed_checks} >= {"output.0", "grad.fc1.weight"}
    result = _run_repro(report)  # the repro pins the planted config itself
    assert result.returncode == 1 and "REPRO: value 0" in result.stdout, result.stdout + result.stderr
    html = report.to_html(tmp_path / "report.html").read_text()
    assert "aten.relu.default" in html and "inductor" in html


@pytest.mark.slow  # an inductor compile of the tiny Llama, forward only: about 10 s on 2 cores (40 s on a cold cache)
def test_inductor_accuracy_bug_after_cpu_sdpa_and_complex_rope_is_localised_to_the_relu_line(tmp_path: Path) -> None:
    model, tokens = tiny_llama()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}):
        report = td.diagnose(model, tokens, train=False, output_dir=tmp_path, repro=False)
    assert report.stage == "inductor" and report.kind == "accuracy", report.summary()
    assert report.finding is not None and report.finding.target == "aten.relu.default", report.summary()
    assert report.module == "layers.0.ffn"
    assert _source_line(report) == (LLAMA, line_of("RELU LINE", LLAMA))
    assert report.notes == []  # every node before the relu, the SDPA kernel included, was judged


@pytest.mark.parametrize("bug", ["compile_error", "runtime_error"])
def test_inductor_exception_is_localised_to_the_relu_line(bug: str, tmp_path: Path) -> None:
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": bug}):
        report = td.diagnose(ReluNet(), torch.randn(4, 8), output_dir=tmp_path, repro=False)
    _assert_relu(report, "inductor", "exception")
    assert report.error is not None


class _PerturbFirstBackwardMul(CustomGraphPass):
    """Our planted bug: in backward graphs, the first ``mul`` becomes an ``add``."""

    def __init__(self) -> None:
        self.perturbed: list[str] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        if not any(n.name.startswith("tangents") for n in graph.find_nodes(op="placeholder")):
            return
        node = next(n for n in graph.nodes if n.target is torch.ops.aten.mul.Tensor)
        node.target = torch.ops.aten.add.Tensor
        self.perturbed.append(node.name)

    def uuid(self) -> None:
        return None


def test_a_post_grad_pass_that_breaks_one_backward_op_is_localised_to_that_node(tmp_path: Path) -> None:
    perturb = _PerturbFirstBackwardMul()
    with torch._inductor.config.patch(post_grad_custom_post_pass=perturb):
        report = td.diagnose(TanhNet(), torch.randn(4, 8), output_dir=tmp_path, repro=False)
    assert report.stage == "inductor" and report.kind == "accuracy", report.summary()
    assert all(c.name.startswith("grad.") for c in report.failed_checks)  # the forward is right
    assert report.finding is not None and report.finding.phase == "backward"
    assert report.node == perturb.perturbed[-1] and report.finding.graph == "model__0 backward"
    assert _source_line(report) == (MODELS, line_of("SIN LINE"))


def test_a_correct_program_passes_every_stage(tmp_path: Path) -> None:
    report = td.diagnose(ReluNet(), torch.randn(4, 8), backend="aot_eager_decomp_partition", output_dir=tmp_path)
    assert report.ok and report.stage is None and report.finding is None and report.repro_path is None
    assert [s.stage.label for s in report.stages] == ["uncompiled", "eager", "aot_eager", "aot_eager_decomp_partition"]
    assert "every stage matches" in report.summary()


def test_an_exception_in_eager_names_the_user_frame(tmp_path: Path) -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        return x @ torch.ones(3, 3)  # shapes do not match

    report = td.diagnose(broken, torch.randn(2, 2), backend="aot_eager", output_dir=tmp_path)
    assert report.stage == "uncompiled" and report.kind == "exception" and report.finding is None
    assert report.user_frame is not None and report.user_frame.endswith("in broken")
