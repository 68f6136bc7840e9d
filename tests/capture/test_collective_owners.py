"""FSDP2's collectives are recorded under the module whose parameters they gather or whose gradients
they reduce, in the pass they run for: prefetches and the root's final reduce-scatters included."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import torchdebug
from tests import gloo
from torchdebug.nonfinite import find_origin
from torchdebug.records import UNREAD

_GATHER, _SCATTER = "c10d._allgather_base_.default", "c10d._reduce_scatter_base_.default"


class _Block(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, hidden)
        self.down = torch.nn.Linear(hidden, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) + x


def _worker(rank: int, dump: str) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(8), _Block(12), torch.nn.Linear(8, 4))  # every group of another size
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    debugger = torchdebug.Debugger(dump, task="statistics")
    for step in range(2):
        if step == 1:
            _poison_freed_buffers(model)
        debugger.start(model)
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        debugger.step()
    debugger.close()


def _poison_freed_buffers(model: torch.nn.Module) -> None:
    """Give each parameter's all-gather buffers, freed at reshard, memory full of NaN, as memory a
    NaN step freed holds: FSDP2's next unshard keeps storage of the right size and views it before
    its copy-out writes it. (FSDP2's internals, read by the test only.)"""
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if hasattr(module, "_get_fsdp_state") else None
        for buffer in (b for param in (group.fsdp_params if group else ()) for b in param.all_gather_outputs):
            assert buffer.untyped_storage().size() == 0  # freed after the last backward
            buffer.untyped_storage().resize_(buffer.numel() * buffer.itemsize)
            buffer.fill_(float("nan"))


@pytest.mark.slow
def test_fsdp2_collectives_are_recorded_under_the_module_and_phase_they_belong_to(tmp_path):
    gloo.spawn(_worker, tmp_path, str(tmp_path / "dump"))
    # all-gathers return a group's whole parameters, reduce-scatters one rank's half of its gradients
    whole = {"0": 2 * (8 * 8 + 8), "1": 8 * 12 + 12 + 12 * 8 + 8, "<root>": 8 * 4 + 4}
    # the forward gathers every group; backward gathers the blocks again (resharded after forward;
    # the root keeps its parameters) and reduces every group's gradients once, the root's last
    gathered = {("forward", "<root>"), ("forward", "0"), ("forward", "1"), ("backward", "0"), ("backward", "1")}
    scattered = {("backward", "<root>"), ("backward", "0"), ("backward", "1")}
    run = torchdebug.load(tmp_path / "dump")
    for rank, dump in run.ranks.items():
        records = dump.records()
        for step in (0, 1):
            outputs = [r for r in records if r.step == step and r.op in (_GATHER, _SCATTER) and r.io == "output"]
            for record in outputs:
                assert record.module in whole, (rank, record.name)
                expected = whole[record.module] if record.op == _GATHER else whole[record.module] // 2
                assert record.shape == [expected] and record.fwd is None, (rank, record.name, record.shape)
            calls = Counter((r.op, r.phase, r.module, r.call) for r in outputs)
            assert set(calls.values()) == {1}, calls  # one output each
            expected_calls = {(_GATHER, phase, module, 0) for phase, module in gathered}
            expected_calls |= {(_SCATTER, phase, module, 0) for phase, module in scattered}
            assert set(calls) == expected_calls, (rank, step, sorted(calls))
        collectives = {r.name for r in records if r.op.startswith("c10d.")}
        assert not [name for name in collectives if "/-/" in name], sorted(collectives)
        # FSDP2's buffers are not read before they hold values: garbage from torch.empty (NaN after
        # a NaN step freed that memory) made two identical runs differ there and named a NaN's origin
        unread = {(r.op, r.io, r.arg.partition(".")[0]): r.extra.get(UNREAD) for r in records if r.step == 0}
        assert unread["aten.empty.memory_format", "output", "0"] == "uninitialised"
        assert unread["fsdp.all_gather_copy_in.default", "input", "1"] == "overwritten"
        assert unread["fsdp.all_gather_copy_in.default", "output", "1"] == "partly written"
        assert unread["fsdp.all_gather_copy_in.default", "output", "0"] is None  # this rank's shards, written
        assert unread[_GATHER, "input", "0"] == "overwritten" and unread[_GATHER, "output", "0"] is None
        assert unread["fsdp.split_with_sizes_copy.default", "input", "out"] == "overwritten"
        # at the next step FSDP2 resizes the freed buffers (no op shows it) and views them before
        # its copy-out writes them: those views are unread, and the NaN the memory held is not seen
        later = [r for r in records if r.step == 1]
        assert {r.op for r in later if r.extra.get(UNREAD) == "uninitialised"} >= {"aten.view.default"}
        assert not [r.name for r in later if (r.stats or {}).get("nan")], rank
        assert find_origin(later) is None
