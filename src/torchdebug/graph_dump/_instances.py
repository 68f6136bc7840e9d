"""Which compiled module instance a graph run belongs to, named by its path in the user's model.

Large models are compiled block by block (``for block in model.layers: block.compile()``, or
``model.layers[i] = torch.compile(block)``). Dynamo traces each block from the block itself, so the
module paths of its graph are relative to the block (``attention.wo``), and the blocks of one class
run one graph (``torch.compile(block)``) or recompile the same code (``block.compile()``). What
tells the blocks apart at run time is their parameters: Dynamo passes every parameter a graph reads
as a graph input, so the backend's wrapper around each compiled graph hands the capture the graph's
first parameter before the graph runs (:meth:`GraphCapture.enter`). Looked up among the compiled
modules of the root model the user gave (``get_backend(config, model=model)``), it names the
instance that ran (``layers.1``); ``torch.compile``'s wrapper is named where it sits in the model,
never ``_orig_mod``. Without a root model the parameter still tells instances apart (steps, call
indices) but names none.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch import nn

from torchdebug._torch.nn import compiled_modules
from torchdebug.capture.modules import ROOT_MODULE
from torchdebug.records import NO_MODULE


class Instance(NamedTuple):
    """The module instance a graph run belongs to."""

    key: int
    """Tells instances apart (the identity of the parameter the graph was handed; 0: none)."""
    path: str
    """Its path in the root model (``layers.1``); empty when unknown or when it is the root."""


NO_INSTANCE = Instance(0, "")


class CompiledInstances:
    """Maps the parameters of the compiled modules of a root model to the module's path.

    The map is built when first needed and again after a compile (:meth:`changed`), since blocks
    are compiled after the backend exists (``block.compile(backend=backend)`` needs it), and when
    a graph is handed a parameter the map lacks: FSDP2 registers a block's unsharded parameters
    only while the block runs (its sharded DTensors the rest of the time), so a map built during
    one block's forward holds the other blocks' sharded parameters, not the ones their graphs get.
    A parameter still unknown after a rebuild is remembered, so each costs one rebuild at most.
    """

    def __init__(self, root: nn.Module | None) -> None:
        self._root = root
        self._paths: dict[int, tuple[weakref.ref[torch.Tensor], str]] | None = None
        self._unknown: dict[int, weakref.ref[torch.Tensor]] = {}
        """Parameters no rebuild found (handed by graphs of modules outside the root's compiled ones)."""

    def changed(self) -> None:
        """A graph was compiled: modules may have been compiled since the map was built."""
        self._paths = None
        self._unknown.clear()

    def of(self, parameter: torch.Tensor | None) -> Instance:
        """The instance whose graph was handed ``parameter`` (``None``: the graph reads none)."""
        if parameter is None:
            return NO_INSTANCE
        path = self._lookup(parameter)
        known_unknown = (ref := self._unknown.get(id(parameter))) is not None and ref() is parameter
        if path is None and self._root is not None and not known_unknown:
            self._paths = self._build()
            path = self._lookup(parameter)
            if path is None:
                self._unknown[id(parameter)] = weakref.ref(parameter)
        return Instance(id(parameter), path or "")

    def _lookup(self, parameter: torch.Tensor) -> str | None:
        if self._paths is None:
            self._paths = self._build()
        found = self._paths.get(id(parameter))
        return found[1] if found is not None and found[0]() is parameter else None

    def _build(self) -> dict[int, tuple[weakref.ref[torch.Tensor], str]]:
        paths: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        if self._root is None:
            return paths
        for path, module in compiled_modules(self._root):  # outer modules first: the innermost wins
            for tensor in module.parameters():
                paths[id(tensor)] = (weakref.ref(tensor), path)
        return paths


def in_instance(path: str, module: str) -> str:
    """A module path of a graph traced from the instance at ``path``, as a path in the root model:
    ``attention.wo`` -> ``layers.1.attention.wo``; the instance itself (``<root>``, or ``-`` for
    nodes with no module) -> ``layers.1``."""
    if not path:
        return module
    if module in (ROOT_MODULE, NO_MODULE):
        return path
    return f"{path}.{module}"
