"""Tolerances from the run itself (``noise=``, issue 46 item 4): each slot of A is judged against a
tolerance measured from B against B's step run again with its inputs rounded through bf16 and back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug
from tests.compare.conftest import BuggyMLP
from torchdebug.cli import main
from torchdebug.compare._calibration import NOISE_MULTIPLE
from torchdebug.compare._tolerances import rounding_tolerance
from torchdebug.errors import ConfigError


def _dump(path: Path, *, bf16: bool = False, rounded: bool = False, gain: float = 1.0) -> Path:
    """One SGD step of :class:`BuggyMLP` (``gain``: its planted scale), its forward under bf16
    autocast if ``bf16``, its inputs rounded through bf16 and back if ``rounded`` (the noise dump)."""
    torchdebug.seed_all(1234)
    model = BuggyMLP(gain=gain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(4, 16), torch.randint(0, 8, (4,))
    if rounded:
        x = x.to(torch.bfloat16).float()
    with torchdebug.dump(path, model=model, task="tensor"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        nn.functional.cross_entropy(logits.float(), target).backward()
        optimizer.step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A healthy bf16 run, one with a 1.05 scale planted, the fp32 reference and its noise dump."""
    root = tmp_path_factory.mktemp("calibrated")
    return {
        "bf16": _dump(root / "bf16", bf16=True),
        "scaled": _dump(root / "scaled", gain=1.05),
        "reference": _dump(root / "reference"),
        "noise": _dump(root / "noise", rounded=True),
    }


def _beyond(result: torchdebug.compare.CompareResult) -> int:  # type: ignore[name-defined]
    """Rows whose difference exceeds their tolerance (inherited, warned, undecided or blamed)."""
    rows = result.rows
    return sum(1 for row in rows if row.difference is not None and row.tolerance is not None and row.difference > row.tolerance)


def test_a_healthy_bf16_run_has_fewer_rows_beyond_tolerance_with_a_noise_dump(runs):
    plain = torchdebug.compare(runs["bf16"], runs["reference"])
    calibrated = torchdebug.compare(runs["bf16"], runs["reference"], noise=runs["noise"])
    assert _beyond(plain) > 0  # the dtype rule flags the healthy run's drift
    assert _beyond(calibrated) < _beyond(plain)
    for result in (plain, calibrated):
        assert result.first_divergence is None and result.counts()["error"] == 0
        assert result.counts()["warning"] == 0
    assert calibrated.options["noise"] == str(runs["noise"])


def test_each_calibrated_tolerance_is_the_noise_multiple_or_the_dtype_rounding_floor(runs):
    noise = {row.name: row.difference for row in torchdebug.compare(runs["reference"], runs["noise"]).rows}
    calibrated = torchdebug.compare(runs["bf16"], runs["reference"], noise=runs["noise"])
    checked = 0
    for row in calibrated.rows:
        measured = noise.get(row.name_b or "")
        if row.tolerance is None or measured is None or row.dtype_b != "float32":
            continue
        floor = rounding_tolerance("bfloat16" if "bfloat16" in (row.dtype_a, row.dtype_b) else "float32")
        assert row.tolerance == pytest.approx(max(NOISE_MULTIPLE * measured, floor)), row.name  # type: ignore[type-var]
        checked += 1
    assert checked > 10


def test_a_planted_scale_is_still_the_first_divergence_with_a_noise_dump(runs):
    plain = torchdebug.compare(runs["scaled"], runs["reference"])
    calibrated = torchdebug.compare(runs["scaled"], runs["reference"], noise=runs["noise"])
    assert plain.first_divergence is not None
    assert calibrated.first_divergence is not None
    assert calibrated.first_divergence.name == plain.first_divergence.name == "forward/<root>/aten.mul.Tensor#0/output.0"


def test_cli_noise_judges_with_the_noise_dump(runs, capsys):
    assert main(["compare", str(runs["scaled"]), str(runs["reference"]), "--noise", str(runs["noise"])]) == 1
    assert "aten.mul.Tensor#0/output.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("noise", "message"),
    [
        (3, r"^noise: got 3, expected the path of a dump"),
        ("", r"^noise: got '', expected the path of a dump"),
        ("/no/such/dump", r"^noise: got '/no/such/dump', which is not a folder; expected the path of a dump"),
    ],
)
def test_a_bad_noise_value_fails_in_one_line_before_any_dump_is_read(noise, message):
    with pytest.raises(ConfigError, match=message) as raised:
        torchdebug.compare("/no/such/a", "/no/such/b", noise=noise)  # A and B are never opened
    assert "\n" not in str(raised.value)


def test_cli_a_bad_noise_path_is_one_line_and_exit_status_2(runs, capsys):
    with pytest.raises(SystemExit) as exited:  # argparse names a flag's bad value while parsing
        main(["compare", str(runs["bf16"]), str(runs["reference"]), "--noise", "/no/such/dump"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "noise: got '/no/such/dump', which is not a folder" in err


def test_cli_noise_is_refused_with_across_ranks(runs, capsys):
    assert main(["compare", "--across-ranks", str(runs["reference"]), "--noise", str(runs["noise"])]) == 2
    assert "--noise applies to A B only" in capsys.readouterr().err


def test_worker_processes_calibrate_as_one_process_does(runs):
    alone = torchdebug.compare(runs["bf16"], runs["reference"], noise=runs["noise"])
    spread = torchdebug.compare(runs["bf16"], runs["reference"], noise=runs["noise"], workers=2)
    assert [(r.name, r.tolerance, r.verdict) for r in spread.rows] == [(r.name, r.tolerance, r.verdict) for r in alone.rows]
