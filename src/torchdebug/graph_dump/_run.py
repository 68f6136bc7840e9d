"""One execution of an instrumented graph, as the capture and the scenes see it at run time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchdebug.graph_dump._handover import Arrived, RunValues
    from torchdebug.graph_dump._instances import Instance
    from torchdebug.graph_dump._plan import GraphPlan, Key


@dataclass
class GraphRun:
    """One execution of one graph: where its call indices and seq numbers start (what a scene is
    handed at run time, with the capture that builds its records)."""

    plan: GraphPlan
    step: int
    dumped: bool
    bases: dict[Key, int]
    """Per key of the plan: the call index its first call takes in this run."""
    seq: int
    instance: Instance
    keys: dict[Key, Key]
    """Per key of the plan: the key of the same calls named in the instance (``layers.1.attn``)."""
    forward_bases: dict[Key, int]
    """For a backward run: ``bases`` of the forward run it belongs to (its ``fwd`` names)."""
    values: RunValues
    """How the plan's local value ids become the dump's in this run (``graph_dump._handover``)."""
    arrived: Arrived
    """What arrived at the run's inputs (``Handover.received``)."""
    recomputed: bool = False
    """A forward graph run again in the backward (activation checkpointing around it): its calls
    are in phase ``recompute``, each naming the forward call it repeats (``fwd``)."""
    computed: dict[str, Any] = field(default_factory=dict)
    """``dump_stage="original"``: node name -> value computed by the interpreter."""
    sizes: tuple[int, ...] = ()
    """The values of the plan's symbols in this run (``plan.sizes.symbols``; none for static shapes)."""
    evaluated: list[Any] = field(default_factory=list)
    """``plan.sizes.expressions`` evaluated with ``sizes``."""
