"""Tensor subclasses never crash capture: DTensor, FSDP2's sharded parameters and wrapper subclasses
are read through their plain inner tensors, or recorded with a readable capture_error."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

import torchdebug
from tests import gloo
from torchdebug._torch.subclasses import describe, is_subclass


class ScaledInt8(torch.Tensor):
    """A float32 value stored as int8 data times a scale (the shape of float8 and NF4 weights)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.float32, device=data.device)

    def __init__(self, data: torch.Tensor, scale: torch.Tensor) -> None:
        self._data, self._scale = data, scale

    def __tensor_flatten__(self):
        return ["_data", "_scale"], type(self)  # the class, so that compiled code rebuilds a subclass as itself

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return meta(inner["_data"], inner["_scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:  # nn.Parameter detaches: the type is kept, as torchao's is
            return cls(args[0]._data.detach(), args[0]._scale)
        if func is torch.ops.aten.t.default:  # a transpose stays quantized, the matmul reading it does not
            return cls(args[0]._data.t(), args[0]._scale)

        def plain(x):
            return x._data.float() * x._scale if isinstance(x, ScaledInt8) else x

        return func(*pytree.tree_map(plain, args), **pytree.tree_map(plain, kwargs or {}))


class _DequantizedLinear(torch.autograd.Function):
    """``x @ w.t()`` of a quantized ``w`` that is saved as it is and dequantized in each pass (NF4's ``linear_nf4``)."""

    @staticmethod
    def forward(ctx, x, weight):  # noqa: ANN001, ANN205
        ctx.save_for_backward(weight)
        return x @ (weight._data.float() * weight._scale).t()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        (weight,) = ctx.saved_tensors
        return grad @ (weight._data.float() * weight._scale), None


class LinearScaledInt8(ScaledInt8):
    """A quantized weight that takes ``F.linear`` through ``__torch_function__`` into an autograd
    Function of its own, as torchao's NF4 weights do."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.linear:
            x, weight, bias = (list(args) + [None])[:3]
            out = _DequantizedLinear.apply(x, weight)
            return out if bias is None else out + bias
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class Wrapped(torch.Tensor):
    """A thin wrapper: one inner tensor of its own dtype holds its elements."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner: torch.Tensor) -> None:
        self._inner = inner

    def __tensor_flatten__(self):
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return Wrapped(inner["_inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            return Wrapped(args[0]._inner.detach())

        def plain(x):
            return x._inner if isinstance(x, Wrapped) else x

        out = func(*pytree.tree_map(plain, args), **pytree.tree_map(plain, kwargs or {}))
        in_place = func._schema.is_mutable and isinstance(args[0], Wrapped)
        return args[0] if in_place else out  # an in-place op returns its argument, as torch's contract says


@pytest.fixture(params=["native", "torch ops"])
def native(request, monkeypatch):
    if request.param == "torch ops":
        monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")
    return request.param


def test_the_seam_reads_wrappers_through_their_inner_tensors():
    assert not is_subclass(torch.ones(2)) and not is_subclass(torch.nn.Parameter(torch.ones(2)))
    inner = torch.arange(6.0).reshape(2, 3)
    view = describe(Wrapped(inner))
    assert view.local is inner and view.info == {"subclass": "Wrapped", "local_shape": [2, 3]}
    quantized = describe(ScaledInt8(torch.ones(2, 3, dtype=torch.int8), torch.tensor(0.5)))
    assert quantized.local is None and [path for path, _ in quantized.inner] == ["_data", "_scale"]
    assert "_data int8[2, 3], _scale float32[]" in quantized.why_unread()


@pytest.mark.parametrize("task", ["statistics", "tensor", "checksum", "overflow_check"])
def test_wrapper_subclasses_pass_through_every_task_without_touching_the_step(tmp_path, native, task):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    weight = ScaledInt8(torch.randint(-8, 8, (2, 4), dtype=torch.int8), torch.tensor(0.25))
    thin = Wrapped(torch.randn(3, 2))
    expected = (x @ (weight._data.float() * 0.25).t()) + thin._inner
    with torchdebug.dump(tmp_path, task=task):
        out = torch.nn.functional.linear(x, weight) + thin
    assert torch.equal(out, expected)
    records = torchdebug.load(tmp_path).ranks[0].records()
    if task == "overflow_check":
        assert records == []
        return
    quantized = [r for r in records if r.extra.get("subclass") == "ScaledInt8"]
    assert quantized and all("computed from several inner tensors" in r.capture_error for r in quantized)
    wrapped = [r for r in records if r.extra.get("subclass") == "Wrapped"]
    assert wrapped and all(r.capture_error is None and r.shape == [3, 2] for r in wrapped)
    if task in ("statistics", "tensor"):
        assert wrapped[0].stats["max"] == pytest.approx(thin._inner.max().item())
    if task == "tensor":
        dump = torchdebug.load(tmp_path).ranks[0]
        assert torch.equal(dump.load_tensor(wrapped[0]), thin._inner)


def test_a_nan_in_a_wrapped_tensor_is_found_by_the_overflow_check(tmp_path, native):
    thin = Wrapped(torch.tensor([0.0, 1.0]))
    with torchdebug.dump(tmp_path, task="overflow_check"):
        thin / 0.0
    dump = torchdebug.load(tmp_path).ranks[0]
    records = dump.records()
    assert {r.call_name for r in records} == {"forward/-/aten.div.Tensor#0"}
    wrapped = next(r for r in records if r.extra.get("subclass") == "Wrapped")
    assert torch.equal(dump.load_tensor(wrapped), thin._inner)  # saved through its inner tensor


def test_an_inf_written_into_a_wrapped_tensor_is_given_to_the_ops_that_read_it(tmp_path, native):
    """A subclass's handler may write its inner tensor moving no version (a ``_foreach_*_`` op's, as
    FSDP2's optimizer step runs them on DTensors): a check that judged it finite before that write
    must not take that for what the next op reads. The dispatch mode did, and named that op the
    origin (found on FSDP2's optimizer step, 2026-11-30). The ``_foreach`` op returns nothing: what
    it writes is its output, read through the inner tensor, and it is the origin."""
    thin = Wrapped(torch.ones(2))
    with torchdebug.dump(tmp_path, task="overflow_check", overflow_nums=-1):
        thin.sum()  # judged finite
        torch._foreach_div_([thin], 0.0)  # the Inf
        assert thin._inner._version == 0
        thin.mul(2)  # given
    records = torchdebug.load(tmp_path).ranks[0].records()
    assert {r.call_name for r in records} == {"forward/-/aten._foreach_div_.Scalar#0"}
    assert next(r for r in records if r.io == "output").stats["posinf"] == 2


# -- DTensor and FSDP2 on two gloo ranks ----------------------------------------------------------


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


def _fsdp_steps(rank: int, debugger: torchdebug.Debugger | None) -> dict[str, torch.Tensor]:
    """Two FSDP2 training steps of a fresh seeded model (under ``debugger`` if given): the last loss
    and the full parameters."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(), _Block(), torch.nn.Linear(8, 4))
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        if debugger:
            debugger.start(model)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if debugger:
            debugger.step()
    if debugger:
        debugger.close()
    return {"loss": loss.detach(), **{name: param.full_tensor() for name, param in model.named_parameters()}}


def _fsdp_worker(rank: int, dump_path: str, out_path: str) -> None:
    results = {
        captured: _fsdp_steps(rank, torchdebug.Debugger(dump_path, task="statistics") if captured else None)
        for captured in (False, True)
    }
    if rank == 0:
        torch.save(results, out_path)


@pytest.mark.slow
def test_an_fsdp2_training_step_is_captured_bit_identically_with_local_statistics(tmp_path):
    out = tmp_path / "out.pt"
    gloo.spawn(_fsdp_worker, tmp_path, str(tmp_path / "dump"), str(out))  # the same ranks run without and with capture
    results = torch.load(out)
    for name, value in results[False].items():
        assert torch.equal(results[True][name], value), name
    run = torchdebug.load(tmp_path / "dump")
    assert sorted(run.ranks) == [0, 1] and not run.partial_ranks
    for rank, dump in run.ranks.items():
        records = dump.records()
        sharded = [r for r in records if r.extra.get("subclass") == "DTensor"]
        assert sharded, "the optimizer's sharded parameters are DTensors"
        assert all(r.extra["mesh_coordinate"] == [rank] and r.extra["placements"] == ["S(0)"] for r in sharded)
        assert all(r.capture_error is None and r.stats is not None for r in sharded)
        assert any(r.shape != r.extra["local_shape"] for r in sharded)
