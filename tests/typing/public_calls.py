"""Calls the docs show, as a type checker must accept them: ``make lint`` runs mypy on this file
against the package's stub, so a signature that rejects a documented spelling fails it."""

from __future__ import annotations

from pathlib import Path

import torch

import torchdebug


def documented_calls(model: torch.nn.Module, batch: torch.Tensor) -> None:
    with torchdebug.dump("dump", model=model, task="overflow_check", step="0|3-5", list="re:layers\\.0"):
        model(batch)
    with torchdebug.dump(Path("dump"), step=[0, "3-5"], rank=0, tensor_list=["attn"]):
        model(batch)
    result = torchdebug.compare("dump_bf16", "dump_fp32", tolerances={"bfloat16": 0.02}, rerun=True)
    if result is not None:
        print(result.first_divergence)
    torchdebug.compare(Path("a"), Path("b"), tolerances={"float32": {"rtol": 1e-5, "atol": 1e-6}}, noise=Path("c"))
    torchdebug.compare("dump", workers=4)
    torchdebug.compare("a", "b", mapping={"modules": {"old": "new"}})
    torchdebug.compare("a", "b", mapping="renames.json")
