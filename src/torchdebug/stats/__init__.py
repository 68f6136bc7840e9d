"""Statistics of a tensor: min, max, mean and L2 norm of its values, and counts of elements (NaN,
+Inf, -Inf, ...: :data:`STAT_KEYS` lists them all).

Computed on the tensor's own device with float32 (half types) or float64 (integers) accumulation.
Min, max, mean and norm ignore NaNs; they are ``None`` for empty tensors or tensors that hold only
NaNs. Complex tensors are described by their magnitudes.

- :mod:`~torchdebug.stats._schema`: the one declaration of the accumulators every path computes and
  of how they are finished into a record's ``stats`` (no torch: records import it);
- :mod:`~torchdebug.stats._torch_ops`: the accumulators with torch ops, on any device, no sync;
- :mod:`~torchdebug.stats._cpu`: statistics taken now (the C kernel on the CPU, else torch ops).

The kernels live in :mod:`torchdebug.native` (C, Triton), the per-device table the host reads once
per flush in :mod:`torchdebug.stats_table`. The names below load their module on first use, so
importing the schema does not import torch.
"""

from __future__ import annotations

from torchdebug.callable_package import lazy_exports

TYPE_CHECKING = False  # typing's, without importing typing: records import this package

_EXPORTS = {
    "StatsDict": "torchdebug.stats._schema",
    "empty_stats": "torchdebug.stats._schema",
    "stats_from_sums": "torchdebug.stats._schema",
    "stats_array_from_sums": "torchdebug.stats._schema",
    "STAT_KEYS": "torchdebug.stats._schema",
    "VALUE_KEYS": "torchdebug.stats._schema",
    "COUNT_KEYS": "torchdebug.stats._schema",
    "NONFINITE_KEYS": "torchdebug.stats._schema",
    "COUNTS": "torchdebug.stats._schema",
    "FIRST_COUNT": "torchdebug.stats._schema",
    "COLUMNS": "torchdebug.stats._schema",
    "WIDTH": "torchdebug.stats._schema",
    "IDENTITY": "torchdebug.stats._schema",
    "as_real": "torchdebug.stats._torch_ops",
    "has_statistics": "torchdebug.stats._torch_ops",
    "NO_STATISTICS": "torchdebug.stats._torch_ops",
    "device_sums": "torchdebug.stats._torch_ops",
    "cpu_sums": "torchdebug.stats._cpu",
    "cpu_sums_into": "torchdebug.stats._cpu",
    "cpu_sums_many_into": "torchdebug.stats._cpu",
    "cpu_stats": "torchdebug.stats._cpu",
    "cpu_stats_and_fingerprint": "torchdebug.stats._cpu",
    "tensor_stats": "torchdebug.stats._cpu",
}

__all__ = [
    "COLUMNS",
    "COUNTS",
    "COUNT_KEYS",
    "FIRST_COUNT",
    "IDENTITY",
    "NONFINITE_KEYS",
    "NO_STATISTICS",
    "STAT_KEYS",
    "StatsDict",
    "VALUE_KEYS",
    "WIDTH",
    "as_real",
    "cpu_stats",
    "cpu_stats_and_fingerprint",
    "cpu_sums",
    "cpu_sums_into",
    "cpu_sums_many_into",
    "device_sums",
    "empty_stats",
    "has_statistics",
    "stats_array_from_sums",
    "stats_from_sums",
    "tensor_stats",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchdebug.stats._cpu import (
        cpu_stats,
        cpu_stats_and_fingerprint,
        cpu_sums,
        cpu_sums_into,
        cpu_sums_many_into,
        tensor_stats,
    )
    from torchdebug.stats._schema import (
        COLUMNS,
        COUNT_KEYS,
        COUNTS,
        FIRST_COUNT,
        IDENTITY,
        NONFINITE_KEYS,
        STAT_KEYS,
        VALUE_KEYS,
        WIDTH,
        StatsDict,
        empty_stats,
        stats_array_from_sums,
        stats_from_sums,
    )
    from torchdebug.stats._torch_ops import NO_STATISTICS, as_real, device_sums, has_statistics
