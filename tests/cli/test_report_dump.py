"""``torchdebug report DUMP`` on an eager dump: one offline page naming each rank's first NaN/Inf."""

import re

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


class _Scaled(torch.nn.Module):
    """Two linears and an exact large value (3000 = 1000 * 3, the same bits from every kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(3, 3)
        self.decoder = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = torch.full_like(x, 1000.0) * 3.0
        return self.decoder(self.encoder(x) + big * 0.0).sum()


def test_report_of_a_clean_dump_is_an_overview_of_phases_magnitudes_and_modules(tmp_path):
    torch.manual_seed(0)
    model = _Scaled()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.dump(tmp_path / "dump", model=model):
        model(torch.randn(2, 3)).backward()
        optimizer.step()
    page = tmp_path / "pages" / "report.html"  # the folder is made
    assert main(["report", str(tmp_path / "dump"), "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    phases = re.search(r'<table class="small" id="phases-0">.*?</table>', html, re.S).group(0)
    assert all(f"<td>{phase}</td>" in phases for phase in ("forward", "backward", "optimizer"))
    largest = re.search(r'id="largest-0">.*?</tbody>', html, re.S).group(0)
    first = re.search(r"<tbody>\s*<tr>(.*?)</tr>", largest, re.S).group(1)
    assert ">3000<" in first and "aten.mul.Tensor#0/output.0" in first
    modules = re.findall(r'<td class="mono slot">([^<]*)</td>', re.search(r'id="modules-0">.*?</table>', html, re.S).group(0))
    assert {"encoder", "decoder"} <= set(modules)
    assert '<svg class="module-plot"' in html and "<circle" in html
