"""Eager op capture: what is seen, how it is named and attributed, and that it changes nothing."""

import pytest
import torch
import torch.nn.functional as F
from torch import relu as imported_relu

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step


def _records(tmp_path, fn, model=None, **options):
    with torchdebug.dump(tmp_path, model=model, **options):
        fn()
    return torchdebug.load(tmp_path).ranks[0].records()


def _ops(records):
    return [r.op for r in records if r.io == "output"]


def test_every_way_of_calling_an_op_is_captured(tmp_path):
    x = torch.randn(4)

    def body():
        torch.relu(x)
        imported_relu(x)
        F.relu(x)
        x.relu()

    assert _ops(_records(tmp_path, body)).count("aten.relu.default") == 4


def test_calls_of_the_same_op_get_increasing_call_indices(tmp_path):
    x = torch.randn(4)
    records = _records(tmp_path, lambda: (x.exp(), x.exp()))
    names = [r.name for r in records if r.op == "aten.exp.default" and r.io == "output"]
    assert names == ["forward/-/aten.exp.default#0/output.0", "forward/-/aten.exp.default#1/output.0"]


def test_names_are_identical_across_two_runs_of_the_same_program(tmp_path, tiny):
    names = []
    for run in ("a", "b"):
        torch.manual_seed(0)
        tiny.zero_grad(set_to_none=True)
        records = _records(tmp_path / run, lambda: tiny(torch.randn(2, 4)).sum().backward(), model=tiny)
        names.append([r.name for r in records])
    assert names[0] == names[1] and len(set(names[0])) == len(names[0])


def test_forward_ops_carry_module_path_and_source_line(tmp_path, tiny):
    records = _records(tmp_path, lambda: tiny(torch.randn(2, 4)), model=tiny)
    addmm = [r for r in records if r.op == "aten.addmm.default" and r.io == "output"]
    assert [r.module for r in addmm] == ["fc1", "fc2"]
    assert all("conftest.py" in r.source and "in forward" in r.source for r in addmm)
    frames = torchdebug.load(tmp_path).ranks[0].stack(addmm[0])
    assert "test_eager.py" in frames[-2] and "self.fc1(x)" in frames[-1]


def test_backward_ops_are_attributed_to_the_forward_op_they_differentiate(tmp_path, tiny):
    records = _records(tmp_path, lambda: tiny(torch.randn(2, 4)).sum().backward(), model=tiny)
    backward = [r for r in records if r.phase == "backward" and r.op == "aten.mm.default" and r.io == "output"]
    assert {r.module for r in backward} == {"fc1", "fc2"}
    assert all(r.fwd.endswith("/aten.addmm.default#0") for r in backward)
    fwd_sources = {r.source for r in records if r.phase == "forward" and r.op == "aten.addmm.default"}
    assert {r.source for r in backward} <= fwd_sources


def test_optimizer_ops_are_labelled_optimizer(tmp_path, tiny):
    optimizer = torch.optim.SGD(tiny.parameters(), lr=0.1)

    def body():
        tiny(torch.randn(2, 4)).sum().backward()
        optimizer.step()

    records = _records(tmp_path, body, model=tiny)
    assert {r.phase for r in records} == {"forward", "backward", "optimizer"}
    assert any(r.phase == "optimizer" and r.op.startswith("aten.add_") for r in records)


def test_in_place_ops_record_the_input_before_and_the_output_after(tmp_path):
    x = torch.ones(3)
    records = _records(tmp_path, lambda: x.mul_(5))
    (before,) = [r for r in records if r.op == "aten.mul_.Tensor" and r.io == "input" and r.arg == "0"]
    (after,) = [r for r in records if r.op == "aten.mul_.Tensor" and r.io == "output"]
    assert before.stats["max"] == 1.0 and after.stats["max"] == 5.0


def test_views_share_statistics_with_their_base(tmp_path):
    x = torch.randn(4, 6)
    records = _records(tmp_path, lambda: x.exp().view(24).t())
    exp_out = next(r for r in records if r.op == "aten.exp.default" and r.io == "output")
    view_out = next(r for r in records if r.op == "aten.view.default" and r.io == "output")
    assert view_out.stats == exp_out.stats and view_out.shape == [24]


def test_views_are_saved_as_strided_views_of_their_base_not_as_copies(tmp_path):
    x = torch.randn(4, 6)

    def body():
        y = x.exp()
        y.t()[1:3]
        y.view(2, 12).expand(3, 2, 12)

    records = _records(tmp_path, body, task="tensor")
    dump = torchdebug.load(tmp_path).ranks[0]
    expected = {
        "aten.t.default": x.exp().t(),
        "aten.slice.Tensor": x.exp().t()[1:3],
        "aten.expand.default": x.exp().view(2, 12).expand(3, 2, 12),
    }
    for op, value in expected.items():
        out = next(r for r in records if r.op == op and r.io == "output")
        assert "view" in out.tensor, op
        assert torch.equal(dump.load_tensor(out), value), op
    files = {r.tensor["file"] for r in records if r.tensor}
    keys = {r.tensor["key"] for r in records if r.tensor}
    assert len(files) == 1 and len(keys) == 2  # the input x and exp's output


def test_non_tensor_arguments_are_recorded_as_values(tmp_path):
    x = torch.randn(2, 3)
    records = _records(tmp_path, lambda: (x.sum(dim=1, keepdim=True), x.to(torch.float64)))
    values = {(r.op, r.arg): r.value for r in records if r.kind == "value"}
    assert values[("aten.sum.dim_IntList", "1")] == [1] and values[("aten.sum.dim_IntList", "2")] is True
    assert values[("aten._to_copy.default", "dtype")] == "float64"


def test_lists_of_tensors_get_nested_argument_paths(tmp_path):
    a, b = torch.ones(2), torch.zeros(2)
    records = _records(tmp_path, lambda: torch.cat([a, b]))
    assert {r.arg for r in records if r.op == "aten.cat.default" and r.io == "input"} == {"0.0", "0.1"}


def test_ops_without_tensor_outputs_are_recorded(tmp_path):
    x = torch.tensor([3.5])
    records = _records(tmp_path, lambda: x.item())
    (out,) = [r for r in records if r.op == "aten._local_scalar_dense.default" and r.io == "output"]
    assert out.kind == "value" and out.value == 3.5


def test_int_bool_complex_empty_and_bfloat16_tensors_are_captured(tmp_path):
    def body():
        torch.arange(5).mul(2)
        (torch.ones(3) > 0).logical_not()
        torch.tensor([1 + 1j]).mul(2)
        torch.empty(0, 4).add(1)
        torch.ones(4, dtype=torch.bfloat16).mul(3)

    records = _records(tmp_path, body, task="tensor")
    outputs = {r.dtype: r for r in records if r.io == "output" and r.kind == "tensor" and r.op != "aten.arange.default"}
    assert outputs["int64"].stats["max"] == 8
    assert outputs["bool"].stats["max"] == 0
    assert outputs["complex64"].stats["max"] > 2.8
    assert outputs["bfloat16"].stats["mean"] == 3.0
    empty = [r for r in records if r.shape == [0, 4] and r.io == "output"]
    assert empty and empty[0].stats["min"] is None
    dump = torchdebug.load(tmp_path).ranks[0]
    assert dump.load_tensor(outputs["bfloat16"]).dtype == torch.bfloat16
    assert torch.equal(dump.load_tensor(outputs["complex64"]), torch.tensor([2 + 2j]))  # stored as (real, imag)
    assert all(r.capture_error is None for r in records)


def test_structure_task_keeps_names_and_shapes_without_statistics(tmp_path):
    records = _records(tmp_path, lambda: torch.ones(2).exp(), task="structure")
    out = next(r for r in records if r.op == "aten.exp.default" and r.io == "output")
    assert out.shape == [2] and out.stats is None and out.tensor is None and out.stack


def test_capture_does_not_change_the_loss_bit_for_bit(tmp_path):
    config = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64)
    losses = []
    for capture in (False, True, False):
        torchdebug.seed_all(7)
        model = GPT(config)
        optimizer = torch.optim.AdamW(model.parameters())
        batch = make_batch(config, batch=2)
        step_losses = []
        for _ in range(2):
            if capture:
                with torchdebug.dump(tmp_path, model=model, task="tensor"):
                    step_losses.append(train_step(model, optimizer, batch))
            else:
                step_losses.append(train_step(model, optimizer, batch))
        losses.append(torch.stack(step_losses))
    assert torch.equal(losses[0], losses[1]) and torch.equal(losses[0], losses[2])


@pytest.mark.gpu
def test_cuda_tensors_are_saved_and_described_without_a_sync_per_op(tmp_path):
    x = torch.randn(64, 64, device="cuda")

    def body():
        y = x.exp()
        y.mul_(2)  # the saved output of exp must be the value before this in-place op

    records = _records(tmp_path, body, task="tensor")
    exp_out = next(r for r in records if r.op == "aten.exp.default" and r.io == "output")
    saved = torchdebug.load(tmp_path).ranks[0].load_tensor(exp_out)
    assert torch.equal(saved, x.exp().cpu())
    assert exp_out.stats["max"] == pytest.approx(x.exp().max().item())
    assert exp_out.device == "cuda:0"


def test_gradient_accumulation_ops_are_named_after_the_parameter(tmp_path, tiny):
    records = _records(tmp_path, lambda: tiny(torch.randn(2, 4)).sum().backward(), model=tiny)
    modules = {r.module for r in records if r.phase == "backward" and r.op == "aten.detach.default"}
    assert {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"} <= modules


def test_clones_are_saved_as_their_own_values(tmp_path):
    x = torch.randn(4, 6)

    def body():
        y = x.exp()
        y.t().clone()  # own memory, contiguous in the transposed order

    records = _records(tmp_path, body, task="tensor")
    out = next(r for r in records if r.op == "aten.clone.default" and r.io == "output")
    assert "view" not in out.tensor
    assert torch.equal(torchdebug.load(tmp_path).ranks[0].load_tensor(out), x.exp().t().clone())


def test_views_of_complex_tensors_and_views_into_another_dtype_load_as_they_ran(tmp_path):
    """A complex tensor is saved as (real, imag) pairs, and a view of a saved tensor in another
    dtype counts its offset in its own elements: neither is saved as a view of the other's memory
    (before 2026-11-30 their references were, and loading them failed or read other elements)."""
    x = torch.randn(4, 6)

    def body():
        spectrum = torch.fft.rfft(x.exp())  # complex
        spectrum.conj().clone()  # a conjugate view of the complex output
        torch.view_as_real(spectrum).mul(2)  # real pairs on its memory
        torch.view_as_complex(x.exp().view(4, 3, 2)).mul(2)  # complex on real memory

    records = _records(tmp_path, body, task="tensor")
    dump = torchdebug.load(tmp_path).ranks[0]
    spectrum = torch.fft.rfft(x.exp())
    expected = {
        "aten._conj.default": spectrum.conj(),
        "aten.view_as_real.default": torch.view_as_real(spectrum),
        "aten.view_as_complex.default": torch.view_as_complex(x.exp().view(4, 3, 2)),
    }
    for op, value in expected.items():
        out = next(r for r in records if r.op == op and r.io == "output")
        assert torch.equal(dump.load_tensor(out).resolve_conj(), value.resolve_conj()), op


def test_tensor_task_statistics_equal_statistics_task_and_the_saved_tensors(tmp_path, monkeypatch):
    """Tensor dumps take statistics during the snapshot copy; they must be those of the tensor (both
    dumps on the dispatch mode, which the tensor task takes: a mode makes torch run other ops)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")
    config = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64)

    def run(path, task):
        torchdebug.seed_all(0)
        model = GPT(config)
        optimizer = torch.optim.AdamW(model.parameters())
        return _records(path, lambda: train_step(model, optimizer, make_batch(config, batch=2)), model, task=task)

    by_stats = {r.name: r.stats for r in run(tmp_path / "stats", "statistics")}
    tensor_records = run(tmp_path / "tensor", "tensor")
    dump = torchdebug.load(tmp_path / "tensor").ranks[0]
    checked = 0
    for record in tensor_records:
        if record.kind != "tensor" or not record.stats or record.stats["min"] is None:
            continue
        assert record.stats == pytest.approx(by_stats[record.name], rel=1e-5, abs=1e-6), record.name
        if record.dtype == "float32" and "view" not in record.tensor:
            saved = dump.load_tensor(record).double()
            assert record.stats["max"] == saved.max().item() and record.stats["min"] == saved.min().item()
            assert record.stats["norm"] == pytest.approx(saved.norm().item(), rel=1e-5)
            checked += 1
    assert checked > 100


def test_module_records_taken_through_the_device_table_are_right_and_add_no_ops(tmp_path, monkeypatch):
    """level="mix" on an accelerator: module hooks hand tensors to the device table while the op
    capture's dispatch mode is active. The table's own torch ops must neither be recorded as the
    model's ops nor take rows of the table in the middle of another tensor's (they once did on CUDA:
    rows went to the wrong records). The CPU stands in for the device here (``_resolves_now``)."""
    from torchdebug import stats_table

    config = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64)

    def run(path):
        torchdebug.seed_all(0)
        model = GPT(config)
        optimizer = torch.optim.AdamW(model.parameters())
        batch = make_batch(config, batch=2)  # made before the dump: the root module's hook sees it first
        records = _records(path, lambda: train_step(model, optimizer, batch), model, level="mix")
        return {r.name: r.stats for r in records}

    at_once = run(tmp_path / "cpu")
    monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    through_table = run(tmp_path / "table")
    assert through_table.keys() == at_once.keys()
    assert any("/module#" in name for name in at_once)
    for name, stats in at_once.items():
        if stats is None or stats["min"] is None:
            assert through_table[name] == stats, name
        else:
            assert through_table[name] == pytest.approx(stats, rel=1e-5, abs=1e-6), name


def test_tensor_task_keeps_every_record_when_the_tensor_batch_fills_mid_call(tmp_path, monkeypatch):
    """A snapshot that does not fit hands the batch to the writer in the middle of a call; the
    slots recorded after it must land in the next batch, not be lost (both dumps on the dispatch mode)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")
    config = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16, vocab=64)

    def run(path, task, batch_bytes=None):
        torchdebug.seed_all(0)
        model = GPT(config)
        optimizer = torch.optim.AdamW(model.parameters())
        dbg = torchdebug.Debugger(path, task=task)
        if batch_bytes is not None:
            dbg.session.writer.batch_bytes = batch_bytes  # a few tensors per batch
        dbg.start(model)
        train_step(model, optimizer, make_batch(config, batch=2))
        dbg.stop()
        dbg.close()
        return torchdebug.load(path).ranks[0]

    expected = [r.name for r in run(tmp_path / "stats", "statistics").records()]
    dump = run(tmp_path / "tensor", "tensor", batch_bytes=16 * 1024)
    records = dump.records()
    assert [r.name for r in records] == expected
    assert len({r.tensor["file"] for r in records if r.tensor}) > 10, "many batches were written"
    for record in records[:200]:
        if record.tensor:
            dump.load_tensor(record)


def test_stacks_follow_the_caller_of_each_op(tmp_path):
    """Ops of one line share a stack; the same line reached from another caller, or a generator
    resumed from another place, gets its own."""

    def inner(x):
        return torch.relu(x) + 1  # two ops, one line

    def caller_a(x):
        return inner(x)

    def caller_b(x):
        return inner(x)

    def steps(x):
        while True:
            x = torch.sin(x)
            yield x

    def run():
        x = torch.randn(4)
        caller_a(x)
        caller_b(x)
        gen = steps(x)
        next(gen)  # resumed from here ...
        (lambda: next(gen))()  # ... and from inside a lambda

    ops = ("aten.relu.default", "aten.add.Tensor", "aten.sin.default")
    records = [r for r in _records(tmp_path, run) if r.io == "output" and r.op in ops]
    dump = torchdebug.load(tmp_path).ranks[0]
    stacks = [dump.stack(r) for r in records]
    relu_a, add_a, relu_b, add_b, sin_1, sin_2 = stacks
    assert relu_a == add_a and relu_b == add_b
    assert any("caller_a" in frame for frame in relu_a) and not any("caller_b" in frame for frame in relu_a)
    assert any("caller_b" in frame for frame in relu_b)
    resumed_in_lambda = "in <lambda>: (lambda: next(gen))()"
    assert not any(resumed_in_lambda in frame for frame in sin_1) and any(resumed_in_lambda in frame for frame in sin_2)


def test_an_allocations_output_is_described_never_read(tmp_path):
    """``torch.empty`` holds whatever the memory held (NaN after a NaN step freed it, FSDP2's
    all-gather buffers): its record has dtype and shape, no statistics, and says why; what the next
    op writes into it is read as usual. Read, two identical runs differed there, and a NaN's origin
    was named there."""
    from torchdebug.records import ALLOCATIONS, UNREAD, allocates

    x = torch.randn(4)

    def body():
        torch.empty(4).copy_(x)
        torch.empty_like(x).fill_(2.0)
        x.new_empty(3).zero_()

    records = _records(tmp_path, body, task="statistics")
    allocated = [r for r in records if allocates(r.op) and r.io == "output"]
    assert [r.op for r in allocated] == ["aten.empty.memory_format", "aten.empty_like.default", "aten.new_empty.default"]
    for record in allocated:
        assert record.stats is None and record.extra == {UNREAD: "uninitialised"} and record.shape in ([4], [3])
    written = [
        r for r in records if r.io == "output" and r.op in ("aten.copy_.default", "aten.fill_.Scalar", "aten.zero_.default")
    ]
    assert [r.stats["max"] for r in written] == [x.max().item(), 2.0, 0.0]
    assert allocates("empty_strided") and not allocates("aten.empty_permuted_like.default") and "empty" in ALLOCATIONS


def test_a_view_of_an_allocation_is_not_read_until_something_writes_it(tmp_path):
    """FSDP2 views its unsharded parameters' fresh buffers before the all-gather's copy-out fills
    them: until a write (which moves the version counter the views share), what they hold is the
    allocation's garbage, not read; after it, the values are."""
    from torchdebug.records import UNREAD

    x = torch.randn(8)

    def body():
        buffer = torch.empty(8)
        buffer.view(2, 4).t()  # these views die here: the allocation, alive, still marks its storage
        buffer.view(8)
        buffer.copy_(x)
        buffer.view(2, 4)

    records = [r for r in _records(tmp_path, body, task="statistics") if r.kind == "tensor"]
    before = [r for r in records if r.op in ("aten.view.default", "aten.t.default") and r.call in (0, 1)]
    assert len(before) == 6 and all(r.stats is None and r.extra == {UNREAD: "uninitialised"} for r in before)
    after = [r for r in records if r.op == "aten.view.default" and r.call == 2]
    assert [r.stats["max"] for r in after] == [x.max().item()] * 2 and not any(r.extra for r in after)
    copied = [r for r in records if r.op == "aten.copy_.default"]
    assert [r.extra.get(UNREAD) for r in copied] == ["overwritten", None, None]  # self, src, the written output


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_a_tensor_a_foreach_op_writes_is_read_again_with_its_new_value_and_version(tmp_path, monkeypatch, native):
    """Under a dispatch mode torch moves no version for a ``_foreach_*_`` op's writes (an optimizer's
    steps and moments): the next read still has its new statistics and a later version."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    steps = [torch.zeros(2), torch.zeros(3)]
    with torchdebug.dump(tmp_path, task="statistics", checksum=True):
        steps[0].mul(1.0)
        torch._foreach_add_(steps, 1.0)
        steps[0].mul(1.0)
    reads = [r for r in torchdebug.load(tmp_path).ranks[0].records() if r.op == "aten.mul.Tensor" and r.name.endswith("input.0")]
    assert [r.stats["max"] for r in reads] == [0.0, 1.0]
    assert reads[0].checksum != reads[1].checksum
    assert reads[0].value_id == reads[1].value_id and reads[1].version == reads[0].version + 1


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_a_foreach_update_records_what_it_wrote_as_its_outputs(tmp_path, monkeypatch, native):
    """An in-place ``_foreach_*_`` op returns nothing: its outputs are the tensors it wrote, after the
    write, named as its inputs (``output.0.<i>``), so a foreach optimizer's update is where its
    results show (before, nothing until the next step read the parameters)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, foreach=True)
    model(torch.randn(3, 4)).sum().backward()
    with torchdebug.Debugger(tmp_path, task="statistics") as debugger:
        debugger.start(model)
        optimizer.step()
        debugger.step()
    records = [r for r in torchdebug.load(tmp_path).ranks[0].records() if r.op == "aten._foreach_add_.List"]
    inputs = {r.arg: r for r in records if r.io == "input"}
    outputs = {r.arg: r for r in records if r.io == "output"}
    assert sorted(outputs) == ["0.0", "0.1"] and {r.phase for r in records} == {"optimizer"}
    for index, parameter in enumerate(model.parameters()):
        written, before = outputs[f"0.{index}"], inputs[f"0.{index}"]
        assert written.stats["max"] == parameter.max().item() != before.stats["max"]
        assert written.value_id == before.value_id and written.version == before.version + 1


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_a_tensor_a_fused_optimizer_wrote_is_read_again_with_its_new_value(tmp_path, monkeypatch, native):
    """A fused optimizer writes parameters and moments without moving their versions: a read after
    it in the same step takes the new values, not those read before, and the records count the
    write in the version (two values of one tensor)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    x = torch.randn(3, 4)
    with torchdebug.Debugger(tmp_path, task="statistics") as debugger:
        debugger.start(model)
        model(x).sum().backward()
        optimizer.step()
        model.bias.mul(1.0)
        debugger.step()
    records = {r.name: r for r in torchdebug.load(tmp_path).ranks[0].records()}
    before, after = records["forward/<root>/aten.addmm.default#0/input.0"], records["forward/-/aten.mul.Tensor#0/input.0"]
    assert before.value_id == after.value_id and after.version == before.version + 1  # torch moved none: capture counts it
    assert after.stats["max"] == model.bias.max().item() != before.stats["max"]
