"""Step, rank, name, range, data-mode, tensor-list, stack and sampling filters."""

import pytest
import torch

import torchdebug
from torchdebug.capture.filters import NameMatcher, RangeGate


def _run_steps(tmp_path, steps, body, **options):
    dbg = torchdebug.Debugger(tmp_path, **options)
    for _ in range(steps):
        dbg.start()
        body()
        dbg.stop()
        dbg.step()
    dbg.close()
    return torchdebug.load(tmp_path).ranks[0].records()


def test_name_matcher_accepts_substrings_exact_names_and_regexes():
    matcher = NameMatcher(["layers.0", "re:aten\\.mm\\.default#1$"])
    assert matcher("forward/layers.0/aten.add.Tensor#0")
    assert matcher("forward/x/aten.mm.default#1") and not matcher("forward/x/aten.mm.default#10")
    assert not NameMatcher([])("anything")


def test_range_gate_opens_at_from_and_closes_after_to():
    gate = RangeGate(["relu", "exp"])
    assert [gate.check(n) for n in ("add", "relu", "mul", "exp", "sin")] == [False, True, True, True, False]


def test_step_filter_dumps_only_selected_steps(tmp_path):
    x = torch.ones(2)
    records = _run_steps(tmp_path, 5, lambda: x.exp(), step="1|3-4")
    assert sorted({r.step for r in records}) == [1, 3, 4]


def test_rank_filter_skips_unselected_ranks(tmp_path):
    dbg = torchdebug.Debugger(tmp_path, rank=[1])
    dbg.start()
    torch.ones(2).exp()
    dbg.close()
    assert not dbg.enabled and not dbg.rank_dir.exists()


def test_list_filter_keeps_matching_calls(tmp_path):
    x = torch.ones(2)
    records = _run_steps(tmp_path, 1, lambda: (x.exp(), x.sin(), x.exp()), list=["re:exp.default#1$"])
    assert {r.call_name for r in records} == {"forward/-/aten.exp.default#1"}


def test_range_filter_keeps_the_calls_between_two_names(tmp_path):
    x = torch.ones(2)
    records = _run_steps(tmp_path, 1, lambda: (x.cos(), x.exp(), x.sin(), x.tan(), x.abs()), range=["aten.exp", "aten.tan"])
    assert [r.op for r in records if r.io == "output"] == ["aten.exp.default", "aten.sin.default", "aten.tan.default"]


@pytest.mark.parametrize(
    ("mode", "phases", "ios"),
    [
        (["forward"], {"forward"}, {"input", "output"}),
        (["backward"], {"backward"}, {"input", "output"}),
        (["output"], {"forward", "backward"}, {"output"}),
        (["backward", "input"], {"backward"}, {"input"}),
    ],
)
def test_data_mode_selects_phases_and_slots(tmp_path, mode, phases, ios):
    w = torch.ones(2, requires_grad=True)
    records = _run_steps(tmp_path, 1, lambda: (w * 3).sum().backward(), data_mode=mode)
    assert {r.phase for r in records} == phases and {r.io for r in records} == ios


def test_tensor_list_saves_tensors_only_for_matching_calls(tmp_path):
    x = torch.ones(2)
    records = _run_steps(tmp_path, 1, lambda: (x.exp(), x.sin()), task="tensor", tensor_list=["aten.sin"])
    saved = {r.op for r in records if r.tensor}
    assert saved == {"aten.sin.default"}
    assert all(r.stats is not None for r in records if r.kind == "tensor")


def test_stack_range_records_stacks_only_inside_the_range(tmp_path):
    x = torch.ones(2)
    records = _run_steps(tmp_path, 1, lambda: (x.cos(), x.exp(), x.sin()), stack=["aten.exp", "aten.exp"])
    with_stack = {r.op for r in records if r.stack}
    assert with_stack == {"aten.exp.default"}


def test_sampling_saves_head_every_kth_and_tail_of_big_tensors(tmp_path):
    x = torch.arange(2000.0)
    records = _run_steps(tmp_path, 1, lambda: x.neg(), task="tensor", sample_stride=10)
    out = next(r for r in records if r.op == "aten.neg.default" and r.io == "output")
    saved = torchdebug.load(tmp_path).ranks[0].load_tensor(out)
    expected = torch.cat([-x[:256], -x[256:1744:10], -x[1744:]])
    assert out.sampled == 10 and torch.equal(saved, expected)
    assert out.stats["min"] == -1999.0  # statistics are of the whole tensor
