"""The program under diagnosis: a function or module and its inputs, run fresh for every stage.

Each run gets its own deep copy of the module (so gradients and compiled state never leak between
stages) and clones of the inputs; the fp64 reference widens each parameter, buffer and input within
its kind: floating to float64, complex to complex128 (a complex64 RoPE frequency buffer stays
complex), integer and bool untouched. With ``train`` every floating input requires a gradient, and
backward runs on ``sum(output * w)`` with fixed seeded weights ``w`` (a scalar output is used as
is), so every run differentiates the same function. Every run starts from the same random seed
(:data:`SEED`), so a program with dropout draws the same numbers in each run that executes the
same random ops. The values of a run are named ``output.N``, ``grad.<parameter>``
and ``grad.input.N``.
"""

from __future__ import annotations

import copy
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn

from torchdebug._torch.pytree import tree_leaves
from torchdebug.capture.stacks import SKIP_DIRS


@dataclass(slots=True)
class Outcome:
    """What one run produced: named tensors, or the exception it raised and where."""

    values: dict[str, torch.Tensor]
    error: BaseException | None = None
    user_frame: str | None = None
    """Innermost frame of the exception outside torch and torchdebug, ``file:line in function``."""


def user_frame(error: BaseException) -> str | None:
    """The innermost traceback frame outside torch and torchdebug (the chained causes included)."""
    found = None
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _innermost(current.__traceback__) or found
        current = current.__cause__ or getattr(current, "inner_exception", None) or current.__context__
    return found


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (of its cause, for a backend Dynamo wrapped)."""
    cause = getattr(error, "inner_exception", None) or error
    text = str(cause).strip() or type(cause).__name__
    return text.splitlines()[0]


def _innermost(tb: TracebackType | None) -> str | None:
    found = None
    for frame, line in traceback.walk_tb(tb):
        path = frame.f_code.co_filename
        if path.startswith(SKIP_DIRS) or path.startswith("<") or path.startswith(sys.prefix):
            continue
        found = f"{path}:{line} in {frame.f_code.co_name}"
    return found


SEED = 0
"""The seed of torch's global generators at the start of every run."""


def widen(value: torch.Tensor) -> torch.Tensor:
    """``value`` in the widest dtype of its kind: float64 or complex128; other dtypes as they are."""
    if value.is_complex():
        return value.to(torch.complex128)
    if value.is_floating_point():
        return value.to(torch.float64)
    return value


def widen_module(module: nn.Module) -> nn.Module:
    """Widen every parameter and buffer of ``module`` in place (:func:`widen`; shared tensors stay
    shared). Unlike ``module.to(torch.float64)``, which casts complex tensors to real and drops
    their imaginary part."""
    parameters: set[int] = set()
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (original, widened); keeps ids unique
    with torch.no_grad():
        for owner in module.modules():
            for _, parameter in owner.named_parameters(recurse=False):
                if id(parameter) not in parameters:
                    parameters.add(id(parameter))
                    parameter.data = widen(parameter.data)
            for name, buffer in owner.named_buffers(recurse=False):
                if id(buffer) not in buffers:
                    buffers[id(buffer)] = (buffer, widen(buffer))
                setattr(owner, name, buffers[id(buffer)][1])
    return module


def _grad_weight(value: torch.Tensor, index: int) -> torch.Tensor:
    if value.dim() == 0:
        return torch.ones((), dtype=value.dtype, device=value.device)
    generator = torch.Generator().manual_seed(1000 + index)
    return torch.randn(value.shape, generator=generator, dtype=torch.float64).to(value.device, value.dtype)


def _weighted_sum(value: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``sum(value * weight)``, real (the real part of a complex output's sum)."""
    total = (value * weight).sum()
    return total.real if total.is_complex() else total


class Program:
    """``fn(*inputs)`` for a function or an ``nn.Module``, forward only or forward and backward."""

    def __init__(self, fn: Callable[..., Any], inputs: Sequence[Any], *, train: bool) -> None:
        if not callable(fn):
            raise TypeError(f"diagnose: expected a function or nn.Module, got {type(fn).__name__}")
        self.fn, self.inputs, self.train = fn, tuple(inputs), train

    def instance(self, float64: bool = False) -> tuple[Callable[..., Any], list[Any]]:
        """A fresh copy of the callable and of the inputs (fp64 for the reference)."""
        fn = self.fn
        if isinstance(fn, nn.Module):
            fn = copy.deepcopy(fn)
            fn.zero_grad(set_to_none=True)
            if float64:
                fn = widen_module(fn)
        inputs = [self._input(x, float64) for x in self.inputs]
        return fn, inputs

    def _input(self, value: Any, float64: bool) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        copied = widen(value.detach()).clone() if float64 else value.detach().clone()
        if copied.is_floating_point():
            copied.requires_grad_(self.train or value.requires_grad)
        return copied

    def run(self, fn: Callable[..., Any], inputs: list[Any], params: nn.Module | None = None) -> Outcome:
        """Call ``fn`` (forward, then backward when training) and collect its values."""
        torch.manual_seed(SEED)
        try:
            return Outcome(self._execute(fn, inputs, params))
        except Exception as error:  # noqa: BLE001 - the exception is the finding
            return Outcome({}, error, user_frame(error))

    def _execute(self, fn: Callable[..., Any], inputs: list[Any], params: nn.Module | None) -> dict[str, torch.Tensor]:
        leaves = [t for t in tree_leaves(fn(*inputs)) if isinstance(t, torch.Tensor)]
        values = {f"output.{i}": t.detach() for i, t in enumerate(leaves)}
        if not self.train:
            return values
        differentiable = [(i, t) for i, t in enumerate(leaves) if t.requires_grad]
        if differentiable:
            loss = sum(_weighted_sum(t, _grad_weight(t, i)) for i, t in differentiable)
            loss.backward()  # type: ignore[union-attr]  # a tensor: differentiable is not empty
        if params is not None:
            values.update({f"grad.{name}": p.grad for name, p in params.named_parameters() if p.grad is not None})
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.grad is not None:
                values[f"grad.input.{i}"] = x.grad
        return values
