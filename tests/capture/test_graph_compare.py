"""An eager dump and a compiled dump of the GPT example line up and agree (issue 5, item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch
from tests.backends import dump_backend

CONFIG = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64)


@pytest.mark.slow  # about 100 s on 2 cores: inductor compiles a statistics kernel per dumped value
def test_eager_and_compiled_dumps_of_gpt_compare_as_all_pass(tmp_path: Path) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(CONFIG)
    with torchdebug.dump(tmp_path / "eager", model=model, task="statistics"):
        model(*make_batch(CONFIG)).backward()
    model.zero_grad()
    backend = dump_backend(tmp_path / "compiled")
    torch.compile(model, backend=backend)(*make_batch(CONFIG)).backward()
    backend.data_dump.close()

    result = torchdebug.compare(tmp_path / "compiled", tmp_path / "eager")
    counts = result.counts()
    assert counts["error"] == 0 and counts["warning"] == 0, result.summary()
    assert counts["pass"] >= 100, result.summary()
    passed = {row.name for row in result.rows if row.verdict == "pass"}
    for name in (
        "forward/layers.0.attn.qkv/aten.addmm.default#0/output.0",
        "forward/layers.0.attn/aten.bmm.default#0/output.0",
        "forward/tok/aten.embedding.default#0/output.0",
        "backward/layers.0.mlp.fc/aten.mm.default#0/output.0",
    ):
        assert name in passed, name
    # forward nodes that alone replaced a decomposed view op carry that op's name
    renamed = {row.name: row.record_a.extra.get("target") for row in result.rows if row.verdict == "pass"}
    assert renamed["forward/layers.0.attn.proj/aten.t.default#0/output.0"] == "aten.permute.default"
    assert renamed["forward/layers.0.attn.proj/aten.view.default#0/output.0"] == "aten.reshape.default"
    assert result.first_divergence is None
    torch._dynamo.reset()
