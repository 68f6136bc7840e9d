"""The private autograd hooks eager capture relies on.

- ``torch._C._current_autograd_node()``: the autograd node the engine is running (``None`` outside
  backward). It tells backward ops from forward ones and which forward op they differentiate.
- ``torch._C._autograd._get_sequence_nr()``: the sequence number the next autograd node will get;
  a node's ``_sequence_nr()`` is the number it got when its forward op ran.
- ``Tensor._version``: the in-place version counter; a tensor whose storage and version are
  unchanged holds the values already captured.

Unchanged from torch 2.11 through 2.14. The accessors are C-level callables (``operator``), so the
per-op path pays no Python frame for going through this module.
"""

from __future__ import annotations

import operator

from torchdebug._torch import require

require("eager capture (autograd internals)")

from torch._C import _current_autograd_node as current_autograd_node  # noqa: E402
from torch._C._autograd import _get_sequence_nr as next_sequence_nr  # noqa: E402

node_sequence_nr = operator.methodcaller("_sequence_nr")
"""``node_sequence_nr(node)``: the sequence number an autograd node got when its forward op ran."""

tensor_version = operator.attrgetter("_version")
"""``tensor_version(tensor)``: the tensor's in-place version counter."""

__all__ = ["current_autograd_node", "next_sequence_nr", "node_sequence_nr", "tensor_version"]
