"""The native module that takes the flight recorder's per-tensor host work (``native/ring_sums.cpp``).

A module's one output, or a whole list of parameters or gradients, is checked, described (its slot's
dtype and shape) and reduced into the ring by one call, with the CPU statistics kernel the Python
path calls (``td_stats_many``): the same bits. ``None`` where it cannot be built or the kernel's
library is missing (``TORCHDEBUG_NATIVE=0`` included): the Python path does the same work.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from torchdebug.capture.session import PLAIN_TENSORS
from torchdebug.native.build import load_torch_extension
from torchdebug.native.fused_stats import many_kernel_address
from torchdebug.slots import dtype_name
from torchdebug.stats import IDENTITY, WIDTH

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
"""The dtypes the native path takes, in the order of the kernel's dtype codes."""


@functools.cache
def ring_sums() -> ModuleType | None:
    """The bound native module (``output_sums``, ``group_sums``: see ``ring_sums.cpp``), or ``None``."""
    address = many_kernel_address()
    module = load_torch_extension("ring_sums") if address is not None else None
    if module is not None:
        module.bind(address, PLAIN_TENSORS, tuple(dtype_name(dtype) for dtype in KERNEL_DTYPES), IDENTITY, WIDTH)
    return module
