"""The ``torch.amp.GradScaler`` state the flight recorder reads, which the scaler has no public API for:

- ``GradScaler._scale``: the scale tensor on the gradients' device (``None`` until the first
  ``scale()``). ``get_scale()`` reads it to the host, a synchronisation; the monitor instead stages
  the tensor with the step's statistics, so that gradients watched as the backward leaves them
  (still scaled) are divided by the scale they were made with once the host has both.
- ``GradScaler._per_optimizer_states[id(optimizer)]``: whether ``unscale_`` already ran on an
  optimizer since the last ``update()`` (a loop that unscales in order to clip), which a second
  ``unscale_`` refuses, and what it found; a replay of the step's closure needs a fresh one, and
  the step's own back after.

Unchanged from torch 2.11 through 2.14 (``torch/amp/grad_scaler.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

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


@contextlib.contextmanager
def unscaling_again(scaler: object, optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Within: ``scaler`` takes an ``unscale_(optimizer)`` again (a replay of a closure that unscales
    to clip); after: its state for ``optimizer`` is the step's own again (its stage, the overflow it
    found), so the step's ``scaler.step`` and ``update`` go on as if nothing ran in between."""
    if not isinstance(scaler, torch.amp.GradScaler) or optimizer is None:
        yield
        return
    states = scaler._per_optimizer_states
    kept = states.pop(id(optimizer), None)  # a defaultdict: the next read makes a fresh one
    try:
        yield
    finally:
        states.pop(id(optimizer), None)
        if kept is not None:
            states[id(optimizer)] = kept


__all__ = ["scale_reader", "unscaled", "unscaling_again"]
