"""Fixtures for the compile backend tests: a clean Dynamo, and a private debug folder per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test compiles from scratch: Dynamo's caches and counters are reset before and after."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def debug_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``TORCH_COMPILE_DEBUG=1`` with PyTorch's run folders under ``tmp_path/debug``."""
    monkeypatch.setenv("TORCH_COMPILE_DEBUG", "1")
    root = tmp_path / "debug"
    with torch._dynamo.config.patch(debug_dir_root=str(root)):
        yield root
