"""Graph dumps of models compiled with dynamic shapes hold the sizes that ran (issue 26, items 3-5).

A tiny Llama-style model (embedding, RMSNorm, fused QKV, SDPA) runs at three sequence lengths, as
compiled with automatic dynamic shapes (the second length recompiles with symbolic sizes),
``dynamic=True`` and ``mark_dynamic``: every record line parses, shapes, strides and size arguments
are those of the run, and ``torchdebug.compare`` pairs the records with an eager dump of the same
lengths. ``aot_eager`` keeps these short; one test runs inductor, which hands the sizes over from
its generated code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sympy
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import torchdebug
from torchdebug._torch import symbolic
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump import _planner as planner
from torchdebug.graph_dump._capture import GraphCapture
from torchdebug.graph_dump._run import GraphRun
from torchdebug.store._reader import RankDump

LENGTHS = (32, 16, 24)
BATCH, WIDTH, HEADS, VOCAB = 2, 16, 2, 32


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, HEADS, -1).transpose(1, 2) for t in self.qkv(x).split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class TinyLlama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.RMSNorm(WIDTH)
        self.attn = Attention()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.attn(self.norm(x))
        return F.cross_entropy(self.head(x).flatten(0, 1), tokens.flatten())


def _tokens(length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(length))


def _eager_dump(path: Path) -> None:
    torch.manual_seed(0)
    model = TinyLlama()
    debugger = torchdebug.Debugger(path, task="statistics")
    for length in LENGTHS:
        debugger.start(model)
        model(_tokens(length)).backward()
        model.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()


def _backend(path: Path, backend_name: str) -> torchdebug.compile._backend.TorchDebugBackend:
    """A statistics dump of every node into ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    config = CompilerConfig(backend=backend_name)
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = "statistics"
    return get_backend(config)


def _compiled_dump(path: Path, dynamic: bool | None = None, mark: bool = False, backend_name: str = "aot_eager") -> Path:
    torch.manual_seed(0)
    model = TinyLlama()
    backend = _backend(path, backend_name)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    for length in LENGTHS:
        tokens = _tokens(length)
        if mark:
            torch._dynamo.mark_dynamic(tokens, 1)
        compiled(tokens).backward()
        model.zero_grad()  # else the next length reads as a micro-batch of this step
    backend.data_dump.close()
    return backend.data_dump.rank_dir


def _lines(rank_dir: Path) -> list[dict]:
    """Every record as its JSON object (no batch may be skipped)."""
    dump = RankDump.open(rank_dir)
    records = dump.records()
    assert not dump.truncated
    return [record.to_json() for record in records]


def _concrete(value: object) -> bool:
    if isinstance(value, list):
        return all(_concrete(item) for item in value)
    return value is None or isinstance(value, (int, float, bool)) or (isinstance(value, str) and not value[:1].isalpha())


def _check_sizes_ran(records: list[dict]) -> None:
    """Shapes, strides and size arguments of each step are the concrete ones of its length."""
    assert {r["step"] for r in records} == {0, 1, 2}
    for record in records:
        for key in ("shape", "stride"):
            assert all(isinstance(size, int) for size in record.get(key) or []), record
        if record["kind"] == "value" and isinstance(record.get("value"), list):
            assert _concrete(record["value"]), record
    for step, length in enumerate(LENGTHS):
        by_name = {r["name"]: r for r in records if r["step"] == step}
        embedded = by_name["forward/embed/aten.embedding.default#0/output.0"]
        assert embedded["shape"] == [BATCH, length, WIDTH] and embedded["stride"] == [length * WIDTH, WIDTH, 1]
        qkv = by_name["forward/attn.qkv/aten.addmm.default#0/output.0"]
        assert qkv["shape"] == [BATCH * length, 3 * WIDTH]
        sizes = by_name["forward/attn/aten.view.default#0/input.1"]["value"]  # q.view(batch, length, heads, -1)
        assert sizes == [BATCH, length, HEADS, -1]
        grad = by_name["backward/attn.qkv/aten.mm.default#0/output.0"]
        assert grad["shape"] in ([BATCH * length, WIDTH], [3 * WIDTH, WIDTH])


def _check_pairs_with_eager(graph_dump: Path, eager_dump: Path) -> None:
    result = torchdebug.compare(graph_dump, eager_dump)
    counts = result.counts()
    assert counts["error"] == 0, result.summary()
    paired = [row for row in result.rows if row.match == "exact" and row.kind == "tensor"]
    for step, length in enumerate(LENGTHS):
        rows = {row.name: row for row in paired if row.step == step}
        assert len(rows) >= 40, (step, len(rows))
        assert all(row.shape_a == row.shape_b for row in rows.values())
        for row in rows.values():  # means divide by the element count of the run
            mean_a, mean_b = (record.stats["mean"] if record.stats else None for record in (row.record_a, row.record_b))
            assert (mean_a is None) == (mean_b is None), row.name
            assert mean_a is None or abs(mean_a - mean_b) <= 1e-4 * (1 + abs(mean_b)), (row.name, mean_a, mean_b)
        qkv = rows["forward/attn.qkv/aten.addmm.default#0/output.0"]
        assert qkv.shape_a == [BATCH * length, 3 * WIDTH] and qkv.verdict == "pass", qkv
        sdpa = next(row for name, row in rows.items() if "scaled_dot_product" in name and name.endswith("output.0"))
        assert sdpa.shape_a == [BATCH, HEADS, length, WIDTH // HEADS] and sdpa.verdict == "pass", sdpa


@pytest.fixture(scope="module")
def eager_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("eager")
    _eager_dump(path)
    return path


@pytest.mark.parametrize(
    ("dynamic", "mark"),
    [(None, False), (True, False), (None, True)],
    ids=["automatic-dynamic-after-a-recompile", "dynamic-true", "mark-dynamic"],
)
def test_records_of_a_dynamic_shape_graph_hold_the_sizes_that_ran_and_pair_with_eager(
    dynamic: bool | None, mark: bool, tmp_path: Path, eager_dump: Path
) -> None:
    rank_dir = _compiled_dump(tmp_path / "compiled", dynamic=dynamic, mark=mark)
    records = _lines(rank_dir)
    graphs = [{r["extra"]["graph"] for r in records if r["step"] == step} for step in range(3)]
    assert graphs[1] == graphs[2]  # one graph with symbolic sizes ran both lengths
    _check_sizes_ran(records)
    _check_pairs_with_eager(tmp_path / "compiled", eager_dump)


def test_statistics_taken_in_the_graph_count_the_elements_of_the_run(
    tmp_path: Path, eager_dump: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every value's statistics in the graph: the host divides by the element count of the run,
    not by the one the graph was traced with (and the graph counts no values itself)."""
    monkeypatch.setattr(planner, "_host_stats", lambda value: False)
    rank_dir = _compiled_dump(tmp_path / "compiled", dynamic=True)
    _check_sizes_ran(_lines(rank_dir))
    _check_pairs_with_eager(tmp_path / "compiled", eager_dump)


def test_a_runs_records_queued_as_columns_equal_its_records_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The records of a run are queued as columns made once per template (the sizes that ran, the
    call indices and seq numbers), filled with each run's statistics and value ids: they equal the
    records written one record object a slot, over steps whose sizes change the template."""
    by_columns = _compiled_dump(tmp_path / "columns", dynamic=True)
    runs = []

    def one_by_one(capture: GraphCapture, run: GraphRun, template: object, rows: list[dict]) -> None:
        runs.append(run)
        capture._write_records(run, template, range(len(run.plan.calls)), rows, [])

    monkeypatch.setattr(GraphCapture, "_write_columns", one_by_one)
    by_records = _compiled_dump(tmp_path / "records", dynamic=True)
    assert len(runs) >= 6  # forward and backward of three steps: every run took the column path above
    columns, records = _lines(by_columns), _lines(by_records)
    for record in columns + records:  # the graph's name counts the compiles of the process
        record["extra"]["graph"] = record["extra"]["graph"].split("__")[-1].split("/")[-1]
    assert columns == records and {r["step"] for r in columns} == {0, 1, 2}
    assert sum(r.get("value_id") is not None for r in columns) > len(columns) // 2


def test_inductor_hands_the_symbolic_sizes_over_from_its_generated_code(tmp_path: Path) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).sum(-1)

    backend = _backend(tmp_path, "inductor")
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    w = torch.randn(8, 4)
    for rows in (5, 3, 7):
        compiled(torch.randn(rows, 8), w)
    backend.data_dump.close()
    records = _lines(backend.data_dump.rank_dir)
    mm = [r for r in records if r["name"] == "forward/-/aten.mm.default#0/output.0"]
    assert [(r["step"], r["shape"], r["stride"]) for r in mm] == [(0, [5, 4], [4, 1]), (1, [3, 4], [4, 1]), (2, [7, 4], [4, 1])]
    assert [r["stats"]["mean"] for r in mm if r["step"] == 2][0] is not None


def test_symbolic_expressions_evaluate_with_the_values_of_their_symbols() -> None:
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    from torch.utils._sympy.functions import FloorDiv

    values = symbolic.evaluate([2 * s0, s0 * s1 + 1, FloorDiv(s0, 2), sympy.Max(s0, s1), s1], {s0: 6})
    assert values[:4] == [12, "s0*s1 + 1", 3, "Max(s0, s1)"] and values[4] == "s1"
    assert symbolic.evaluate([sympy.Max(s0, s1)], {s0: 2, s1: 5}) == [5]


def test_the_original_stage_interprets_a_graph_whose_inputs_include_symbolic_ints(tmp_path: Path) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).relu().sum(0) / x.shape[0]  # the graph reads its symbolic-int input

    path = tmp_path / "original"
    path.mkdir()
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = "tensor"
    config.dump_config.dump_stage = "original"
    backend = get_backend(config)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    inputs = [torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows)) for rows in (5, 3, 7)]
    for x in inputs:
        compiled(x)
    backend.data_dump.close()
    run = torchdebug.load(backend.data_dump.run_dir).ranks[0]
    relu = [r for r in run.records() if r.name == "forward/-/aten.relu.default#0/output.0"]
    assert [(r.step, r.shape) for r in relu] == [(0, [5, 4]), (1, [3, 4]), (2, [7, 4])]
    for record, x in zip(relu, inputs):
        torch.testing.assert_close(run.load_tensor(record), (x * 2).relu())


def test_the_symbolic_size_and_compile_id_seams_read_what_dynamo_hands_a_backend() -> None:
    """``torchdebug._torch.symbolic`` and ``guards`` on the running torch: a symbolic size's
    expression and traced value, and the frame of the compile in progress."""
    from torchdebug._torch import guards

    seen: dict[str, object] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        size = next(value for value in example_inputs if isinstance(value, torch.SymInt))
        seen.update(symbolic=symbolic.is_symbolic(size), hint=symbolic.hint(size, -1), frame=guards.current_frame())
        seen["expression"] = symbolic.expression(size)
        seen["doubled"] = symbolic.evaluate([symbolic.expression(size * 2)], {seen["expression"]: 7})
        return gm.forward

    torch.compile(lambda x: x * 2, backend=backend, dynamic=True)(torch.randn(5, 3))
    assert seen["symbolic"] and seen["hint"] in (5, 3) and isinstance(seen["expression"], sympy.Symbol)
    assert seen["doubled"] == [14] and str(seen["frame"]).isdigit()
    assert guards.current_frame() is None and not symbolic.is_symbolic(5) and symbolic.hint(5, -1) == 5
