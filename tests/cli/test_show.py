"""``torchdebug show`` fits a screen: a summary, the first records, and how to see more."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import torchdebug
from torchdebug.cli import main


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Linear(4, 4)
        self.big = nn.Linear(4, 4)
        with torch.no_grad():
            self.big.weight.fill_(100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.big(self.small(x)) - 1e4).log()  # log of negative numbers: NaN, made by `log`


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("show") / "dump"
    torch.manual_seed(0)
    model = _Net()
    with torchdebug.dump(path, model=model, task="statistics"):
        model(torch.linspace(-1, 1, 8).reshape(2, 4)).nan_to_num().sum().backward()
    return path


def _records(out: str) -> int:
    return sum(line.startswith(("forward/", "backward/", "optimizer/")) for line in out.splitlines())


def test_by_default_a_summary_then_ten_records_then_how_to_see_more(dump, capsys):
    assert main(["show", str(dump), "--no-stack"]) == 0
    out = capsys.readouterr().out
    total = len(torchdebug.load(dump).ranks[0].records())
    assert f"{total} records of " in out and "in steps 0" in out
    phases = out[out.index("phase") : out.index("modules (")]
    assert "forward" in phases and "backward" in phases
    assert _records(out.split("the first 10 records:")[1]) == 10
    assert f"... {total - 10} more: --limit N or --all prints them" in out


def test_modules_with_a_nan_come_first_then_the_largest(dump, capsys):
    assert main(["show", str(dump), "--no-stack"]) == 0
    out = capsys.readouterr().out
    assert "first NaN/Inf of rank 0: step 0: forward/<root>/aten.log.default#0" in out
    table = out[out.index("modules (") : out.index("largest magnitudes:")].splitlines()[2:]
    rows = [row.split() for row in table if row.strip()]
    nonfinite = [row[0] for row in rows if row[2] != "0"]
    assert nonfinite and [row[0] for row in rows[: len(nonfinite)]] == nonfinite  # the log's NaN and its gradient
    later = [row[0] for row in rows[len(nonfinite) :]]
    assert later.index("big") < later.index("small")  # |x| in the hundreds before |x| <= 1


def test_all_and_limit_zero_print_every_record_and_limit_n_prints_n(dump, capsys):
    total = len(torchdebug.load(dump).ranks[0].records())
    for argv in (["--all"], ["--limit", "0"]):
        assert main(["show", str(dump), "--no-stack", *argv]) == 0
        out = capsys.readouterr().out
        assert f"all {total} records:" in out and _records(out) == total and "more:" not in out
    assert main(["show", str(dump), "--no-stack", "--limit", "3"]) == 0
    assert _records(capsys.readouterr().out.split("the first 3 records:")[1]) == 3


def test_filters_narrow_the_summary_too(dump, capsys):
    assert main(["show", str(dump), "--no-stack", "--name", "aten.log"]) == 0
    out = capsys.readouterr().out
    phases = out[out.index("phase") : out.index("modules (")]
    assert "forward" in phases and "backward" not in phases
    assert "all " in out and "more:" not in out


def test_piping_into_head_ends_quietly(dump):
    show = subprocess.Popen(
        [sys.executable, "-m", "torchdebug", "show", str(dump), "--all"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    show.stdout.readline()
    show.stdout.close()  # what `head -1` does after one line
    assert show.wait(timeout=120) == 0
    assert show.stderr.read() == b""
