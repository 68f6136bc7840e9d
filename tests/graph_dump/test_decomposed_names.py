"""Names follow values (issue 49, item 2): a compiled node is named after the eager op it stands
for only where its dtype and shape say it holds that op's value.

Inductor decomposes a float32 ``arange`` into an int64 ``iota``, a ``mul``, an ``add`` and a
``convert_element_type`` to float32 (diffusers' ``get_timestep_embedding`` makes its frequencies
so). The ``iota`` is the one view or factory stand-in among them, but not the ``arange``'s value:
named ``aten.arange.start``, it was paired with the eager float ``arange``, and through it the eager
float ``mul`` with the int64 ``mul`` inside the decomposition, a false error.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch._dynamo
from torch import nn

import torchdebug
from tests.backends import dump_backend


class TimestepEmbedding(nn.Module):
    """Sinusoidal timestep embedding, then a projection (diffusers' ``get_timestep_embedding``
    and ``TimestepEmbedding``)."""

    def __init__(self, channels: int = 16, out: int = 8) -> None:
        super().__init__()
        self.channels = channels
        self.linear = nn.Linear(channels, out)

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        half = self.channels // 2
        exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32, device=timesteps.device)
        exponent = exponent / half
        emb = timesteps[:, None].float() * torch.exp(exponent)[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        return self.linear(emb)


def test_a_float_arange_made_from_an_int64_iota_gives_no_false_error_under_inductor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TimestepEmbedding()
    timesteps = torch.tensor([1.0, 250.0, 999.0])
    with torchdebug.dump(tmp_path / "eager", model=model, task="statistics"):
        model(timesteps).sum().backward()
    model.zero_grad()
    torch._dynamo.reset()
    backend = dump_backend(tmp_path / "compiled")  # inductor: its decompositions, its generated code
    torch.compile(model, backend=backend)(timesteps).sum().backward()
    backend.data_dump.close()
    torch._dynamo.reset()

    records = torchdebug.load(tmp_path / "compiled").ranks[0].records()
    named = [r for r in records if r.op == "aten.arange.start" and r.io == "output"]
    assert all(r.dtype == "float32" for r in named), [(r.name, r.dtype) for r in named]
    assert any(r.op == "prims.iota.default" and r.dtype == "int64" for r in records), "the iota keeps its own name"

    result = torchdebug.compare(tmp_path / "compiled", tmp_path / "eager")
    assert result.counts()["error"] == 0, result.summary()
    assert result.first_divergence is None
    inside = {row.name: row.name_b for row in result.rows if row.match == "inside"}
    assert inside.get("forward/<root>/prims.iota.default#0/output.0") == "forward/<root>/aten.arange.start#0", inside
    for row in result.rows:  # no pair of an integer value with a floating-point one
        if row.record_a is not None and row.record_b is not None and row.kind == "tensor":
            assert (row.record_a.dtype == "int64") == (row.record_b.dtype == "int64"), row.name
