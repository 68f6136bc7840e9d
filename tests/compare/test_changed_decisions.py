"""A selection whose integer result differs on inputs that agree is the first divergence: the routing
changed there, and what runs differently after it follows from it.

The model is :mod:`tests.compare.moe`: two mixture-of-experts layers, top-1 routing. Side B's batch
routes token 0 of layer 1 to expert 0, side A's to expert 1, each by a logit gap of 1e-3 (far above
float32 rounding, so no CPU kernel can break the tie another way), with inputs that differ by less
than the tolerance the pair is judged at (1e-2, the order of bf16 round-off). Every other token is
far from a tie.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import torchdebug
from tests.compare.moe import MoENet, moe_batch, train_step

_TOLERANCES = {"float32": 1e-2}
_TOPK = "forward/layer1/aten.topk.default#0/output.1"


@pytest.fixture(scope="module")
def moe_dump(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("moe")
    made: dict[tuple, Path] = {}

    def get(side: int, gap: float = 1e-3, task: str = "statistics", bug: float = 1.0) -> Path:
        key = (side, gap, task, bug)
        if key not in made:
            model = MoENet()
            x = moe_batch(model, side, gap)
            if bug != 1.0:  # a router weight wrong on this side: the flip has a cause upstream
                model.layer1.router.weight.data[1] *= bug
            with torchdebug.dump(root / f"run{len(made)}", model=model, task=task) as debugger:
                train_step(model, x)
            made[key] = debugger.run_dir
        return made[key]

    return get


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_routing_flip_on_inputs_that_agree_is_the_first_divergence(moe_dump, task):
    result = torchdebug.compare(moe_dump(-1, task=task), moe_dump(1, task=task), tolerances=_TOLERANCES)
    first = result.first_divergence
    assert first is not None and first.name == _TOPK
    assert first.message.startswith("the routing changed here: ")
    counted = "1 of 16 elements differ" if task == "tensor" else "at least 1 of 16 elements differ"
    assert counted in first.message
    assert first.module == "layer1" and first.source is not None and "moe.py" in first.source
    topk_input = next(row for row in result.rows if row.name == "forward/layer1/aten.topk.default#0/input.0")
    assert topk_input.verdict == "pass"  # the probabilities agree: the op chose differently
    assert [row.name for row in result.rows if row.verdict == "error"] == [_TOPK]  # one cause only
    reshaped = [row for row in result.rows if row.matched and row.shape_a != row.shape_b]
    assert reshaped  # the experts get other tokens: their calls have other shapes
    assert all((row.verdict, row.attribution) == ("warning", "inherited") for row in reshaped)
    # each follows layer 1's flip, directly or through layer 2's routing of token 0, which carries it
    assert all("follows the routing changed at" in row.message and _TOPK in row.message for row in reshaped)
    layer2 = next(row for row in result.rows if row.name == "forward/layer2/aten.topk.default#0/output.1")
    assert layer2.verdict != "error"  # layer 2 routes token 0 anew: a consequence, not a second cause
    assert not any("differ in shape" in problem for problem in result.problems)


def test_a_routing_that_does_not_flip_stays_clean(moe_dump):
    # both batches route token 0 to expert 0, by gaps of 1e-3 and 2e-3: the inputs differ within tolerance
    result = torchdebug.compare(moe_dump(1, gap=2e-3), moe_dump(1), tolerances=_TOLERANCES)
    assert result.first_divergence is None and not result.diverged
    assert result.counts()["error"] == 0 and result.counts()["warning"] == 0
    assert not any("routing" in row.message for row in result.rows)


def test_a_routing_flip_caused_by_a_weight_that_differs_is_blamed_on_the_weight(moe_dump):
    # A's router weight of expert 1 is 2 % larger: token 0 goes to expert 1, but the router's input
    # (the weight) differs before any op did, so the topk is not a cause
    result = torchdebug.compare(moe_dump(1, bug=1.02), moe_dump(1))
    first = result.first_divergence
    assert first is not None and first.module == "layer1.router" and "differs before any op did" in first.message
    topk = next(row for row in result.rows if row.name == _TOPK)
    assert topk.attribution == "inherited" and not topk.message.startswith("the routing changed")
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]  # the rest follows
    reshaped = [row for row in result.rows if row.matched and row.shape_a != row.shape_b]
    assert reshaped and all(row.attribution == "inherited" for row in reshaped)
    assert all("follows the routing changed at" in row.message and f"blamed on {first.name}" in row.message for row in reshaped)
