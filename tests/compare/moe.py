"""A two-layer mixture-of-experts model whose routing of one token can be flipped on purpose.

Each layer is a router linear → softmax → top-1 → a loop over the experts (``nonzero`` picks each
expert's tokens, ``index_add`` puts their outputs back), plus the residual. :func:`moe_batch` builds
a batch whose token 0 sits next to the tie between layer 1's experts 0 and 1, on either side of it
(``side=+1`` or ``-1``), by a logit gap of ``gap``: two batches that differ by a nudge of that size
route token 0 to different experts, and every other token is far from any tie (checked in float64,
so no CPU kernel's rounding can flip it).
"""

from __future__ import annotations

import torch
from torch import nn

_TOKENS, _DIM, _EXPERTS = 16, 8, 4
_MARGIN = 0.02
"""The smallest top-1 logit gap every token but token 0 of layer 1 keeps, on both batches."""


class MoE(nn.Module):
    """Router → softmax → top-1 → per-expert loop; ``scale`` multiplies the router's logits (a bug)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.router = nn.Linear(_DIM, _EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Linear(_DIM, _DIM) for _ in range(_EXPERTS))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(x) * self.scale if self.scale != 1.0 else self.router(x), dim=-1)
        weight, index = torch.topk(probs, 1, dim=-1)
        out = torch.zeros_like(x)
        for number, expert in enumerate(self.experts):
            rows = (index[:, 0] == number).nonzero().squeeze(-1)
            out = out.index_add(0, rows, expert(x[rows]) * weight[rows])
        return x + out


class MoENet(nn.Module):
    """Two MoE layers and a linear head."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer1 = MoE(scale)
        self.layer2 = MoE()
        self.head = nn.Linear(_DIM, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer2(self.layer1(x)))


def _logits(model: MoENet, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both layers' router logits in float64."""
    double = MoENet()
    double.load_state_dict(model.state_dict())
    double = double.double()
    with torch.no_grad():
        first = double.layer1.router(x.double())
        second = double.layer2.router(double.layer1(x.double()))
    return first, second


def _gaps(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def moe_batch(model: MoENet, side: int, gap: float = 1e-3, seed: int = 12) -> torch.Tensor:
    """A batch routing token 0 of layer 1 to expert 0 (``side=+1``) or 1 (``-1``) by ``gap``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(_TOKENS, _DIM, generator=generator, dtype=torch.float64)
    weight = model.layer1.router.weight.detach().double()
    towards = weight[0] - weight[1]  # moving along it changes logit 0 - logit 1 alone, among those two
    x[0] = 0.5 * (weight[0] + weight[1]) / (weight[0] + weight[1]).norm()  # experts 0 and 1 lead
    x[0] += (side * gap - towards @ x[0]) * towards / (towards @ towards)
    first, second = _logits(model, x)
    assert int(first[0].argmax()) == (0 if side > 0 else 1), "token 0 should lead with expert 0 or 1"
    assert float(_gaps(first)[0]) > 0.5 * gap and float(_gaps(first)[1:].min()) > _MARGIN, "a token near a tie"
    assert float(_gaps(second).min()) > _MARGIN, "a token of layer 2 near a tie"
    experts = first.argmax(-1)
    assert all(int((experts == e).sum()) >= 2 for e in range(_EXPERTS)), "an expert with fewer than 2 tokens"
    return x.float()


def train_step(model: MoENet, x: torch.Tensor) -> None:
    """One SGD step on the head's squared output."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).square().mean().backward()
    optimizer.step()
