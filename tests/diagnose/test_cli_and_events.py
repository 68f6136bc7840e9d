"""The command line entry convention, graph-break summary and the report outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdebug.diagnose as td
from tests.diagnose.models import broken_in_the_middle, line_of
from torchdebug.cli import main
from torchdebug.diagnose._entry import load_entry

MODELS = Path(__file__).with_name("models.py")


def test_graph_breaks_are_counted_with_their_reason_and_source_line(tmp_path: Path) -> None:
    report = td.diagnose(broken_in_the_middle, torch.randn(4), backend="aot_eager", output_dir=tmp_path)
    events = report.compile_events
    assert report.ok and events.graphs == 2 and events.count("graph break") == 1 and events.count("recompile") == 0
    event = events.events[0]
    assert event.source == f"{MODELS}:{line_of('BREAK LINE')} in broken_in_the_middle"
    assert "print" in event.reason or "builtin" in event.reason
    assert "1 graph break" in report.summary()


def test_entry_loads_a_script_function_returning_model_and_inputs() -> None:
    model, inputs = load_entry(f"{MODELS}:make_model_and_inputs")
    assert isinstance(model, torch.nn.Module) and len(inputs) == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [("no_colon.py", "must look like"), (f"{MODELS}:missing", "has no function 'missing'"), ("nowhere.py:f", "no script")],
)
def test_entry_errors_name_the_problem_and_the_fix(spec: str, message: str) -> None:
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_entry(spec)


def test_cli_reports_a_planted_bug_with_exit_status_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["diagnose", f"{MODELS}:make_model_and_inputs", "--backend", "relu_accuracy_error_TESTING_ONLY", "-o", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert status == 1
    assert f"models.py:{line_of('RELU LINE')}" in out and "repro:" in out
    assert (tmp_path / "report.html").is_file() and (tmp_path / "repro.py").is_file()


def test_cli_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "not-an-entry"]) == 2
    assert "must look like" in capsys.readouterr().err
