"""When a graph dump's training step begins: the step's first graph running again, unless the
gradients are being accumulated (the next micro-batch of the same step).

A compiled graph does not know the training loop, so a step begins when the step's first forward
graph runs again for the same module instance. Under gradient accumulation that rule would count
each micro-batch as a step; eager capture counts what the user counts (``Debugger.step()`` once per
optimizer step), and compare pairs steps by number. So a run of the first graph again continues the
step while gradients accumulate: the step ran a backward, no optimizer step followed it
(``torch.optim``'s global step hook) and the instance's parameters still hold gradients (after
``zero_grad()`` they hold ``None``). docs/graph_dump.md, "Records and names", says what the rule
cannot see.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = ["StepClock"]

log = logging.getLogger("torchdebug.graph_dump._step_clock")


class StepClock:
    """Tells which forward graph runs begin a training step (see the module's docstring)."""

    def __init__(self) -> None:
        self._first: Hashable | None = None
        """The graph code and instance of the step's first forward run."""
        self._backward = False
        """A backward graph ran in this step."""
        self._optimizer_stepped = False
        """An optimizer step ran in this step."""
        self._optimizer_seen = False
        """An optimizer step ran since the dump began."""
        self._continued = 0
        """Runs of the first graph that continued their step (micro-batches)."""
        clock = weakref.ref(self)  # the global hook must not keep an unclosed dump alive

        def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
            alive = clock()
            if alive is not None:
                alive._optimizer_stepped = alive._optimizer_seen = True

        self._hook = register_optimizer_step_post_hook(stepped)

    def backward_ran(self) -> None:
        """A backward graph ran."""
        self._backward = True

    def begins(self, code: Hashable, parameters: Callable[[], Iterable[torch.Tensor]]) -> bool:
        """Whether a forward graph run outside any backward, of ``code`` (the graph's code and its
        instance), begins a new step; ``parameters``: the instance's parameters, asked for only when
        the first graph runs again after a backward (their ``grad`` is read, never their values)."""
        if self._first is None:
            self._first = code
            return False
        if code != self._first:
            return False
        if self._accumulating(parameters):
            self._continued += 1
            return False
        self._backward = self._optimizer_stepped = False
        return True

    def _accumulating(self, parameters: Callable[[], Iterable[torch.Tensor]]) -> bool:
        if not self._backward or self._optimizer_stepped:
            return False
        return any(parameter.grad is not None for parameter in parameters())

    def close(self) -> None:
        """Stop listening to optimizer steps; warn where steps were continued as micro-batches in a
        run without any ``torch.optim`` step (a loop that keeps its gradients between steps)."""
        self._hook.remove()
        if self._continued and not self._optimizer_seen:
            log.warning(
                "torchdebug: the graph dump counted %d runs of the step's first graph as micro-batches of gradient "
                "accumulation (each after a backward, with gradients held) and no torch.optim step ran: if they began "
                "training steps, set the gradients to None between steps (model.zero_grad()), or the dump's steps will "
                "not pair with an eager dump's",
                self._continued,
            )
