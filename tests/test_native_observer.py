"""The native op observer records the ops a dispatch mode sees, op for op, with their tensors."""

from __future__ import annotations

import ctypes
import difflib
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from examples.gpt import GPT, GPTConfig, make_batch, train_step
from torchdebug.checksum import cpu_fingerprint
from torchdebug.native import build
from torchdebug.native.fused_stats import fused_stats, stats_and_fingerprint
from torchdebug.native.observer import MODULE_ROWS, SUBCLASS, NativeObserver, ObservedOps, _line, load_observer
from torchdebug.slots import iter_slots
from torchdebug.stats._schema import WIDTH

pytestmark = pytest.mark.skipif(build._cxx_compiler() is None, reason="no C++ compiler to build the observer")


@pytest.fixture
def observer() -> NativeObserver:
    """The process's observer, with what a Debugger run before (another test file) may have left set
    turned off: fingerprints change how the callback sums a tensor (in memory order); sweeps make
    slots name tensors by keys, not by ``_cdata`` alone, once one let go of an address."""
    loaded = load_observer()
    assert loaded is not None, "a C++ compiler is here: the observer must build"
    loaded.use_fingerprints(False)
    loaded.keep_unsummed(False)
    loaded.sweep_after(-1)
    loaded.forget_seen()
    return loaded


class _Seen(TorchDispatchMode):
    """What a dispatch mode sees of each op: name, backward, the node's sequence number (backward ops)
    or that of the node the op made (forward ops), the module context, and its tensors."""

    def __init__(self, context: list[int]) -> None:
        super().__init__()
        self.context = context
        self.rows: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        node = torch._C._current_autograd_node()
        inputs = _tensors(iter_slots(args, kwargs))
        out = func(*args, **kwargs)
        seq = node._sequence_nr() if node is not None else torch._C._autograd._get_sequence_nr() - 1
        outputs = _tensors(iter_slots(out if isinstance(out, (tuple, list)) else (out,)))
        if func.namespace != "profiler":  # record_function's bookkeeping: capture skips it too
            self.rows.append((str(func), node is not None, seq, self.context[-1], inputs, outputs))
        return out


def _tensors(slots) -> list[tuple[tuple[int, ...], torch.dtype]]:  # noqa: ANN001
    return [(tuple(value.shape), value.dtype) for _, value in slots if isinstance(value, torch.Tensor)]


def _rows(observer: NativeObserver, ops: ObservedOps) -> list[tuple]:
    """The observer's rows in the form of :class:`_Seen`'s (the sequence number left out)."""
    shapes = ops.slot_shapes()
    rows = [[name, bool(ops.backward[i]), ops.module[i], [], []] for i, name in enumerate(ops.op_names())]
    for slot, row in enumerate(ops.slot_row):
        rows[row - ops.first_row][3 + ops.slot_io[slot]].append((shapes[slot], observer.dtypes[ops.slot_dtype[slot]]))
    return [tuple(row) for row in rows]


class _Small(nn.Module):
    """Linear, GELU, in-place ops on an activation, Linear: a model whose backward a dispatch mode
    does not change (no saved outputs, no gradient summed from two uses)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.second = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.first(x))
        h.mul_(2.0).add_(1.0)
        return self.second(h).sum()


def _with_context(model: nn.Module, set_context) -> list:  # noqa: ANN001
    """Hooks that set each submodule's index as the context while it runs, -1 outside."""
    handles = []
    for index, module in enumerate(model.children()):
        handles.append(module.register_forward_pre_hook(lambda *_, index=index: set_context(index)))
        handles.append(module.register_forward_hook(lambda *_: set_context(-1)))
    return handles


def _small_step(model: nn.Module) -> None:
    model(torch.ones(3, 8, device=model.first.weight.device)).backward()
    model.zero_grad(set_to_none=True)


_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
"""On CUDA the backward runs on the engine's device thread: the observer follows it there."""


@pytest.mark.parametrize("device", _DEVICES)
def test_the_observer_records_the_ops_a_dispatch_mode_sees_forward_backward_and_in_place(
    observer: NativeObserver, device: str
) -> None:
    torch.manual_seed(0)
    model = _Small().to(device)
    context = [-1]
    handles = _with_context(model, lambda index: context.append(index))
    with _Seen(context) as seen:
        _small_step(model)
    for handle in handles:
        handle.remove()
    _with_context(model, observer.set_module)
    observer.set_module(-1)
    observer.start()
    _small_step(model)
    observer.stop()
    got = _rows(observer, observer.drain())
    want = [(name, backward, module, inputs, outputs) for name, backward, _, module, inputs, outputs in seen.rows]
    assert [row[0] for row in got] == [row[0] for row in want]
    assert {"aten.addmm.default", "aten.mul_.Tensor", "aten.add_.Tensor", "aten.gelu_backward.default"} <= {r[0] for r in got}
    forward = [row for row in got if not row[1]]
    assert got == want
    assert {row[2] for row in forward} == {-1, 0, 1}
    assert any(row[1] for row in got)


_NO_NODE = 2**63 - 1
"""Python's view of an ``AccumulateGrad`` node's sequence number (``UINT64_MAX``); native rows say -1."""


def test_a_backward_op_links_to_the_forward_op_that_made_its_node(observer: NativeObserver) -> None:
    torch.manual_seed(0)
    model = _Small()
    with _Seen([-1]) as seen:
        _small_step(model)
    observer.start()
    _small_step(model)
    observer.stop()
    ops = observer.drain()
    names, backward, seq = ops.op_names(), ops.backward, ops.seq
    made = {seq[row]: names[row] for row in range(len(names)) if not backward[row]}  # the last op with a number made it
    expected = {}
    for name, in_backward, number, *_ in seen.rows:
        if not in_backward:
            expected.setdefault(number, name)  # the op that ran first once the node existed
    links = [(names[row], made.get(seq[row])) for row in range(len(names)) if backward[row] and seq[row] >= 0]
    want = [(name, expected.get(number)) for name, in_backward, number, *_ in seen.rows if in_backward and number < _NO_NODE]
    assert links == want
    assert ("aten.gelu_backward.default", "aten.gelu.default") in links
    assert ("aten.mm.default", "aten.addmm.default") in links


_MODE_ONLY = {
    ("delete", ("aten.detach.default",), ()),
    ("replace", ("aten.view.default",), ("aten._reshape_alias.default",)),
    ("replace", ("aten.add.Tensor",), ("aten.add_.Tensor",)),
}
"""What a dispatch mode changes in what torch runs: autograd saves an op's output (softmax) through
``detach`` and unpacks it through another; ``reshape`` (forward and backward) takes ``view`` where it takes
``_reshape_alias`` without a mode; gradients summed in the engine's input buffer are added out of
place (``isTensorSubclassLike`` is true for every tensor while a mode is on)."""


def test_on_a_training_step_the_ops_differ_from_a_dispatch_modes_only_where_the_mode_changes_them(
    observer: NativeObserver,
) -> None:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(config, batch=2)
    train_step(model, optimizer, batch)
    with _Seen([-1]) as seen:
        train_step(model, optimizer, batch)
    observer.start()
    train_step(model, optimizer, batch)
    observer.stop()
    got = [name for name, *_ in _rows(observer, observer.drain())]
    want = [name for name, *_ in seen.rows]
    differences = set()
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, want, got, autojunk=False).get_opcodes():
        if tag == "delete":
            differences |= {(tag, (name,), ()) for name in want[a0:a1]}
        elif tag == "replace" and a1 - a0 == b1 - b0:
            differences |= {(tag, (old,), (new,)) for old, new in zip(want[a0:a1], got[b0:b1])}
        elif tag != "equal":
            differences.add((tag, tuple(want[a0:a1]), tuple(got[b0:b1])))
    assert differences <= _MODE_ONLY
    assert len(got) > 500 and "aten.addcdiv_.default" in got  # the optimizer's ops are there


def test_value_ids_are_the_tensors_impl_and_a_subclass_is_flagged_not_read(observer: NativeObserver) -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    weight = torch.randn(4, 4)
    pair = TwoTensor(torch.ones(2), torch.ones(2))
    observer.start()
    weight.t()
    pair.sin()
    observer.stop()
    ops = observer.drain()
    assert ops.op_names() == ["aten.t.default", "aten.sin.default"]  # TwoTensor's own ops run inside: hidden
    first_input = [slot for slot, row in enumerate(ops.slot_row) if row == ops.first_row and ops.slot_io[slot] == 0]
    assert [ops.slot_value[slot] for slot in first_input] == [weight._cdata]
    subclass_slots = [slot for slot, row in enumerate(ops.slot_row) if row == ops.first_row + 1]
    assert [ops.slot_flag[slot] for slot in subclass_slots] == [SUBCLASS, SUBCLASS]
    assert [ops.slot_ndim[slot] for slot in subclass_slots] == [0, 0]


def test_a_recorded_tensors_address_is_no_other_tensors_until_a_drain_reports_it_freed(observer: NativeObserver) -> None:
    """A freed tensor's ``TensorImpl`` address is the next one of its size (the allocator reuses it),
    and its ``StorageImpl``'s too; the observer holds every recorded one weakly, so an address names
    one tensor (one storage) from its first slot until the drain after its free, which lists it in
    ``freed`` (value ids and unwritten storages by address rely on it)."""
    observer.forget_seen()
    x = torch.randn(4)
    observer.start()
    x.neg()
    observer.stop()
    address, storage = x._cdata, x.untyped_storage()._cdata
    assert address in set(observer.drain().slot_value) and address not in observer.drain().freed  # held, alive
    del x
    others = [torch.randn(4) for _ in range(8)]  # without the hold the first of them takes x's addresses
    assert address not in {other._cdata for other in others}
    assert storage not in {other.untyped_storage()._cdata for other in others}
    assert sorted(observer.drain().freed) == sorted([address, storage])
    assert list(observer.drain().freed) == []  # reported once; the addresses are free to take again
    observer.forget_seen()


def _negations(observer: NativeObserver, count: int, survivors: list[torch.Tensor]) -> tuple[ObservedOps, tuple[int, int]]:
    """A chain of ``count`` negations recorded, each output freeing the one before but every fourth,
    which goes into ``survivors``: the drain, and what the observer held before it (``NativeObserver.held``)."""
    x = torch.randn(64)
    observer.start()
    for link in range(count):
        x = x.neg()
        if link % 4 == 3:
            survivors.append(x)
    held = observer.held()
    observer.stop()
    return observer.drain(), held


def test_a_sweep_lets_go_of_freed_tensors_and_another_takes_an_address_under_a_new_key(observer: NativeObserver) -> None:
    """With sweeps (``sweep_after``; 0: at every op) the observer lets go of a freed tensor at the next
    op, not at the drain: another tensor may take its address before the drain, and slots name it by
    another key (the address, and from bit 48 how often a sweep let it go); the drain lists the keys
    let go in ``freed``. At the drain the generations of the addresses nothing holds are forgotten:
    a new tensor's key is its address again; :meth:`~NativeObserver.keys` gives a live one's (what
    Python names FSDP2's unshard buffers by)."""
    (_, (held_to_the_drain, _)) = _negations(observer, 20, [])
    observer.forget_seen()
    observer.sweep_after(0)
    survivors: list[torch.Tensor] = []
    try:
        ops, (held, retired) = _negations(observer, 20, survivors)
    finally:
        observer.sweep_after(-1)
    assert held_to_the_drain >= 40  # each output's TensorImpl and StorageImpl, to the drain
    assert held <= 16 and retired >= 24  # the survivors', the live tensor's, the one before it: the others let go
    outputs = [ops.slot_value[slot] for slot in range(len(ops.slot_row)) if ops.slot_io[slot] == 1]
    assert len(set(outputs)) == 20  # one key a tensor
    addresses = {key & ((1 << 48) - 1) for key in outputs}
    assert len(addresses) < 20 and max(key >> 48 for key in outputs) > 0  # the allocator reused freed TensorImpls' memory
    alive = outputs[3::4]
    assert set(outputs) - set(alive) <= set(ops.freed) and not set(alive) & set(ops.freed)
    assert observer.keys([tensor._cdata for tensor in survivors]) == alive and max(key >> 48 for key in alive) > 0
    del survivors
    fresh = [torch.randn(64) for _ in range(8)]
    assert observer.keys([tensor._cdata for tensor in fresh]) == [tensor._cdata for tensor in fresh]
    observer.forget_seen()


def test_at_level_module_a_module_call_sweeps(observer: NativeObserver) -> None:
    """With no op observed (``MODULE_ROWS``, level module), a module call's row sweeps as an op
    would: the tensors of earlier calls freed since are let go, each slot keyed as at an op."""
    observer.sweep_after(0)
    try:
        observer.start(MODULE_ROWS)
        x = torch.randn(64)
        for _ in range(12):
            with torch.no_grad():  # (no op recorded at this level)
                x = x * 2
            observer.module_row([x])
        held, retired = observer.held()
        observer.stop()
        ops = observer.drain()
    finally:
        observer.sweep_after(-1)
    assert held <= 6 and retired >= 18
    assert len(set(ops.slot_value)) == 12
    observer.forget_seen()


def test_native_code_disabled_gives_no_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.DISABLE_ENV, "0")
    assert build.load_torch_library.__wrapped__("observer") is None


class _SeenSums(TorchDispatchMode):
    """The sums ``fused_stats`` gives each tensor a dispatch mode sees (inputs before the op runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: list[list[float] | None] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        self.sums += [fused_stats(value) for _, value in iter_slots(args, kwargs) if isinstance(value, torch.Tensor)]
        out = func(*args, **kwargs)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        self.sums += [fused_stats(value) for _, value in iter_slots(outputs) if isinstance(value, torch.Tensor)]
        return out


def test_the_statistics_of_cpu_tensors_are_fused_stats_bit_for_bit(observer: NativeObserver) -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    row = torch.randn(5, dtype=torch.float64)
    half = torch.randn(3, 4, dtype=torch.bfloat16)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.5])
    big = torch.randn(300_000)  # split over torch's threads where it has several

    def ops(big: torch.Tensor) -> None:
        x.t().sin()  # a transposed input
        row.expand(4, 5).cos()  # a broadcast one
        x[:, 1:].exp()  # a slice
        half.mul(3)
        special.abs()
        big.add_(1.0)  # in place: its input is taken before the op
        torch.arange(4).add(1)  # integers: summed too
        (row > 0).logical_not()  # bool
        torch.ones(3, dtype=torch.float16).neg()  # float16: no sums

    copy = big.clone()
    with _SeenSums() as seen:
        ops(big)
    assert observer.use_stats()
    observer.start()
    ops(copy)
    observer.stop()
    ops_ = observer.drain()
    got = [
        ops_.stats[slot * WIDTH : (slot + 1) * WIDTH].tobytes() if ops_.slot_has_stats[slot] else None
        for slot in range(len(ops_.slot_row))
    ]
    want = [struct.pack(f"{WIDTH}d", *sums) if sums is not None else None for sums in seen.sums]
    assert got == want
    assert sum(value is not None for value in got) == 25  # all but float16, the view ops included


class _SeenValues(TorchDispatchMode):
    """What ``read`` gives of each tensor a dispatch mode sees (inputs before the op runs)."""

    def __init__(self, read: Callable[[torch.Tensor], object]) -> None:
        super().__init__()
        self.read = read
        self.values: list[object] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        self.values += [self.read(value) for _, value in iter_slots(args, kwargs) if isinstance(value, torch.Tensor)]
        out = func(*args, **kwargs)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        self.values += [self.read(value) for _, value in iter_slots(outputs) if isinstance(value, torch.Tensor)]
        return out


def _fingerprinted_ops(big: torch.Tensor) -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    x.t().sin()  # a transposed input: the fingerprint follows the logical order, the walk the memory's
    x.t().reshape(5, 6, 1).permute(2, 1, 0).cos()  # dims that continue in memory but not in that order
    torch.randn(5, dtype=torch.float64).expand(4, 5).exp()  # a broadcast one
    torch.randn(3, 4, dtype=torch.bfloat16)[:, 1:].mul(3)  # a slice
    big.add_(1.0)  # in place: its input is taken before the op
    torch.arange(12).view(3, 4).t().add(1)  # integers
    torch.ones(3, dtype=torch.bool).logical_not()
    torch.randn(4, dtype=torch.complex64).mul(2)


@pytest.mark.parametrize("statistics", [True, False], ids=["with statistics", "alone"])
def test_the_fingerprints_of_cpu_tensors_are_those_of_the_statistics_pass_or_the_hash_alone(
    observer: NativeObserver, statistics: bool
) -> None:
    """With statistics, float32, bfloat16 and float64 tensors get their sums and fingerprint in one
    pass, bit for bit as ``stats_and_fingerprint`` (the dispatch mode's ``checksum=True``) takes them;
    every other dtype of up to 8 bytes gets its fingerprint alone (its statistics are taken at the drain)."""

    def read(tensor: torch.Tensor) -> tuple:
        both = stats_and_fingerprint(tensor) if statistics else None
        return both or (None, cpu_fingerprint(tensor))

    big = torch.randn(300_000)  # split over torch's threads where it has several
    copy = big.clone()
    with _SeenValues(read) as seen:
        _fingerprinted_ops(big)
    assert observer.use_stats(statistics) and observer.use_fingerprints()
    try:
        observer.start()
        _fingerprinted_ops(copy)
        observer.stop()
    finally:
        observer.use_fingerprints(False)
        observer.use_stats(False)
    ops = observer.drain()
    got = [
        (
            ops.stats[slot * WIDTH : (slot + 1) * WIDTH].tolist() if ops.slot_has_stats[slot] else None,
            int(ops.slot_fingerprint[slot]) & 0xFFFFFFFFFFFFFFFF if ops.slot_has_fingerprint[slot] else None,
        )
        for slot in range(len(ops.slot_row))
    ]
    want = [tuple(value) if value is not None else (None, None) for value in seen.values]
    assert [repr(value) for value in got] == [repr(value) for value in want]
    dtypes = {observer.dtypes[code] for code, has in zip(ops.slot_dtype, ops.slot_has_fingerprint) if has}
    assert dtypes >= {torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool, torch.complex64}


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_composite_ops_are_seen_as_a_dispatch_mode_sees_them_without_grad_and_in_inference_mode(
    observer: NativeObserver, context: type
) -> None:
    """Under inference mode autograd's keys are excluded: composite ops (linear, layer_norm, reshape,
    narrow, matmul, chunk) reach the mode whole; under no_grad they still decompose above autograd."""
    model = _Small()

    def run() -> None:
        with context():
            x = torch.ones(3, 8)
            model(x)
            nn.functional.layer_norm(x, (8,))
            x.reshape(24).narrow(0, 2, 5).contiguous()
            torch.matmul(x, x.t())
            x.chunk(2, 1)

    with _Seen([-1]) as seen:
        run()
    observer.start()
    run()
    observer.stop()
    got = observer.drain().op_names()
    assert got == [name for name, *_ in seen.rows]
    assert ("aten.linear.default" in got) == (context is torch.inference_mode)


def test_an_op_an_autograd_kernel_runs_before_its_redispatch_comes_first_as_a_dispatch_mode_sees_it(
    observer: NativeObserver,
) -> None:
    """An in-place op whose backward needs the value it overwrites saves ``self.clone()`` in its
    autograd kernel, before it goes below autograd: the clone's row comes before the op's."""
    weight = torch.randn(3, requires_grad=True)
    x = torch.randn(3, requires_grad=True)

    def run() -> None:
        product = x * 1
        product.mul_(weight)
        quotient = x * 2
        quotient.div_(weight)

    with _Seen([-1]) as seen:
        run()
    observer.start()
    run()
    observer.stop()
    got = observer.drain().op_names()
    assert got == [name for name, *_ in seen.rows]
    assert got[1:3] == ["aten.clone.default", "aten.mul_.Tensor"]


def test_ops_no_dispatch_mode_sees_are_not_recorded_a_tensor_from_data_and_a_live_detach_(observer: NativeObserver) -> None:
    """``torch.tensor(data)`` builds its tensor with the Python key excluded (``empty``, ``to``,
    ``detach_``: only ``lift_fresh`` reaches a mode); a live ``detach_`` never leaves its autograd
    kernel (under inference mode it reaches its kernel, and a mode sees it)."""

    def run() -> None:
        torch.tensor([1.0, 2.0])
        torch.ones(2, requires_grad=True).mul(2).detach_()
        with torch.inference_mode():
            torch.ones(2).detach_()

    with _Seen([-1]) as seen:
        run()
    observer.start()
    run()
    observer.stop()
    got = [row[0] for row in _rows(observer, observer.drain())]
    assert got == [row[0] for row in seen.rows]
    assert got.count("aten.detach_.default") == 1 and "aten.lift_fresh.default" in got


def test_tensors_without_sums_are_kept_and_a_factorys_result_keeps_its_impl(observer: NativeObserver) -> None:
    """Kept for Python: a float16 tensor (an input at once, an output from the next op on, weakly until
    then: a factory's binding wraps its result itself only while nothing else holds it); an output
    freed before the next op is not kept (slot -1)."""
    observer.use_stats(True)
    observer.keep_unsummed(True)
    try:
        linear = nn.Linear(16, 4, dtype=torch.float16)
        observer.start()
        positions = torch.ones(16, dtype=torch.float16)
        linear(positions)
        torch.ones(3, dtype=torch.float16)  # freed at once
        positions.add(1)
        observer.stop()
    finally:
        observer.keep_unsummed(False)
        observer.use_stats(False)
    ops = observer.drain()
    assert ops.slot_value[0] == positions._cdata  # arange's output is the tensor Python holds
    kept = [slot for slot in ops.kept_slot if slot >= 0]
    assert -1 in ops.kept_slot
    assert [ops.slot_value[slot] for slot in kept[:2]] == [positions._cdata, positions._cdata]
    assert all(tensor.dtype == torch.float16 for tensor in ops.kept) and len(ops.kept) == len(kept)
    assert not any(ops.slot_has_stats[slot] for slot in kept)


def _called_here(observer: NativeObserver) -> None:
    torch.ones(2).add(1)


def test_a_forward_ops_stack_is_its_python_frames_innermost_first_and_a_backward_op_has_none(
    observer: NativeObserver,
) -> None:
    observer.want_stacks(True)
    try:
        observer.start()
        _called_here(observer)
        torch.ones(2, requires_grad=True).sum().backward()
        observer.stop()
    finally:
        observer.want_stacks(False)
    ops = observer.drain()
    stacks = observer.stacks()
    names = ops.op_names()
    add = stacks[ops.stack[names.index("aten.add.Tensor")]]
    line = _called_here.__code__.co_firstlineno + 1
    assert add[0] == (__file__, line, "_called_here")
    assert add[1][0] == __file__ and add[1][2].startswith("test_a_forward_ops_stack")
    assert all(ops.stack[row] < 0 for row in range(len(names)) if ops.backward[row])
    assert all(ops.stack[row] >= 0 for row in range(len(names)) if not ops.backward[row])


def _two_call_sites(observer: NativeObserver) -> None:
    for _ in range(2):  # one call site twice: one stack
        torch.ones(2).mul(2)
    torch.ones(2).sub(1)  # another line


@pytest.mark.parametrize("lines", [False, True], ids=["offsets", "lines (Python 3.10)"])
def test_a_call_site_has_one_stack_id_across_drains_with_the_frames_lines(observer: NativeObserver, lines: bool) -> None:
    """Stacks are interned as they are taken: the same frames give the same id in every drain, and
    each stack is symbolized once, to the lines the frames were at, whether the frames tell their
    last instruction's offset (Python 3.11 on) or their line (3.10)."""
    observer.want_stacks(True)
    observer.take_lines(lines)
    try:
        drains = []
        for _ in range(2):
            observer.start()
            _two_call_sites(observer)
            observer.stop()
            drains.append(observer.drain())
    finally:
        observer.want_stacks(False)
        observer.take_lines(False)
    stacks = observer.stacks()
    first = _two_call_sites.__code__.co_firstlineno
    for ops in drains:
        names = ops.op_names()
        ids = {
            name: {ops.stack[row] for row in range(len(names)) if names[row] == name}
            for name in ("aten.mul.Tensor", "aten.sub.Tensor")
        }
        assert all(len(found) == 1 for found in ids.values()), ids
        (mul,), (sub,) = ids["aten.mul.Tensor"], ids["aten.sub.Tensor"]
        assert stacks[mul][0] == (__file__, first + 2, "_two_call_sites")
        assert stacks[sub][0] == (__file__, first + 3, "_two_call_sites")
        assert (
            stacks[mul][1][0] == __file__
            and stacks[mul][1][2] == "test_a_call_site_has_one_stack_id_across_drains_with_the_frames_lines"
        )
    assert [ops.stack[ops.op_names().index("aten.sub.Tensor")] for ops in drains] == [sub, sub]


_EXECUTED = compile("torch.ones(2).neg()", "<executed>", "exec")  # (compiled once: one code object)


def _ops_in_many_frames() -> None:
    def nested(depth: int) -> torch.Tensor:
        return torch.ones(2).add(1) if depth == 0 else nested(depth - 1)

    def generator() -> Iterator[torch.Tensor]:
        yield torch.ones(2).mul(2)

    class Equal:
        def __eq__(self, other: object) -> bool:
            torch.ones(2).sub(1)
            return True

    nested(3)
    nested(100)  # deeper than the room the walk starts with: taken again with room for all
    list(generator())
    list(map(lambda _: torch.ones(2).div(2), [0]))  # called by C code: the C stack's shim frame left out (3.12 on)
    assert Equal() == Equal()
    exec(_EXECUTED, {"torch": torch})


def _frames_read_directly() -> bool:
    library = build.load_python_library("py_frames")
    return library is not None and bool(library.td_frames_supported())


@pytest.mark.skipif(not _frames_read_directly(), reason="this Python's frames are read through its C API only")
def test_frames_read_directly_are_the_stacks_pythons_c_api_gives(observer: NativeObserver) -> None:
    """Read from the interpreter's structures without the GIL (py_frames.c) or through
    ``PyEval_GetFrame`` and ``PyFrame_GetBack``, the frames of ops called from nested calls (one
    stack deeper than the walk's first room), a generator, a lambda that C code calls, a slot method
    and exec'd code make the same stacks: the same ids, the second way interning none."""
    observer.want_stacks(True)
    drains, counts = [], []
    try:
        for direct in (True, False):
            assert observer.read_frames_directly(direct) == direct
            observer.start()
            _ops_in_many_frames()
            observer.stop()
            drains.append(observer.drain())
            counts.append(len(observer.stacks()))
    finally:
        observer.want_stacks(False)
        observer.read_frames_directly()
    direct, api = drains
    assert direct.op_names() == api.op_names() and list(direct.stack) == list(api.stack)
    assert counts[0] == counts[1]
    names, stacks = direct.op_names(), observer.stacks()
    add = stacks[direct.stack[names.index("aten.add.Tensor")]]
    assert [function for _, _, function in add[:5]] == ["nested"] * 4 + ["_ops_in_many_frames"]
    div = stacks[direct.stack[names.index("aten.div.Tensor")]]
    assert [function for _, _, function in div[:2]] == ["<lambda>", "_ops_in_many_frames"]


@pytest.mark.skipif(not _frames_read_directly(), reason="this Python's frames are read through its C API only")
def test_py_frames_takes_the_code_and_last_instruction_of_each_frame_python_sees() -> None:
    """``td_frames_take``: each frame's code object and last instruction's offset, innermost first,
    as ``sys._getframe`` walks them (the innermost at its own instruction), whatever the room given."""
    library = build.load_python_library("py_frames")
    library.td_frames_take.restype = ctypes.c_int64
    library.td_frames_take.argtypes = [ctypes.c_void_p, ctypes.c_int64]

    def taken(room: int) -> tuple[int, list[tuple[int, int]], list[tuple[int, int]]]:
        words = (ctypes.c_int64 * (2 * room))()
        count = library.td_frames_take(words, room)
        frame, seen = sys._getframe(), []
        while frame is not None:
            seen.append((id(frame.f_code), frame.f_lasti))
            frame = frame.f_back
        return count, [(words[2 * at], words[2 * at + 1]) for at in range(min(count, room))], seen

    def nested(depth: int, room: int) -> tuple[int, list[tuple[int, int]], list[tuple[int, int]]]:
        return taken(room) if depth == 0 else nested(depth - 1, room)

    for room in (64, 3):
        count, words, seen = nested(4, room)
        assert count == len(seen) and len(words) == min(count, room)
        assert [code for code, _ in words] == [code for code, _ in seen[: len(words)]]
        assert words[1:] == seen[1 : len(words)]  # (the innermost frame has moved on since)


def _branchy(x: int) -> int:
    if x > 3:  # lines with several ranges of instructions, and instructions with no line
        for _ in range(x):
            x -= 1
    return x


@pytest.mark.parametrize("code", [_branchy.__code__, torch.nn.Module._call_impl.__code__], ids=["branches", "torch"])
def test_an_instructions_line_is_the_one_its_codes_line_table_gives(code) -> None:
    """``PyCode_Addr2Line``'s answer at every offset: the first line before the code, -1 past it."""
    for offset in range(len(code.co_code) + 4):
        line = next((line for start, end, line in code.co_lines() if start <= offset < end), None)
        assert _line(code, offset) == (-1 if line is None else line), offset
    assert _line(code, -1) == code.co_firstlineno


_SYMBOLIZE_IN_A_FRESH_PROCESS = """
import sys, torch
from torchdebug.native.observer import load_observer
observer = load_observer()
observer.want_stacks(True)
observer.start()
torch.ones(2).add(1)
observer.stop()
ops = observer.drain()
assert observer.stacks()[ops.stack[0]], "a stack was taken"
print(sorted(name for name in ("torch._dynamo", "torch._inductor") if name in sys.modules))
"""


def test_symbolizing_stacks_loads_neither_dynamo_nor_inductor() -> None:
    """Inductor's generated code maps to source lines only where its code cache is loaded; asking
    ``torch`` for ``_inductor`` (as torch's own symbolize does) would import it, and Dynamo, seconds
    into a user's first flush."""
    run = subprocess.run([sys.executable, "-c", _SYMBOLIZE_IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_a_frame_of_generated_code_is_followed_by_the_source_frames_inductor_maps_it_to(
    observer: NativeObserver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where inductor's code cache is loaded, a frame of code it generated is followed by the frames
    of the source it was generated from (what its ``PyCodeCache`` says), as torch's symbolize gives them."""
    from torch._inductor import codecache

    generated = str(tmp_path / "generated_kernel.py")  # a name only: the code is compiled from a string
    asked = []

    def source_frames(filename: str, line: int) -> list[dict] | None:
        asked.append((filename, line))
        return [{"filename": "model.py", "line": 7, "name": "forward"}] if filename == generated else None

    monkeypatch.setattr(codecache.PyCodeCache, "stack_frames_for_code", staticmethod(source_frames))
    namespace: dict = {}
    exec(compile("def call(x):\n    return x.add(1)\n", generated, "exec"), namespace)
    observer.want_stacks(True)
    try:
        observer.start()
        namespace["call"](torch.ones(2))
        observer.stop()
        ops = observer.drain()
    finally:
        observer.want_stacks(False)
    stack = observer.stacks()[ops.stack[ops.op_names().index("aten.add.Tensor")]]
    assert stack[:2] == [(generated, 2, "call"), ("model.py", 7, "forward")]
    assert (generated, 2) in asked


def test_ops_under_dynamos_fake_mode_are_not_recorded_and_a_later_modes_handler_calls_are(observer: NativeObserver) -> None:
    """Dynamo traces with FakeTensorMode (a capture mode that ignores compile internals lets it
    through): the first call of a compiled function records what later calls record. Under a mode
    entered after the observer started, the calls its handler makes are recorded, as a capture mode
    below it sees them."""

    @torch.compile(backend="eager")
    def compiled(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin().sum()

    x = torch.randn(4, requires_grad=True)
    names = []
    for _ in range(2):
        x.grad = None
        observer.start()
        compiled(x).backward()
        with _Seen([-1]):
            torch.ones(1).add(1)
        observer.stop()
        ops = observer.drain()
        assert not any(ops.slot_flag)
        names.append(ops.op_names())
    assert names[0] == names[1] and "aten.sin.default" in names[0] and names[0][-2:] == ["aten.ones.default", "aten.add.Tensor"]


def test_a_kept_tensor_changed_in_place_before_the_drain_is_not_handed_over(observer: NativeObserver) -> None:
    """Its values are not those recorded: slot -1, as for an output freed before it was held."""
    observer.use_stats(True)
    observer.keep_unsummed(True)
    try:
        counts = torch.arange(4, dtype=torch.float16)
        observer.start()
        negated = counts.neg()
        observer.stop()
        counts.add_(1)  # between the op and the drain: the kept input's version moved
        ops = observer.drain()
    finally:
        observer.keep_unsummed(False)
        observer.use_stats(False)
    assert ops.slot_value[0] == counts._cdata and list(ops.kept_slot) == [-1, 1] and len(ops.kept) == 1
    kept = ops.kept[0]  # an alias of the output (its memory, a TensorImpl and version counter of its own)
    assert kept._cdata != negated._cdata and kept.data_ptr() == negated.data_ptr() and torch.equal(kept, negated)


def test_a_views_base_seen_only_through_it_is_held_and_reported_freed(observer: NativeObserver) -> None:
    """The base's address names it (``slot_base``) until the drain after its free, like a slot's."""
    observer.forget_seen()
    base = torch.randn(4, 4, requires_grad=True).clone()
    view = base[1:]
    observer.start()
    view.neg()
    observer.stop()
    address = base._cdata
    ops = observer.drain()
    assert ops.slot_base[0] == address and address not in set(ops.slot_value)
    del base, view
    assert address in set(observer.drain().freed)
    observer.forget_seen()
