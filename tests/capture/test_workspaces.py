"""A kernel's workspace for its backward (the reserve an LSTM's mkldnn or cuDNN kernel returns) is
scratch partly never written: two identical runs hold other bytes there. It is recorded as
``uninitialised`` and not read, where the kernel returns it and where the backward reads it, so two
identical runs compare clean (4 false errors before)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug
from torchdebug.records import UNINITIALISED, UNREAD


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8, padding_idx=0)
        self.rnn = nn.LSTM(8, 8, batch_first=True, num_layers=2)
        self.out = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(ids))
        return self.out(hidden[:, -1]).square().mean()


def _dump(folder: Path) -> list:
    torch.manual_seed(0)
    model = _Recurrent()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    with torchdebug.Debugger(folder, task="statistics") as debugger:
        for _ in range(2):
            debugger.start(model)
            model(ids).backward()
            optimizer.step()
            optimizer.zero_grad()
            debugger.step()
    return torchdebug.load(folder).ranks[0].records()


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_two_identical_lstm_runs_compare_clean_and_the_workspace_is_not_read(tmp_path, monkeypatch, native: str) -> None:
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    records = _dump(tmp_path / "a")
    _dump(tmp_path / "b")
    result = torchdebug.compare(tmp_path / "a", tmp_path / "b")
    assert result.counts()["error"] == 0 and result.counts()["warning"] == 0, result.summary()
    workspaces = [r for r in records if r.op == "aten.mkldnn_rnn_layer.default" and r.name.endswith("output.3")]
    read_again = [r for r in records if r.op == "aten.mkldnn_rnn_layer_backward.default" and r.dtype == "uint8"]
    assert len(workspaces) == len(read_again)  # each layer's, each step: none where torch takes another kernel
    for record in workspaces + read_again:
        assert record.extra.get(UNREAD) == UNINITIALISED and record.stats is None
