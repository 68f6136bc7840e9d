"""Regions of a model to dump inside compiled graphs.

::

    with torchdebug.scope.data_dump():
        y = self.proj(x)          # every node traced here is dumped, forward and backward

The block rides on ``torch.fx.traceback.annotate``: the mark lands in ``node.meta["custom"]`` of the
nodes traced inside it, in Dynamo's graph, AOT autograd's forward and backward graphs (AOT copies the
forward node's ``custom`` to the gradient nodes) and inductor's post-grad graph, with no graph break.
The dumped set is the union of the marked nodes and ``dump_config.nodes``. In eager mode the
block does nothing. Importing this module loads neither Dynamo nor inductor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx.traceback

__all__ = ["SCOPE_KEY", "data_dump"]

SCOPE_KEY = "torchdebug_data_dump"
"""The ``node.meta["custom"]`` key the block sets; the compile backend's dump pass reads it."""


@contextlib.contextmanager
def data_dump() -> Iterator[None]:
    """Dump every node traced inside this block (see the module docstring)."""
    with torch.fx.traceback.annotate({SCOPE_KEY: True}):
        yield
