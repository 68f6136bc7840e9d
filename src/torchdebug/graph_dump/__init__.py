"""Op data dumps inside compiled graphs (``CompilerConfig.dump_config``; ``docs/graph_dump.md``).

How one Dynamo graph is dumped, module by module::

    settings.py     DumpConfig + the TorchAir scene file -> DumpSettings (DumpConfig's names, a Scene)
    planner.py      each AOT graph -> Plan: calls and slots named as eager names them (node_names.py),
                    statistics rows split between graph and host, tensors, symbolic sizes, points
    instrument.py   DataDumpPass (the backend's ``data_dump`` pass): plan, register, insert the
                    accumulators (accumulators.py) and the custom ops (runtime.py)
    capture.py      GraphCapture: each run's values -> records, steps and call indices across graphs,
                    module instances of per-block compiles (instances.py), dump_stage="original" (golden.py)
    scenes/         model, overflow, watcher: one class each behind one interface (scenes/base.py):
                    which nodes, what the graph hands over, which records a run writes

Users meet :func:`find_overwrites` (the watcher's finding, from records) and :class:`Overflow`
(``backend.data_dump.overflows``).
"""

from torchdebug.graph_dump.scenes import Overflow, Overwrite, find_overwrites

__all__ = ["Overflow", "Overwrite", "find_overwrites"]
