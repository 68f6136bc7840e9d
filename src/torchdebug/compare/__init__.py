"""Compare two dumps: match records, compute error metrics, judge and attribute, find the first divergence.

::

    result = torchdebug.compare("dump_bf16", "dump_fp32")   # A against the reference B
    print(result.summary())
    result.first_divergence          # earliest op whose error its inputs do not explain
    result.to_html("report.html")    # also to_csv / to_json
    torchdebug.compare.compare_ranks("dump")                 # the ranks of one run with each other

Modules: ``config`` (``CompareConfig``, the options), ``matching`` (pairing records), ``metrics``
(float64 errors), ``tolerances`` (per dtype), ``replay`` (an op call re-run in float64 from its
records), ``verdicts`` (pass/warning/error, blamed/inherited), ``comparable`` (what cannot be
compared: shapes of other inputs, constants made for the dtype), ``checksums`` (bit-exact verdicts),
``shards`` (a sharded run's DTensor pieces read as whole tensors), ``steps`` (one comparison's
steps), ``engine`` (the in-process run), ``distributed`` (worker processes), ``across_ranks``
(cross-rank check), ``result``. The names below load lazily: ``torchdebug compare --help`` imports
``config`` without torch.
"""

from __future__ import annotations

from torchdebug.callable_package import lazy_exports, make_callable

_EXPORTS = {
    "compare": "torchdebug.compare.engine",
    "compare_ranks": "torchdebug.compare.across_ranks",
    "compare_distributed": "torchdebug.compare.distributed",
    "open_dump": "torchdebug.compare.engine",
    "CompareConfig": "torchdebug.compare.config",
    "CompareResult": "torchdebug.compare.result",
    "RanksResult": "torchdebug.compare.across_ranks",
    "Row": "torchdebug.compare.rows",
    "NameMapping": "torchdebug.compare.matching",
    "load_mapping": "torchdebug.compare.matching",
    "Tolerance": "torchdebug.compare.tolerances",
    "DEFAULT_TOLERANCES": "torchdebug.compare.tolerances",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

make_callable(__name__, "compare")
