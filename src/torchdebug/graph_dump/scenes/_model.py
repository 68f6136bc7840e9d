"""The model dump: the selected nodes of the selected graphs, every run of a dumped step.

Selected: the nodes named in ``dump_config.nodes`` and, from a scene file's ``dump_list``, in the
``layer`` of the graph's entry (``model_name``, ``model__N`` as the backend numbers its graphs),
plus those inside ``torchdebug.scope.data_dump()`` blocks; with none of them, every node of each
listed graph (every graph when the file lists none, or sets ``"dump_op_switch": "on"``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torchdebug.graph_dump.scenes._base import GraphWriter, Scene, name_list
from torchdebug.scope import SCOPE_KEY

if TYPE_CHECKING:
    import torch
    import torch.fx

    from torchdebug.graph_dump._run import GraphRun


def safe_model_name(name: str) -> str:
    """A graph name as it appears in dump folders: ``.``, ``/``, ``\\`` and spaces turned into ``_``."""
    return re.sub(r"[./\\ ]", "_", name)


def _marked(node: torch.fx.Node) -> bool:
    """Whether the node comes from a ``torchdebug.scope.data_dump()`` block."""
    custom = node.meta.get("custom")
    return isinstance(custom, dict) and bool(custom.get(SCOPE_KEY))


class ModelScene(Scene):
    """Statistics (and, in a tensor dump, the tensors) of every slot of the selected calls."""

    name = "model"
    tensors = True

    def __init__(self, models: Mapping[str, frozenset[str]] | None = None) -> None:
        self.models = models
        """From ``dump_list``: graph name -> node names (empty set: every node); ``None``: every graph."""

    @classmethod
    def from_file(cls, dump: Mapping[str, Any]) -> ModelScene:
        entries = dump.get("dump_list", [])
        if not entries or dump.get("dump_op_switch", "off") == "on":
            return cls()
        models: dict[str, frozenset[str]] = {}
        for index, entry in enumerate(entries):
            name = safe_model_name(str(entry.get("model_name", "")))
            layer = frozenset(name_list(f"dump.dump_list[{index}].layer", entry.get("layer", [])))
            models[name] = models.get(name, frozenset()) | layer
        return cls(models)

    def selector(self, graph: torch.fx.Graph, model: str, nodes: frozenset[str]) -> Callable[[torch.fx.Node], bool]:
        name = safe_model_name(model)
        if self.models is not None and name not in self.models:
            return lambda node: False
        layers = nodes | (self.models or {}).get(name, frozenset())
        if not layers and not any(_marked(node) for node in graph.nodes):
            return lambda node: True
        return lambda node: node.name in layers or _marked(node)

    def on_graph(self, capture: GraphWriter, run: GraphRun, stats: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
        """Every planned call, at once; the statistics fill in when they reach the host."""
        capture.write(run, range(len(run.plan.calls)), capture.stage_rows(run, stats, None), tensors)

    def to_dict(self) -> dict[str, Any]:
        return {"models": {k: sorted(v) for k, v in self.models.items()} if self.models else None}
