"""task="overflow_check": only the op calls that make a NaN/Inf are recorded, and the first is named."""

import inspect
import logging

import pytest
import torch

import torchdebug
from tests.capture.native_compare import on_the_dispatch_mode
from torchdebug import stats_table
from torchdebug.capture import overflow_check
from torchdebug.capture.native_capture import why_not_native
from torchdebug.cli import main
from torchdebug.config import DebuggerConfig
from torchdebug.native import build
from torchdebug.nonfinite import find_origin


@pytest.fixture(autouse=True, params=["native", "dispatch mode"])
def path(request, monkeypatch):
    """Every check runs on both capture paths: the observer's judgment (``native_overflow.py``) and
    the dispatch mode's (``overflow_check.py``)."""
    monkeypatch.delenv("TORCHDEBUG_NATIVE", raising=False)
    if request.param == "dispatch mode":
        on_the_dispatch_mode(monkeypatch)
    elif build._cxx_compiler() is None or torch.accelerator.is_available():
        pytest.skip("the native path needs a C++ compiler; beside an accelerator the dispatch mode checks (DEVICE_STATISTICS)")
    else:  # (a config the native path stopped taking would run both params on the mode)
        assert why_not_native(DebuggerConfig(task="overflow_check"), None) is None
    return request.param


@pytest.fixture(params=["at once", "at flush"])
def resolution(request, monkeypatch, path):
    """The dispatch mode's CPU results resolve at once; "at flush" makes them wait for the flush as on
    an accelerator, so the pending-call path (held tensors, copy on write, windows) runs on the CPU
    too. The native path judges each call as it ends: it has no pending call."""
    if request.param == "at flush":
        if path == "native":
            pytest.skip("the native path has no pending call")
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    return request.param


def _records(tmp_path, fn, model=None, **options):
    with torchdebug.dump(tmp_path, model=model, task="overflow_check", **options):
        fn()
    return torchdebug.load(tmp_path).ranks[0].records()


def _calls(records):
    return list(dict.fromkeys(r.call_name for r in records))


def _line_of(function, text):
    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, line in enumerate(lines) if text in line)


class Planted(torch.nn.Module):
    """A linear layer whose forward overflows (``inf_weight``: a finite scale too large for float32)
    or a square root of zeros, finite in forward, whose gradient is Inf (``backward_only``)."""

    def __init__(self, *, inf_weight: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.inf_weight = inf_weight
        self.register_buffer("scale", torch.tensor([1.0, 3e38, 1.0]))

    def forward(self, x):
        h = self.fc(x)
        if self.inf_weight:
            h = (h.abs() + 2.0) * self.scale  # planted forward Inf: 2 * 3e38 overflows float32
        return torch.sqrt(h * 0.0).sum()  # finite forward, Inf gradient


def test_a_forward_inf_is_the_first_overflow_with_its_module_and_source_line(tmp_path, resolution):
    torch.manual_seed(0)
    model = Planted(inf_weight=True)
    records = _records(tmp_path, lambda: model(torch.randn(2, 3)).backward(), model=model)
    origin = find_origin(records)
    first = origin.record
    assert first.call_name == "forward/<root>/aten.mul.Tensor#0" and first.phase == "forward"
    assert first.source.endswith(f":{_line_of(Planted.forward, 'planted forward Inf')} in forward")
    assert first.stats["posinf"] + first.stats["neginf"] > 0
    assert all(r.tensor for r in records if r.call_name == first.call_name and r.kind == "tensor")
    assert "forward/<root>/aten.mul.Tensor#0" in str(origin) and "made 0 NaN" in str(origin)


def test_a_backward_only_inf_is_named_in_backward_with_the_forward_line(tmp_path, resolution, caplog):
    torch.manual_seed(0)
    model = Planted()
    with caplog.at_level(logging.WARNING, "torchdebug.capture.overflow_check"):
        records = _records(tmp_path, lambda: model(torch.randn(2, 3)).backward(), model=model)
    assert not [r for r in records if r.phase == "forward"]
    first = find_origin(records).record
    assert first.phase == "backward" and first.fwd == "forward/<root>/aten.sqrt.default#0"
    line = _line_of(Planted.forward, "Inf gradient")
    assert first.source.endswith(f":{line} in forward")
    message = caplog.records[0].getMessage()
    assert "first NaN/Inf" in message and "phase backward" in message and f"forward line {first.source}" in message


def test_only_calls_that_make_a_nan_or_inf_are_recorded_and_recording_stops_after_overflow_nums(tmp_path):
    def body():
        torch.ones(4).exp()  # finite: not recorded
        big = torch.full((4,), 3e38)
        (big * 2).mul(2).sub(3)  # the first mul overflows; the ops after it pass the Inf on
        torch.zeros(4).div(0.0)  # 0/0: a new NaN
        torch.zeros(4).log()  # log(0) = -inf

    records = _records(tmp_path / "two", body, overflow_nums=2)
    assert _calls(records) == ["forward/-/aten.mul.Tensor#0", "forward/-/aten.div.Tensor#0"]
    records = _records(tmp_path / "all", body, overflow_nums=-1)
    assert _calls(records) == ["forward/-/aten.mul.Tensor#0", "forward/-/aten.div.Tensor#0", "forward/-/aten.log.default#0"]


def test_overflow_nums_counts_over_the_whole_run(tmp_path):
    debugger = torchdebug.Debugger(tmp_path, task="overflow_check", overflow_nums=3)
    for _ in range(3):
        debugger.start()
        torch.zeros(2).div(0.0).add(1)  # div makes a NaN, add passes it on
        torch.zeros(2).log()
        debugger.step()
    debugger.close()
    records = torchdebug.load(tmp_path).ranks[0].records()
    assert [(r.step, r.call_name) for r in records if r.io == "output"] == [
        (0, "forward/-/aten.div.Tensor#0"),
        (0, "forward/-/aten.log.default#0"),
        (1, "forward/-/aten.div.Tensor#0"),
    ]


def test_a_nan_already_in_a_parameter_enters_at_the_first_op_that_reads_it(tmp_path, resolution, caplog):
    weight = torch.tensor([1.0, float("nan")])
    with caplog.at_level(logging.WARNING, "torchdebug.capture.overflow_check"):
        records = _records(tmp_path, lambda: weight.mul(2).add(1).sum(), overflow_nums=-1)
    assert _calls(records) == ["forward/-/aten.mul.Tensor#0"]  # add and sum pass it on
    origin = find_origin(records)
    assert origin.kind == "entry" and origin.record.io == "input" and origin.record.arg == "0"
    assert "1 NaN already in input.0" in str(origin)
    assert "passes on a NaN" in caplog.records[0].getMessage()


def test_given_infinities_are_not_origins_and_new_nans_made_from_them_are(tmp_path, resolution):
    def body():
        scores = torch.zeros(3, 3)
        mask = torch.ones(3, 3, dtype=torch.bool).tril()
        masked = scores.masked_fill(~mask, float("-inf"))  # given: not an origin
        masked.softmax(-1)  # -inf -> 0: nothing
        torch.full((2,), float("-inf")).exp()  # given, and exp(-inf) = 0
        torch.where(mask, scores, torch.finfo(torch.float32).min).to(torch.float16)  # limit cast to -inf: given
        scores.masked_fill(~mask, torch.finfo(torch.float32).min).to(torch.bfloat16).mul(2)  # rounds to -inf: given
        bias = torch.full((2,), float("-inf"))
        bias - bias  # -inf - -inf = NaN: new

    records = _records(tmp_path, body, overflow_nums=-1)
    assert _calls(records) == ["forward/-/aten.sub.Tensor#0"]


def test_a_product_or_a_cast_that_overflows_is_an_origin(tmp_path):
    def body():
        torch.ones(2, dtype=torch.float16).fill_(-65504.0).mul(2)  # the float16 limit, doubled: a limit given
        torch.ones(2, dtype=torch.float16) * 1e5  # a finite scalar, a product too large for float16
        torch.full((2,), 1e5).to(torch.float16)  # 1e5 does not fit float16: the cast makes the Inf

    calls = _calls(_records(tmp_path, body, overflow_nums=-1))
    assert calls == ["forward/-/aten.mul.Tensor#1", "forward/-/aten._to_copy.default#0"]


def test_inputs_of_an_in_place_op_are_the_values_before_it(tmp_path, resolution):
    def body():
        y = torch.full((3,), 1e38)
        y.mul_(10)

    records = _records(tmp_path, body)
    by_slot = {(r.io, r.arg): r for r in records}
    assert by_slot["input", "0"].stats["max"] == pytest.approx(1e38, rel=1e-6) and by_slot["input", "0"].stats["posinf"] == 0
    assert by_slot["output", "0"].stats["posinf"] == 3
    saved = torchdebug.load(tmp_path).ranks[0].load_tensor(by_slot["input", "0"])
    assert torch.equal(saved, torch.full((3,), 1e38))


def test_copies_that_fail_cost_the_saved_tensors_never_the_step(tmp_path, path):
    """Where a copy of a call's tensors fails (memory: the observer's seam makes every one fail), the
    call found is recorded with its statistics and no saved tensor, and the ops run on unchanged."""
    if path != "native":
        pytest.skip("the observer's copies")
    from torchdebug.native.observer import load_observer

    observer = load_observer()
    observer.overflow_copies_fail()
    try:

        def body():
            y = torch.full((3,), 1e38)
            y.mul_(10)  # the input copied as the call starts, the output as it ends: both fail
            assert torch.equal(y, torch.full((3,), float("inf")))
            torch.zeros(2).div(0.0)

        records = _records(tmp_path, body, overflow_nums=-1)
    finally:
        observer.overflow_copies_fail(False)
    assert _calls(records) == ["forward/-/aten.mul_.Tensor#0", "forward/-/aten.div.Tensor#0"]
    tensors = [r for r in records if r.kind == "tensor"]
    assert all(r.tensor is None for r in tensors) and all(r.stats is not None for r in tensors)


def test_a_pending_call_keeps_its_output_when_a_later_op_writes_into_it(tmp_path, resolution, monkeypatch):
    monkeypatch.setattr(overflow_check, "WINDOW_CALLS", 2)  # several windows in one step
    x = torch.ones(1, 2)
    w = torch.tensor([[-3e38, 1.0], [-3e38, 1.0]])

    def body():
        for _ in range(3):
            y = torch.mm(x, w)  # [-6e38 -> -inf, 2]: overflows in any summation order
            y.relu_()  # [0, 2]: writes into the pending mm's output
            y.add_(1)

    records = _records(tmp_path, body, overflow_nums=-1)
    dump = torchdebug.load(tmp_path).ranks[0]
    outputs = [r for r in records if r.op == "aten.mm.default" and r.io == "output"]
    assert len(outputs) == 3
    for record in outputs:
        assert record.stats["neginf"] == 1
        assert dump.load_tensor(record).tolist() == [[float("-inf"), 2.0]]
    assert not [r for r in records if r.op != "aten.mm.default"]


def test_the_optimizer_step_is_checked(tmp_path):
    param = torch.nn.Parameter(torch.full((2,), 1e38))
    param.grad = torch.full((2,), -1e38)
    optimizer = torch.optim.SGD([param], lr=10.0, foreach=False)
    records = _records(tmp_path, optimizer.step)
    first = find_origin(records).record
    assert first.phase == "optimizer" and first.op.startswith("aten.add_")
    _assert_written_in_place(records, "0")


def _assert_written_in_place(records: list, arg: str) -> None:
    """The input and output records of what an in-place call wrote name one tensor (the input's copy,
    taken before the call, stands for it as it was), the output at the version the write left."""
    written = {r.io: r for r in records if r.arg == arg and r.call_name == records[0].call_name}
    assert written["input"].value_id == written["output"].value_id
    assert written["output"].version == written["input"].version + 1


def test_a_foreach_optimizer_step_is_checked_through_what_it_writes(tmp_path):
    """An in-place ``_foreach_`` op returns nothing: what it writes is taken for its outputs
    (``output.0.<i>``, the list after the op), so the update that overflows is the origin."""
    params = [torch.nn.Parameter(torch.full((2,), 1e38)), torch.nn.Parameter(torch.ones(3))]
    for param in params:
        param.grad = torch.full_like(param, -1e38)
    optimizer = torch.optim.SGD(params, lr=10.0, foreach=True)
    records = _records(tmp_path, optimizer.step)
    first = find_origin(records).record
    assert first.phase == "optimizer" and first.op.startswith("aten._foreach_add_") and first.arg == "0.0"
    outputs = {r.arg: r.stats["posinf"] for r in records if r.io == "output"}
    assert outputs == {"0.0": 2, "0.1": 3}
    inputs = {r.arg: r.stats["max"] for r in records if r.io == "input" and r.arg.startswith("0.")}
    assert inputs == {"0.0": pytest.approx(1e38, rel=1e-6), "0.1": 1.0}  # the values before the update
    for arg in ("0.0", "0.1"):
        _assert_written_in_place(records, arg)


def test_check_exits_one_on_a_nan_and_zero_on_a_clean_run(tmp_path, capsys):
    _records(tmp_path / "bad", lambda: torch.tensor([0.0]).div(0.0))
    _records(tmp_path / "clean", lambda: torch.ones(2).add(1))
    assert main(["check", str(tmp_path / "bad")]) == 1
    assert "first NaN/Inf at step 0: forward/-/aten.div.Tensor#0" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "clean")]) == 0
    with torchdebug.dump(tmp_path / "shape", task="structure"):
        torch.ones(2).add(1)
    assert main(["check", str(tmp_path / "shape")]) == 2


def test_show_names_the_first_overflow_at_the_top(tmp_path, capsys):
    with torchdebug.dump(tmp_path):  # a statistics dump: every record, the first NaN named on top
        torch.ones(2).add(1)
        torch.tensor([0.0]).div(0.0).add(1)
    assert main(["show", str(tmp_path), "--no-stack"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("first NaN/Inf of rank 0: step 0: forward/-/aten.div.Tensor#0")


@pytest.mark.gpu
def test_the_cuda_check_never_synchronises_per_op(tmp_path):
    model = Planted(inf_weight=True).cuda()
    x = torch.randn(2, 3, device="cuda")
    debugger = torchdebug.Debugger(tmp_path, task="overflow_check", overflow_nums=-1)
    debugger.start(model)
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(x).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    debugger.close()
    first = find_origin(torchdebug.load(tmp_path).ranks[0].records()).record
    assert first.call_name == "forward/<root>/aten.mul.Tensor#0"


def test_an_allocation_and_a_buffer_before_it_is_written_are_never_an_overflow(tmp_path, monkeypatch):
    """``torch.empty`` hands out whatever the memory held, NaN after a NaN step freed it (allocator
    reuse makes that happen or not): an allocation makes no value and is not judged, and neither is
    what ``copy_`` (or an ``out=`` op, a collective, FSDP2's copy-in) writes over. Shown with
    ``full`` counted as an allocation, which makes its NaN every time."""
    from torchdebug.capture import eager

    def body():
        torch.full((4,), float("nan")).copy_(torch.ones(4))

    assert "aten.full.default" in {r.op for r in _records(tmp_path / "full", body)}  # a real op making a NaN
    monkeypatch.setattr(eager, "allocates", lambda op: op == "aten.full.default")
    assert _records(tmp_path / "allocation", body) == []  # copy_ wrote over it without reading it

    def views():  # as FSDP2's copy-out: views of the fresh buffer are its out= buffers
        buffer = torch.full((4,), float("nan"))
        torch.mul(torch.ones(2, 2), 2.0, out=buffer.view(2, 2))
        buffer.view(4).log()  # written since: judged (log(2) is finite)

    assert _records(tmp_path / "views", views) == []


def test_buffers_an_unshard_hands_out_are_not_judged_until_written(tmp_path, monkeypatch):
    """FSDP2's copy-in marks the all-gather buffers its unshard hands out (``unshard_buffers``, both
    paths' seam: here a buffer of NaN, as a NaN step leaves them): a view of one holds no value until
    an op writes it (the copy-out's ``out=``), then it is judged."""
    import torch.distributed.fsdp  # noqa: F401  (registers the fsdp ops)

    from torchdebug.capture import eager, native_records

    buffer = torch.full((4,), float("nan"))
    monkeypatch.setattr(native_records, "unshard_buffers", lambda frame: [buffer])
    monkeypatch.setattr(eager, "unshard_buffers", lambda frame: [buffer])

    def body():
        torch.ops.fsdp.all_gather_copy_in([torch.ones(2)], torch.empty(4), [2], 2, 0)  # the unshard marks the buffer
        buffer.view(2, 2)  # a view of it before the copy-out: not judged
        torch.mul(torch.ones(2, 2), 2.0, out=buffer.view(2, 2))  # the copy-out writes it
        buffer.view(4).log()  # judged (log(2) is finite)

    assert _records(tmp_path, body) == []
    buffer.fill_(float("nan"))  # unmarked, the same view is a NaN that entered
    assert _calls(_records(tmp_path / "unmarked", lambda: buffer.view(2, 2))) == ["forward/-/aten.view.default#0"]


def test_memory_an_allocation_hands_out_again_holds_no_value(tmp_path, monkeypatch):
    """An allocation's output freed unread leaves its mark behind; the next allocation at that memory
    (the allocator hands it out again) marks it anew: a stale mark kept passed the new one for a
    write, and a view of the garbage was named the entry. (Shown with ``full`` counted as an
    allocation, which makes its NaN every time.)"""
    from torchdebug.capture import eager

    monkeypatch.setattr(eager, "allocates", lambda op: op == "aten.full.default")

    def body():
        for _ in range(4):
            torch.full((4,), float("nan"))  # freed unread
            torch.full((4,), float("nan")).view(2, 2)  # likely at the same memory: not judged either

    assert _records(tmp_path, body) == []


def test_inference_tensors_are_judged_at_each_op(tmp_path, resolution):
    """Under ``torch.inference_mode`` tensors keep no version counter (reading it raised into the
    loop): a tensor judged finite, then written in place, is judged again at its next op."""

    def evaluate():
        with torch.inference_mode():
            x = torch.ones(3)
            x.sum()
            x.mul_(torch.tensor([1.0, 3e38, 1.0]))
            x.mul_(10.0)  # the first overflow
            x.sum()

    records = _records(tmp_path, evaluate)
    assert find_origin(records).record.call_name == "forward/-/aten.mul_.Tensor#1"


def test_packed_fp4_values_are_not_judged(tmp_path, resolution):
    """Packed fp4 pairs are bits torch reduces nothing of (``stats.has_statistics``): not checked,
    and the run goes on (before 2026-11-28 the check raised into the step)."""

    def fn():
        packed = torch.full((2, 4), 3.0).to(torch.float8_e4m3fn).view(torch.uint8).view(torch.float4_e2m1fn_x2)
        packed.view(torch.uint8).float().mul(3e38)  # the first overflow

    records = _records(tmp_path, fn)
    assert _calls(records) == ["forward/-/aten.mul.Tensor#0"]


def test_an_infinity_inductor_writes_in_place_is_given_to_the_extern_kernel_that_reads_it(tmp_path, resolution):
    """Inductor fuses the ``exp`` after a matmul into a kernel that overwrites the matmul's output in
    place (no aten op, no version moved), which the next matmul reads: the check judges that input as
    it is then (infinite: given), not as the first matmul left it (finite), so the second matmul is no
    origin; the ``mul`` that overflows after the compiled code is."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, w1, w2: (a @ w1).exp() @ w2, backend="inductor")
    a, w1, w2 = torch.full((8, 8), 4.0), torch.full((8, 8), 4.0), torch.rand(8, 8) + 0.1
    with torch.no_grad():
        compiled(a, w1, w2)

    def body():
        with torch.no_grad():
            compiled(a, w1, w2)
        (w2 * 1e30) * 1e30

    records = _records(tmp_path, body, overflow_nums=-1)
    assert _calls(records) == ["forward/-/aten.mul.Tensor#1"]
    torch._dynamo.reset()


def test_an_argument_an_origin_overwrites_is_described_not_read(tmp_path, resolution):
    """``out=``'s buffer holds no input of the op: its record says so (as a statistics dump's does),
    and shows none of what it held (here NaN, which would read as where the overflow came from)."""

    big, buffer = torch.full((2, 2), 1e20), torch.full((2, 2), float("nan"))

    def body():
        torch.mm(big, big, out=buffer)

    records = _records(tmp_path, body, overflow_nums=-1)
    assert _calls(records) == ["forward/-/aten.mm.out#0"]
    out = next(r for r in records if r.io == "input" and r.arg == "out")
    assert out.stats is None and out.extra == {"unread": "overwritten"}
    assert next(r for r in records if r.io == "output").stats["posinf"] == 4
