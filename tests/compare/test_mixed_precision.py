"""Blame that survives mixed precision (issue 16, items 3, 4 and 6).

A 2-layer GPT (d_model 64, seq 32, batch 2), one AdamW step. Healthy bf16/fp16 autocast runs against
fp32 have no error row, at most 2 % warning rows and no first divergence. A 3 % scaling bug planted
in one op (attention, MLP, norm, loss; forward and backward) is named with its module and source
line in fp32, bf16 and fp16 pairings where tensors are saved (rerun decides what statistics cannot),
and a bug entering through an op only one side runs (a forward hook) is blamed on that op, a structure
difference, with the hook's source line.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step

aten = torch.ops.aten
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class _Scale(TorchDispatchMode):
    """Call ``index`` (from 0, counted over the step) of ``op`` returns its first output ``factor``
    times too large (3 % by default)."""

    def __init__(self, op: object, index: int, factor: float = 1.03) -> None:
        super().__init__()
        self.op, self.index, self.factor, self.calls = op, index, factor, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if func is self.op:
            if self.calls == self.index:
                out = out * self.factor if isinstance(out, torch.Tensor) else (out[0] * self.factor, *out[1:])
            self.calls += 1
        return out


BUGS = {
    # name: (op, call index, expected first divergence: call name, source line's text)
    "attention": (aten.addmm.default, 0, "forward/layers.0.attn.qkv/aten.addmm.default#0", "self.qkv(x)"),
    "mlp": (aten.addmm.default, 6, "forward/layers.1.mlp.fc/aten.addmm.default#0", "self.fc(x)"),
    "norm": (aten.native_layer_norm.default, 3, "forward/layers.1.ln2/aten.native_layer_norm.default#0", "self.ln2"),
    "loss": (aten._log_softmax.default, 0, "forward/<root>/aten._log_softmax.default#0", "cross_entropy"),
    "mlp_backward": (aten.mm.default, 4, "backward/layers.1.mlp.out/aten.mm.default#1", "self.out("),
    "attention_backward": (aten.bmm.default, 6, "backward/layers.1.attn/aten.bmm.default#2", "q @ k"),
}


@pytest.fixture(scope="module")
def gpt_dump(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("mixed")
    made: dict[tuple, Path] = {}

    def get(task: str, dtype: str, bug: str | None = None, hook: bool = False) -> Path:
        key = (task, dtype, bug, hook)
        if key not in made:
            torchdebug.seed_all(0)
            model = GPT(GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab=128))
            if hook:  # an op only A runs: the MLP's output scaled by 3 %
                model.layers[0].mlp.register_forward_hook(lambda module, args, out: out * 1.03)
            optimizer = torch.optim.AdamW(model.parameters())
            path = root / "-".join(str(part) for part in key)
            with _Scale(*BUGS[bug][:2]) if bug else contextlib.nullcontext():
                with torchdebug.dump(path, model=model, task=task):
                    train_step(model, optimizer, make_batch(model.config, batch=2), autocast=DTYPES[dtype])
            made[key] = path
        return made[key]

    return get


def _source_text(row: torchdebug.compare.Row) -> str:
    path, line = row.source.split(" in ")[0].rsplit(":", 1)
    return Path(path).read_text().splitlines()[int(line) - 1]


@pytest.mark.parametrize("task", ["statistics", "tensor"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_healthy_mixed_precision_run_has_no_error_few_warnings_and_no_divergence(gpt_dump, task, dtype):
    result = torchdebug.compare(gpt_dump(task, dtype), gpt_dump(task, "fp32"))
    counts = result.counts()
    assert counts["error"] == 0 and counts["undecided"] == 0
    assert counts["warning"] <= 0.02 * len(result.rows)
    assert result.first_divergence is None
    inherited = [row for row in result.rows if row.attribution == "inherited"]
    assert inherited and all(row.verdict == "pass" for row in inherited)  # drift beyond tolerance, explained


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("bug", list(BUGS))
def test_a_3_percent_bug_is_named_with_module_and_source_line_where_tensors_are_saved(gpt_dump, bug, dtype):
    result = torchdebug.compare(gpt_dump("tensor", dtype, bug), gpt_dump("tensor", "fp32"))
    first = result.first_divergence
    call, text = BUGS[bug][2:]
    assert (first.call_name, first.io) == (call, "output")
    assert text in _source_text(first)
    assert result.counts()["undecided"] == 0


@pytest.mark.parametrize(
    "dtype, bug",
    [
        ("fp32", "attention"),
        ("fp32", "attention_backward"),
        ("fp32", "loss"),
        ("fp16", "mlp"),
        ("fp16", "norm"),
        ("bf16", "norm"),
    ],
)
def test_statistics_name_a_3_percent_bug_above_the_pairs_rounding(gpt_dump, dtype, bug):
    first = torchdebug.compare(gpt_dump("statistics", dtype, bug), gpt_dump("statistics", "fp32")).first_divergence
    assert first.call_name == BUGS[bug][2]


def test_statistics_that_cannot_tell_say_undecided_and_that_a_tensor_dump_would_decide(gpt_dump):
    result = torchdebug.compare(gpt_dump("statistics", "fp16", "mlp_backward"), gpt_dump("statistics", "fp32"))
    undecided = [row for row in result.rows if row.verdict == "undecided"]
    assert undecided and result.first_divergence is None and result.counts()["error"] == 0
    assert 'a tensor dump (task="tensor") would decide' in undecided[0].message
    assert "undecided: 1 rows" in result.summary() and "would decide them" in result.summary()


@pytest.mark.parametrize("task", ["statistics", "tensor"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_a_bug_in_an_op_only_one_side_runs_is_blamed_on_that_op(gpt_dump, task, dtype):
    result = torchdebug.compare(gpt_dump(task, dtype, hook=True), gpt_dump(task, "fp32"))
    first = result.first_divergence
    assert (first.call_name, first.io, first.module, first.match) == (
        "forward/layers.0.mlp/aten.mul.Tensor#0",
        "output",
        "layers.0.mlp",
        "only_a",
    )
    assert "only A runs this op (a structure difference)" in first.message
    assert "out * 1.03" in _source_text(first)
    consumer = next(
        row
        for row in result.rows
        if row.call_name == "forward/layers.0/aten.add.Tensor#1" and row.io == "input" and first.name in row.message
    )
    assert consumer.attribution == "inherited" and "which changed the value" in consumer.message
    assert [block.cause for block in result.structure_differences if block.verdict == "error"] == [first.name]
