"""The smallest graph around a wrong node that still shows the problem: the node alone, a region
ending at it, or its graph; and a backward bug in a UNet that only shows with its neighbour, found
and reproduced end to end.

The region tests cut ATen graphs traced with ``make_fx`` and judge regions with a stand-in for a
compile (fails when the region holds a given node), so they run in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchdebug.diagnose as td
from tests.diagnose.models import ScatterReadTooEarly, line_of
from tests.diagnose.test_planted_bugs import assert_repro_fails
from tests.diagnose.unet import tiny_unet
from torchdebug.diagnose._region import prefix, region, smallest_failing_region

UNET = str(Path(__file__).with_name("unet.py"))


def _chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = (x @ w).sin()
    return (y.cos() * 2 + y).exp().neg()


@pytest.fixture
def chain() -> tuple[torch.fx.GraphModule, dict[str, Any]]:
    args = (torch.randn(3, 4), torch.randn(4, 4))
    gm = make_fx(_chain)(*args)
    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            values[n.name] = super().run_node(n)
            return values[n.name]

    Recorder(gm).run(*args)
    return gm, values


def _node(gm: torch.fx.GraphModule, target: Any) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.target is target)


class _Verdict:
    def __init__(self, failed: bool) -> None:
        self.failed = failed


def _fails_with(name: str, calls: list[list[str]]) -> Callable[[torch.fx.GraphModule, list[Any]], _Verdict]:
    """A stand-in judge: a graph fails when it computes node ``name`` (a bug that needs that neighbour)."""

    def judge(gm: torch.fx.GraphModule, inputs: list[Any]) -> _Verdict:
        computed = [n.name for n in gm.graph.nodes if n.op == "call_function"]
        calls.append(computed)
        return _Verdict(name in computed)

    return judge


def test_a_region_of_depth_two_holds_the_node_and_its_producers_and_computes_the_same_value(chain: Any) -> None:
    gm, values = chain
    exp = _node(gm, torch.ops.aten.exp.default)
    cut = region(gm, exp, values, depth=2)
    assert cut is not None
    sub, inputs = cut
    computed = [n.target for n in sub.graph.nodes if n.op == "call_function"]
    assert computed == [torch.ops.aten.add.Tensor, torch.ops.aten.exp.default]
    assert set(inputs) == {"mul", "sin"}  # what the add reads, fed the run's values
    assert torch.equal(sub(*inputs.values())[0], values[exp.name])


def test_the_smallest_failing_region_is_the_shallowest_that_holds_what_the_bug_needs(chain: Any) -> None:
    gm, values = chain
    neg = _node(gm, torch.ops.aten.neg.default)
    calls: list[list[str]] = []
    found = smallest_failing_region(gm, neg, values, _fails_with("cos", calls))
    assert found is not None and found.fails and found.depth == 5  # neg <- exp <- add <- mul <- cos
    assert "cos" in computed_by(found) and found.describe("neg") == f"a region of {found.nodes} nodes ending at neg"
    assert len(calls) == 4  # depth 1, 2, 4, then 5 (every ancestor: no deeper region exists)


def computed_by(found: Any) -> list[str]:
    return [n.name for n in found.gm.graph.nodes if n.op == "call_function"]


def test_the_node_alone_is_kept_when_it_fails_alone(chain: Any) -> None:
    gm, values = chain
    neg = _node(gm, torch.ops.aten.neg.default)
    calls: list[list[str]] = []
    found = smallest_failing_region(gm, neg, values, _fails_with("neg", calls))
    assert found is not None and found.fails and found.depth == 1 and len(calls) == 1
    assert found.describe("neg") == "the node alone"


def test_when_no_region_fails_the_shortest_failing_prefix_is_found_and_else_the_node_alone_comes_back(chain: Any) -> None:
    gm, values = chain  # mm, sin, cos, mul, add, exp, neg
    cos = _node(gm, torch.ops.aten.cos.default)
    tried: list[int] = []

    def larger(count: int) -> tuple[torch.fx.GraphModule, dict[str, Any]]:
        tried.append(count)
        return prefix(gm, count), {}

    found = smallest_failing_region(gm, cos, values, lambda g, i: _Verdict(False), larger)
    assert found is not None and not found.fails and found.depth == 1
    assert tried == [3, 4, 6, 7]  # 0, 1, 3 nodes after cos, then the whole graph

    tried.clear()
    found = smallest_failing_region(gm, cos, values, _fails_with("exp", []), larger)  # the bug needs a later node
    assert found is not None and found.fails and found.depth is None and not found.whole
    assert (
        computed_by(found)[-1] == "exp"
        and found.describe("cos") == "the graph's first 6 nodes, cos among them (every value an output)"
    )
    assert tried == [3, 4, 6, 5]  # 0, 1, 3 nodes after cos, then bisection between 1 and 3


@pytest.mark.slow  # inductor compiles the UNet's training step, then a few small graphs: about a minute on 2 cores
def test_a_backward_bug_in_a_unet_that_needs_its_neighbour_is_localised_and_its_repro_fails(tmp_path: Path) -> None:
    model, inputs = tiny_unet()
    with torch._inductor.config.patch(post_grad_custom_post_pass=ScatterReadTooEarly()):
        report = td.diagnose(model, *inputs, output_dir=tmp_path)
    assert report.stage == "inductor" and report.kind == "accuracy", report.summary()
    assert report.skipped == ["aot_eager", "aot_eager_decomp_partition"]  # inductor's own values name the node
    finding = report.finding
    assert finding is not None and finding.phase == "backward", report.summary()
    # the first reader of the scatter: the div by output_scale_factor (torch 2.13), or the shortcut
    # convolution's backward where torch drops a div by 1.0 (2.14)
    assert finding.target in ("aten.div.Tensor", "aten.convolution_backward.default"), report.summary()
    assert report.module is not None and report.module.startswith("up_blocks.0.resnets.1")
    lines = {f"{UNET}:{line_of(marker, UNET)} in forward" for marker in ("OUTPUT LINE", "SHORTCUT LINE")}
    assert report.source in lines, report.summary()
    # the reader alone is compiled right; the repro holds the scatter that feeds it too
    assert finding.reproduced and finding.scope.startswith("a region of") and finding.scope.endswith(f"ending at {report.node}")
    assert "index_put" in report.repro_path.read_text()
    assert_repro_fails(report, f"REPRO: {report.node}")  # its value (or first output) is wrong
