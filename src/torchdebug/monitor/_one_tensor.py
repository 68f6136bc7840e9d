"""One CPU tensor's sums written at an address in one native call: a module's output, as its hook sees it.

A module output comes alone, and must be read as its call returns (the code after it may change it in
place), so it cannot wait for others to share a native call. The general path
(:func:`~torchdebug.stats._cpu.cpu_sums_into`) works out any layout first; a contiguous float32,
bfloat16 or float64 tensor needs none, and goes to the kernel's batched entry point
(``td_stats_many``) as one four-integer entry: about half the host time, the same walk of the
memory, the same bits. Other tensors, or a machine without the kernel, take the general path.
"""

from __future__ import annotations

import array

import torch

from torchdebug.native import fused_stats
from torchdebug.stats import cpu_sums_into


def cpu_sums_one_into(tensor: torch.Tensor, address: int) -> None:
    """:func:`~torchdebug.stats._cpu.cpu_sums_into` of one non-empty floating CPU tensor: ``WIDTH``
    doubles at ``address``."""
    code = fused_stats._MANY_CODES.get(tensor.dtype)
    kernels = fused_stats._kernels()
    if code is None or kernels is None or not tensor.is_contiguous() or tensor.is_neg():
        cpu_sums_into(tensor, address)
        return
    entry = array.array("q", (tensor.data_ptr(), code, tensor.numel(), address))  # one per call: threads may share none
    kernels.many(1, entry.buffer_info()[0], torch.get_num_threads())
