"""The origin of a NaN/Inf is the op that made it: a causal mask's -inf is given, never blamed.

The rule (``torchdebug.nonfinite``) alone, then a small GPT with a ``-inf`` and a ``finfo.min``
causal mask through every reader of it: ``check`` and ``show`` on a statistics dump, the eager
``overflow_check`` task and the compiled overflow scene, each healthy and with a real overflow
planted behind the mask.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug
from torchdebug.cli import main
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.nonfinite import ENTRY, GIVEN, INF, LIMIT, NAN, ORIGIN, OriginTracker, find_origin, tensor_flags, value_flags
from torchdebug.records import Record

# -- the rule --------------------------------------------------------------------------------------


def test_tensor_flags_name_nan_inf_and_dtype_limits():
    assert tensor_flags({"nan": 1, "posinf": 0, "neginf": 0, "min": 0.0, "max": 1.0}, "float32") == NAN
    assert tensor_flags({"nan": 0, "posinf": 0, "neginf": 2, "min": -math.inf, "max": 1.0}, "float32") == INF | LIMIT
    fp32_min = torch.finfo(torch.float32).min
    assert tensor_flags({"nan": 0, "posinf": 0, "neginf": 0, "min": fp32_min, "max": 0.0}, "float32") == LIMIT
    assert tensor_flags({"nan": 0, "posinf": 0, "neginf": 0, "min": fp32_min, "max": 0.0}, "float64") == 0
    assert tensor_flags({"nan": 0, "posinf": 0, "neginf": 0, "min": -65504.0, "max": 0.0}, "float16") == LIMIT
    assert tensor_flags({"nan": 0, "posinf": 0, "neginf": 0, "min": -7, "max": 9}, "int64") == 0
    assert tensor_flags(None, "float32") == 0


def test_value_flags_treat_infinities_and_finfo_limits_as_given():
    assert value_flags(float("-inf")) == INF and value_flags(float("nan")) == NAN
    assert value_flags(torch.finfo(torch.bfloat16).min) == LIMIT and value_flags(-65504.0) == LIMIT
    assert value_flags(1e5) == 0 and value_flags(-1e9) == 0 and value_flags(True) == 0 and value_flags([3, 4]) == 0


@pytest.mark.parametrize(
    ("inputs", "outputs", "expected"),
    [
        (0, 0, None),  # finite
        (INF, 0, None),  # softmax of a masked row: -inf -> 0
        (0, INF, ORIGIN),  # exp overflowing
        (0, NAN, ORIGIN),  # 0/0
        (INF, NAN, ORIGIN),  # -inf - -inf: the NaN is new
        (INF, INF, GIVEN),  # passes a -inf on
        (LIMIT, INF, GIVEN),  # finfo.min cast to a narrower dtype, or added to itself
        (LIMIT, NAN, ORIGIN),
    ],
)
def test_the_tracker_judges_a_call_by_what_its_inputs_held(inputs, outputs, expected):
    assert OriginTracker().judge(inputs, outputs) == expected


def test_a_nan_no_call_made_enters_once_then_is_passed_on():
    tracker = OriginTracker()
    assert tracker.judge(NAN, NAN) == ENTRY
    assert tracker.judge(NAN, NAN) == GIVEN
    tracker = OriginTracker()
    assert tracker.judge(0, NAN) == ORIGIN and tracker.judge(NAN, NAN) == GIVEN


def test_without_input_records_the_first_nonfinite_output_is_taken_for_the_origin():
    tracker = OriginTracker()
    assert tracker.judge(0, INF, inputs_known=False) == ORIGIN
    assert tracker.judge(0, INF, inputs_known=False) == GIVEN
    assert tracker.judge(0, NAN, inputs_known=False) == ORIGIN


def _record(
    call: str, io: str, seq: int, *, step: int = 0, nan: int = 0, inf: int = 0, kind: str = "tensor", value=None, arg: str = "0"
):
    phase, module, op_call, *_ = call.split("/")
    op, index = op_call.split("#")
    stats = None
    if kind == "tensor":
        stats = {"min": -math.inf if inf else 0.0, "max": 1.0, "mean": 0.0, "norm": 0.0, "nan": nan, "posinf": 0, "neginf": inf}
    return Record(
        f"{call}/{io}.{arg}",
        step,
        0,
        phase,
        module,
        op,
        int(index),
        seq,
        io,
        arg,
        kind=kind,
        dtype="float32",
        stats=stats,
        value=value,
    )


def test_find_origin_skips_given_infinities_and_looks_at_each_step():
    records = [
        _record("forward/attn/aten.masked_fill.Scalar#0", "input", 0),
        _record("forward/attn/aten.masked_fill.Scalar#0", "output", 0, inf=4),
        _record("forward/attn/aten._softmax.default#0", "input", 1, inf=4),
        _record("forward/attn/aten._softmax.default#0", "output", 1),
        _record("forward/attn/aten.masked_fill.Scalar#0", "input", 0, step=1),
        _record("forward/attn/aten.masked_fill.Scalar#0", "output", 0, step=1, inf=4),
        _record("forward/mlp/aten.exp.default#0", "input", 2, step=1),
        _record("forward/mlp/aten.exp.default#0", "output", 2, step=1, inf=1),
    ]
    records.insert(5, _record("forward/attn/aten.masked_fill.Scalar#0", "input", 0, step=1, kind="value", value=-math.inf))
    records.insert(1, _record("forward/attn/aten.masked_fill.Scalar#0", "input", 0, kind="value", value=-math.inf))
    origin = find_origin(records)
    assert origin.kind == ORIGIN and origin.record.name == "forward/mlp/aten.exp.default#0/output.0" and origin.record.step == 1
    assert find_origin(records[:5]) is None


def test_a_nan_given_as_a_number_is_where_it_entered():
    """A NaN a call is handed as a number (``loss * float("nan")``) enters the step there: the entry
    names that argument, not the output as if a parameter or the batch had brought it."""
    call = "forward/-/aten.mul.Tensor#0"
    records = [
        _record(call, "input", 0),
        _record(call, "input", 0, kind="value", value=math.nan, arg="1"),
        _record(call, "output", 0, nan=1),
    ]
    origin = find_origin(records)
    assert origin.kind == ENTRY and origin.record.name == f"{call}/input.1"
    assert str(origin).endswith("a NaN given as input.1, a number of the program's, not a tensor")
    records[1] = _record(call, "input", 0, kind="value", value=2.0, arg="1")
    assert find_origin(records).kind == ORIGIN  # a finite number: the call made the NaN


def test_find_origin_orders_calls_by_dispatch_so_a_collective_precedes_the_ops_reading_its_output():
    """A collective's outputs are recorded once its work completes, after ops that ran meanwhile:
    FSDP2's copy-out views the all-gather's output (with the NaN another rank's shard held) before
    the capture sees the work completed. By record order that view took the NaN in first."""
    gather = "forward/layers.1/c10d._allgather_base_.default#0"
    view = "forward/layers.1/aten.view.default#0"
    records = [
        _record(gather, "input", 5),
        _record(view, "input", 6, nan=1),
        _record(view, "output", 6, nan=1),
        _record(gather, "output", 5, nan=1),  # written when the work completed
    ]
    origin = find_origin(records)
    assert origin.kind == ORIGIN and origin.record.name == f"{gather}/output.0"


# -- a small GPT with a causal mask --------------------------------------------------------------------


class _Attention(nn.Module):
    def __init__(self, width: int, fill: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fill = fill

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, self.fill)
        return self.proj(scores.softmax(dim=-1) @ v)


class _MLP(nn.Module):
    def __init__(self, width: int, overflow: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.overflow = overflow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.overflow:
            h = (h.abs() + 100.0).exp()  # planted overflow: exp(>= 100) is Inf in float32
        return torch.relu(h)


class TinyGPT(nn.Module):
    """Two blocks of causal attention and an MLP; ``fill`` is the mask's value, ``overflow`` plants an
    Inf in the second block's MLP, behind the mask."""

    def __init__(self, fill: float, overflow: bool = False, width: int = 8, vocab: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"attn": _Attention(width, fill), "mlp": _MLP(width, overflow and i == 1)}) for i in range(2)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block["attn"](x)
            x = x + block["mlp"](x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), tokens.flatten())


FILLS = {"-inf": float("-inf"), "finfo.min": torch.finfo(torch.float32).min}
PLANTED_LINE = next(i for i, line in enumerate(inspect.getsourcelines(_MLP.forward)[0]) if "planted" in line)
PLANTED_SOURCE = f"{Path(__file__).name}:{inspect.getsourcelines(_MLP.forward)[1] + PLANTED_LINE} in forward"


def _train_step(model: nn.Module) -> None:
    tokens = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(0))
    model(tokens).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()


def _model(fill: str, overflow: bool) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(FILLS[fill], overflow)


@pytest.mark.parametrize("fill", FILLS)
def test_check_passes_a_healthy_gpt_and_names_an_overflow_behind_the_mask(tmp_path, capsys, fill):
    for overflow in (False, True):
        model = _model(fill, overflow)
        with torchdebug.dump(tmp_path / str(overflow), model=model):
            _train_step(model)
    capsys.readouterr()
    assert main(["check", str(tmp_path / "False")]) == 0
    given = "output slots hold infinities they were given (first: forward/blocks.0.attn/aten.masked_fill.Scalar#0/output.0)"
    assert given in capsys.readouterr().out or fill == "finfo.min"
    assert main(["check", str(tmp_path / "True")]) == 1
    out = capsys.readouterr().out
    assert "forward/blocks.1.mlp/aten.exp.default#0 (phase forward, module blocks.1.mlp)" in out
    assert PLANTED_SOURCE in out
    assert main(["show", str(tmp_path / "True"), "--limit", "1"]) == 0
    assert "first NaN/Inf of rank 0: step 0: forward/blocks.1.mlp/aten.exp.default#0" in capsys.readouterr().out


@pytest.mark.parametrize("fill", FILLS)
def test_overflow_check_records_the_overflow_behind_the_mask_first(tmp_path, fill):
    for overflow in (False, True):
        model = _model(fill, overflow)
        with torchdebug.dump(tmp_path / str(overflow), model=model, task="overflow_check", overflow_nums=1):
            _train_step(model)
    assert torchdebug.load(tmp_path / "False").ranks[0].records() == []
    records = torchdebug.load(tmp_path / "True").ranks[0].records()
    assert {r.call_name for r in records} == {"forward/blocks.1.mlp/aten.exp.default#0"}
    assert all(r.source.endswith(PLANTED_SOURCE) for r in records)


def _overflow_scene_backend(tmp_path: Path):
    scene = tmp_path / "overflow.json"
    scene.write_text(json.dumps({"dump": {"dump_path": str(tmp_path), "dump_debug": "on"}}))
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    config.dump_config.dump_config_path = str(scene)
    return get_backend(config)


@pytest.mark.parametrize("overflow", [False, True])
def test_the_compiled_overflow_scene_skips_the_mask_and_names_the_overflow(tmp_path, overflow):
    model = _model("-inf", overflow)
    backend = _overflow_scene_backend(tmp_path)
    _train_step(torch.compile(model, backend=backend))
    backend.data_dump.close()
    if not overflow:
        assert backend.data_dump.overflows == []
        return
    first = backend.data_dump.overflows[0]
    assert first.name == "forward/blocks.1.mlp/aten.exp.default#0" and first.inf > 0
    assert first.source.endswith(PLANTED_SOURCE)
    records = torchdebug.load(backend.data_dump.run_dir).ranks[0].records()
    assert "forward/blocks.1.mlp/aten.exp.default#0" in {r.call_name for r in records}
    assert not any("masked_fill" in r.op for r in records)
