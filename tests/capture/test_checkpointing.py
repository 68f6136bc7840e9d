"""Eager capture under activation checkpointing: recomputed forward ops are phase ``recompute``,
named after their own module, and a checkpointed run compares clean against a plain one."""

import functools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import torchdebug
from torchdebug._torch.checkpoint import (
    BOOKKEEPING_CODES,
    BOOKKEEPING_OPS,
    RECOMPUTE_CODES,
    REENTRANT_NODE,
    in_bookkeeping,
    in_recomputation,
)
from torchdebug._torch.nn import WRAPPER_ATTRIBUTES, strip_wrappers
from torchdebug.compare._flow_alignment import aligned_op

FLAVOURS = ("non_reentrant", "reentrant", "wrapper", "selective")
DETACH = "aten.detach.default"


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, dim=2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        out = torch.softmax(scores, dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def _keep_matmuls(ctx, op, *args, **kwargs):
    kept = (torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
    return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE


class TinyGPT(nn.Module):
    """Embedding, pre-norm blocks, a head; ``flavour`` says how the blocks are checkpointed."""

    def __init__(self, flavour: str = "plain", layers: int = 3, width: int = 16, heads: int = 2, vocab: int = 32) -> None:
        super().__init__()
        self.flavour = flavour
        self.tok = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        if flavour in ("wrapper", "selective"):
            context = {"context_fn": functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)}
            for index, block in enumerate(self.blocks):
                self.blocks[index] = checkpoint_wrapper(
                    block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **(context if flavour == "selective" else {})
                )

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            if self.flavour in ("reentrant", "non_reentrant"):
                x = checkpoint(block, x, use_reentrant=self.flavour == "reentrant")
            else:
                x = block(x)
        return self.head(self.ln(x))


def _train_step(flavour: str, path=None, **options):
    """One forward and backward from seed 0; the loss and the gradients by parameter name."""
    torch.manual_seed(0)
    model = TinyGPT(flavour)
    idx = torch.randint(0, 32, (2, 8))

    def run():
        logits = model(idx)
        loss = F.cross_entropy(logits.flatten(0, 1), idx.flatten())
        loss.backward()
        return loss.detach()

    if path is None:
        loss = run()
    else:
        with torchdebug.dump(path, model=model, **options):
            loss = run()
    return loss, {strip_wrappers(name): param.grad for name, param in model.named_parameters()}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """A captured step of the plain model and of each checkpointed flavour, and the warnings seen."""
    root = tmp_path_factory.mktemp("checkpointing")
    out = {}
    for flavour in ("plain", *FLAVOURS):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, grads = _train_step(flavour, root / flavour)
        out[flavour] = {"path": root / flavour, "loss": loss, "grads": grads, "warnings": [str(w.message) for w in caught]}
    return out


def _records(dump):
    return torchdebug.load(dump["path"]).ranks[0].records()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_loss_and_gradients_are_bit_identical_with_capture_on_and_off(dumps, flavour):
    loss, grads = _train_step(flavour)
    assert torch.equal(dumps[flavour]["loss"], loss)
    assert grads.keys() == dumps[flavour]["grads"].keys()
    assert all(torch.equal(grads[name], dumps[flavour]["grads"][name]) for name in grads)
    plain_loss, plain_grads = _train_step("plain")  # the checkpointed run computes the same bits
    assert torch.equal(plain_loss, loss) and all(torch.equal(plain_grads[name], grads[name]) for name in grads)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_checkpointed_run_compares_clean_against_a_plain_one(dumps, flavour):
    result = torchdebug.compare(dumps[flavour]["path"], dumps["plain"]["path"])
    coverage = result.coverage()
    for side in "ab":
        assert coverage[side]["matched"] >= 0.98 * coverage[side]["rows"], result.summary()
    assert set(coverage["a"]["other_phases"]) == {"recompute"} and not coverage["b"]["other_phases"]
    assert not [row.name for row in result.rows if row.verdict == "error"]
    assert result.first_divergence is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_recomputed_ops_are_forward_ops_of_their_own_module_and_line(dumps, flavour):
    records = _records(dumps[flavour])
    calls = {r.call_name: r for r in records}
    # checkpoint's bookkeeping (detaching what it keeps or rebuilds, torch 2.11's empty tensors) aside
    recomputed = [r for r in records if r.phase == "recompute" and r.io == "output" and r.op not in BOOKKEEPING_OPS]
    assert recomputed
    modules = {r.module for r in recomputed}
    assert {"blocks.0.ln1", "blocks.2.attn", "blocks.1.fc"} <= modules
    assert all(m.startswith("blocks.") for m in modules)
    assert {r.op for r in recomputed} >= {"aten.native_layer_norm.default", "aten._softmax.default", "aten.gelu.default"}
    for record in recomputed:  # each names the forward call it repeats: same op, module and line
        forward = calls[record.fwd]
        assert (forward.phase, forward.op, forward.module, forward.source) == ("forward", record.op, record.module, record.source)
        assert "test_checkpointing.py" in record.source
    if flavour == "selective":  # the matmuls it kept are not run again
        assert not {"aten.addmm.default", "aten.bmm.default"} & {r.op for r in recomputed}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_backward_calls_are_numbered_as_without_checkpointing(dumps, flavour):
    def backward(records):
        # autograd detaches a saved output when it unpacks it; a checkpoint's saved tensors are all
        # rebuilt, and those detaches are phase recompute; a reentrant region's nested backward sums
        # gradients out of place where the engine sums them in place (aligned as the same op)
        named = (r for r in records if r.phase == "backward" and r.op != DETACH)
        return {r.name.replace(r.op, aligned_op(r.op)): r.fwd for r in named}

    assert backward(_records(dumps[flavour])) == backward(_records(dumps["plain"]))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_no_wrapper_name_in_module_paths_and_no_warning(dumps, flavour):
    records = _records(dumps[flavour])
    assert not [r.name for r in records if any(name in r.name for name in WRAPPER_ATTRIBUTES)]
    assert {r.module for r in records if r.phase != "recompute"} == {r.module for r in _records(dumps["plain"])}
    assert dumps[flavour]["warnings"] == []


def test_two_checkpointed_runs_name_their_recomputation_alike(dumps, tmp_path):
    _train_step("selective", tmp_path)
    again = [r.name for r in torchdebug.load(tmp_path).ranks[0].records()]
    assert again == [r.name for r in _records(dumps["selective"])]


@pytest.mark.parametrize("flavour", ["non_reentrant", "wrapper"])
def test_module_records_of_a_recomputed_call_are_phase_recompute(tmp_path, flavour):
    _train_step(flavour, tmp_path / "a", level="mix")
    _train_step("plain", tmp_path / "b", level="mix")
    records = torchdebug.load(tmp_path / "a").ranks[0].records()
    modules = [r for r in records if r.op == "module"]
    assert {r.module for r in modules if r.phase == "recompute"} >= {"blocks.0", "blocks.2.attn.qkv"}
    plain = torchdebug.load(tmp_path / "b").ranks[0].records()

    def names(records):
        return sorted(r.name for r in records if r.op == "module" and r.phase != "recompute")

    assert names(records) == names(plain)


def test_a_forward_that_raises_leaves_no_warning_and_the_module_path_right(tmp_path):
    class Failing(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.failing = Failing()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            try:
                self.failing(x)
            except ValueError:
                pass
            return self.fc(x).exp()

    model = Model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torchdebug.dump(tmp_path, model=model, level="mix"):
            model(torch.randn(1, 2))
    assert [str(w.message) for w in caught] == []
    records = torchdebug.load(tmp_path).ranks[0].records()
    assert {r.module for r in records if r.op == "aten.exp.default"} == {"<root>"}
    assert not [r for r in records if r.module == "failing" and r.io == "output"]


def test_wrapper_attribute_names_are_left_out_of_paths(tmp_path):
    class Wrapper(nn.Module):  # shaped like FSDP1's wrapper: the module it stands for is its only child
        def __init__(self, module):
            super().__init__()
            self._fsdp_wrapped_module = module

        def forward(self, x):
            return self._fsdp_wrapped_module(x)

    model = nn.Sequential(Wrapper(nn.Linear(2, 2)), nn.ReLU())
    with torchdebug.dump(tmp_path, model=model, level="mix"):
        model(torch.randn(1, 2, requires_grad=True)).sum().backward()
    records = torchdebug.load(tmp_path).ranks[0].records()
    assert {r.module for r in records if r.op == "aten.addmm.default"} == {"0"}
    assert {r.module for r in records if r.io == "parameter_grad"} == {"0"}
    assert [r.name for r in records if r.op == "module" and r.phase == "forward" and r.io == "output"] == [
        "forward/0/module#0/output.0",
        "forward/1/module#0/output.0",
        "forward/<root>/module#0/output.0",
    ]
    assert strip_wrappers("_orig_mod.h.0._checkpoint_wrapped_module.attn") == "h.0.attn"


def test_the_checkpoint_internals_eager_capture_relies_on_exist():
    assert len(RECOMPUTE_CODES) == 1 and RECOMPUTE_CODES[0].co_name == "recompute_fn"
    assert REENTRANT_NODE.__name__ == "CheckpointFunctionBackward"
    names = {code.co_name for code in BOOKKEEPING_CODES}
    assert names & {"_maybe_detach", "_detach_helper"} and "_checkpoint_without_reentrant_generator" in names


def test_symbolized_frames_tell_checkpoint_functions_by_file_name_and_line():
    """The native path judges the frames the observer took: a line of ``recompute_fn``'s body is in
    it, the same name on a line outside it or in another file is not."""
    code = RECOMPUTE_CODES[0]
    body = [line for _, _, line in code.co_lines() if line is not None]
    inside = (code.co_filename, max(body), "recompute_fn")
    assert in_recomputation([("user.py", 3, "forward"), inside])
    assert not in_recomputation([(code.co_filename, max(body) + 200, "recompute_fn"), ("other.py", max(body), "recompute_fn")])
    assert not in_bookkeeping([inside])
