"""Op data dumps inside compiled graphs (``CompilerConfig.dump_config``; ``docs/graph_dump.md``).

How one Dynamo graph is dumped, module by module::

    _settings.py    DumpConfig + the TorchAir scene file -> DumpSettings (DumpConfig's names, a Scene)
    _planner.py     each AOT graph -> Plan: calls and slots named as eager names them (_node_names.py),
                    statistics rows split between graph and host, tensors, symbolic sizes, points
    _instrument.py  DataDumpPass (the backend's ``data_dump`` pass): plan, register, insert the
                    accumulators (_accumulators.py) and the custom ops (_runtime.py)
    _capture.py     GraphCapture: each run's values -> records, steps and call indices across graphs,
                    the module instance running each graph (_instances.py), dump_stage="original" (_golden.py);
                    one run of a graph is a GraphRun (_run.py)
    scenes/         model, overflow, watcher: one class each behind one interface (scenes/_base.py):
                    which nodes, what the graph hands over, which records a run writes (through the
                    GraphWriter the capture is to them: scenes never import the capture)

Users meet :func:`find_overwrites` (the watcher's finding, from records) and :class:`Overflow`
(``backend.data_dump.overflows``).
"""

from torchdebug.graph_dump.scenes import Overflow, Overwrite, find_overwrites

__all__ = ["Overflow", "Overwrite", "find_overwrites"]
