"""Compare two dumps: match records, compute error metrics, judge and attribute, find the first divergence.

::

    result = torchdebug.compare("dump_bf16", "dump_fp32")   # A against the reference B
    print(result.summary())
    result.first_divergence          # earliest op whose error its inputs do not explain
    result.to_html("report.html")    # also to_csv / to_json
    torchdebug.compare.compare_ranks("dump")                 # the ranks of one run with each other

Modules: ``matching`` (pairing records), ``metrics`` (float64 errors), ``tolerances`` (per dtype),
``replay`` (an op call re-run in float64 from its records), ``verdicts`` (pass/warning/error,
blamed/inherited), ``comparable`` (what cannot be compared: shapes of other inputs, constants made
for the dtype), ``checksums`` (bit-exact verdicts), ``shards`` (a sharded run's DTensor pieces read as
whole tensors), ``steps`` (one comparison's steps), ``engine`` (the in-process run),
``distributed`` (worker processes), ``across_ranks`` (cross-rank check), ``result``.
"""

from __future__ import annotations

from torchdebug.callable_package import make_callable
from torchdebug.compare.across_ranks import RanksResult, compare_ranks
from torchdebug.compare.distributed import compare_distributed
from torchdebug.compare.engine import compare, open_dump
from torchdebug.compare.matching import NameMapping, load_mapping
from torchdebug.compare.result import CompareResult
from torchdebug.compare.rows import Row
from torchdebug.compare.tolerances import DEFAULT_TOLERANCES, Tolerance

__all__ = [
    "compare",
    "compare_ranks",
    "compare_distributed",
    "open_dump",
    "CompareResult",
    "RanksResult",
    "Row",
    "NameMapping",
    "load_mapping",
    "Tolerance",
    "DEFAULT_TOLERANCES",
]


make_callable(__name__, compare)
