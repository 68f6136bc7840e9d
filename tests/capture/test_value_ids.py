"""Value ids: every tensor slot names the tensor it holds and its version, so the data flow is exact."""

import torch
import torch.distributed as dist

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from tests import gloo
from torchdebug.compare._matching import execution_order


def _records(tmp_path, fn, model=None, **options):
    with torchdebug.dump(tmp_path, model=model, **options):
        fn()
    return torchdebug.load(tmp_path).ranks[0].records()


def _slot(records, name):
    return next(r for r in records if r.name == name)


def _unmade_reads(records):
    """Input slots whose ``(value_id, version)`` no earlier output slot holds, though an earlier output
    slot holds that ``value_id`` at another version (a version capture got wrong), and the count of
    input slots; execution order."""
    made: set[tuple] = set()
    ids: set[int] = set()
    wrong, inputs = [], 0
    for record in (records[i] for i in execution_order(records)):
        if record.kind != "tensor":
            continue
        assert record.value_id is not None, record.name
        if record.io in ("output", "parameter_grad"):
            made.add((record.value_id, record.version))
            ids.add(record.value_id)
        else:
            inputs += 1
            if (record.value_id, record.version) not in made and record.value_id in ids:
                wrong.append(record.name)
    return wrong, inputs


def test_every_read_of_a_gpt_training_step_names_a_value_an_earlier_op_made(tmp_path):
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = torchdebug.Debugger(dump_path=tmp_path, task="statistics", level="mix")
    for step in range(2):  # the second step reads the parameters the first step's optimizer wrote
        debugger.start(model)
        train_step(model, optimizer, make_batch(config, batch=2, seed=step), autocast=torch.bfloat16 if step else None)
        debugger.stop()
        debugger.step()
    debugger.close()
    records = torchdebug.load(tmp_path).ranks[0].records()
    wrong, inputs = _unmade_reads(records)
    assert inputs > 1000 and wrong == []
    reads = [r for r in records if r.step == 1 and r.phase == "forward" and r.io == "input" and r.kind == "tensor"]
    made = {(r.value_id, r.version) for r in records if r.io == "output"}
    assert all((r.value_id, r.version) in made for r in reads)  # parameters included: the optimizer wrote them


def test_an_output_read_by_the_next_op_keeps_its_id_and_equal_tensors_get_different_ones(tmp_path):
    def body():
        first, second = torch.zeros(4), torch.zeros(4)
        (first + 1).relu()
        second.exp()

    records = _records(tmp_path, body)
    zeros = [r for r in records if r.op == "aten.zeros.default" and r.io == "output"]
    assert len({r.value_id for r in zeros}) == 2
    add = _slot(records, "forward/-/aten.add.Tensor#0/output.0")
    assert _slot(records, "forward/-/aten.relu.default#0/input.0").value_id == add.value_id
    assert _slot(records, "forward/-/aten.add.Tensor#0/input.0").value_id == zeros[0].value_id
    assert _slot(records, "forward/-/aten.exp.default#0/input.0").value_id == zeros[1].value_id


def test_an_in_place_op_keeps_the_id_and_leaves_the_next_version(tmp_path):
    x = torch.ones(4)

    def body():
        x.mul_(2)
        x.exp()

    records = _records(tmp_path, body)
    read = _slot(records, "forward/-/aten.mul_.Tensor#0/input.0")
    written = _slot(records, "forward/-/aten.mul_.Tensor#0/output.0")
    after = _slot(records, "forward/-/aten.exp.default#0/input.0")
    assert read.value_id == written.value_id == after.value_id
    assert (read.version + 1, read.version + 1) == (written.version, after.version)


def test_an_in_place_op_is_known_as_a_write_when_inputs_are_not_recorded(tmp_path):
    x = torch.ones(4)
    records = _records(tmp_path, lambda: (x.mul_(2), x.exp()), data_mode=["output"])
    written = _slot(records, "forward/-/aten.mul_.Tensor#0/output.0")
    assert written.version == x._version


def test_views_get_ids_of_their_own_that_name_their_memory_at_its_version(tmp_path):
    def body():
        base = torch.ones(6, 2)
        base.add_(1)  # version 1: the views below share it
        first, second, third = base.split(2)
        second.t().exp()

    records = _records(tmp_path, body)
    base = _slot(records, "forward/-/aten.ones.default#0/output.0")
    chunks = [_slot(records, f"forward/-/aten.split.Tensor#0/output.{i}") for i in range(3)]
    assert len({c.value_id for c in chunks} | {base.value_id}) == 4
    assert {c.view_of for c in chunks} == {base.value_id} and {c.version for c in chunks} == {1}
    transposed = _slot(records, "forward/-/aten.t.default#0/output.0")
    assert transposed.view_of == base.value_id  # a view of a view names the first memory
    assert _slot(records, "forward/-/aten.exp.default#0/input.0").value_id == transposed.value_id
    assert base.view_of is None


def test_a_write_through_a_view_moves_the_version_its_base_is_read_at(tmp_path):
    def body():
        base = torch.zeros(2, 4)
        base[:, :2].add_(1)
        base.sum()

    records = _records(tmp_path, body)
    base = _slot(records, "forward/-/aten.zeros.default#0/output.0")
    written = _slot(records, "forward/-/aten.add_.Tensor#0/output.0")
    read = _slot(records, "forward/-/aten.sum.default#0/input.0")
    assert written.view_of == read.value_id == base.value_id
    assert read.version == written.version == base.version + 1


def test_a_view_made_before_capture_names_its_base_as_its_memory(tmp_path):
    base = torch.ones(4, 2)
    column = base[:, 0]
    records = _records(tmp_path, lambda: (column.exp(), base.exp()))
    read_view = _slot(records, "forward/-/aten.exp.default#0/input.0")
    read_base = _slot(records, "forward/-/aten.exp.default#1/input.0")
    assert read_view.view_of == read_base.value_id != read_view.value_id and read_base.view_of is None


def test_ids_are_unique_in_the_run_and_a_parameter_keeps_its_id_across_steps(tmp_path, tiny):
    debugger = torchdebug.Debugger(dump_path=tmp_path, task="structure")
    for _ in range(2):
        debugger.start(tiny)
        tiny(torch.randn(2, 4)).sum()
        debugger.stop()
        debugger.step()
    debugger.close()
    records = torchdebug.load(tmp_path).ranks[0].records()
    made = [r for r in records if r.op == "aten.randn.default" and r.io == "output"]
    assert len({r.value_id for r in made}) == 2
    weight = [r for r in records if r.op == "aten.t.default" and r.io == "input" and r.module == "fc1"]
    assert len(weight) == 2 and weight[0].value_id == weight[1].value_id


def test_value_slots_and_inference_tensors_carry_no_version(tmp_path):
    with torch.inference_mode():
        x = torch.ones(3)
    records = _records(tmp_path, lambda: x.mul(2))
    read = _slot(records, "forward/-/aten.mul.Tensor#0/input.0")
    assert read.value_id is not None and read.version is None
    assert _slot(records, "forward/-/aten.mul.Tensor#0/input.1").value_id is None  # the scalar 2


def _distributed_worker(rank: int, dump_path: str) -> None:
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    weight = DTensor.from_local(torch.ones(4, 2), mesh, [Shard(0)])
    with torchdebug.dump(dump_path):
        x = torch.full((4,), 2.0)
        dist.all_reduce(x)
        x.mul_(10)
        with torch.no_grad():
            weight.mul_(0.5)  # torch moves the DTensor's version, not its local shard's
        weight.sum()


def test_a_collective_and_a_dtensor_in_place_op_leave_the_version_later_ops_read(tmp_path):
    gloo.spawn(_distributed_worker, tmp_path, str(tmp_path / "dump"), world_size=1)
    records = torchdebug.load(tmp_path / "dump").ranks[0].records()
    reduced = next(r for r in records if r.op.startswith("c10d.allreduce_") and r.io == "output" and r.kind == "tensor")
    read = _slot(records, "forward/-/aten.mul_.Tensor#0/input.0")
    assert (read.value_id, read.version) == (reduced.value_id, reduced.version)  # c10d declares no write
    written = _slot(records, "forward/-/aten.mul_.Tensor#1/output.0")
    summed = _slot(records, "forward/-/aten.sum.default#0/input.0")
    assert (summed.value_id, summed.version) == (written.value_id, written.version)
    assert written.version == _slot(records, "forward/-/aten.mul_.Tensor#1/input.0").version + 1


def test_an_op_that_returns_its_argument_as_a_view_keeps_its_id(tmp_path):
    x = torch.ones(3)
    records = _records(tmp_path, lambda: torch.ops.aten.lift_fresh(x))
    read = _slot(records, "forward/-/aten.lift_fresh.default#0/input.0")
    returned = _slot(records, "forward/-/aten.lift_fresh.default#0/output.0")
    assert (returned.value_id, returned.version, returned.view_of) == (read.value_id, read.version, None)


def test_entries_of_freed_tensors_are_dropped_within_a_step_and_live_ones_keep_their_ids():
    """Memory stays within about twice the live tensors' entries however many tensors a step makes;
    ids stay unique and a live tensor keeps its own through the drops."""
    from torchdebug.capture.value_ids import ValueIds

    values = ValueIds()
    kept = [torch.zeros(1) for _ in range(10)]
    values.see(kept)
    ids = [values._id(tensor) for tensor in kept]
    seen = set(ids)
    for _ in range(5 * ValueIds._FLOOR):
        temporary = torch.zeros(1)
        values.see([temporary])
        seen.add(values._id(temporary))
        assert len(values._refs) <= 2 * ValueIds._FLOOR + 1
    assert [values._id(tensor) for tensor in kept] == ids
    assert len(seen) == 10 + 5 * ValueIds._FLOOR  # never an id twice
