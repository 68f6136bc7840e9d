"""What a graph-dump scene is: the one interface the planner and the capture call.

A scene decides, at compile time, which nodes of a graph are dumped and what the instrumenter
inserts for them (statistics rows, tensors handed to ``dump_graph``, watcher points), and, at run
time, which records it writes from the values a graph run hands over. The planner, the
instrumenter and the capture (:class:`GraphWriter`) ask the scene; none of them tests which scene
it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from torchdebug.errors import ConfigError

if TYPE_CHECKING:
    import torch
    import torch.fx

    from torchdebug.capture.session import CaptureSession
    from torchdebug.graph_dump._plan import CallPlan, PointPlan, Rows, SlotPlan
    from torchdebug.graph_dump._run import GraphRun
    from torchdebug.records import Record


class GraphWriter(Protocol):
    """What a scene asks of the capture that runs it (``graph_dump._capture.GraphCapture``)."""

    session: CaptureSession
    save_tensors: bool

    def stage_rows(self, run: GraphRun, stats: list[torch.Tensor], done: Callable[[Rows], None] | None) -> Rows: ...

    def write(self, run: GraphRun, calls: Iterable[int], rows: Rows, tensors: list[torch.Tensor]) -> None: ...

    def call_name(self, run: GraphRun, call: CallPlan) -> str: ...

    def slot_record(self, run: GraphRun, call: CallPlan, slot: SlotPlan) -> Record: ...


class Scene(ABC):
    """One kind of graph dump (the model dump, the overflow dump, the watcher)."""

    name: ClassVar[str]
    """The scene's name in the dump's manifest (``dump_config.scene``)."""
    inputs: ClassVar[bool] = True
    """Whether the dumped calls' input slots are planned (as ``data_mode`` allows)."""
    statistics: ClassVar[bool] = True
    """Whether each dumped tensor slot gets a statistics row computed as the graph runs."""
    tensors: ClassVar[bool] = False
    """Whether a tensor dump hands the dumped tensors to ``dump_graph``."""

    @classmethod
    @abstractmethod
    def from_file(cls, dump: Mapping[str, Any]) -> Scene:
        """The scene of a checked TorchAir scene file's ``dump`` object (``settings.read_scene_file``)."""

    @abstractmethod
    def selector(self, graph: torch.fx.Graph, model: str, nodes: frozenset[str]) -> Callable[[torch.fx.Node], bool]:
        """Which op nodes of ``graph`` (the Dynamo graph ``model``'s, ``model__N``) are dumped;
        ``nodes``: the node names ``dump_config.nodes`` selects."""

    def points(self, graph: torch.fx.Graph, calls: list[CallPlan]) -> list[PointPlan]:
        """Where the graph hands tensors over while it runs (``dump_point``); ``calls``: the dumped ones."""
        return []

    @abstractmethod
    def on_graph(self, capture: GraphWriter, run: GraphRun, stats: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
        """A run of a dumped step ended with these ``dump_graph`` values: write its records through ``capture``."""

    def on_point(self, capture: GraphWriter, run: GraphRun, point: int, tensors: list[torch.Tensor]) -> None:
        """Point ``point`` of :meth:`points` handed over ``tensors`` in a dumped step."""
        raise NotImplementedError(f"the {self.name} scene plans no points, so it is handed none")

    @property
    def findings(self) -> list[Any]:
        """What the scene found while the graphs ran (the overflow scene: the first call of each
        step that made a NaN/Inf); none by default."""
        return []

    def to_dict(self) -> dict[str, Any]:
        """The scene's own options, JSON-ready, for the dump's manifest."""
        return {}


def name_list(key: str, value: Any) -> list[str]:
    """A scene file's list of node names (``layer``, ``watcher_nodes``), checked."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{key}: got {value!r}, expected a list of node names like ['addmm', 'mul_3']")
    return [v.strip() for v in value]
