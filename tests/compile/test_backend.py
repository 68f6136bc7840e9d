"""The backend under TORCH_COMPILE_DEBUG=1: TorchAir's example's tree, pass dumps, modes, reasons."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch

import torchdebug
from torchdebug.compile import CompilerConfig, GraphPass, get_backend

DUMP = re.compile(r"^(\d{3})_aot_(forward|backward|joint)_graph(?:_after_(\w+))?\.txt$")


def torchdebug_folder(root: Path) -> Path:
    (folder,) = root.glob("run_*/torchdebug")
    return folder


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def numbered_dumps(phase_folder: Path) -> list[str]:
    names = sorted(p.name for p in phase_folder.iterdir() if DUMP.match(p.name))
    assert [int(DUMP.match(n)[1]) for n in names] == list(range(len(names))), names
    return names


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def run_seed_example(config: CompilerConfig | None = None) -> None:
    """TorchAir's debug-save example: train step at 10x10, then inference at 20x20 (dynamic=False)."""
    model = torch.compile(Double(), backend=torchdebug.get_backend(config), dynamic=False)
    x = torch.randn(10, 10, requires_grad=True)
    loss = torch.nn.MSELoss()(model(x), torch.randn(10, 10))
    loss.backward()
    assert x.grad is not None and x.grad.shape == (10, 10)
    out = model(torch.randn(20, 20))
    assert out.shape == (20, 20)


def test_seed_example_writes_forward_backward_and_inference_dumps_in_numbered_order(debug_root: Path) -> None:
    run_seed_example()
    folder = torchdebug_folder(debug_root)
    assert (folder / "debug.log").is_file()
    assert sorted(p.name for p in (folder / "model__0").iterdir()) == [
        "backward",
        "dynamo_out_graph.txt",
        "forward",
        "joint",
        "model.json",
    ]
    assert sorted(p.name for p in (folder / "model__1").iterdir()) == ["dynamo_out_graph.txt", "forward", "model.json"]
    for model, phase, label in [
        ("model__0", "forward", "forward"),
        ("model__0", "backward", "backward"),
        ("model__1", "forward", "forward"),
        ("model__0", "joint", "joint"),
    ]:
        phase_folder = folder / model / phase
        dumps = numbered_dumps(phase_folder)
        assert dumps[0] == f"000_aot_{label}_graph.txt"
        assert all(f"_aot_{label}_graph_after_" in name for name in dumps[1:])
        passes = json.loads((phase_folder / "passes.json").read_text())
        assert [p["file"] for p in passes["passes"]] == dumps[1:]
        if phase != "joint":
            assert "reinplace_inplaceable_ops" in [p["name"] for p in passes["passes"]]
            assert "def call(" in (phase_folder / "output_code.py").read_text()
    assert "mul" in (folder / "model__0" / "dynamo_out_graph.txt").read_text()
    recompiles = json.loads((folder / "recompiles.json").read_text())
    assert [r["model"] for r in recompiles] == ["model__1"]
    assert recompiles[0]["compile_id"] == "0/1" and "'x'" in recompiles[0]["reason"]
    assert recompiles[0]["user_stack"][-1]["code"] == "return 2 * x"


def test_warm_cache_compile_still_writes_every_dump(debug_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor_cache"))
    run_seed_example()
    cold = files_under(torchdebug_folder(debug_root))
    torch._dynamo.reset()
    warm_root = tmp_path / "warm"
    with torch._dynamo.config.patch(debug_dir_root=str(warm_root)):
        run_seed_example()
    assert files_under(torchdebug_folder(warm_root)) == cold


def test_backend_reads_torch_compile_debug_when_it_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "debug"
    monkeypatch.delenv("TORCH_COMPILE_DEBUG", raising=False)
    with torch._dynamo.config.patch(debug_dir_root=str(root)):
        backend = get_backend(CompilerConfig(backend="aot_eager"))
        torch.compile(lambda x: x + 1, backend=backend)(torch.randn(3))
        assert not root.exists()
        monkeypatch.setenv("TORCH_COMPILE_DEBUG", "1")
        torch.compile(lambda x: x * 3, backend=backend)(torch.randn(3))
    assert (torchdebug_folder(root) / "model__0" / "forward" / "000_aot_forward_graph.txt").is_file()


def test_backend_is_reachable_by_name(debug_root: Path) -> None:
    out = torch.compile(lambda x: x.sin() + 1, backend="torchdebug")(torch.zeros(4))
    torch.testing.assert_close(out, torch.ones(4))
    assert (torchdebug_folder(debug_root) / "model__0" / "forward" / "output_code.py").is_file()


def test_extra_pass_runs_after_inductor_post_grad_passes_and_changes_the_compiled_code(debug_root: Path) -> None:
    def triple_instead_of_double(gm: torch.fx.GraphModule) -> None:
        for node in gm.graph.nodes:
            if node.target == torch.ops.aten.mul.Tensor and node.args[1] == 2:
                node.args = (node.args[0], 3)

    rewrite = GraphPass("triple_instead_of_double", triple_instead_of_double, phases=frozenset({"inference"}))
    compiled = torch.compile(Double(), backend=get_backend(passes=[rewrite]))
    torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 3.0))
    phase = torchdebug_folder(debug_root) / "model__0" / "forward"
    passes = json.loads((phase / "passes.json").read_text())["passes"]
    names = [p["name"] for p in passes]
    # inductor's post_grad_custom_post_pass slot: after its pattern passes, before re-inplacing
    assert names.index("pass_pattern_0") < names.index("triple_instead_of_double") < names.index("reinplace_inplaceable_ops")
    ours = passes[names.index("triple_instead_of_double")]
    assert ours["owner"] == "torchdebug"
    assert "mul.Tensor(arg0_1, 3)" in (phase / ours["file"]).read_text()


def test_aot_eager_runs_user_passes_in_order_and_dumps_them(debug_root: Path) -> None:
    calls: list[str] = []
    config = CompilerConfig(backend="aot_eager")
    config.post_grad_custom_pre_pass = lambda graph: calls.append("pre")
    config.post_grad_custom_post_pass = lambda graph: calls.append("post")
    x = torch.randn(4, requires_grad=True)
    torch.compile(lambda t: (t * t).sum(), backend=get_backend(config))(x).backward()
    assert calls == ["pre", "post", "pre", "post"]  # forward, then backward
    model = torchdebug_folder(debug_root) / "model__0"
    assert numbered_dumps(model / "backward") == [
        "000_aot_backward_graph.txt",
        "001_aot_backward_graph_after_post_grad_custom_pre_pass.txt",
        "002_aot_backward_graph_after_post_grad_custom_post_pass.txt",
    ]
    owners = {p["owner"] for p in json.loads((model / "forward" / "passes.json").read_text())["passes"]}
    assert owners == {"user"}
    assert not (model / "forward" / "output_code.py").exists()


def test_run_eagerly_traces_inductor_graphs_but_generates_no_code(debug_root: Path) -> None:
    config = CompilerConfig()
    config.debug.run_eagerly = True
    out = torch.compile(torch.nn.functional.gelu, backend=get_backend(config))(torch.ones(3))
    torch.testing.assert_close(out, torch.nn.functional.gelu(torch.ones(3)))
    model = torchdebug_folder(debug_root) / "model__0"
    assert (model / "forward" / "000_aot_forward_graph.txt").is_file()
    assert not (model / "forward" / "output_code.py").exists()
    assert "erf" in (model / "forward" / "000_aot_forward_graph.txt").read_text()  # inductor's decomposition


def test_reduce_overhead_on_cpu_warns_once_and_runs_without_cuda_graphs(caplog: pytest.LogCaptureFixture) -> None:
    backend = get_backend(CompilerConfig(compile_mode="reduce-overhead"))
    with caplog.at_level(logging.WARNING, logger="torchdebug"):
        torch.compile(lambda x: x + 1, backend=backend)(torch.zeros(2))
        torch.compile(lambda x: x + 2, backend=backend)(torch.zeros(2))
    warnings = [r for r in caplog.records if "without CUDA graphs" in r.getMessage()]
    assert len(warnings) == 1


def test_graph_breaks_are_recorded_with_the_user_source_line(debug_root: Path) -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        x = x.sin()
        torch._dynamo.graph_break()
        return x.cos()

    torch.compile(broken, backend=get_backend(CompilerConfig(backend="aot_eager")))(torch.randn(3))
    folder = torchdebug_folder(debug_root)
    (record,) = json.loads((folder / "graph_breaks.json").read_text())
    assert record["model"] == "model__0"
    assert record["user_stack"][-1]["code"] == "torch._dynamo.graph_break()"
    assert record["user_stack"][-1]["file"] == __file__
    assert (folder / "model__1" / "forward").is_dir()


def test_recompiles_are_recorded_with_the_guard_that_failed(debug_root: Path) -> None:
    compiled = torch.compile(lambda x, scale: x * scale, backend=get_backend(CompilerConfig(backend="aot_eager")))
    compiled(torch.ones(2), 2.0)
    compiled(torch.ones(2), 3.0)
    (record,) = json.loads((torchdebug_folder(debug_root) / "recompiles.json").read_text())
    assert record["model"] == "model__1" and record["compile_id"] == "0/1"
    assert "scale" in record["reason"]


def test_graph_dump_type_without_debug_writes_first_and_last_graphs_to_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCH_COMPILE_DEBUG", raising=False)
    config = CompilerConfig(backend="aot_eager")
    config.debug.graph_dump.type = "json"
    config.debug.graph_dump.path = str(tmp_path / "graphs")
    config.post_grad_custom_post_pass = lambda graph: None
    torch.compile(lambda x: x.exp(), backend=get_backend(config))(torch.randn(2))
    assert files_under(tmp_path / "graphs") == [
        "model__0/dynamo_out_graph.json",
        "model__0/forward/000_aot_forward_graph.json",
        "model__0/forward/001_aot_forward_graph_after_post_grad_custom_post_pass.json",
    ]


def test_the_eager_backend_returns_the_dynamo_graph_and_dumps_it(debug_root: Path) -> None:
    out = torch.compile(lambda x: x - 1, backend=get_backend(CompilerConfig(backend="eager")))(torch.ones(2))
    torch.testing.assert_close(out, torch.zeros(2))
    assert files_under(torchdebug_folder(debug_root) / "model__0") == ["dynamo_out_graph.txt", "model.json"]


def test_debug_log_detaches_after_the_compile(debug_root: Path) -> None:
    torch.compile(lambda x: x + 1, backend=get_backend(CompilerConfig(backend="aot_eager")))(torch.ones(2))
    logger = logging.getLogger("torchdebug")
    assert not [h for h in logger.handlers if isinstance(h, logging.FileHandler)]
    assert "model__0/inference" in (torchdebug_folder(debug_root) / "debug.log").read_text()


def test_dynamic_shapes_training_compiles_once_and_dumps_symbolic_graphs(debug_root: Path) -> None:
    config = CompilerConfig()
    config.debug.graph_dump.type = "py"
    compiled = torch.compile(Double(), backend=get_backend(config), dynamic=True)
    for size in (3, 5):
        x = torch.randn(size, 2, requires_grad=True)
        compiled(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((size, 2), 2.0))
    folder = torchdebug_folder(debug_root)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["model__0"]
    forward = folder / "model__0" / "forward"
    assert "Sym(s" in (forward / "000_aot_forward_graph.txt").read_text()
    assert (forward / "000_aot_forward_graph.py").is_file()


def test_graph_pass_rejects_unknown_phases() -> None:
    with pytest.raises(ValueError, match=r"GraphPass 'p': unknown phases \['training'\]"):
        GraphPass("p", lambda gm: None, phases=frozenset({"training"}))
