"""The planner returns its plan: FX graphs traced with make_fx (no compiler), planned, never edited."""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from torchdebug.graph_dump._planner import ModelContext, Plan, plan_graph
from torchdebug.graph_dump._settings import DumpSettings
from torchdebug.graph_dump.scenes import ModelScene


def _product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.mm(x, w).view(-1) * 2).relu()


def _traced() -> torch.fx.GraphModule:
    return make_fx(_product, tracing_mode="fake")(torch.randn(4, 8), torch.randn(8, 3))


def _plan(gm: torch.fx.GraphModule, settings: DumpSettings, model: str = "model__0") -> Plan:
    return plan_graph(gm.graph, settings, ModelContext(model), "forward")


def _op_nodes(gm: torch.fx.GraphModule) -> list[str]:
    return [node.name for node in gm.graph.nodes if node.op == "call_function"]


def test_the_plan_names_every_node_the_instrumenter_reads_and_the_graph_is_unchanged() -> None:
    gm = _traced()
    before = [(node.name, node.target, node.args) for node in gm.graph.nodes]
    plan = _plan(gm, DumpSettings(task="tensor"))
    assert [(node.name, node.target, node.args) for node in gm.graph.nodes] == before
    calls = plan.graph.calls
    assert [call.node for call in calls] == _op_nodes(gm)
    row = {(call.node, slot.io): slot.stat for call in calls for slot in call.slots if slot.kind == "tensor"}
    mm, view, mul, relu = (call.node for call in calls)
    assert row[view, "input"] == row[view, "output"] == row[mm, "output"]  # a view shares its input's row
    assert len({row[mm, "output"], row[mul, "output"], row[relu, "output"]}) == 3
    assert sorted(plan.stat_rows.values()) == list(range(len(plan.stat_rows)))
    inputs = {node.name for node in gm.graph.find_nodes(op="placeholder")}
    assert {node.name for node in plan.stat_rows} == {*inputs, mm, mul, relu}
    host = [node for group in plan.host_groups for node in group]
    assert set(plan.in_graph) | set(host) == set(plan.stat_rows) and not set(plan.in_graph) & set(host)
    assert [plan.stat_rows[node] for node in plan.in_graph] == sorted(plan.stat_rows[node] for node in plan.in_graph)
    outputs = [(call.node, slot.tensor) for call in calls for slot in call.slots if slot.io == "output"]
    assert all(plan.tensors[index].name == node for node, index in outputs)  # what dump_graph is handed
    assert plan.size_sources == [] and plan.graph.sizes.expressions == []  # static shapes


def test_the_plan_dumps_what_the_scene_selects_and_still_counts_every_call() -> None:
    gm = _traced()
    mm, view, mul, relu = _op_nodes(gm)
    plan = _plan(gm, DumpSettings(task="statistics", data_mode="output", nodes=frozenset({mul})))
    assert [call.node for call in plan.graph.calls] == [mul]
    assert [slot.io for slot in plan.graph.calls[0].slots] == ["output"]
    assert plan.graph.n_ops == 4 and sum(plan.graph.counts.values()) == 4
    assert plan.tensors == []  # a statistics dump hands no tensor over
    other_graph = DumpSettings(scene=ModelScene({"model__1": frozenset()}))
    assert _plan(gm, other_graph).graph.calls == []
    assert [call.node for call in _plan(gm, other_graph, "model__1").graph.calls] == [mm, view, mul, relu]


def test_an_attention_kernels_random_number_state_is_described_but_never_read() -> None:
    """The efficient kernel's seed and offset live on the host while their fake values say the
    device: statistics of them in the graph launched a device kernel on host memory (CUDA "invalid
    argument", a Llama training step). Neither the outputs nor the backward's inputs get a row."""
    import operator

    from torch._subclasses.fake_tensor import FakeTensorMode

    aten = torch.ops.aten
    with FakeTensorMode():
        q = torch.empty(1, 2, 8, 16)
        lse = torch.empty(1, 2, 8)
        seed = torch.empty((), dtype=torch.int64)
    graph = torch.fx.Graph()

    def node(target, args, val):  # noqa: ANN001, ANN202
        made = graph.call_function(target, args)
        made.meta["val"] = val
        return made

    inputs = []
    for name in ("q", "k", "v", "grad"):
        inputs.append(graph.placeholder(name))
        inputs[-1].meta["val"] = q
    q_, k_, v_, grad = inputs
    values = (q, lse, seed, seed)
    attention = node(aten._scaled_dot_product_efficient_attention.default, (q_, k_, v_, None, False), values)
    out, logsumexp, philox_seed, philox_offset = (node(operator.getitem, (attention, i), v) for i, v in enumerate(values))
    backward = node(
        aten._scaled_dot_product_efficient_attention_backward.default,
        (grad, q_, k_, v_, None, out, logsumexp, philox_seed, philox_offset, 0.0, [True, True, True, False]),
        (q, q, q, None),
    )
    graph.output((out, node(operator.getitem, (backward, 0), q)))
    plan = plan_graph(graph, DumpSettings(task="statistics"), ModelContext("model__0"), "forward")
    slots = {(call.node, slot.io, slot.arg): slot for call in plan.graph.calls for slot in call.slots}
    forward, back = attention.name, backward.name
    assert slots[forward, "output", "0"].stat is not None and slots[forward, "output", "1"].stat is not None
    for key in ((forward, "output", "2"), (forward, "output", "3"), (back, "input", "7"), (back, "input", "8")):
        assert slots[key].stat is None and "random-number state" in slots[key].note, key
    assert philox_seed not in plan.stat_rows and philox_offset not in plan.stat_rows
    assert out in plan.stat_rows and logsumexp in plan.stat_rows


def test_a_functional_collectives_output_is_read_off_its_wait() -> None:
    """An all-reduce's output holds its result only once waited for: its row, its tensor and its
    golden value are the wait's (read after it), its input keeps its own; an output the graph never
    waits for keeps its own row."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    functional = torch.ops._c10d_functional
    with FakeTensorMode():
        x = torch.empty(4, 8)
    graph = torch.fx.Graph()

    def node(target, args, val=x):  # noqa: ANN001, ANN202
        made = graph.call_function(target, args)
        made.meta["val"] = val
        return made

    placeholder = graph.placeholder("x")
    placeholder.meta["val"] = x
    summed = node(functional.all_reduce.default, (node(torch.ops.aten.relu.default, (placeholder,)), "sum", "0"))
    waited = node(functional.wait_tensor.default, (summed,))
    unwaited = node(functional.all_reduce.default, (waited, "sum", "0"))
    graph.output((node(torch.ops.aten.exp.default, (waited,)), unwaited))

    for settings in (DumpSettings(task="statistics"), DumpSettings(task="tensor"), DumpSettings(dump_stage="original")):
        golden = torch.fx.GraphModule(torch.nn.Module(), graph) if settings.dump_stage == "original" else None
        plan = plan_graph(graph, settings, ModelContext("model__0"), "forward", golden)
        slots = {(call.node, slot.io, slot.arg): slot for call in plan.graph.calls for slot in call.slots}
        first, wait, second = summed.name, waited.name, unwaited.name
        same = [slots[first, "output", "0"], slots[wait, "input", "0"], slots[wait, "output", "0"]]
        if settings.dump_stage == "original":
            assert {slot.source_node for slot in same} == {wait}
            continue
        rows = plan.stat_rows
        assert summed not in rows and waited in rows  # the statistics are taken after the wait
        assert {slot.stat for slot in same} == {rows[waited]}
        assert slots[first, "input", "0"].stat != rows[waited] and slots[second, "output", "0"].stat == rows[unwaited]
        if settings.task == "tensor":
            assert {slot.tensor for slot in same} == {plan.tensors.index(waited)} and summed not in plan.tensors


def test_an_output_the_graph_never_uses_is_described_as_never_materialised() -> None:
    """A multi-output node whose graph uses one output (a ``split`` chunk another rank holds under
    sequence parallelism): the other has no value to read; its record says so (``extra.unread``),
    which compare passes with the reason, where a capture error made a warning."""
    from torchdebug.records import NEVER_MATERIALISED

    gm = make_fx(lambda x: x.split(2)[0].exp())(torch.randn(4))
    gm.graph.eliminate_dead_code()  # as AOT's graphs: no node for the unused chunk
    plan = _plan(gm, DumpSettings(task="statistics"))
    (split,) = [call for call in plan.graph.calls if call.node.startswith("split")]
    slots = {(slot.io, slot.arg): slot for slot in split.slots}
    assert slots["output", "0"].stat is not None and slots["output", "0"].unread is None
    assert slots["output", "1"].unread == NEVER_MATERIALISED and slots["output", "1"].stat is None
    assert slots["output", "1"].note is None  # not a capture error
