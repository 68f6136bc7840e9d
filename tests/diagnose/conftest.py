"""Every diagnose test starts from fresh Dynamo state and default planted-bug settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch.compiler.reset()
    torch.manual_seed(0)
    yield
    torch.compiler.reset()
