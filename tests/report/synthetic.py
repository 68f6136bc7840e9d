"""A compare result of any size made without a model, for the report's scale tests.

The rows look like a deep GPT's tensor compare: blocks of modules in forward, backward and the
optimizer step, errors spread over ten decades, every metric filled (the largest page a row can
make), one row in five with a message holding its own numbers, a warning in 50 and an error in 997.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from torchdebug.compare._rows import VERDICTS, Row
from torchdebug.records import Record, make_name

_SLOTS = (  # (submodule, op, io, arg) of one block
    ("ln_1", "aten.native_layer_norm.default", "input", "0"),
    ("ln_1", "aten.native_layer_norm.default", "output", "0"),
    ("attn.qkv", "aten.addmm.default", "input", "1"),
    ("attn.qkv", "aten.addmm.default", "output", "0"),
    ("attn", "aten._scaled_dot_product_flash_attention_for_cpu.default", "output", "0"),
    ("attn.proj", "aten.addmm.default", "output", "0"),
    ("", "aten.add.Tensor", "output", "0"),
    ("ln_2", "aten.native_layer_norm.default", "output", "0"),
    ("mlp.fc", "aten.addmm.default", "output", "0"),
    ("mlp", "aten.gelu.default", "output", "0"),
    ("mlp.proj", "aten.addmm.default", "output", "0"),
    ("mlp.proj", "module", "param", "weight"),
)
_RECORD = Record("forward/model/aten.add.Tensor#0/output.0", 0, 0, "forward", "model", "aten.add.Tensor", 0, 0, "output", "0")
"""Both sides' record of every row: a row is matched when it has both (the plot draws matched rows)."""
_PHASES = (("forward", 0.45), ("backward", 0.9), ("optimizer", 1.0))  # phase, up to this share of rows


class SyntheticResult:
    """What ``render_compare`` reads of a ``CompareResult`` (``report.compare.Result``)."""

    heading = "synthetic compare: A against the reference B"

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.problems: list[str] = []
        self.ranks = [0]
        self.first_divergence = next((row for row in rows if row.verdict == "error"), None)
        self.first_nonfinite = None

    def sides(self) -> list[tuple[str, str]]:
        return [("A", "synthetic/a"), ("B", "synthetic/b")]

    def counts(self, rank: int | None = None) -> dict[str, int]:
        counted = Counter(row.verdict for row in self.rows)
        return {verdict: counted[verdict] for verdict in VERDICTS if counted[verdict]}

    def rank_rows(self, rank: int) -> list[Row]:
        return self.rows

    def describe(self, row: Row) -> dict[str, Any]:
        return {**row.to_dict(), "stack": ["model.py:56 in forward", "    return self.proj(x)"]}


def synthetic_rows(count: int, seed: int = 0) -> list[Row]:
    """``count`` rows of a deep model's compare (see the module docstring)."""
    random = np.random.default_rng(seed)
    errors = 10 ** random.uniform(-10, 0, count)
    cosines = 1 - 10 ** random.uniform(-9, -2, count)
    scales = 10 ** random.uniform(-3, 2, count)
    ulps = random.integers(0, 4096, count)
    blocks = max(count // 1000, 1)  # as a GPT: about a thousand rows a layer in a training step
    rows = []
    for i in range(count):
        block, slot, call = i * blocks // count, i % len(_SLOTS), i // len(_SLOTS) % 40
        phase = next(name for name, share in _PHASES if i < share * count)
        sub, op, io, arg = _SLOTS[slot]
        module = f"model.layers.{block}" + (f".{sub}" if sub else "")
        error, tolerance = float(errors[i]), 0.0078125 if i % 3 else 1.3e-06
        verdict = "error" if i % 997 == 996 else "warning" if i % 50 == 49 else "pass"
        message = ""
        if verdict == "error":
            message = f"difference {error:.3g} > tolerance {tolerance:.2g}: this op makes the difference"
        elif i % 5 == 0:
            explained = f"explained by its inputs (difference {error * 0.97:.3g})"
            message = f"difference {error:.3g} > tolerance {tolerance:.2g}, {explained}"
        rows.append(
            Row(
                0, 0, phase, module, op, call, io, arg, make_name(phase, module, op, call, io, arg), None, "exact", i,
                dtype_a="bfloat16", dtype_b="float32", shape_a=[2, 16, 32], shape_b=[2, 16, 32],
                metrics={
                    "cosine": float(cosines[i]),
                    "max_abs_err": float(error * scales[i]),
                    "rel_l2": float(error * 0.3),
                    "max_ulp": float(ulps[i]),
                },
                difference=error, tolerance=tolerance, verdict=verdict, message=message,
                source=f"model.py:{40 + slot} in forward", record_a=_RECORD, record_b=_RECORD,
            )
        )  # fmt: skip
    return rows
