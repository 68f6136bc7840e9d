"""Blame that survives mixed precision on more models and smaller bugs (issue 16, items 3 and 6).

* A bf16 **model** (weights, activations, gradients and AdamW state in bf16, ``model.to(bfloat16)``)
  against its fp32 twin, forward, backward and optimizer: no error row, at most 2 % warning rows,
  no first divergence, with statistics and with tensors.
* Planted bugs of 1 % and 2 % (attention and MLP, forward and backward) with tensor dumps: named in
  fp32 and fp16 pairs; in bf16 pairs a 2 % bug is named, and a 1 % bug, below bf16's tolerance of
  1.6 %, is found once the tolerance is lowered to 0.8 %, as ``undecided`` (its own error against
  the float64 rerun is about 1 %, the CPU kernel's 0.2–0.4 %: too close to bf16 rounding to blame).
* Tiny Hugging Face GPT-2, Llama and BERT built from configs (no download), bf16 autocast and bf16
  models against fp32 with statistics: no error row, at most 2 % warning rows, no first divergence
  (a bf16 Llama's RMSNorm backward sums its gradients in another order than the fp32 twin).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from tests.compare.test_mixed_precision import BUGS, DTYPES, _Scale
from tests.hf_models import tiny_model
from torchdebug.compare._flow_alignment import aligned_op
from torchdebug.compare._rerun import own_errors
from torchdebug.compare._tolerances import rounding_tolerance
from torchdebug.records import Record

PLACES = ("attention", "mlp", "attention_backward", "mlp_backward")


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``gpt(task, dtype, bug=None, factor=1.0)`` → a dump of one AdamW step of the 2-layer GPT of
    ``test_mixed_precision``; ``dtype`` ``bf16model`` is the model cast to bf16, the others autocast."""
    root = tmp_path_factory.mktemp("models")
    made: dict[tuple, Path] = {}

    def get(task: str, dtype: str, bug: str | None = None, factor: float = 1.0) -> Path:
        key = (task, dtype, bug, factor)
        if key not in made:
            torchdebug.seed_all(0)
            model = GPT(GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab=128))
            if dtype == "bf16model":
                model.to(torch.bfloat16)
            optimizer = torch.optim.AdamW(model.parameters())
            path = root / "-".join(str(part) for part in key)
            op, index = BUGS[bug][:2] if bug else (None, -1)
            with _Scale(op, index, factor), torchdebug.dump(path, model=model, task=task):
                train_step(model, optimizer, make_batch(model.config, batch=2), autocast=DTYPES.get(dtype))
            made[key] = path
        return made[key]

    return get


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_bf16_model_against_its_fp32_twin_has_no_error_few_warnings_and_no_divergence(gpt, task):
    result = torchdebug.compare(gpt(task, "bf16model"), gpt(task, "fp32"))
    counts = result.counts()
    assert counts["error"] == 0 and counts["undecided"] == 0, result.summary()
    assert counts["warning"] <= 0.02 * len(result.rows)
    assert result.first_divergence is None
    phases = {row.phase for row in result.rows if (row.dtype_a, row.dtype_b) == ("bfloat16", "float32")}
    assert phases == {"forward", "backward", "optimizer"}


def test_a_bf16_layer_norm_backward_is_measured_against_its_cpu_kernel_rerun(gpt):
    # its weight and bias gradients are reduced in bf16, in partial sums whose number and order depend
    # on the CPU's kernel (its instruction set) and thread count: from under one to about three units
    # from the float64 rerun, which a fixed bound would blame. Whatever this CPU makes, the CPU kernel
    # re-run on the same inputs makes the same error, and it is measured whenever an own error is
    # beyond one unit: the healthy dump, then one output of each call planted 10 % off (beyond what any
    # CPU's kernel makes), whose re-run keeps the healthy error.
    dump = torchdebug.load(gpt("tensor", "bf16model")).ranks[0]
    calls: dict[str, list[Record]] = {}
    for record in dump.records():
        if record.op == "aten.native_layer_norm_backward.default":
            calls.setdefault(record.call_name, []).append(record)
    unit = rounding_tolerance("bfloat16")
    healthy = {name: own_errors(records, dump.load_tensor, lambda dtype: 1e-5) for name, records in calls.items()}
    assert sum(len(errors) for errors in healthy.values()) == 3 * len(calls) == 15
    for errors in healthy.values():
        rerun = any(e["own_err"] > unit for e in errors.values())
        assert all(("kernel_err" in e) == rerun and e.get("kernel_err", e["own_err"]) == e["own_err"] for e in errors.values())

    for name, records in calls.items():
        wrong = next(r for r in records if (r.io, r.arg) == ("output", "1"))  # the weight's gradient

        def load(record: Record, wrong: Record = wrong) -> torch.Tensor:
            tensor = dump.load_tensor(record)
            return tensor * 1.1 if record is wrong else tensor

        errors = own_errors(records, load, lambda dtype: 1e-5)
        assert errors.keys() == healthy[name].keys() == {"0", "1", "2"}
        assert all("kernel_err" in e and e["kernel_err"] == healthy[name][arg]["own_err"] for arg, e in errors.items()), name
        assert errors["1"]["own_err"] > errors["1"]["kernel_err"] + unit, name
        assert all(errors[arg]["own_err"] == healthy[name][arg]["own_err"] for arg in ("0", "2")), name


@pytest.mark.parametrize("factor", [1.01, 1.02])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("bug", PLACES)
def test_a_1_or_2_percent_bug_is_named_in_fp32_and_fp16_pairs(gpt, bug, dtype, factor):
    result = torchdebug.compare(gpt("tensor", dtype, bug, factor), gpt("tensor", "fp32"))
    first = result.first_divergence
    assert (first.call_name, first.io) == (BUGS[bug][2], "output")
    assert result.counts()["error"] == 1 and result.counts()["undecided"] == 0


@pytest.mark.parametrize("bug", PLACES)
def test_a_2_percent_bug_is_named_in_a_bf16_pair(gpt, bug):
    first = torchdebug.compare(gpt("tensor", "bf16", bug, 1.02), gpt("tensor", "fp32")).first_divergence
    assert (first.call_name, first.io) == (BUGS[bug][2], "output")


@pytest.mark.parametrize("bug", PLACES)
def test_a_1_percent_bug_in_a_bf16_pair_is_undecided_never_blamed(gpt, bug):
    buggy, reference = gpt("tensor", "bf16", bug, 1.01), gpt("tensor", "fp32")
    default = torchdebug.compare(buggy, reference)  # within bf16's tolerance (1.6 %): not judged
    assert default.counts()["error"] == 0 and default.first_divergence is None

    result = torchdebug.compare(buggy, reference, tolerances={"bfloat16": 0.008})
    assert result.counts()["error"] == 0 and result.first_divergence is None
    undecided = [row for row in result.rows if row.verdict == "undecided"]
    assert [(row.call_name, row.io) for row in undecided] == [(BUGS[bug][2], "output")]
    assert "too close to bfloat16 rounding to tell a bug from a kernel that rounds differently" in undecided[0].message
    summary = result.summary()
    assert "undecided: 1 rerun rows whose own error is within two rounding units" in summary
    assert "would decide them" not in summary  # a tensor dump is what it already is


def test_a_lower_bf16_tolerance_keeps_a_healthy_pair_clean(gpt):
    result = torchdebug.compare(gpt("tensor", "bf16"), gpt("tensor", "fp32"), tolerances={"bfloat16": 0.008})
    assert result.counts()["error"] == result.counts()["undecided"] == 0
    assert result.counts()["warning"] <= 0.02 * len(result.rows)


transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``hf(family, precision)`` → a statistics dump of one AdamW step of a 2-layer ``family`` model,
    made once per module (the fp32 twin serves both bf16 tests): ``precision`` ``fp32``, ``bf16``
    (forward under bf16 autocast) or ``bf16model`` (the model cast to bf16)."""
    root = tmp_path_factory.mktemp("hf")
    made: dict[tuple[str, str], Path] = {}

    def get(family: str, precision: str) -> Path:
        if (family, precision) not in made:
            path = root / f"{family}-{precision}"
            model = tiny_model(family, layers=2).to(torch.bfloat16 if precision == "bf16model" else torch.float32)
            ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
            optimizer = torch.optim.AdamW(model.parameters())
            with torchdebug.dump(path, model=model, task="statistics"):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizer.step()
            made[family, precision] = path
        return made[family, precision]

    return get


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_a_healthy_bf16_autocast_hugging_face_model_has_no_error_few_warnings_and_no_divergence(family, hf):
    result = torchdebug.compare(hf(family, "bf16"), hf(family, "fp32"))
    counts = result.counts()
    assert counts["error"] == 0, result.summary()
    assert counts["warning"] <= 0.02 * len(result.rows)
    assert result.first_divergence is None
    # what statistics cannot decide is said, never blamed: a LayerNorm's saved mean (BERT), Adam's
    # update of a parameter whose gradient is zero in places (GPT-2)
    assert all(
        'a tensor dump (task="tensor") would decide it' in row.message for row in result.rows if row.verdict == "undecided"
    )


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_a_healthy_bf16_hugging_face_model_has_no_error_few_warnings_and_no_divergence(family, hf):
    result = torchdebug.compare(hf(family, "bf16model"), hf(family, "fp32"))
    counts = result.counts()
    assert counts["error"] == 0, result.summary()
    assert counts["warning"] <= 0.02 * len(result.rows)
    assert result.first_divergence is None
    if family == "llama":
        # RMSNorm casts its bf16 input to float32: autograd adds the two float32 gradients, casts the
        # sum back and adds the residual's, where the twin adds the residual's first. The partial sums
        # are not paired with each other; the final sums are, and their inputs are told apart.
        backward = [row for row in result.rows if row.phase == "backward" and "layernorm" in row.module]
        sums = [row for row in backward if aligned_op(row.op) == "aten.add.Tensor"]  # add_ where summed in place
        assert {row.verdict for row in sums if row.call == 0} == {"unmatched"}
        apart = [row for row in sums if "between different tensors" in row.message]
        assert apart and all(row.verdict == "pass" and row.io == "input" and row.call == 1 for row in apart)
