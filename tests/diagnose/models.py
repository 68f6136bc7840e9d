"""Tiny programs with a relu (the planted bugs' target), an entry for the command line, and planted
backward bugs as inductor passes (importable, so a repro can install them too)."""

from __future__ import annotations

import torch
import torch.fx
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass


class ReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc1(x)
        return self.fc2(torch.relu(hidden) * 2).sin()  # RELU LINE


class TanhNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.fc1(x))
        return self.fc2(hidden).sin()  # SIN LINE


def broken_in_the_middle(x: torch.Tensor) -> torch.Tensor:
    y = x.cos()
    print("graph break")  # BREAK LINE
    return torch.relu(y) + 1


def line_of(marker: str, path: str = __file__) -> int:
    """The line number of the line of ``path`` (this file by default) ending with ``# marker``."""
    with open(path) as handle:
        return next(i for i, line in enumerate(handle, 1) if line.rstrip().endswith(f"# {marker}"))


def make_model_and_inputs() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The command line's entry: a model and its example inputs."""
    torch.manual_seed(0)
    return ReluNet(), (torch.randn(4, 8),)


class PerturbMulOfCos(CustomGraphPass):
    """A planted backward bug (a post-grad pass): the first ``mul`` that reads a ``cos`` becomes an
    ``add``. Only ``sin``'s backward multiplies by a cos, and the ``mul`` alone (its inputs fed in)
    is compiled right: the repro needs the ``cos`` with it."""

    def __init__(self) -> None:
        self.perturbed: list[str] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor):
            if any(arg.target is torch.ops.aten.cos.default for arg in node.all_input_nodes):
                node.target = torch.ops.aten.add.Tensor
                self.perturbed.append(node.name)
                return

    def uuid(self) -> str:
        return "tests.diagnose.models.PerturbMulOfCos"


class ScatterReadTooEarly(CustomGraphPass):
    """A planted backward bug like inductor's own on diffusers' UNet (torch 2.13): whatever reads an
    ``index_put`` (the scatter-add that nearest upsampling's backward lowers to) reads the zero
    buffer before the scatter instead. The reader alone is compiled right; the repro needs the
    scatter. (Torch 2.13 keeps the UNet's ``/ output_scale_factor`` there, a ``div`` by 1.0; torch
    2.14 drops it, so the first reader is the shortcut convolution's backward.)"""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.nodes:
            if node.op == "call_function" and "index_put" in str(node.target):
                for user in list(node.users):
                    user.replace_input_with(node, node.args[0])

    def uuid(self) -> str:
        return "tests.diagnose.models.ScatterReadTooEarly"
