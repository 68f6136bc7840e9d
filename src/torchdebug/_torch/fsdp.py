"""FSDP2's parameter groups, seen from the collectives they issue.

``fully_shard`` gives each sharded module an ``FSDPParamGroup``
(``torch.distributed.fsdp._fully_shard._fsdp_param_group``, private): its ``unshard()`` issues the
all-gather of the group's parameters, its ``post_backward()`` the reduce-scatter of their gradients.
A prefetch runs the *target* group's ``unshard()`` from another module's hook, under the training
state of the pass it prefetches for (``use_training_state``), and the last reduce-scatters run in
the root's final backward callback, outside every autograd node. So the group whose method is on
the stack, and its ``_training_state``, name the module and the phase a collective belongs to,
where the running module does not.

An unshard also hands out memory that no captured op allocates: each parameter's all-gather
buffers (``FSDPParam.all_gather_outputs``) are freed at reshard (their storage resized to 0) and
resized again inside the next unshard, where FSDP2 views them as ``out=`` buffers of its copy-out
before anything writes them. Only the group knows them.

Read here: the class ``FSDPParamGroup``, its ``modules``, ``fsdp_params`` and ``_training_state``,
the ``TrainingState`` members ``FORWARD``, ``PRE_BACKWARD`` and ``POST_BACKWARD``, and
``FSDPParam.all_gather_outputs``; unchanged from torch 2.11 through 2.14.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import torch
from torch import nn

from torchdebug._torch import require

require("FSDP2 collective owners")

__all__ = ["issuing_group", "unshard_buffers"]

_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
"""Looked up, never imported: a process that did not import FSDP2 runs no parameter group."""


def _running_group(frame: FrameType | None) -> tuple[Any, Any] | None:
    """``(group, the module defining its class)``: the innermost FSDP2 parameter group whose method is
    running at ``frame`` or its callers; ``None`` when none is (or FSDP2 was never imported)."""
    groups = sys.modules.get(_MODULE)
    if groups is None:
        return None
    while frame is not None:
        if frame.f_code.co_filename == groups.__file__:
            group = frame.f_locals.get("self")
            if isinstance(group, groups.FSDPParamGroup):
                return group, groups
        frame = frame.f_back
    return None


def issuing_group(frame: FrameType | None) -> tuple[tuple[nn.Module, ...], str | None] | None:
    """``(modules, phase)`` of the innermost FSDP2 parameter group whose method is running at
    ``frame`` or its callers (``phase``: ``forward``, ``backward``, or ``None`` when the group is
    idle: an ``unshard()`` called by the user); ``None`` when no group's method is."""
    found = _running_group(frame)
    if found is None:
        return None
    group, groups = found
    state = groups.TrainingState
    phase = {state.FORWARD: "forward", state.PRE_BACKWARD: "backward", state.POST_BACKWARD: "backward"}
    return tuple(group.modules), phase.get(group._training_state)


def unshard_buffers(frame: FrameType | None) -> list[torch.Tensor]:
    """The all-gather buffers of the parameter group unsharding at ``frame`` (called from its
    copy-in): memory its copy-out fills, holding nothing of the run until then. Empty at a group's
    first unshard, whose buffers are still to be made (by ``torch.empty``, which capture sees)."""
    found = _running_group(frame)
    if found is None:
        return []
    return [buffer for param in found[0].fsdp_params for buffer in param.all_gather_outputs]
