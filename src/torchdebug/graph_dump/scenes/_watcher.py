"""The watcher scene: find outputs that changed after they were produced (memory stomping).

After each node in ``layer`` runs, the compiled graph hands over the outputs of the
``watcher_nodes`` (``torchdebug::dump_point``); each becomes a record of the watched call with
``extra["after"]`` naming the node that had just run. An output's first record is taken right after
the watched node itself; a later record whose statistics differ shows that the node named in its
``after`` (or one run since the previous record) wrote into memory it does not own
(:func:`find_overwrites`). The scene file asks for it with ``"dump_scene": "watcher"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchdebug.graph_dump import _node_names as node_names
from torchdebug.graph_dump._plan import CallPlan, PointPlan
from torchdebug.graph_dump.scenes._base import GraphWriter, Scene, name_list
from torchdebug.records import Record
from torchdebug.stats import STAT_KEYS

if TYPE_CHECKING:
    import torch
    import torch.fx

    from torchdebug.graph_dump._run import GraphRun


class WatcherScene(Scene):
    """The outputs of the watched nodes, handed over after they ran and after each later ``layer``
    node; no statistics rows in the graph (each point's tensors are read as they arrive)."""

    name = "watcher"
    inputs = False
    statistics = False

    def __init__(self, watched: tuple[str, ...], watched_after: frozenset[str] = frozenset()) -> None:
        self.watched = watched
        """The nodes whose outputs are dumped (``watcher_nodes``)."""
        self.watched_after = watched_after
        """The nodes after which the watched outputs are dumped again (``layer``; empty: after every node)."""

    @classmethod
    def from_file(cls, dump: Mapping[str, Any]) -> WatcherScene:
        entries = dump.get("dump_list", [])
        after = {n for i, e in enumerate(entries) for n in name_list(f"dump.dump_list[{i}].layer", e.get("layer", []))}
        watched = [
            n for i, e in enumerate(entries) for n in name_list(f"dump.dump_list[{i}].watcher_nodes", e.get("watcher_nodes", []))
        ]
        return cls(tuple(dict.fromkeys(watched)), frozenset(after))

    def selector(self, graph: torch.fx.Graph, model: str, nodes: frozenset[str]) -> Callable[[torch.fx.Node], bool]:
        watched = set(self.watched)
        return lambda node: node.name in watched

    def points(self, graph: torch.fx.Graph, calls: list[CallPlan]) -> list[PointPlan]:
        """A point after each watched node (its reference values) and after each later ``layer`` node."""
        by_name = {call.node: index for index, call in enumerate(calls)}
        points, seen = [], []
        for node in graph.nodes:
            if node.name in by_name:
                seen.append(by_name[node.name])
                points.append(PointPlan(node.name, [(by_name[node.name], "0")]))
            elif (
                seen
                and node.op == "call_function"
                and node_names.op_name(node) is not None
                and (not self.watched_after or node.name in self.watched_after)
            ):
                points.append(PointPlan(node.name, [(index, "0") for index in seen]))
        return points

    def on_graph(self, capture: GraphWriter, run: GraphRun, stats: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
        """Nothing: the watcher's records come from its points."""

    def on_point(self, capture: GraphWriter, run: GraphRun, point: int, tensors: list[torch.Tensor]) -> None:
        """One record per watched output, with the shape, stride and statistics it has now."""
        session, spec = capture.session, run.plan.points[point]
        records = []
        for (index, arg), tensor in zip(spec.watched, tensors[-len(spec.watched) :]):
            call = run.plan.calls[index]
            slot = next(s for s in call.slots if s.io == "output" and s.arg == arg)
            record = capture.slot_record(run, call, slot)
            record.shape, record.stride = list(tensor.shape), list(tensor.stride())  # as it ran
            record.extra = {"after": spec.after}
            record.stats = session.tensor_stats(tensor)
            if capture.save_tensors:
                record.tensor = session.save(f"{record.name}@{spec.after}", tensor)
            records.append(record)
        session.add_records(records)

    def to_dict(self) -> dict[str, Any]:
        return {"watched_after": sorted(self.watched_after), "watcher_nodes": list(self.watched)}


@dataclass(frozen=True, slots=True)
class Overwrite:
    """A watched output whose values changed between two watcher points."""

    step: int
    name: str
    """Slot name of the watched output."""
    before: str
    """The last node after which the output still had its produced values."""
    after: str
    """The first node after which it had changed."""

    def __str__(self) -> str:
        return f"step {self.step}: {self.name} changed between after {self.before} and after {self.after}"


def find_overwrites(records: Iterable[Record]) -> list[Overwrite]:
    """The first change of each watched output in each step, in the order the records were written."""
    first: dict[tuple[int, str], Record] = {}
    unchanged_after: dict[tuple[int, str], str] = {}
    found: dict[tuple[int, str], Overwrite] = {}
    for record in records:
        after = record.extra.get("after") if record.extra else None
        if after is None or record.stats is None:
            continue
        key = (record.step, record.name)
        if key not in first:
            first[key], unchanged_after[key] = record, after
            continue
        if key in found:
            continue
        reference = first[key].stats or {}
        if any(reference.get(k) != record.stats.get(k) for k in STAT_KEYS):
            found[key] = Overwrite(record.step, record.name, unchanged_after[key], after)
        else:
            unchanged_after[key] = after
    return list(found.values())
