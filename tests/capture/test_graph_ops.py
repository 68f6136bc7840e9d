"""Sink keys: deterministic across processes, never shared by two sinks of one process."""

from __future__ import annotations

import subprocess
import sys

import torch

from torchdebug.graph_dump._runtime import dump_graph, register_sink, unregister_sink


class _Sink:
    def __init__(self) -> None:
        self.runs: list[tuple[list[torch.Tensor], list[str]]] = []

    def on_graph(self, stats: list[torch.Tensor], tensors: list[torch.Tensor], labels: list[str]) -> None:
        self.runs.append((tensors, labels))

    def on_point(self, point: int, tensors: list[torch.Tensor]) -> None:
        return None


_KEYS = "from torchdebug.graph_dump._runtime import register_sink as r; print(r(None, 'g'), r(None, 'g'), r(None, 'h'))"


def test_sink_keys_are_the_same_in_every_fresh_process() -> None:
    first, second = (
        subprocess.run([sys.executable, "-c", _KEYS], capture_output=True, text=True, timeout=120, check=True).stdout
        for _ in range(2)
    )
    assert first == second
    assert len(set(first.split())) == 3


def test_two_live_sinks_of_the_same_graph_get_their_own_keys_and_runs() -> None:
    one, two = _Sink(), _Sink()
    key_one, key_two = register_sink(one, "test/same graph"), register_sink(two, "test/same graph")
    try:
        assert key_one != key_two
        dump_graph([], [torch.ones(2)], key_two, "a,b")
        assert one.runs == [] and len(two.runs) == 1 and two.runs[0][1] == ["a", "b"]
    finally:
        unregister_sink(key_one)
        unregister_sink(key_two)


def test_a_key_is_never_handed_out_again_so_stale_code_delivers_nowhere() -> None:
    old = _Sink()
    key = register_sink(old, "test/stale")
    unregister_sink(key)
    new = _Sink()
    new_key = register_sink(new, "test/stale")
    try:
        assert new_key != key
        dump_graph([], [torch.ones(1)], key)  # code compiled for the old sink
        assert old.runs == [] and new.runs == []
    finally:
        unregister_sink(new_key)


class _SizedSink(_Sink):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[list[int]] = []

    def on_graph(self, stats: list[torch.Tensor], tensors: list[torch.Tensor], labels: list[str], *, sizes=()) -> None:
        self.sizes.append(list(sizes))


def test_a_graph_with_symbolic_sizes_hands_their_values_over_and_a_sink_without_them_gets_none() -> None:
    sized, plain = _SizedSink(), _Sink()
    sized_key, plain_key = register_sink(sized, "test/sizes"), register_sink(plain, "test/no sizes")
    try:
        torch.ops.torchdebug.dump_graph.default([], [torch.ones(1)], sized_key, "", [16, 32])
        torch.ops.torchdebug.dump_graph.default([], [torch.ones(1)], plain_key)  # older callers: no sizes argument
        assert sized.sizes == [[16, 32]] and len(plain.runs) == 1
        assert "SymInt[]? sizes=None" in str(torch.ops.torchdebug.dump_graph.default._schema)
    finally:
        unregister_sink(sized_key)
        unregister_sink(plain_key)
