"""Graph breaks and recompiles of the program, with their reasons and source lines.

Read from the Dynamo graphs :class:`torchdebug.diagnose._bisect.DynamoRecorder` recorded: the
graph-break reason Dynamo attaches to each graph it ends early (the attribute
``torch._dynamo.explain`` reads) and the recompile reason of each recompiled frame, both through the
seam ``torchdebug._torch.dynamo``. No extra run of the program is needed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from torchdebug._torch import dynamo as _dynamo
from torchdebug.diagnose._bisect import DynamoGraph


@dataclass(frozen=True, slots=True)
class CompileEvent:
    """One graph break or recompile."""

    kind: str
    """``graph break`` or ``recompile``."""
    graph: int
    """Index of the Dynamo graph it ended (graph break) or started (recompile)."""
    reason: str
    frames: tuple[dict[str, Any], ...] = ()
    """User frames, outermost first: ``{file, line, function, code}``."""

    @property
    def source(self) -> str | None:
        if not self.frames:
            return None
        last = self.frames[-1]
        return f"{last['file']}:{last['line']} in {last['function']}"


@dataclass(slots=True)
class CompileEvents:
    """Every graph break and recompile of one run, and the number of graphs."""

    graphs: int = 0
    events: list[CompileEvent] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind)

    def reasons(self, kind: str) -> Counter[str]:
        """First line of each reason, with how often it occurred."""
        return Counter(e.reason.splitlines()[0] for e in self.events if e.kind == kind)

    def summary(self) -> str:
        """``2 graphs, 1 graph break, 0 recompiles``."""
        breaks, recompiles = self.count("graph break"), self.count("recompile")
        return (
            f"{self.graphs} graph{'s' * (self.graphs != 1)}, {breaks} graph break{'s' * (breaks != 1)}, "
            f"{recompiles} recompile{'s' * (recompiles != 1)}"
        )


def compile_events(graphs: list[DynamoGraph]) -> CompileEvents:
    """The graph breaks and recompiles recorded with ``graphs``."""
    events = []
    for index, graph in enumerate(graphs):
        broken = _dynamo.graph_break_reason(graph.gm)
        if broken is not None:
            reason, frames = broken
            events.append(CompileEvent("graph break", index, reason, tuple(frames)))
        if graph.recompile_reason is not None:
            frames = tuple(_dynamo.user_frames(graph.gm))
            events.append(CompileEvent("recompile", index, graph.recompile_reason, frames))
    return CompileEvents(len(graphs), events)
