"""Compare two dumps, or the ranks of one: match records, measure differences, judge and attribute, find the first divergence.

::

    result = torchdebug.compare("dump_bf16", "dump_fp32")   # A against the reference B
    print(result.summary())
    result.first_divergence          # earliest op whose difference its inputs do not explain
    result.to_html("report.html")    # also to_csv / to_json
    torchdebug.compare("dump")       # the ranks of one run with each other
    torchdebug.compare("a", "b", workers=4)                  # four worker processes

The public names are listed, one line each, in docs/api.md; the modules (``_engine``: the one entry
point, ``_steps``: one comparison's steps, ``_matching``, ``_metrics``, ``_verdicts``, ...) say what
they hold in their docstrings. The names below load lazily: ``torchdebug compare --help`` imports
``_config`` without torch.
"""

from __future__ import annotations

from torchdebug.callable_package import lazy_exports, make_callable

_EXPORTS = {
    "compare": "torchdebug.compare._engine",
    "open_dump": "torchdebug.compare._engine",
    "launched_by_torchrun": "torchdebug.compare._distributed",
    "process_group_from_env": "torchdebug.compare._distributed",
    "CompareConfig": "torchdebug.compare._config",
    "RanksConfig": "torchdebug.compare._config",
    "CompareResult": "torchdebug.compare._result",
    "RanksResult": "torchdebug.compare._across_ranks",
    "Row": "torchdebug.compare._rows",
    "NameMapping": "torchdebug.compare._matching",
    "load_mapping": "torchdebug.compare._matching",
    "Tolerance": "torchdebug.compare._tolerances",
    "DEFAULT_TOLERANCES": "torchdebug.compare._tolerances",
    # former spellings of compare(), one release, each with a FutureWarning naming its compare() call
    "compare_ranks": "torchdebug.compare._across_ranks",
    "compare_distributed": "torchdebug.compare._distributed",
    "compare_ranks_distributed": "torchdebug.compare._distributed",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

make_callable(__name__, "compare")
