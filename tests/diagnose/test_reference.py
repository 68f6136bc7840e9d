"""The float64 reference keeps each tensor's kind (complex stays complex, integers stay integers);
every run is seeded alike, so a program with dropout is judged against the same random draws; a
failing stage with no node to name says why."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

import torchdebug.diagnose as td
from tests.diagnose.llama import apply_rope, rope_frequencies
from torchdebug.diagnose._accuracy import check
from torchdebug.diagnose._program import Program
from torchdebug.diagnose._stages import references


class Rotary(nn.Module):
    """RoPE alone: a complex64 frequency buffer and an integer position buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("frequencies", rope_frequencies(8, 6))
        self.register_buffer("positions", torch.tensor([5, 4, 3, 2, 1, 0]))
        self.register_buffer("keep", torch.tensor([True, True, False, True, True, True]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rotated = apply_rope(self.proj(x), self.frequencies[self.positions])
        return rotated * self.keep[:, None]


def test_fp64_reference_widens_a_complex_rope_buffer_to_complex128_keeping_its_imaginary_part() -> None:
    model = Rotary()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when a cast drops an imaginary part
        wide, _ = Program(model, (torch.randn(6, 8),), train=True).instance(float64=True)
    assert wide.proj.weight.dtype == torch.float64 and wide.proj.weight.requires_grad
    assert wide.frequencies.dtype == torch.complex128
    assert torch.equal(wide.frequencies, model.frequencies.to(torch.complex128))
    assert model.frequencies.dtype == torch.complex64  # the user's model is not changed


def test_fp64_reference_leaves_integer_and_bool_buffers_as_they_are() -> None:
    model = Rotary()
    program = Program(model, (torch.randn(6, 8),), train=True)
    wide, _ = program.instance(float64=True)
    assert wide.positions.dtype == torch.int64 and torch.equal(wide.positions, model.positions)
    assert wide.keep.dtype == torch.bool and torch.equal(wide.keep, model.keep)
    assert references(program).fp64.error is None  # the positions still index the frequencies


def test_fp64_reference_of_rope_is_as_close_to_eager_as_rounding() -> None:
    refs = references(Program(Rotary(), (torch.randn(6, 8),), train=True))
    assert refs.fp64.error is None and refs.eager.error is None
    for name, fp64 in refs.fp64.values.items():
        verdict = check(name, fp64, refs.eager.values[name], refs.eager.values[name])
        # rounding of float32 against float64: far below what a dropped imaginary part costs (order 1)
        assert verdict.error < 1e-4, (name, verdict)


def test_fp64_reference_widens_a_complex_input_and_keeps_an_integer_input() -> None:
    program = Program(lambda z, i: (z * z)[i].abs(), (torch.randn(4, dtype=torch.complex64), torch.tensor([0, 2])), train=False)
    _, (z, i) = program.instance(float64=True)
    assert z.dtype == torch.complex128 and i.dtype == torch.int64


def test_check_judges_complex_values_by_the_modulus_of_the_difference() -> None:
    fp64 = torch.randn(64, dtype=torch.complex128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check("z", fp64, fp64.to(torch.complex64), fp64.to(torch.complex64)).passed
        wrong = check("z", fp64, fp64.to(torch.complex64), (fp64 * 1j).to(torch.complex64))  # rotated a quarter turn
    assert not wrong.passed and wrong.error > 0.5


class DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 4)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(torch.tanh(self.fc1(x))))


def test_a_program_with_dropout_is_judged_against_the_same_random_draws_in_every_stage(tmp_path: Path) -> None:
    torch.manual_seed(0)
    report = td.diagnose(DropoutNet(), torch.randn(16, 8), backend="aot_eager_decomp_partition", output_dir=tmp_path)
    assert report.ok, report.summary()  # inductor's decompositions draw eager's numbers too
    random_notes = [note for note in report.notes if "draws random numbers" in note]
    assert len(random_notes) == 1 and ("dropout" in random_notes[0] or "bernoulli" in random_notes[0]), report.notes
    budgets = [c.budget for c in report.stages[-1].checks if c.budget != float("inf")]
    # the fp64 run drew the same mask as eager: eager's budget is rounding, not a different mask
    assert all(budget < 1e-3 for budget in budgets), budgets


def test_diagnose_leaves_the_callers_random_state_as_it_was(tmp_path: Path) -> None:
    x = torch.randn(4)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    td.diagnose(lambda x: x.sin(), x, backend="eager", output_dir=tmp_path)
    assert torch.equal(torch.rand(3), expected)


def _wrong_only_with_one_output(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
    """A backend whose result is wrong only for a graph with exactly one output: every prefix that
    bisection compiles returns more, so no prefix fails."""
    outputs = gm.graph.find_nodes(op="output")[0].args[0]
    single = len(outputs) == 1 if isinstance(outputs, (tuple, list)) else True

    def run(*args: torch.Tensor) -> object:
        result = gm(*args)
        return tuple(t + 1 for t in result) if single else result

    return run


def test_a_failing_stage_whose_node_cannot_be_found_says_why(tmp_path: Path) -> None:
    report = td.diagnose(lambda x: (x.sin() * 2).cos(), torch.randn(8), backend=_wrong_only_with_one_output, output_dir=tmp_path)
    assert report.stage == "_wrong_only_with_one_output" and report.kind == "accuracy"
    assert report.finding is None and report.not_localised is not None
    assert "no single Dynamo graph prefix fails" in report.not_localised and report.notes[-1] == report.not_localised
    assert "not found" in report.summary()
