"""Dumps shared by the compare tests: a tiny MLP with a plantable bug, a tiny GPT in fp32/bf16 (either
with a wrong kernel planted), and a three-rank data-parallel run with one rank's update perturbed.

Each dump is written once per session, when a test first asks for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from tests.compare.replicas import dump_replicas


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor`` (NaN plants a backward NaN)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.clone()  # scale grad forward

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


class BuggyMLP(nn.Module):
    """Linear → tanh → (× gain) → Linear. ``gain != 1`` plants a single-op bug in the forward."""

    def __init__(self, gain: float = 1.0, grad_factor: float = 1.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)
        self.gain = gain
        self.grad_factor = grad_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        h = h * self.gain  # planted bug line
        h = _ScaleGrad.apply(h, self.grad_factor)
        return self.fc2(h)


def source_line(marker: str) -> int:
    """Line number in this file of the line that ends with ``# {marker}``."""
    lines, start = inspect.getsourcelines(inspect.getmodule(BuggyMLP))
    for offset, line in enumerate(lines):
        if line.rstrip().endswith(f"# {marker}"):
            return max(start, 1) + offset
    raise AssertionError(marker)


class WrongKernel(TorchDispatchMode):
    """A kernel bug: call number ``call`` (from 0) of the aten op ``op`` returns its result times
    ``factor``. Entered before the dump, so the dump records the op's inputs and its wrong output."""

    def __init__(self, op: str, call: int, factor: float) -> None:
        super().__init__()
        self.op, self.call, self.factor = op, call, factor
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if str(func) == self.op:
            if self.calls == self.call:
                out = out * self.factor
            self.calls += 1
        return out


def planted(wrong: tuple[str, int, float] | None) -> WrongKernel | nullcontext:
    """``WrongKernel(*wrong)``, or nothing planted."""
    return WrongKernel(*wrong) if wrong else nullcontext()


def dump_mlp(
    path: Path,
    task: str = "tensor",
    bf16: bool = False,
    wrong: tuple | None = None,
    tensor_list: tuple[str, ...] = (),
    **options: float,
) -> Path:
    """One SGD step of :class:`BuggyMLP` dumped at ``path`` (forward under bf16 autocast if asked;
    ``wrong``: a :class:`WrongKernel` planted; ``tensor_list``: the calls whose tensors are saved)."""
    torchdebug.seed_all(1234)
    model = BuggyMLP(**options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)
    target = torch.randint(0, 8, (4,))
    with planted(wrong), torchdebug.dump(path, model=model, task=task, tensor_list=list(tensor_list)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), target)
        loss.backward()
        optimizer.step()
    return path


def dump_gpt(
    path: Path, task: str = "tensor", bf16: bool = False, d_model: int = 32, wrong: tuple | None = None, dropout: float = 0.0
) -> Path:
    """One AdamW step of a 1-layer GPT, in fp32 or with the forward under bf16 autocast (``wrong``:
    a :class:`WrongKernel` planted)."""
    torchdebug.seed_all(1234)
    model = GPT(GPTConfig(n_layer=1, d_model=d_model, n_head=4, seq_len=16, dropout=dropout))
    optimizer = torch.optim.AdamW(model.parameters())
    batch = make_batch(model.config, batch=2)
    with planted(wrong), torchdebug.dump(path, model=model, task=task):
        train_step(model, optimizer, batch, autocast=torch.bfloat16 if bf16 else None)
    return path


@pytest.fixture(scope="session")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``dumps(kind, **options)`` → a dump folder, made once per session for each distinct request."""
    made: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("dumps")

    def get(kind: str, **options: object) -> Path:
        key = (kind, tuple(sorted(options.items())))
        if key not in made:
            path = root / f"{kind}-{len(made)}"
            made[key] = (dump_mlp if kind == "mlp" else dump_gpt)(path, **options)
        return made[key]

    return get


@pytest.fixture(scope="session")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Dump paths of the three-rank runs (``healthy``, ``perturbed``, ``perturbed_stats``), spawned once."""
    return dump_replicas(tmp_path_factory.mktemp("replicas"))
