"""Eager and compiled dumps of Hugging Face models line up at the eager ops' boundaries (issue 16, item 5).

Each model is built in the test from a tiny config (no download) and trained one step (forward,
backward, AdamW) eagerly under ``torchdebug.dump`` and, from the same weights, compiled by the
torchdebug backend with a statistics dump of every node. The losses agree, so the compare must pair
at least 90 % of the eager rows of the phases both dumps hold and blame nothing.

On CPU GPT-2 and BERT run the graphs inductor would compile (its decompositions) eagerly
(``debug.run_eagerly``): the eager ops' boundaries are those of inductor's graphs, without a C++
compile of a statistics kernel per dumped value (about 20 s a model on 2 cores). Llama goes through
the same graphs and further, through inductor's post-grad passes and generated code, as do all
three on CUDA.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch._dynamo

import torchdebug
from tests.backends import dump_backend
from tests.hf_models import tiny_model
from torchdebug.compare import CompareResult
from torchdebug.compare._matching import match_records
from torchdebug.compare._rows import Row
from torchdebug.records import Record

transformers = pytest.importorskip("transformers")


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def _compare_eager_and_compiled(family: str, device: str, tmp_path: Path, run_eagerly: bool = False) -> CompareResult:
    """One training step eagerly and compiled (every node dumped) from the same weights; the compare
    (``run_eagerly``: inductor's graphs run eagerly, no code generated)."""
    torch._dynamo.reset()
    model = tiny_model(family, layers=1).to(device)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1)).to(device)
    with torchdebug.dump(tmp_path / "eager", model=model, task="statistics"):
        eager_loss = _train_step(model, torch.optim.AdamW(model.parameters()), ids)
    model.load_state_dict(weights)
    backend = dump_backend(tmp_path / "compiled", run_eagerly=run_eagerly)
    compiled_loss = _train_step(torch.compile(model, backend=backend), torch.optim.AdamW(model.parameters()), ids)
    backend.data_dump.close()
    torch._dynamo.reset()
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-5)
    return torchdebug.compare(tmp_path / "compiled", tmp_path / "eager")


def _check(result: CompareResult) -> None:
    eager = result.coverage()["b"]
    assert eager["matched"] >= 0.9 * eager["rows"], result.summary()
    assert result.counts()["error"] == 0, result.summary()
    assert result.first_divergence is None
    # the optimizer ran eagerly on the compiled side: its rows are reported, not counted as unmatched
    assert eager["other_phases"].get("optimizer", 0) > 0
    assert "tensor rows matched" in result.summary()
    matches = {row.match for row in result.rows}
    assert {"value", "group", "inside"} <= matches, matches
    inside = next(row for row in result.rows if row.match == "inside")
    assert inside.message.startswith(f"inside {inside.name_b}")


@pytest.mark.slow  # Dynamo and AOT autograd trace a transformers model: about 5 s a model on 2 cores
@pytest.mark.parametrize("family", ["gpt2", "bert"])  # Llama: the compiled test below, with the same checks
def test_training_step_of_hf_model_in_inductors_graphs_matches_eager_rows_without_errors(family: str, tmp_path: Path) -> None:
    _check(_compare_eager_and_compiled(family, "cpu", tmp_path, run_eagerly=True))


@pytest.mark.slow  # inductor generates a statistics kernel per dumped value: about 20 s on 2 cores
def test_compiled_training_step_of_hf_llama_matches_eager_rows_without_errors(tmp_path: Path) -> None:
    _check(_compare_eager_and_compiled("llama", "cpu", tmp_path))


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_compiled_training_step_of_hf_model_on_cuda_matches_eager_rows_without_errors(family: str, tmp_path: Path) -> None:
    _check(_compare_eager_and_compiled(family, "cuda", tmp_path))


def _record(name: str, stats: tuple[float, float, float, float], capture: str, shape: tuple[int, ...] = (4, 8)) -> Record:
    call, slot = name.rsplit("/", 1)
    phase, module, op_call = call.split("/")
    op, index = op_call.split("#")
    io, arg = slot.split(".")
    minimum, maximum, mean, norm = stats
    values = {"min": minimum, "max": maximum, "mean": mean, "norm": norm, "nan": 0, "posinf": 0, "neginf": 0}
    return Record(
        name=name, step=0, rank=0, phase=phase, module=module, op=op, call=int(index), seq=0, io=io, arg=arg,
        dtype="float32", shape=list(shape), stats=values, capture=capture,
    )  # fmt: skip


def test_layer_norm_decomposed_by_the_compiler_is_compared_at_its_boundary() -> None:
    x, y, z, mean, centred = (
        (-2.0, 3.0, 0.1, 5.0),
        (-1.5, 1.7, 0.0, 5.6),
        (-4.0, 4.0, 0.2, 9.0),
        (0.0, 0.2, 0.1, 0.5),
        (-2.1, 2.9, 0.0, 4.9),
    )
    eager = [
        _record("forward/ln/aten.native_layer_norm.default#0/input.0", x, "eager"),
        _record("forward/ln/aten.native_layer_norm.default#0/output.0", y, "eager"),
        _record("forward/ln/aten.native_layer_norm.default#0/output.1", mean, "eager", (4, 1)),
        _record("forward/fc/aten.addmm.default#0/input.1", y, "eager"),
        _record("forward/fc/aten.addmm.default#0/output.0", z, "eager"),
    ]
    near_mean = (0.0, 0.2 + 1e-7, 0.1, 0.5)  # computed by another kernel: rounding apart
    compiled = [
        _record("forward/ln/aten.var_mean.correction#0/input.0", x, "graph"),
        _record("forward/ln/aten.var_mean.correction#0/output.1", near_mean, "graph", (4, 1)),
        _record("forward/ln/aten.sub.Tensor#0/input.0", x, "graph"),
        _record("forward/ln/aten.sub.Tensor#0/output.0", centred, "graph"),
        _record("forward/ln/aten.mul.Tensor#0/input.0", centred, "graph"),
        _record("forward/ln/aten.mul.Tensor#0/output.0", y, "graph"),
        _record("forward/fc/aten.addmm.default#0/input.1", y, "graph"),
        _record("forward/fc/aten.addmm.default#0/output.0", z, "graph"),
    ]
    pairs = match_records(compiled, eager, compiled=True)  # the boundaries paired last
    by_b = {p.b.name: p for p in pairs if p.b is not None and p.a is not None}
    assert all(record.name in by_b for record in eager)  # every eager slot is paired
    layer_norm = "forward/ln/aten.native_layer_norm.default#0"
    assert by_b[f"{layer_norm}/output.0"].a.name == "forward/ln/aten.mul.Tensor#0/output.0"  # what addmm reads
    assert by_b[f"{layer_norm}/output.0"].how == "value"
    assert by_b[f"{layer_norm}/output.1"].a.name == "forward/ln/aten.var_mean.correction#0/output.1"
    assert by_b[f"{layer_norm}/output.1"].how == "group"
    assert by_b[f"{layer_norm}/input.0"].a.name.endswith("/input.0")
    inside = [p for p in pairs if p.how == "inside"]
    assert inside and all(p.inside == layer_norm for p in inside)
    assert "forward/ln/aten.sub.Tensor#0/output.0" in {p.a.name for p in inside}
    rows = [Row.from_records(0, p.a, p.b, p.how, p.order, inside=p.inside) for p in pairs]
    assert {row.name for row in rows if row.match in ("value", "group")} <= {r.name for r in eager}  # named by the eager op


def test_a_masked_minus_infinity_is_never_the_boundary_partner_of_the_finite_scores() -> None:
    # the compiled graph's where(mask, -inf, scores) stands for eager masked_fill; the finite scores
    # agree with the masked ones in every finite statistic, but the -inf says they are other values
    scores, near_scores = (-0.64, 1.1, 0.0365, 4.73), (-0.64, 1.1, 0.0365 + 1e-8, 4.73)
    masked = _record("forward/attn/aten.where.self#0/output.0", (-math.inf, 1.1, -math.inf, math.inf), "graph")
    masked.stats.update(neginf=112)
    compiled = [
        _record("forward/attn/aten.div.Tensor#0/output.0", near_scores, "graph"),
        _record("forward/attn/aten.where.self#0/input.2", near_scores, "graph"),
        masked,
        _record("forward/attn/aten.div.Tensor#1/output.0", (0.0, 1.0, 0.125, 3.36), "graph"),
    ]
    eager_masked = _record("forward/attn/aten.masked_fill.Scalar#0/output.0", (-math.inf, 1.1, -math.inf, math.inf), "eager")
    eager_masked.stats.update(neginf=112)
    eager = [
        _record("forward/attn/aten.div.Tensor#0/output.0", scores, "eager"),
        _record("forward/attn/aten.masked_fill.Scalar#0/input.0", scores, "eager"),
        eager_masked,
    ]
    pairs = match_records(compiled, eager, compiled=True)  # the boundaries paired last
    partner = {p.b.name: p.a.name for p in pairs if p.b is not None and p.a is not None}
    assert partner["forward/attn/aten.div.Tensor#0/output.0"] == "forward/attn/aten.div.Tensor#0/output.0"
    assert partner.get("forward/attn/aten.masked_fill.Scalar#0/output.0") in (None, masked.name)
