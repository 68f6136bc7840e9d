"""The pass pipeline: named FX passes run in order on every AOT graph, each one dumped.

A :class:`GraphPass` is a name and a function that edits a ``GraphModule`` in place. Under inductor
the passes run in its post-grad custom-pass slots as :class:`PassStage` objects (a ``CustomGraphPass``
whose ``uuid()`` names every pass, so the FX graph cache cannot serve a graph they did not see); with
``aot_eager`` or ``debug.run_eagerly`` right after AOT autograd. Each pass is dumped as
``NNN_aot_<phase>_graph_after_<name>.txt`` and timed in ``passes.json``. The order, and how to add a
pass: docs/compile.md, "Adding passes to the pipeline".
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from torchdebug._torch.inductor import CustomGraphPass, observe_inductor_passes
from torchdebug.compile._debug_dir import PhaseDump, current_phase
from torchdebug.errors import ConfigError

if TYPE_CHECKING:
    from torchdebug.compile._config import CompilerConfig

log = logging.getLogger("torchdebug.compile._pipeline")

AOT_PHASES = frozenset({"forward", "backward", "inference"})


@dataclasses.dataclass(frozen=True)
class GraphPass:
    """One named pass. ``fn(gm)`` edits ``gm.graph`` in place; its return value is ignored.

    - ``name``: used in dump file names and ``passes.json``; keep it stable across runs.
    - ``phases``: the AOT phases it runs on (``forward``, ``backward``, ``inference``).
    - ``owner``: ``"torchdebug"`` or ``"user"``, shown in ``passes.json`` and the report.
    - ``uuid``: identifies the implementation for inductor's FX graph cache; by default a hash of
      the function's source (``None`` when it has none, which turns that cache off for the graph).
    """

    name: str
    fn: Callable[[torch.fx.GraphModule], Any]
    phases: frozenset[str] = AOT_PHASES
    owner: str = "torchdebug"
    uuid: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.phases) - AOT_PHASES
        if unknown:
            raise ConfigError(f"GraphPass {self.name!r}: unknown phases {sorted(unknown)}, expected {sorted(AOT_PHASES)}")

    def cache_id(self) -> str | None:
        """What inductor's cache key gets for this pass (``None`` disables that cache)."""
        if self.uuid is not None:
            return self.uuid
        own_uuid = getattr(self.fn, "uuid", None)
        if callable(own_uuid):
            value = own_uuid()
            return None if value is None else f"{self.name}:{value}"
        try:
            source = inspect.getsource(self.fn)
        except (OSError, TypeError):
            return None
        return f"{self.name}:{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def user_pass(slot: str, fn: Callable[[torch.fx.Graph], Any]) -> GraphPass:
    """Wrap a user pass taking a ``torch.fx.Graph`` (inductor's contract) as a :class:`GraphPass`."""
    return GraphPass(slot, lambda gm: fn(gm.graph), owner="user", uuid=GraphPass(slot, fn).cache_id())


def default_passes(config: CompilerConfig, data_dump: Callable[[torch.fx.GraphModule], Any] | None = None) -> list[GraphPass]:
    """The passes torchdebug adds on its own: ``data_dump`` (``config.dump_config.enable_dump``),
    built by the backend for each Dynamo graph because it reports to the backend's capture."""
    if data_dump is None or not config.dump_config.enable_dump:
        return []
    return [GraphPass("data_dump", data_dump)]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """The passes before inductor's post-grad passes (``pre``) and after them (``post``)."""

    pre: tuple[GraphPass, ...]
    post: tuple[GraphPass, ...]
    data_dump: Any = None
    """The data-dump pass among ``post`` (a :class:`~torchdebug.graph_dump.DataDumpPass`), if any."""

    @classmethod
    def build(
        cls,
        config: CompilerConfig,
        extra: Sequence[GraphPass] = (),
        data_dump: Callable[[torch.fx.GraphModule], Any] | None = None,
    ) -> Pipeline:
        """User pre pass, then :func:`default_passes`, then ``extra``, then the user post pass."""
        pre = (
            [user_pass("post_grad_custom_pre_pass", config.post_grad_custom_pre_pass)]
            if config.post_grad_custom_pre_pass is not None
            else []
        )
        post = [*default_passes(config, data_dump), *extra]
        if config.post_grad_custom_post_pass is not None:
            post.append(user_pass("post_grad_custom_post_pass", config.post_grad_custom_post_pass))
        return cls(tuple(pre), tuple(post), data_dump if config.dump_config.enable_dump else None)

    def __bool__(self) -> bool:
        return bool(self.pre or self.post)

    def compiled(self, graph: Any) -> Any:
        """``graph``, one AOT graph as the compiler returned it, as the backend hands it back: telling
        the data dump what each run receives and returns (``graph_dump/_handover.py``)."""
        return graph if self.data_dump is None else self.data_dump.following(graph)


def run_passes(gm: torch.fx.GraphModule, passes: Sequence[GraphPass], phase: PhaseDump) -> None:
    """Run each pass selected for ``phase`` in order, recording and dumping after each one."""
    changed = False
    for graph_pass in passes:
        if phase.aot_phase not in graph_pass.phases:
            continue
        before = [node.name for node in gm.graph.nodes]
        start = time.perf_counter()
        graph_pass.fn(gm)
        seconds = time.perf_counter() - start
        changed = True
        gm.graph.lint()
        phase.record_pass(gm, graph_pass.name, graph_pass.owner, seconds, before)
        log.debug("%s: pass %s took %.4f s", phase.aot_phase, graph_pass.name, seconds)
    if changed:
        gm.recompile()


class PassStage(CustomGraphPass):
    """A list of :class:`GraphPass` in one of inductor's custom-pass slots.

    Runs them under the phase the backend opened for this graph and tells the pass observer not to
    dump the slot itself (each pass inside is dumped under its own name).
    """

    def __init__(self, passes: Sequence[GraphPass]) -> None:
        self.passes = tuple(passes)

    def __call__(self, graph: torch.fx.Graph) -> None:
        phase = current_phase.get()
        if phase is None:
            raise RuntimeError(
                "torchdebug pass stage ran outside a torchdebug compile; install it with "
                "torchdebug.get_backend(...) rather than in torch._inductor.config directly"
            )
        phase.observed_by_us = True
        gm = graph.owning_module
        assert isinstance(gm, torch.fx.GraphModule), "inductor passes a GraphModule-owned graph"
        run_passes(gm, self.passes, phase)

    def uuid(self) -> Any | None:
        ids = [graph_pass.cache_id() for graph_pass in self.passes]
        return None if any(i is None for i in ids) else ("torchdebug.PassStage", *ids)


def _observer_enter(gm: torch.fx.GraphModule, name: str) -> tuple[Any, ...] | None:
    phase = current_phase.get()
    if phase is None or phase.finished:
        return None
    phase.observed_by_us = False
    return phase, gm, name, [node.name for node in gm.graph.nodes], time.perf_counter()


def _observer_exit(token: tuple[Any, ...]) -> None:
    phase, gm, name, before, start = token
    if phase.observed_by_us:  # a PassStage recorded its passes one by one
        phase.observed_by_us = False
        return
    phase.record_pass(gm, name, "inductor", time.perf_counter() - start, before)


def observing_inductor_passes() -> contextlib.AbstractContextManager[None]:
    """Record and dump inductor's own joint-graph and post-grad passes into the current phase."""
    return observe_inductor_passes(_observer_enter, _observer_exit)
