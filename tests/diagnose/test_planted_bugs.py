"""Each of PyTorch's planted compiler bugs, and one of ours in a backward graph, is localised to
the right stage, node and source line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchdebug.diagnose as td
from tests.diagnose.llama import tiny_llama
from tests.diagnose.models import PerturbMulOfCos, ReluNet, TanhNet, line_of

MODELS = str(Path(__file__).with_name("models.py"))
ROOT = Path(__file__).resolve().parents[2]
LLAMA = str(ROOT / "examples" / "llama.py")


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


def run_repro(report: td.DiagnoseResult) -> subprocess.CompletedProcess[str]:
    """Run the written repro.py in a fresh process, where the planted passes of ``tests.diagnose.models``
    can be imported (as a user's own passes would be)."""
    assert report.repro_path is not None and report.repro_path.is_file(), report.summary()
    assert (report.repro_path.parent / "repro_inputs.safetensors").is_file()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(report.repro_path)], capture_output=True, text=True, timeout=300, env=env)


def assert_repro_fails(report: td.DiagnoseResult, shows: str) -> None:
    """The repro exits 1 and prints ``REPRO: ...`` with ``shows`` in it."""
    result = run_repro(report)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "REPRO:" in result.stdout and shows in result.stdout, result.stdout + result.stderr


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
    assert report.finding.scope == "the node alone" and report.finding.reproduced
    assert_repro_fails(report, "raised" if kind == "exception" else "rmse")


@pytest.mark.slow  # an inductor compile and a repro subprocess: about 15-25 s on 2 cores
def test_inductor_accuracy_bug_inside_a_fused_cpp_kernel_is_localised_and_reproduced(tmp_path: Path) -> None:
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}):
        report = td.diagnose(ReluNet(), torch.randn(4, 8), output_dir=tmp_path)
    _assert_relu(report, "inductor", "accuracy")
    assert report.finding.phase == "forward" and report.finding.target == "aten.relu.default"
    assert {c.name for c in report.failed_checks} >= {"output.0", "grad.fc1.weight"}
    assert report.finding.scope == "the node alone" and report.finding.reproduced
    assert_repro_fails(report, f"REPRO: {report.node} of the graph compiled with inductor (compile_fx_inner")  # config pinned
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
def test_inductor_exception_is_localised_to_the_relu_line_and_reproduced(bug: str, tmp_path: Path) -> None:
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": bug}):
        report = td.diagnose(ReluNet(), torch.randn(4, 8), output_dir=tmp_path)
    _assert_relu(report, "inductor", "exception")
    assert report.error is not None
    assert_repro_fails(report, "the graph compiled with 'inductor' raised")


def test_a_post_grad_pass_that_breaks_one_backward_op_is_localised_to_that_node_and_its_repro_fails(tmp_path: Path) -> None:
    perturb = PerturbMulOfCos()
    with torch._inductor.config.patch(post_grad_custom_post_pass=perturb):
        report = td.diagnose(TanhNet(), torch.randn(4, 8), output_dir=tmp_path)
    assert report.stage == "inductor" and report.kind == "accuracy", report.summary()
    assert all(c.name.startswith("grad.") for c in report.failed_checks)  # the forward is right
    assert report.finding is not None and report.finding.phase == "backward"
    assert report.node == perturb.perturbed[0] and report.finding.graph == "model__0 backward"
    assert _source_line(report) == (MODELS, line_of("SIN LINE"))
    # the mul alone is compiled right (the pass needs the cos): the repro holds both, and installs the pass
    assert report.finding.scope == f"a region of 2 nodes ending at {report.node}" and report.finding.reproduced
    assert "post_grad_custom_post_pass = _load('tests.diagnose.models', 'PerturbMulOfCos')()" in report.repro_path.read_text()
    assert_repro_fails(report, f"REPRO: {report.node} of the graph compiled with inductor (compile_fx_inner")


def test_a_correct_program_passes_every_stage(tmp_path: Path) -> None:
    report = td.diagnose(ReluNet(), torch.randn(4, 8), backend="aot_eager_decomp_partition", output_dir=tmp_path)
    assert report.ok and report.stage is None and report.finding is None and report.repro_path is None
    assert [s.stage.label for s in report.stages] == ["uncompiled", "eager", "aot_eager", "aot_eager_decomp_partition"]
    assert "every stage matches" in report.summary() and report.skipped == []


def test_an_exception_in_eager_names_the_user_frame(tmp_path: Path) -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        return x @ torch.ones(3, 3)  # shapes do not match

    report = td.diagnose(broken, torch.randn(2, 2), backend="aot_eager", output_dir=tmp_path)
    assert report.stage == "uncompiled" and report.kind == "exception" and report.finding is None
    assert report.user_frame is not None and report.user_frame.endswith("in broken")
