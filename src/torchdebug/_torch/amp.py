"""The ``torch.amp.GradScaler`` state the flight recorder reads, which the scaler has no public API for:

- ``GradScaler._scale``: the scale tensor on the gradients' device (``None`` until the first
  ``scale()``). ``get_scale()`` reads it to the host, a synchronisation; the monitor instead stages
  the tensor with the step's statistics, so that gradients watched as the backward leaves them
  (still scaled) are divided by the scale they were made with once the host has both.
- ``GradScaler._per_optimizer_states[id(optimizer)]["stage"]``: whether ``unscale_`` already ran
  on an optimizer since the last ``update()`` (a loop that unscales in order to clip), which a
  second ``unscale_`` refuses.

Unchanged from torch 2.11 through 2.14 (``torch/amp/grad_scaler.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.amp.grad_scaler import OptState

from torchdebug._torch import require

require("the flight recorder under a loss scaler (GradScaler internals)")


def scale_reader(scaler: object) -> Callable[[], torch.Tensor | None] | None:
    """A function returning the scale ``scaler`` multiplies the loss by now, as the tensor it keeps
    (no host read; ``None`` while disabled or before its first ``scale()``); ``None`` for a scaler
    that is not a ``GradScaler`` (one of the loop's own kind), whose scale cannot be read."""
    if not isinstance(scaler, torch.amp.GradScaler):
        return None
    return lambda: scaler._scale if scaler.is_enabled() else None


def unscaled(scaler: object, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``scaler.unscale_(optimizer)`` ran since the scaler's last ``update()`` (``False``
    for a scaler that is not a ``GradScaler``)."""
    if not isinstance(scaler, torch.amp.GradScaler):
        return False
    state = scaler._per_optimizer_states.get(id(optimizer))  # a defaultdict: get() adds no entry
    return state is not None and state["stage"] is OptState.UNSCALED


__all__ = ["scale_reader", "unscaled"]
