"""FSDP2's collectives belong to the module whose parameters they gather or whose gradients they
reduce, in the pass they run for: prefetches and the root's final reduce-scatters included."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests import gloo
from torchdebug.capture.collectives import collective_owner
from torchdebug.capture.modules import ModuleTracker

_GATHER, _SCATTER = "c10d._allgather_base_.default", "c10d._reduce_scatter_base_.default"


class _Block(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, hidden)
        self.down = torch.nn.Linear(hidden, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) + x


class _Owners(TorchDispatchMode):
    """Notes, for every FSDP collective, its owner and the size of its output."""

    def __init__(self, name_of) -> None:  # noqa: ANN001
        super().__init__()
        self.name_of, self.seen = name_of, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if str(func) in (_GATHER, _SCATTER):
            self.seen.append((str(func), args[0].numel(), collective_owner(self.name_of)))
        return func(*args, **(kwargs or {}))


def _worker(rank: int, out_path: str) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(8), _Block(12), torch.nn.Linear(8, 4))  # every group of another size
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    owners = _Owners(ModuleTracker(model).name_of)
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    steps = []
    for _ in range(2):
        with owners:
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        steps.append(owners.seen)
        owners.seen = []
    if rank == 0:
        Path(out_path).write_text(json.dumps(steps))


@pytest.mark.slow
def test_fsdp2_collectives_carry_the_module_and_phase_they_belong_to(tmp_path):
    out = tmp_path / "owners.json"
    gloo.spawn(_worker, tmp_path, str(out))
    # all-gathers return a group's whole parameters, reduce-scatters one rank's half of its gradients
    whole = {"0": 2 * (8 * 8 + 8), "1": 8 * 12 + 12 + 12 * 8 + 8, "<root>": 8 * 4 + 4}
    for seen in json.loads(out.read_text()):
        for op, numel, owner in seen:
            assert owner is not None, (op, numel)
            phase, module = owner
            assert numel == (whole[module] if op == _GATHER else whole[module] // 2), (op, numel, owner)
            assert phase == "backward" or op == _GATHER, (op, owner)
        gathered = Counter((phase, module) for op, _, (phase, module) in seen if op == _GATHER)
        scattered = Counter((phase, module) for op, _, (phase, module) in seen if op == _SCATTER)
        # the forward gathers every group; backward gathers the blocks again (resharded after forward;
        # the root keeps its parameters) and reduces every group's gradients once
        forward = {("forward", "<root>"): 1, ("forward", "0"): 1, ("forward", "1"): 1}
        assert gathered == {**forward, ("backward", "0"): 1, ("backward", "1"): 1}
        assert scattered == {("backward", "<root>"): 1, ("backward", "0"): 1, ("backward", "1"): 1}
