"""``torchdebug report DUMP`` on an eager dump: one offline page naming each rank's first NaN/Inf."""

import torch

import torchdebug
from torchdebug.cli import main


class _BackwardInf(torch.nn.Module):
    """Finite forward, Inf gradient: the square root of zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(self.fc(x) * 0.0).sum()


def test_report_of_an_overflow_check_dump_names_the_first_nan_or_inf_and_its_slots(tmp_path, capsys):
    torch.manual_seed(0)
    model = _BackwardInf()
    with torchdebug.dump(tmp_path / "dump", model=model, task="overflow_check", overflow_nums=-1):
        model(torch.randn(2, 3)).backward()
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "dump"), "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    assert "first NaN/Inf</strong> at step 0: backward/" in html
    assert "aten.sqrt.default" in html and "test_report_dump.py:" in html  # the forward line that made it
    assert 'id="overflows-0"' in html and "<script src=" not in html  # the slot table, nothing fetched


def test_report_of_a_clean_statistics_dump_says_so(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    with torchdebug.dump(tmp_path / "dump", model=model):
        model(torch.randn(2, 3)).sum().backward()
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "dump"), "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    assert "no NaN or Inf in the statistics of this rank" in html and "overflows-0" not in html
