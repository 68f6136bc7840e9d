"""Rerun attribution: each op's own error, against the op re-run in float64 on each side's inputs."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import torchdebug
from examples.gpt import MLP
from tests.compare.test_distributed import _assert_same
from tests.compare.test_verdicts import _row
from torchdebug.cli import main
from torchdebug.compare._rerun import NotRerunnable, output_at, resolve, run_op
from torchdebug.compare._verdicts import first_divergence, judge
from torchdebug.records import Record, call_name
from torchdebug.store import _reader as reader

GPT_MLP_FC = ("aten.addmm.default", 2, 1.02)
"""2 % too large: the third addmm of the GPT's forward (qkv, proj, then layers.0.mlp.fc)."""
GPT_GELU_BACKWARD = ("aten.gelu_backward.default", 0, 1.02)
"""2 % too large: the gradient through the GELU of layers.0.mlp."""


def _gelu_line() -> str:
    """``gpt.py:LINE`` of the line of the GPT's MLP running fc and GELU."""
    lines, start = inspect.getsourcelines(MLP.forward)
    return f"gpt.py:{start + next(i for i, line in enumerate(lines) if 'F.gelu(self.fc(x))' in line)}"


@pytest.mark.parametrize(
    ("wrong", "phase", "module", "op"),
    [
        (GPT_MLP_FC, "forward", "layers.0.mlp.fc", "aten.addmm.default"),
        (GPT_GELU_BACKWARD, "backward", "layers.0.mlp", "aten.gelu_backward.default"),
    ],
)
def test_a_2_percent_kernel_bug_in_a_bf16_run_is_found_by_rerun(dumps, wrong, phase, module, op):
    buggy, reference = dumps("gpt", bf16=True, wrong=wrong), dumps("gpt")
    plain = torchdebug.compare(buggy, reference)  # tensors saved: the calls statistics cannot decide are rerun
    assert plain.first_divergence.name == torchdebug.compare(buggy, reference, rerun=True).first_divergence.name

    rerun = torchdebug.compare(buggy, reference, rerun=True)
    first = rerun.first_divergence
    assert (first.phase, first.module, first.op, first.io) == (phase, module, op, "output")
    assert first.source.endswith(f"{_gelu_line()} in forward")
    assert first.message.startswith("own error") and "vs fp64 rerun on side A, the CPU's bfloat16 kernel" in first.message
    assert "(bfloat16 tolerance 7.8e-03): this op makes the difference" in first.message
    assert rerun.counts()["error"] == 1
    assert "--rerun" not in rerun.summary()


def test_two_workers_splitting_one_rank_rerun_as_one_process_does(dumps):
    buggy, reference = dumps("gpt", bf16=True, wrong=GPT_MLP_FC), dumps("gpt")
    expected = torchdebug.compare(buggy, reference, rerun=True)
    _assert_same(torchdebug.compare(buggy, reference, rerun=True, workers=2), expected)


@pytest.mark.parametrize("kind", ["gpt", "mlp"])
def test_a_healthy_bf16_run_against_fp32_has_no_error_rows_with_rerun(dumps, kind):
    result = torchdebug.compare(dumps(kind, bf16=True), dumps(kind), rerun=True)
    assert result.counts()["error"] == 0
    rerun = [row for row in result.rows if "own_err_a" in row.metrics and "own_err_b" in row.metrics]
    assert rerun  # the diverging calls were rerun on both sides, and agree
    assert result.options["rerun"] is True


def test_a_dump_compared_with_itself_needs_no_rerun(dumps):
    result = torchdebug.compare(dumps("gpt"), dumps("gpt"), rerun=True)
    assert result.counts()["pass"] == len(result.rows)
    assert not any("own_err_a" in row.metrics for row in result.rows)


def _program() -> None:
    """Calls whose arguments exercise the rebuilding: a list of tensors, keywords, dtypes, None,
    an in-place op, a view input, optional tensors in a list."""
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    torch.cat([x, y], dim=1)
    torch.sum(x, dim=1, dtype=torch.float64)
    x.to(torch.bfloat16)
    x.t().mm(y)
    x.clone().add_(y, alpha=2.0)
    x[:, torch.tensor([1, 3])]
    F.layer_norm(x, (6,))
    torch.where(x > 0, x, y)
    F.dropout(x, 0.5, training=True)


@pytest.fixture(scope="module")
def program_dump(tmp_path_factory: pytest.TempPathFactory) -> reader.RankDump:
    torchdebug.seed_all(0)
    path = tmp_path_factory.mktemp("program")
    with torchdebug.dump(path, task="tensor"):
        _program()
    return reader.load(path).ranks[0]


def _calls(dump: reader.RankDump) -> dict[str, list[Record]]:
    calls: dict[str, list[Record]] = {}
    for record in dump.records():
        calls.setdefault(call_name(record.name), []).append(record)
    return calls


@pytest.mark.parametrize(
    "call",
    [
        "aten.cat.default#0",  # a list of tensors: 0.0, 0.1
        "aten.sum.dim_IntList#0",  # a keyword argument (dtype=float64)
        "aten._to_copy.default#0",  # dtype given by name: bfloat16
        "aten.mm.default#0",  # its first input saved as a strided view (a transpose)
        "aten.add_.Tensor#0",  # in place, with alpha=2: inputs recorded before it ran
        "aten.index.Tensor#0",  # optional tensors in a list: [None, indices]
        "aten.native_layer_norm.default#0",  # None for weight and bias; three outputs
        "aten.where.self#0",  # a bool tensor input
    ],
)
def test_a_call_rerun_from_its_records_gives_its_recorded_outputs(program_dump, call):
    records = _calls(program_dump)[f"forward/-/{call}"]
    inputs = [r for r in records if r.io == "input"]
    result = run_op(records[0].op, inputs, program_dump.load_tensor)
    outputs = [r for r in records if r.io == "output"]
    assert outputs
    for record in outputs:
        recorded = program_dump.load_tensor(record)
        rerun = output_at(result, record.arg)
        assert rerun.dtype == (torch.bfloat16 if "_to_copy" in call else torch.float64)  # a cast keeps its target
        torch.testing.assert_close(rerun.to(recorded.dtype), recorded)


def test_dropout_reruns_after_its_random_mask(program_dump):
    """The mask is drawn by bernoulli_ (not rerun); the ops applying it rerun on the recorded mask."""
    calls = _calls(program_dump)
    for name, rerunnable in [("bernoulli_.float#0", False), ("empty_like.default#0", False), ("mul.Tensor#0", True)]:
        records = calls[f"forward/-/aten.{name}"]
        inputs = [r for r in records if r.io == "input"]
        if rerunnable:
            run_op(records[0].op, inputs, program_dump.load_tensor)
        else:
            with pytest.raises(NotRerunnable):
                run_op(records[0].op, inputs, program_dump.load_tensor)


def test_rerun_leaves_the_saved_inputs_of_an_in_place_op_unchanged(program_dump):
    records = _calls(program_dump)["forward/-/aten.add_.Tensor#0"]
    inputs = [r for r in records if r.io == "input"]
    before = program_dump.load_tensor(inputs[0]).clone()
    run_op(records[0].op, inputs, program_dump.load_tensor)
    assert torch.equal(program_dump.load_tensor(inputs[0]), before)


@pytest.mark.parametrize(
    ("op", "reason"),
    [
        ("aten.native_dropout.default", "random results"),
        ("aten.bernoulli_.float", "random results"),
        ("aten.randn.default", "random results"),
        ("aten.empty_like.default", "depends on memory"),
        ("aten.as_strided.default", "depends on memory"),
        ("c10d.allreduce_.default", "not an aten op"),
        ("module", "not an aten op"),
        ("aten.no_such_op.default", "no such aten op"),
    ],
)
def test_ops_that_cannot_be_rerun_say_why(op, reason):
    with pytest.raises(NotRerunnable, match=reason):
        resolve(op)


def _input(arg: str, *, value: object = None, saved: bool = True, op: str = "aten.gelu.default") -> Record:
    name = f"forward/-/{op}#0/input.{arg}"
    if arg.isdigit() and value is None:
        tensor = {"file": "t.safetensors", "key": name} if saved else None
        return Record(name, 0, 0, "forward", "-", op, 0, 0, "input", arg, dtype="float32", shape=[3], tensor=tensor)
    return Record(name, 0, 0, "forward", "-", op, 0, 0, "input", arg, kind="value", value=value)


def _ones(record: Record) -> torch.Tensor:
    return torch.ones(3)


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        ([_input("0", saved=False)], "tensor not saved"),
        ([_input("0"), _input("approximate", value="tan...")], "cut short by capture"),
        ([_input("approximate", value="tanh")], r"inputs missing from the records \(self\)"),
        ([_input("0"), _input("approximate", value="fast")], "raised RuntimeError"),
        ([_input("0"), _input("1", value="<object at 0x1>", op="aten._to_copy.default")], "no argument"),
    ],
)
def test_calls_that_cannot_be_rebuilt_say_why(inputs, reason):
    with pytest.raises(NotRerunnable, match=reason):
        run_op(inputs[0].op, inputs, _ones)


def test_a_dtype_that_is_not_a_dtype_name_is_not_rerunnable():
    inputs = [_input("0", op="aten._to_copy.default"), _input("dtype", value="float99", op="aten._to_copy.default")]
    with pytest.raises(NotRerunnable, match="cannot rebuild ScalarType from 'float99'"):
        run_op("aten._to_copy.default", inputs, _ones)


def test_dropout_gets_no_rerun_verdict_and_rerun_blames_nothing_new(dumps):
    a, b = dumps("gpt", bf16=True, dropout=0.1), dumps("gpt", dropout=0.1)
    plain, rerun = torchdebug.compare(a, b), torchdebug.compare(a, b, rerun=True)
    random = [row for row in rerun.rows if row.op == "aten.bernoulli_.float"]
    assert random and not any("own_err_a" in row.metrics or "own_err_b" in row.metrics for row in random)
    assert [r.name for r in rerun.rows if r.verdict == "error"] == [r.name for r in plain.rows if r.verdict == "error"]


def test_a_call_whose_tensors_were_not_saved_gets_no_rerun_verdict(dumps):
    # the planted bug is in fc2, whose tensors the tensor_list filter did not save
    buggy = dumps("mlp", bf16=True, wrong=("aten.addmm.default", 1, 1.02), tensor_list=("fc1",))
    result = torchdebug.compare(buggy, dumps("mlp", tensor_list=("fc1",)), rerun=True)
    fc2 = [row for row in result.rows if row.module == "fc2"]
    assert fc2 and not any("own_err_a" in row.metrics for row in fc2)
    assert not any(row.message.startswith("own error") for row in result.rows)


def test_rerun_on_statistics_dumps_says_nothing_could_be_rerun(dumps):
    result = torchdebug.compare(dumps("mlp", task="statistics", bf16=True), dumps("mlp", task="statistics"), rerun=True)
    assert any(p.startswith("rerun: no slot has saved tensors") for p in result.problems)
    assert "note: rerun: no slot has saved tensors" in result.summary()
    tensors = torchdebug.compare(dumps("mlp", bf16=True), dumps("mlp"), rerun=True)
    assert not any(p.startswith("rerun:") for p in tensors.problems)


def test_rerun_blames_an_output_whose_inputs_explain_its_error_by_the_growth_rule():
    rows = [_row("input", 5e-4), _row("output", 0.005)]
    rows[1].metrics.update(own_err_a=2e-5, own_err_b=1e-7)  # twice float32's rounding tolerance is 1.5e-5
    judge(rows, growth=16)
    assert (rows[1].verdict, rows[1].attribution) == ("error", "blamed")
    assert rows[1].message.startswith("own error 2.0e-05 vs fp64 rerun on side A (float32 tolerance 7.7e-06)")
    assert first_divergence(rows) is rows[1]


@pytest.mark.parametrize(
    ("own", "kernel", "verdict"),
    [
        (2e-5, 1.8e-5, "inherited"),  # as far from float64 as the CPU kernel on the same inputs
        (2e-5, 1e-6, "blamed"),  # beyond 2 tolerances (7.7e-6), and 1 beyond the kernel
        (1.2e-5, 2e-6, "undecided"),  # beyond 1 tolerance, within 2: too close to rounding to blame
        (5e-6, None, "inherited"),  # within 1 tolerance
    ],
)
def test_rerun_blames_only_beyond_what_the_cpu_kernel_makes(own, kernel, verdict):
    rows = [_row("input", 5e-4), _row("output", 0.005)]
    rows[1].metrics.update(own_err_a=own, own_err_b=1e-7)
    if kernel is not None:
        rows[1].metrics["kernel_err_a"] = kernel
    judge(rows, growth=16)
    assert rows[1].attribution == verdict
    assert (first_divergence(rows) is rows[1]) == (verdict == "blamed")


def test_an_output_whose_rerun_agrees_keeps_the_growth_rule_verdict():
    rows = [_row("input", 0.01), _row("output", 0.05)]
    rows[1].metrics.update(own_err_a=1e-6, own_err_b=1e-7)
    judge(rows, growth=16)
    assert (rows[1].verdict, rows[1].attribution) == ("warning", "inherited")


def test_cli_rerun_names_the_bug_and_writes_the_own_errors(dumps, tmp_path, capsys):
    buggy, reference = dumps("gpt", bf16=True, wrong=GPT_MLP_FC), dumps("gpt")
    assert main(["compare", str(buggy), str(reference), "--rerun", "-o", str(tmp_path), "--format", "csv"]) == 1
    assert "own error" in capsys.readouterr().out
    header = (tmp_path / "compare.csv").read_text().splitlines()[0].split(",")
    assert header[-4:] == ["own_err_a", "own_err_b", "kernel_err_a", "kernel_err_b"]


def test_cli_rerun_is_refused_with_across_ranks(dumps, capsys):
    assert main(["compare", "--across-ranks", str(dumps("mlp")), "--rerun"]) == 2
    assert "--rerun applies to A B only" in capsys.readouterr().err


def test_without_rerun_the_csv_has_no_own_error_columns(dumps, tmp_path):
    path = torchdebug.compare(dumps("mlp"), dumps("mlp")).to_csv(tmp_path / "c.csv")
    assert "own_err_a" not in path.read_text().splitlines()[0]
