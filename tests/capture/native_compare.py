"""What the comparisons of the two capture paths share: what a dispatch mode changes in what torch
runs, undone on its records so that they compare with the native path's (``docs/architecture.md``,
the native path; ``tests/test_native_observer.py`` pins the list), the example GPT's training, and
how a test holds capture on the dispatch mode."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from itertools import groupby

import pytest
import torch
from torch import nn

import torchdebug.debugger
from examples.gpt import GPT, GPTConfig, make_batch, train_step
from torchdebug.records import Record, make_name


def on_the_dispatch_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold the Debuggers built from now on (``torchdebug.dump`` included) on the dispatch mode, the
    native kernels still on: the native path is the default, and ``TORCHDEBUG_NATIVE=0`` would take
    statistics with torch ops, which round otherwise than stats.c, so the two paths' statistics would
    no longer be bit-equal."""
    monkeypatch.delenv("TORCHDEBUG_NATIVE", raising=False)
    monkeypatch.setattr(torchdebug.debugger, "why_not_native", lambda config, model: "the test holds it on the dispatch mode")


def gpt_training(device: str = "cpu") -> tuple[nn.Module, Callable[[], None]]:
    """The example GPT (2 layers, width 32), AdamW and a batch, seeded, on ``device``: the model and its step."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(config, batch=2, device=device)
    return model, lambda: train_step(model, optimizer, batch)


def loss_training(
    build: Callable[[], nn.Module], *, width: int = 4, micro_batches: int = 1
) -> tuple[nn.Module, Callable[[], None]]:
    """``build()``'s model, seeded, whose forward returns a loss of a batch of three rows of ``width``,
    trained by SGD with ``micro_batches`` backward passes a step: the model and its step."""
    torch.manual_seed(0)
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, width)

    def step() -> None:
        for _ in range(micro_batches):
            model(x).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


_DETACH, _VIEW, _RESHAPE_ALIAS = "aten.detach.default", "aten.view.default", "aten._reshape_alias.default"
_ADD, _ADD_ = "aten.add.Tensor", "aten.add_.Tensor"
_MODE_ONLY_CALLS = {_DETACH}
"""Calls only a dispatch mode makes: the ``detach`` autograd saves an output through, the one it
unpacks it through, and ``AccumulateGrad``'s of a gradient summed out of place (``docs/architecture.md``,
the native observer)."""
_SCATTER, _INDEX_PUT = "aten.scatter.src", "aten.index_put.default"
_MODE_RENAMES = {
    _VIEW: _RESHAPE_ALIAS,
    _ADD: _ADD_,
    _INDEX_PUT: "aten._index_put_impl_.default",
    "aten.new_zeros.default": "aten.zeros.default",
    _SCATTER: "aten.scatter_.src",
}
"""Ops a dispatch mode runs in place of others: ``reshape`` takes ``view`` for ``_reshape_alias`` while a
mode is active (``at::isTensorSubclassLike``), forward and backward; gradients summed in the engine's
input buffer are added out of place (backward); indexing's backward puts the gradient into zeros
out of place (``index_backward``: ``index_put`` for ``_index_put_impl_``); a selection's backward
(``value_selecting_reduction_backward``: topk, max, sort) makes its zeros with ``new_zeros`` and
scatters into them out of place."""
_ANY_PHASE = {_VIEW, _ADD}
"""Of those, the ones the mode changes in the forward too: ``reshape``'s ``view``, and ``linear``'s bias
added out of place to the product of a 3-D input that is not contiguous (``nn.MultiheadAttention``'s
projections, a GRU's cells)."""
_FACTORIES = {"aten.zeros.default"}
"""Of those, the ones that take no tensor without the mode."""
_OUT_OF_PLACE = {_ADD, _SCATTER, _INDEX_PUT}
"""Of those, the ones whose output is, without the mode, their first argument written in place."""


def _in_place_of(op: str, native: str | None) -> bool:
    """Whether ``native`` is ``op``'s in-place form (``aten.sub_.Tensor`` of ``aten.sub.Tensor``): what a
    composite kernel that checks ``at::isTensorSubclassLike`` runs without a mode where, under one, it
    runs ``op`` (``binary_cross_entropy_with_logits``'s ``sub_`` and ``mul_``)."""
    namespace, _, rest = op.partition(".")
    name, _, overload = rest.partition(".")
    return native == f"{namespace}.{name}_.{overload}"


def call_groups(records: list[Record]) -> list[list[Record]]:
    return [list(call) for _, call in groupby(records, key=lambda record: record.call_name)]


def _followed_by(calls: list[list[Record]], kept: set[int]) -> dict[str, str]:
    """By the name of each call the mode alone made, the kept call after it (``kept``: their ids): a
    mode-only ``detach`` that was the first call to follow an autograd node claimed it, for the
    backward ops that run it (``OpCapture._remember``), as the call after it does without the mode
    (the first run of a compiled block's graph, whose node no op of its own makes)."""
    followed: dict[str, str] = {}
    waiting: list[str] = []
    for call in calls:
        if id(call) not in kept:
            waiting.append(call[0].call_name)
            continue
        followed |= dict.fromkeys(waiting, call[0].call_name)
        waiting.clear()
    return followed


def without_mode(python: list[Record], native: list[Record]) -> tuple[list[tuple[Record, str, str]], dict[int, int]]:
    """Eager capture's tensor records with the mode's own calls undone by the rule above, as
    ``(record, name, fwd)``: the name and ``fwd`` it would have had without them (calls renumbered);
    and the value ids that name, without the mode, another tensor: a mode-only ``detach``'s output is
    its input, an out-of-place gradient sum's output the buffer summed into in place. Fails on any
    other difference in the calls' order."""
    calls = call_groups(python)
    # calls told by op and module: a mode-only detach among the AccumulateGrad detaches of parameters;
    # and by source line where both dumps took stacks: among a recomputation's (the mode's unpacks in
    # its backward, at the backward's line)
    lines = any(r.source for r in python) and any(r.source for r in native)
    want_ops = [(call[0].op, call[0].module, call[0].source if lines else None) for call in calls]
    got_ops = [(call[0].op, call[0].module, call[0].source if lines else None) for call in call_groups(native)]
    kept: list[tuple[list[Record], str]] = []
    aliases: dict[int, int] = {}
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, want_ops, got_ops, autojunk=False).get_opcodes():
        if tag == "equal":
            kept += [(call, call[0].op) for call in calls[a0:a1]]
            continue
        real = [call for call in calls[a0:a1] if call[0].op not in _MODE_ONLY_CALLS]
        ops = [
            _MODE_RENAMES.get(call[0].op) if call[0].phase == "backward" or call[0].op in _ANY_PHASE else None for call in real
        ]
        if len(real) == b1 - b0:  # a composite kernel's step taken out of place under the mode
            natives = [got for got, _, _ in got_ops[b0:b1]]
            ops = [got if op is None and _in_place_of(call[0].op, got) else op for op, call, got in zip(ops, real, natives)]
        if [(op, call[0].module, call[0].source if lines else None) for op, call in zip(ops, real)] != got_ops[b0:b1]:
            raise AssertionError(f"{tag}: eager {want_ops[a0:a1]} against native {got_ops[b0:b1]}")
        kept += zip(real, ops)
        in_place = {id(call) for call, op in zip(real, ops) if _in_place_of(call[0].op, op)}
        for call in calls[a0:a1]:
            if call[0].op in _MODE_ONLY_CALLS or call[0].op in _OUT_OF_PLACE or id(call) in in_place:
                source = next((r.value_id for r in call if r.io == "input" and r.arg == "0"), None)
                if source is not None:  # (inputs filtered out: the ids stay the mode's, as ``joins`` allows)
                    aliases |= {r.value_id: aliases.get(source, source) for r in call if r.io == "output"}
    changed = {(call[0].phase, call[0].module, name) for call, op in kept if op != call[0].op for name in (op, call[0].op)}
    changed |= {(call[0].phase, call[0].module, call[0].op) for call in calls if call[0].op in _MODE_ONLY_CALLS}
    """Keys (phase, module, op) whose calls the mode's own calls renumber; the others keep their indices
    (with filters, calls outside the records count too)."""
    counts: dict[tuple[str, str, str], int] = {}
    renamed: dict[str, tuple[str, int]] = {}
    """By call name: the op and call index without the mode."""
    for call, op in kept:
        key = (call[0].phase, call[0].module, op)
        renamed[call[0].call_name] = (op, counts.get(key, 0) if key in changed else call[0].call)
        counts[key] = renamed[call[0].call_name][1] + 1
    new_names = {name: f"{name.rpartition('/')[0]}/{op}#{index}" for name, (op, index) in renamed.items()}
    new_names |= {name: new_names[after] for name, after in _followed_by(calls, {id(call) for call, _ in kept}).items()}
    expected = [
        (r, make_name(r.phase, r.module, *renamed[r.call_name], r.io, r.arg), new_names.get(r.fwd, r.fwd))
        for call, op in kept
        for r in call
        if not (op in _FACTORIES and r.io == "input")  # the tensor new_zeros takes its options from
    ]
    return expected, aliases
