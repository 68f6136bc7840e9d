"""The seam around compiled AOT graphs' calls (torchdebug._torch.compiled_graphs): each run is seen
with its inputs before the graph frees them and with what it returned; inductor's compiled graph
keeps its type, which AOT autograd reads."""

from __future__ import annotations

from typing import Any

import torch

from torchdebug._torch.compiled_graphs import calls_around
from torchdebug._torch.dynamo import caches_disabled, make_boxed_func
from torchdebug._torch.inductor import compile_fx, compile_fx_inner


def _watching(seen: list[tuple[str, Any]]) -> tuple[Any, Any]:
    return (lambda inputs: seen.append(("before", list(inputs))), lambda outputs: seen.append(("after", outputs)))


def test_a_boxed_function_stays_boxed_and_each_run_is_seen_before_and_after() -> None:
    seen: list[tuple[str, Any]] = []
    compiled = calls_around(make_boxed_func(lambda x: (x * 2,)), *_watching(seen))
    assert compiled._boxed_call
    x = torch.ones(2)
    (y,) = compiled([x])
    assert seen[0][0] == "before" and seen[0][1][0] is x
    assert seen[1][0] == "after" and seen[1][1][0] is y


def test_a_function_that_is_not_boxed_is_left_as_it_is() -> None:
    def plain(x: torch.Tensor) -> torch.Tensor:
        return x

    assert calls_around(plain, print, print) is plain


def test_inductors_compiled_graph_keeps_its_type_and_shows_its_inputs_before_it_frees_them() -> None:
    seen: list[tuple[str, Any]] = []
    kinds: list[type] = []

    def inner(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        kind = type(compiled)
        wrapped = calls_around(compiled, *_watching(seen))
        kinds.append(type(wrapped))
        assert type(wrapped) is kind
        return wrapped

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x + 1).relu()

    x = torch.randn(3)
    compiled = torch.compile(f, backend=lambda gm, inputs: compile_fx(gm, inputs, inner_compile=inner))
    with torch.no_grad(), caches_disabled():  # a cached graph skips inner_compile
        y = compiled(x)
    assert kinds and seen[0][0] == "before" and any(t is x for t in seen[0][1])
    assert seen[-1][0] == "after" and any(t is y for t in seen[-1][1])
