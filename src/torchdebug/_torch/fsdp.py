"""FSDP2's parameter groups, seen from the collectives they issue.

``fully_shard`` gives each sharded module an ``FSDPParamGroup``
(``torch.distributed.fsdp._fully_shard._fsdp_param_group``, private): its ``unshard()`` issues the
all-gather of the group's parameters, its ``post_backward()`` the reduce-scatter of their gradients.
A prefetch runs the *target* group's ``unshard()`` from another module's hook, under the training
state of the pass it prefetches for (``use_training_state``), and the last reduce-scatters run in
the root's final backward callback, outside every autograd node. So the group whose method is on
the stack, and its ``_training_state``, name the module and the phase a collective belongs to,
where the running module does not.

Read here: the class ``FSDPParamGroup``, its ``modules`` and ``_training_state`` and the
``TrainingState`` members ``FORWARD``, ``PRE_BACKWARD`` and ``POST_BACKWARD``; unchanged from torch
2.11 through 2.14.
"""

from __future__ import annotations

import sys
from types import FrameType

from torch import nn

from torchdebug._torch import require

require("FSDP2 collective owners")

__all__ = ["issuing_group"]

_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
"""Looked up, never imported: a process that did not import FSDP2 runs no parameter group."""


def issuing_group(frame: FrameType | None) -> tuple[tuple[nn.Module, ...], str | None] | None:
    """``(modules, phase)`` of the innermost FSDP2 parameter group whose method is running at
    ``frame`` or its callers (``phase``: ``forward``, ``backward``, or ``None`` when the group is
    idle: an ``unshard()`` called by the user); ``None`` when no group's method is."""
    groups = sys.modules.get(_MODULE)
    if groups is None:
        return None
    state = groups.TrainingState
    while frame is not None:
        if frame.f_code.co_filename == groups.__file__:
            group = frame.f_locals.get("self")
            if isinstance(group, groups.FSDPParamGroup):
                phase = {state.FORWARD: "forward", state.PRE_BACKWARD: "backward", state.POST_BACKWARD: "backward"}
                return tuple(group.modules), phase.get(group._training_state)
        frame = frame.f_back
    return None
