"""A dump of the native path and one of the dispatch mode compare clean: the ops a dispatch mode
makes torch run in place of others (an out-of-place gradient sum for an in-place one, ``view`` for
``_reshape_alias``) are aligned as the ops they stand for, by their data flow; only the ``detach``es a mode makes
stay one-sided."""

from __future__ import annotations

import pytest
import torch

import torchdebug
from tests.capture.native_compare import gpt_training
from tests.compare.test_matching_value_ids import _strip_ids
from torchdebug.compare._flow_alignment import aligned_op
from torchdebug.native import build


def test_an_in_place_op_and_the_ops_a_mode_runs_instead_are_aligned_as_the_ops_they_stand_for():
    assert aligned_op("aten.add_.Tensor") == aligned_op("aten.add.Tensor") == "aten.add.Tensor"
    assert aligned_op("aten._foreach_add_.Scalar") == "aten._foreach_add_.Scalar"  # a private op keeps its name
    assert aligned_op("aten._reshape_alias.default") == "aten.view.default"
    assert aligned_op("aten._index_put_impl_.default") == "aten.index_put.default"
    assert aligned_op("aten.__iand__.Tensor") == "aten.__iand__.Tensor"
    assert aligned_op("aten.mm.default") == "aten.mm.default"


def _sum(in_place: bool, rows: int) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(4, 8)[:rows], torch.randn(4, 8)[:rows]
    made = x.mul(2).sin()
    (made.add_(y) if in_place else made.add(y)).neg()


def test_an_in_place_op_is_aligned_with_its_out_of_place_form_where_the_data_flow_cannot_pair_them(tmp_path):
    """Half a batch summed out of place (an FSDP rank on the dispatch mode) against the whole batch
    summed in place (one process on the native path): the sums pair among the calls of their module
    that the walk leaves, with and without value ids."""
    for side, in_place, rows in (("a", False, 2), ("b", True, 4)):
        with torchdebug.dump(tmp_path / side, task="statistics"):
            _sum(in_place, rows)
    for strip in (False, True):
        if strip:
            for side in ("a", "b"):
                _strip_ids(tmp_path / side)
        sums = [row for row in torchdebug.compare(tmp_path / "a", tmp_path / "b").rows if row.op == "aten.add.Tensor"]
        partners = {(row.match, row.name_b.rsplit("/", 2)[1]) for row in sums}
        assert len(sums) == 3 and partners == {("aligned", "aten.add_.Tensor#0")}


@pytest.mark.skipif(build._cxx_compiler() is None, reason="no C++ compiler to build the observer")
def test_a_dump_of_each_capture_path_compares_clean(tmp_path, monkeypatch):
    for path, setting in (("mode", "0"), ("native", "1")):
        monkeypatch.setenv("TORCHDEBUG_NATIVE", setting)
        model, step = gpt_training()
        with torchdebug.Debugger(tmp_path / path, task="statistics") as debugger:
            for _ in range(2):
                debugger.start(model)
                step()
                debugger.step()
    result = torchdebug.compare(tmp_path / "mode", tmp_path / "native")
    assert result.first_divergence is None and result.counts()["error"] == 0
    tensors = [row for row in result.rows if row.verdict == "unmatched" and row.kind == "tensor"]
    assert tensors and {row.op for row in tensors} == {"aten.detach.default"}
    assert all(row.record_b is None and row.record_a is not None for row in tensors)  # the mode's side only
