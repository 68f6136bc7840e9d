"""Compare two dumps: match records, compute error metrics, judge and attribute, find the first divergence.

::

    result = torchdebug.compare("dump_bf16", "dump_fp32")   # A against the reference B
    print(result.summary())
    result.first_divergence          # earliest op whose error its inputs do not explain
    result.to_html("report.html")    # also to_csv / to_json
    torchdebug.compare.compare_ranks("dump")                 # the ranks of one run with each other

Modules: ``_config`` (``CompareConfig``, the options), ``_matching`` (pairing records), ``_metrics``
(float64 errors), ``_tolerances`` (per dtype), ``_calibration`` (per slot, from a noise dump of the
reference), ``_rerun`` (an op call re-run in float64 from its records), ``_verdicts``
(pass/warning/error, blamed/inherited), ``_comparable`` (what cannot be compared: shapes of other
inputs, constants made for the dtype), ``_checksums`` (bit-exact verdicts), ``_shards`` (a sharded
run's DTensor pieces read as whole tensors), ``_structure`` (ops only one side runs: structure
differences, listed as blocks and blamed when they change a value), ``_steps`` (one comparison's
steps), ``_engine`` (the in-process run), ``_distributed`` (worker processes), ``_across_ranks``
(cross-rank check), ``_result``. The names below load lazily: ``torchdebug compare --help`` imports
``_config`` without torch.
"""

from __future__ import annotations

from torchdebug.callable_package import lazy_exports, make_callable

_EXPORTS = {
    "compare": "torchdebug.compare._engine",
    "compare_ranks": "torchdebug.compare._across_ranks",
    "compare_distributed": "torchdebug.compare._distributed",
    "compare_ranks_distributed": "torchdebug.compare._distributed",
    "open_dump": "torchdebug.compare._engine",
    "CompareConfig": "torchdebug.compare._config",
    "RanksConfig": "torchdebug.compare._config",
    "CompareResult": "torchdebug.compare._result",
    "RanksResult": "torchdebug.compare._across_ranks",
    "Row": "torchdebug.compare._rows",
    "NameMapping": "torchdebug.compare._matching",
    "load_mapping": "torchdebug.compare._matching",
    "Tolerance": "torchdebug.compare._tolerances",
    "DEFAULT_TOLERANCES": "torchdebug.compare._tolerances",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

make_callable(__name__, "compare")
