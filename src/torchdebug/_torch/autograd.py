"""The private autograd hooks eager capture relies on.

- ``torch._C._current_autograd_node()``: the autograd node the engine is running (``None`` outside
  backward). It tells backward ops from forward ones and which forward op they differentiate.
- ``torch._C._autograd._get_sequence_nr()``: the sequence number the next autograd node will get;
  a node's ``_sequence_nr()`` is the number it got when its forward op ran.
- ``Tensor._version``: the in-place version counter; a tensor whose storage and version are
  unchanged holds the values already captured. An inference tensor keeps none (reading it raises).
- ``Tensor._base``: the tensor a view was made from (the first one, for views of views), ``None``
  for a tensor that is no view; capture's value ids name a view's memory by it.
- ``Variable._execution_engine.queue_callback``: run a function when the running backward ends,
  after its final callbacks queued before it. FSDP2 and DDP finish their gradients there (the last
  reduce-scatter waited for, the buckets copied back); :func:`after_backward` runs after them.

Unchanged from torch 2.11 through 2.14. The accessors but ``tensor_version`` are C-level callables
(``operator``): the per-op path pays no Python frame for going through this module.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

from torchdebug._torch import require

require("eager capture (autograd internals)")

from torch._C import _current_autograd_node as current_autograd_node  # noqa: E402
from torch._C._autograd import _get_sequence_nr as next_sequence_nr  # noqa: E402

node_sequence_nr = operator.methodcaller("_sequence_nr")
"""``node_sequence_nr(node)``: the sequence number an autograd node got when its forward op ran."""

_version = operator.attrgetter("_version")


def tensor_version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place version counter; ``None`` for an inference tensor (made under
    ``torch.inference_mode``), which keeps none: what was read of one is never reused, since it may
    have been written since without a trace."""
    return None if tensor.is_inference() else _version(tensor)


view_base = operator.attrgetter("_base")
"""``view_base(tensor)``: the tensor whose memory a view shares, ``None`` for a tensor that is no view."""


def after_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the backward now running ends (call it from a hook inside that backward),
    after every final callback queued so far and those they queue: it queues a callback that queues
    ``callback``, and the engine runs callbacks queued while it runs them, in order. So FSDP2's and
    DDP's final callbacks, queued as the backward started or ran, have set the gradients by then."""
    from torch.autograd import Variable

    engine = Variable._execution_engine
    engine.queue_callback(lambda: engine.queue_callback(callback))


__all__ = [
    "after_backward",
    "current_autograd_node",
    "next_sequence_nr",
    "node_sequence_nr",
    "tensor_version",
    "view_base",
]
