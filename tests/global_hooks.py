"""What is registered in torch's global module hooks, for the tests that check capture and the
monitor leave none behind (or keep theirs, idle, for compiled code)."""

from __future__ import annotations

from typing import Any


def global_module_hooks() -> list[Any]:
    """The global forward pre-hooks and forward hooks registered now (torch internals)."""
    from torch.nn.modules import module

    return [*module._global_forward_pre_hooks.values(), *module._global_forward_hooks.values()]
