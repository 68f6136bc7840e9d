"""The private autograd hooks eager capture relies on, in one place.

- ``torch._C._current_autograd_node()``: the autograd node the engine is running (``None`` outside
  backward). It tells backward ops from forward ones and which forward op they differentiate.
- ``torch._C._autograd._get_sequence_nr()``: the sequence number the next autograd node will get;
  a node's ``_sequence_nr()`` is the number it got when its forward op ran.

Both exist unchanged since torch 2.1 (checked on 2.6 through 2.13); ``tests/capture`` imports them
so a torch release that moves them fails there first.
"""

from __future__ import annotations

import torch
from torch.torch_version import TorchVersion

if TorchVersion(torch.__version__) < (2, 6):
    raise ImportError(f"torchdebug needs torch >= 2.6 (found {torch.__version__})")

from torch._C import _current_autograd_node as current_autograd_node  # noqa: E402
from torch._C._autograd import _get_sequence_nr as next_sequence_nr  # noqa: E402

__all__ = ["current_autograd_node", "next_sequence_nr"]
