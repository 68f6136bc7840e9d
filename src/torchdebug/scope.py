"""Regions of a model to dump inside compiled graphs.

::

    with torchdebug.scope.data_dump():
        y = self.proj(x)          # every node traced here is dumped, forward and backward

The block rides on ``torch.fx.traceback.annotate``: the mark lands in ``node.meta["custom"]`` of the
nodes traced inside it, in Dynamo's graph, AOT autograd's forward and backward graphs (AOT copies the
forward node's ``custom`` to the gradient nodes) and inductor's post-grad graph, with no graph break.
The dumped set is the union of the marked nodes and ``dump_config.dump_layer``. In eager mode the
block does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx.traceback

from torchdebug.compile.dump_pass import SCOPE_KEY

__all__ = ["data_dump"]


@contextlib.contextmanager
def data_dump() -> Iterator[None]:
    """Dump every node traced inside this block (see the module docstring)."""
    with torch.fx.traceback.annotate({SCOPE_KEY: True}):
        yield
