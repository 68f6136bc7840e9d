"""Which op calls to capture: name patterns (``list``), a ``range`` of calls, data modes.

A pattern is an exact call name, a substring of it, or ``re:REGEX`` (searched, not matched, so
``re:^forward/`` anchors explicitly). Call names look like ``forward/layers.0.mlp/aten.mm.default#1``
(see ``torchdebug.records``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class NameMatcher:
    """Matches call names against patterns; an empty pattern list matches nothing."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = list(patterns)
        self._plain = [p for p in patterns if not p.startswith("re:")]
        self._regexes = [re.compile(p[3:]) for p in patterns if p.startswith("re:")]

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __call__(self, name: str) -> bool:
        return any(p in name for p in self._plain) or any(r.search(name) for r in self._regexes)


class RangeGate:
    """Open from the first call matching FROM through the first later call matching TO.

    ``RangeGate([])`` is always open. Call :meth:`check` once per op call, in execution order;
    it returns whether that call is inside the range. The gate re-arms each step (:meth:`reset`).
    """

    def __init__(self, bounds: Sequence[str]) -> None:
        self._enabled = bool(bounds)
        self._start = NameMatcher(bounds[:1])
        self._end = NameMatcher(bounds[1:2])
        self._state = "before"

    def reset(self) -> None:
        self._state = "before"

    def check(self, name: str) -> bool:
        if not self._enabled:
            return True
        if self._state == "before" and self._start(name):
            self._state = "inside"
        if self._state == "inside":
            if self._end(name):
                self._state = "after"
            return True
        return False


def phase_and_io_filter(data_mode: Sequence[str]) -> tuple[frozenset[str], frozenset[str]]:
    """Phases and slot kinds selected by ``data_mode`` (``all`` selects everything).

    The optimizer phase follows ``forward``: it is kept unless only ``backward`` is selected.
    """
    modes = set(data_mode)
    if "all" in modes:
        modes |= {"forward", "backward", "input", "output"}
    phases = {p for p in ("forward", "backward") if p in modes} or {"forward", "backward"}
    if "forward" in phases:
        phases.add("optimizer")
    ios = {io for io in ("input", "output") if io in modes} or {"input", "output"}
    ios |= {"parameter", "parameter_grad"}
    return frozenset(phases), frozenset(ios)
