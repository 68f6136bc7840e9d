"""The diagnose tests' Llama: ``examples/llama.py`` at its smallest (one layer, dim 16, sequence 4)."""

from __future__ import annotations

import torch

from examples.llama import Llama, apply_rope, rope_frequencies

__all__ = ["apply_rope", "rope_frequencies", "tiny_llama"]


def tiny_llama(**sizes: int | float) -> tuple[Llama, torch.Tensor]:
    """A seeded model and a batch of tokens ``(1, seq)``; ``sizes`` override the small defaults."""
    torch.manual_seed(0)
    model = Llama(**{"vocab": 16, "dim": 16, "heads": 2, "layers": 1, "seq": 4, "hidden": 32, **sizes})  # type: ignore[arg-type]
    tokens = torch.randint(0, model.head.out_features, (1, model.frequencies.shape[0]))
    return model, tokens
