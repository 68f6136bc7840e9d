"""End to end: dumps of real training steps compared, as the issue's checklist asks."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import torchdebug
from tests.compare.conftest import source_line
from tests.store.old_format import to_json_lines


def test_a_dump_compared_with_itself_is_all_pass(dumps):
    result = torchdebug.compare(dumps("gpt"), dumps("gpt"))
    assert result.counts()["pass"] == len(result.rows) > 0
    assert result.first_divergence is None
    assert not result.diverged


def test_two_runs_of_the_same_program_match_exactly(dumps):
    result = torchdebug.compare(dumps("mlp"), dumps("mlp", gain=1.0, grad_factor=1.0))
    assert {row.match for row in result.rows} == {"exact"}
    assert not result.diverged


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_a_planted_op_bug_is_the_first_divergence_with_its_source_line(dumps, task):
    result = torchdebug.compare(dumps("mlp", task=task, gain=1.001), dumps("mlp", task=task))
    first = result.first_divergence
    assert result.diverged
    assert (first.phase, first.op, first.io) == ("forward", "aten.mul.Tensor", "output")
    assert first.source.endswith(f"conftest.py:{source_line('planted bug line')} in forward")
    assert any("h = h * self.gain" in frame for frame in result.stack(first))


def test_rows_after_the_planted_bug_are_inherited_not_blamed(dumps):
    result = torchdebug.compare(dumps("mlp", gain=1.001), dumps("mlp"))
    blamed = [row for row in result.rows if row.attribution == "blamed"]
    inherited = [row for row in result.rows if row.attribution == "inherited"]
    assert {row.op for row in blamed} == {"aten.mul.Tensor"}
    assert any(row.phase == "backward" for row in inherited)
    assert all(row.verdict == "warning" for row in inherited)


def test_bf16_autocast_against_fp32_of_a_healthy_model_has_no_error_rows(dumps):
    result = torchdebug.compare(dumps("gpt", bf16=True), dumps("gpt"))
    assert result.counts()["error"] == 0
    assert result.first_divergence is None
    # the extra casts of the autocast run are listed, not dropped
    only_b = [row for row in result.rows if row.match == "only_a" and row.op == "aten._to_copy.default"]
    assert only_b


def test_a_bug_larger_than_bf16_rounding_is_found_in_a_bf16_run(dumps):
    healthy = torchdebug.compare(dumps("mlp", bf16=True), dumps("mlp"))
    buggy = torchdebug.compare(dumps("mlp", bf16=True, gain=1.1), dumps("mlp"))
    assert healthy.first_divergence is None
    assert (buggy.first_divergence.op, buggy.first_divergence.io) == ("aten.mul.Tensor", "output")


def test_bf16_statistics_against_fp32_statistics_has_no_error_rows(dumps):
    result = torchdebug.compare(dumps("gpt", task="statistics", bf16=True), dumps("gpt", task="statistics"))
    assert result.counts()["error"] == 0


def test_a_nan_injected_in_the_backward_is_the_first_non_finite_op(dumps):
    result = torchdebug.compare(dumps("mlp", grad_factor=float("nan")), dumps("mlp"))
    first = result.first_nonfinite
    assert (first.phase, first.op, first.io) == ("backward", "aten.mul.Tensor", "output")
    # backward records carry the source line of the forward op they differentiate
    assert first.source.endswith(f"conftest.py:{source_line('scale grad forward')} in forward")
    assert result.first_divergence is first


def test_an_intentional_minus_inf_mask_on_both_sides_is_not_non_finite(dumps):
    result = torchdebug.compare(dumps("gpt"), dumps("gpt"))
    masked = [row for row in result.rows if row.op == "aten.masked_fill.Scalar" and row.io == "output"]
    assert masked and all(row.verdict == "pass" for row in masked)
    assert result.first_nonfinite is None


def test_statistics_only_compare_is_used_when_asked_even_with_tensors(dumps):
    result = torchdebug.compare(dumps("mlp", gain=1.001), dumps("mlp"), tensors=False)
    assert "cosine" not in result.first_divergence.metrics
    assert "norm_rel" in result.first_divergence.metrics


def test_tolerance_override_turns_the_planted_bug_into_a_pass(dumps):
    result = torchdebug.compare(dumps("mlp", gain=1.001), dumps("mlp"), tolerances={"float32": 0.01})
    assert not result.diverged


def test_models_of_different_width_are_reported_as_different_configurations(dumps):
    result = torchdebug.compare(dumps("gpt", d_model=64), dumps("gpt"))
    assert result.diverged
    assert any("differ in shape" in problem for problem in result.problems)
    assert result.first_divergence.message.startswith("shape differs")


def test_unrelated_models_are_noted_as_different_programs(dumps):
    result = torchdebug.compare(dumps("mlp"), dumps("gpt"))
    assert any("look like different models or programs" in problem for problem in result.problems)
    assert result.counts()["unmatched"] > result.counts()["pass"]


def test_dumps_with_nothing_in_common_are_refused(dumps):
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe" / "statistics_fp32"
    with pytest.raises(ValueError, match="no tensor records in common"):
        torchdebug.compare(dumps("mlp"), fixture)


def test_summary_names_the_first_divergence_and_its_source(dumps):
    text = torchdebug.compare(dumps("mlp", gain=1.001), dumps("mlp")).summary()
    assert "first divergence" in text and "aten.mul.Tensor" in text and "conftest.py" in text


def test_a_mapping_pairs_a_renamed_module(dumps, tmp_path):
    renamed = tmp_path / "renamed"
    import shutil

    shutil.copytree(dumps("mlp", task="statistics"), renamed)
    records = to_json_lines(renamed)
    records.write_text(records.read_text().replace('"fc1', '"encoder').replace("/fc1/", "/encoder/"))
    plain = torchdebug.compare(renamed, dumps("mlp", task="statistics"))
    mapped = torchdebug.compare(renamed, dumps("mlp", task="statistics"), mapping={"modules": {"encoder": "fc1"}})
    assert plain.counts()["unmatched"] > 0
    assert mapped.counts()["unmatched"] == 0
    assert "mapped" in {row.match for row in mapped.rows}


def test_json_output_is_strict_json_even_with_infinite_errors(dumps, tmp_path):
    import json

    result = torchdebug.compare(dumps("mlp", grad_factor=float("nan")), dumps("mlp"))
    data = json.loads(result.to_json(tmp_path / "r.json").read_text())
    assert data["first_nonfinite"]["phase"] == "backward"
    assert data["counts"] == result.counts()


def test_a_bug_in_the_second_step_is_found_in_that_step(tmp_path):
    import torch
    from torch import nn

    from tests.compare.conftest import BuggyMLP

    def dump(path, gain):
        torchdebug.seed_all(1234)
        model = BuggyMLP()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        debugger = torchdebug.Debugger(path, task="statistics")
        for step in range(2):
            model.gain = gain if step == 1 else 1.0
            debugger.start(model)
            nn.functional.cross_entropy(model(torch.randn(4, 16)), torch.randint(0, 8, (4,))).backward()
            optimizer.step()
            optimizer.zero_grad()
            debugger.stop()
            debugger.step()
        debugger.close()
        return path

    result = torchdebug.compare(dump(tmp_path / "bad", 1.001), dump(tmp_path / "good", 1.0))
    assert (result.first_divergence.step, result.first_divergence.op) == (1, "aten.mul.Tensor")
    assert result.counts()["error"] == 1


@pytest.mark.parametrize("enabled", [True, False])
def test_compare_leaves_the_garbage_collector_as_it_found_it(dumps, enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        torchdebug.compare(dumps("mlp", task="statistics"), dumps("mlp", task="statistics"))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_the_garbage_collector_runs_once_at_most_in_a_compare(dumps):
    """With torch imported, each full collection walks every live object (tens of ms)."""
    a, b = dumps("gpt", task="statistics", bf16=True), dumps("gpt", task="statistics")
    started = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        torchdebug.compare(a, b)
    finally:
        gc.callbacks.remove(count)
    assert len(started) <= 1  # over the objects the compare made, once it is done
