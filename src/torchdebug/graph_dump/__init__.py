"""Op data dumps inside compiled graphs (``CompilerConfig.dump_config``; ``docs/graph_dump.md``).

How one Dynamo graph is dumped, module by module::

    _settings.py    DumpConfig + the TorchAir scene file -> DumpSettings (DumpConfig's names, a Scene)
    _planner.py     each AOT graph -> Plan: calls and slots named as eager names them (_node_names.py),
                    statistics rows split between graph and host, tensors, symbolic sizes, points
    _instrument.py  DataDumpPass (the backend's ``data_dump`` pass): plan, register, insert the
                    accumulators (_accumulators.py) and the custom ops (_runtime.py)
    _capture.py     GraphCapture: each run (a GraphRun, _run.py) -> records, across graphs, module instances
                    (_instances.py) and value ids (_value_ids.py, _handover.py); dump_stage="original" (_golden.py)
    scenes/         model, overflow, watcher: one class each behind one interface (scenes/_base.py):
                    which nodes, what the graph hands over, which records a run writes (through the
                    GraphWriter the capture is to them: scenes never import the capture)

Users meet :func:`find_overwrites` (the watcher's finding, from records) and :class:`Overflow`
(``backend.data_dump.overflows``); the other names are the doors the backend, its config and
diagnose go through (docs/api.md). They load lazily: the config's module imports this package on
the command line's help path.
"""

from __future__ import annotations

from torchdebug.callable_package import lazy_exports

TYPE_CHECKING = False  # typing's, without importing typing on the help path

_EXPORTS = {
    "Overflow": "torchdebug.graph_dump.scenes",
    "Overwrite": "torchdebug.graph_dump.scenes",
    "find_overwrites": "torchdebug.graph_dump.scenes",
    "DataMode": "torchdebug.graph_dump._settings",
    "DumpSettings": "torchdebug.graph_dump._settings",
    "DumpStage": "torchdebug.graph_dump._settings",
    "Task": "torchdebug.graph_dump._settings",
    "read_scene_file": "torchdebug.graph_dump._settings",
    "resolve": "torchdebug.graph_dump._settings",
    "ModelContext": "torchdebug.graph_dump._planner",
    "DataDumpPass": "torchdebug.graph_dump._instrument",
    "GraphCapture": "torchdebug.graph_dump._capture",
    "propagate_fake_values": "torchdebug.graph_dump._accumulators",
    "DUMP_GRAPH": "torchdebug.graph_dump._runtime",
    "register_sink": "torchdebug.graph_dump._runtime",
    "unregister_sink": "torchdebug.graph_dump._runtime",
    "graph_is_rooted": "torchdebug.graph_dump._node_names",
    "is_backward_node": "torchdebug.graph_dump._node_names",
    "module_of": "torchdebug.graph_dump._node_names",
    "module_stack_path": "torchdebug.graph_dump._node_names",
}
__all__ = [
    "DUMP_GRAPH",
    "DataDumpPass",
    "DataMode",
    "DumpSettings",
    "DumpStage",
    "GraphCapture",
    "ModelContext",
    "Overflow",
    "Overwrite",
    "Task",
    "find_overwrites",
    "graph_is_rooted",
    "is_backward_node",
    "module_of",
    "module_stack_path",
    "propagate_fake_values",
    "read_scene_file",
    "register_sink",
    "resolve",
    "unregister_sink",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchdebug.graph_dump._accumulators import propagate_fake_values
    from torchdebug.graph_dump._capture import GraphCapture
    from torchdebug.graph_dump._instrument import DataDumpPass
    from torchdebug.graph_dump._node_names import graph_is_rooted, is_backward_node, module_of, module_stack_path
    from torchdebug.graph_dump._planner import ModelContext
    from torchdebug.graph_dump._runtime import DUMP_GRAPH, register_sink, unregister_sink
    from torchdebug.graph_dump._settings import DataMode, DumpSettings, DumpStage, Task, read_scene_file, resolve
    from torchdebug.graph_dump.scenes import Overflow, Overwrite, find_overwrites
