"""TorchAir's debug example as users run it: a fresh process, TORCH_COMPILE_DEBUG set after importing
torchdebug, run twice on one compile cache (the second run is warm)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import os
import torch
import torchdebug
os.environ["TORCH_COMPILE_DEBUG"] = "1"   # after import: still honoured, read at compile time

class Model(torch.nn.Module):
    def forward(self, x):
        return 2 * x

model = torch.compile(Model(), backend=torchdebug.get_backend(), dynamic=False)
x = torch.randn(10, 10, requires_grad=True)
torch.nn.MSELoss()(model(x), torch.randn(10, 10)).backward()
model(torch.randn(20, 20))
"""


def run_once(tmp_path: Path, name: str) -> list[str]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "TORCH_COMPILE_DEBUG_DIR": str(tmp_path / name)}
    env.pop("TORCH_COMPILE_DEBUG", None)
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (folder,) = (tmp_path / name).glob("torch_compile_debug/run_*/torchdebug")
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_second_run_on_a_warm_cache_writes_the_same_tree(tmp_path: Path) -> None:
    cold = run_once(tmp_path, "cold")
    warm = run_once(tmp_path, "warm")
    assert warm == cold
    assert "model__0/forward/000_aot_forward_graph.txt" in cold
    assert "model__0/backward/000_aot_backward_graph.txt" in cold
    assert "model__1/forward/000_aot_forward_graph.txt" in cold
    assert "debug.log" in cold and "recompiles.json" in cold
