"""Which module instance a graph run belongs to, named by its path in the user's model.

Dynamo traces each frame it compiles from the frame's own module, so a graph's module paths are
relative to that module and instances of one class run one graph: in a model compiled block by block,
and wherever a graph break makes Dynamo compile a submodule's ``forward`` as a frame of its own. Each
graph remembers its frame (:func:`compiled_frame`), found on the stack when the graph runs
(:meth:`CompiledInstances.running`), else the run's first parameter names it
(:meth:`CompiledInstances.of`). How runs are named, with and without ``model=``: docs/graph_dump.md,
"Per-block compile".
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.fx
from torch import nn

from torchdebug._torch import frames
from torchdebug._torch.nn import compiled_modules, strip_wrappers
from torchdebug.capture.modules import ROOT_MODULE
from torchdebug.capture.stacks import TRACE_FRAME
from torchdebug.graph_dump._node_names import module_stack_path
from torchdebug.records import NO_MODULE


class Instance(NamedTuple):
    """The module instance a graph run belongs to."""

    key: int
    """Tells instances apart (the identity of the module, or of the parameter the graph was handed; 0: none)."""
    path: str
    """Its path in the root model (``layers.1``); empty when unknown or when it is the root."""


NO_INSTANCE = Instance(0, "")


class CompiledFrame(NamedTuple):
    """The frame a Dynamo graph was compiled from, as its runs find it on the stack."""

    file: str
    function: str
    """The code's name: ``forward``, or a resume function's (``torch_dynamo_resume_in_forward_at_54``)."""
    local: str | None
    """The local the graph's module paths start at (``self``, ``args``); ``None`` when no node
    names a module: the frame's own ``self`` (or its caller's) is the instance."""
    index: int | None = None
    """``0`` for ``args[0]`` (a ``forward`` wrapped by a ``*args`` decorator)."""


_STACK_ROOT = re.compile(r"^L\['([^']+)'\](?:\[(\d+)\])?")


def compiled_frame(graph: torch.fx.Graph) -> CompiledFrame | None:
    """The frame a graph comes from, read from its nodes' ``stack_trace`` (the first frame is the
    one Dynamo compiled) and ``nn_module_stack`` (where its paths start: the local ``self`` or
    ``args[0]``); ``None`` when no node has a stack trace."""
    where, local, index = None, None, None
    for node in graph.nodes:
        if where is None and (first := TRACE_FRAME.search(node.meta.get("stack_trace") or "")):
            where = first["file"], first["function"]
        path = module_stack_path(node, "nn_module_stack") or module_stack_path(node, "fwd_nn_module_stack")
        if local is None and path is not None and (root := _STACK_ROOT.match(path)):
            local, index = root[1], int(root[2]) if root[2] is not None else None
        if where is not None and local is not None:
            break
    return None if where is None else CompiledFrame(*where, local, index)


class _Paths:
    """Paths of a root model's modules or parameters by identity, built when first needed and
    again when asked for one it lacks (blocks are compiled, and FSDP2 registers a block's
    unsharded parameters, after the map is built); one still unknown after a rebuild is
    remembered, so each costs one rebuild at most."""

    def __init__(self, build: Callable[[], dict[int, tuple[weakref.ref, str]]]) -> None:
        self._build = build
        self._paths: dict[int, tuple[weakref.ref, str]] | None = None
        self._unknown: dict[int, weakref.ref] = {}

    def changed(self) -> None:
        self._paths = None
        self._unknown.clear()

    def get(self, item: object) -> str | None:
        path = self._lookup(item)
        if path is None and not ((ref := self._unknown.get(id(item))) is not None and ref() is item):
            self._paths = self._build()
            path = self._lookup(item)
            if path is None:
                self._unknown[id(item)] = weakref.ref(item)
        return path

    def _lookup(self, item: object) -> str | None:
        if self._paths is None:
            self._paths = self._build()
        found = self._paths.get(id(item))
        return found[1] if found is not None and found[0]() is item else None


class CompiledInstances:
    """Names the module instance a graph run belongs to by its path in the root model: the model handed
    to ``get_backend(config, model=model)``, else the module the user compiled, the outermost compiled
    module whose call is running (``torch.compile(model)``'s); ``torch.compile``'s wrapper is named
    where it sits in the model, never ``_orig_mod``. A resume function that no longer reads ``self``
    takes the instance of the ``forward`` it resumes. Without a root model it still tells instances
    apart (steps, call indices) but names none."""

    def __init__(self, root: nn.Module | None) -> None:
        self._root = root
        self._parameters = _Paths(self._build_parameters)
        self._modules: dict[int, tuple[weakref.ref[nn.Module], _Paths]] = {}
        """Per root (the given one, or each module found compiled): its modules' paths."""
        self._found: dict[int, tuple[weakref.ref[nn.Module], weakref.ref[nn.Module] | None]] = {}
        """Each instance found running (by :attr:`Instance.key`) and its root: what :meth:`resolve` follows paths from."""

    def changed(self) -> None:
        """A graph was compiled: modules may have been compiled since the maps were built."""
        self._parameters.changed()
        for _, paths in self._modules.values():
            paths.changed()

    def running(self, frame: CompiledFrame | None) -> Instance | None:
        """The instance whose frame runs a graph compiled from ``frame`` now (``None``: not found)."""
        if frame is None:
            return None
        running = frames.running_frame(frame.file, frame.function)
        if running is None:
            return None
        if frame.local is None:
            module = frames.enclosing_module(running)
        else:
            module = frames.local_module(running, frame.local, frame.index)
        if module is None:
            return None
        root = self._root if self._root is not None else frames.outermost_compiled_module(running)
        path = self._module_paths(root).get(module) if root is not None else None
        if len(self._found) >= _KEPT_ROOTS and id(module) not in self._found:
            del self._found[next(iter(self._found))]
        self._found[id(module)] = (weakref.ref(module), weakref.ref(root) if root is not None else None)
        return Instance(id(module), path or "")

    def module(self, instance: Instance) -> nn.Module | None:
        """The module of an instance found running (``None`` when it was not, or is gone)."""
        found = self._found.get(instance.key)
        return found[0]() if found is not None else None

    def resolve(self, instance: Instance, relative: str) -> str | None:
        """The path in the root model of the module a graph of ``instance`` reached at ``relative``
        through more than its submodules (a forward replaced on an instance by a closure, Dynamo's
        ``mlp.forward.__closure__.0.cell_contents.__self__.fc``, or by accelerate's
        ``functools.partial``, ``mlp._old_forward.__self__.fc`` on torch 2.13 and
        ``mlp.forward.args.0.fc`` on 2.11), followed on the instance found running; ``None`` for a
        path of submodules (the instance's path and it name the module) and for one that cannot be
        followed or leads to no module of the root."""
        found = self._found.get(instance.key)
        module = self.module(instance)
        root = found[1]() if found is not None and found[1] is not None else None
        if module is None or root is None or relative in (ROOT_MODULE, NO_MODULE) or _submodule_path(module, relative):
            return None
        target = _follow(module, relative)
        return self._module_paths(root).get(target) if isinstance(target, nn.Module) else None

    def _module_paths(self, root: nn.Module) -> _Paths:
        kept = self._modules.get(id(root))
        if kept is None or kept[0]() is not root:
            if len(self._modules) >= _KEPT_ROOTS:
                del self._modules[next(iter(self._modules))]
            kept = self._modules[id(root)] = (weakref.ref(root), _Paths(lambda: _module_paths(root)))
        return kept[1]

    def of(self, parameter: torch.Tensor | None) -> Instance:
        """The instance whose graph was handed ``parameter`` (``None``: the graph reads none): where
        no frame is found (a graph without stack traces), the backend's wrapper hands the capture the
        graph's first parameter input before each run (Dynamo passes every parameter a graph reads as
        an input), looked up here among the compiled modules of the root model."""
        if parameter is None:
            return NO_INSTANCE
        path = self._parameters.get(parameter) if self._root is not None else None
        return Instance(id(parameter), path or "")

    def _build_parameters(self) -> dict[int, tuple[weakref.ref, str]]:
        paths: dict[int, tuple[weakref.ref, str]] = {}
        if self._root is None:
            return paths
        for path, module in compiled_modules(self._root):  # outer modules first: the innermost wins
            for tensor in module.parameters():
                paths[id(tensor)] = (weakref.ref(tensor), path)
        return paths


_KEPT_ROOTS = 64
"""Roots whose module maps are kept (without a given root, each module found compiled is one)."""


def _module_paths(root: nn.Module) -> dict[int, tuple[weakref.ref, str]]:
    """Each module of ``root`` by identity, with its path (wrappers left out: ``layers.0``)."""
    return {id(module): (weakref.ref(module), strip_wrappers(path)) for path, module in root.named_modules()}


def _submodule_path(module: nn.Module, relative: str) -> bool:
    """Whether ``relative`` names a submodule of ``module`` through registered children alone."""
    found: nn.Module | None = module
    for part in relative.split("."):
        found = found._modules.get(part) if found is not None else None
        if found is None:
            return False
    return True


def _follow(start: object, relative: str) -> object | None:
    """The object at ``relative`` from ``start``, a dotted path whose parts are attributes, or
    indices and keys of tuples, lists and dicts (``forward.__closure__.0.cell_contents``)."""
    found = start
    for part in relative.split("."):
        try:
            if isinstance(found, (tuple, list)):
                found = found[int(part)]
            elif isinstance(found, dict):
                found = found[part]
            else:
                found = getattr(found, part)
        except Exception:  # noqa: BLE001 (a property of the user's may raise anything: the name stays Dynamo's)
            return None
    return found


def in_instance(path: str, module: str) -> str:
    """A module path of a graph traced from the instance at ``path``, as a path in the root model:
    ``attention.wo`` -> ``layers.1.attention.wo``; the instance itself (``<root>``, or ``-`` for
    nodes with no module) -> ``layers.1``."""
    if not path:
        return module
    if module in (ROOT_MODULE, NO_MODULE):
        return path
    return f"{path}.{module}"
