"""The instrumented inductor compile uses inductor's FX graph cache across processes, and a cached
graph still reports every node's value to the sink of the compile that loaded it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = '''
import json
import torch
from torch._dynamo.utils import counters
from torchdebug.diagnose._instrument import InstrumentedInductor


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def instrumented_run(seed):
    """Compile and run the same program afresh; check what the sinks got against eager values."""
    torch.compiler.reset()
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
    backend = InstrumentedInductor()
    with backend.active():
        torch.compile(net, backend=backend)(x).sum().backward()
    forward = next(g for g in backend.graphs if g.phase == "forward")
    relu = next(n.name for n in forward.original.graph.nodes if n.target is torch.ops.aten.relu.default)
    expected = torch.relu(net.fc1(x)).detach()
    return {
        "phases": sorted(g.phase for g in backend.graphs),
        "delivered": [g.values is not None and len(g.values) > 0 for g in backend.graphs],
        "relu_matches_eager": forward.values is not None and torch.allclose(forward.values[relu], expected),
    }


runs = [instrumented_run(1), instrumented_run(2)]  # the same graphs twice: two keys, two cache entries
hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
print(json.dumps({"runs": runs, "hit": hits, "miss": misses}))
'''


def _process(cache: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh processes, the first compiles C++ kernels into an empty cache
def test_a_second_process_hits_the_fx_graph_cache_and_still_gets_the_right_values(tmp_path: Path) -> None:
    first = _process(tmp_path / "cache")
    second = _process(tmp_path / "cache")
    assert (first["hit"], first["miss"]) == (0, 4)  # forward and backward, twice
    assert (second["hit"], second["miss"]) == (4, 0)
    for result in (first, second):
        for run in result["runs"]:
            assert run == {"phases": ["backward", "forward"], "delivered": [True, True], "relu_matches_eager": True}
