"""Python's cyclic garbage collector paused while many acyclic objects are made.

Reading a dump builds a record per slot (itself, its dicts and lists) and a comparison hundreds of
thousands of rows and metrics, almost none of them in a reference cycle. With torch imported, a full
collection walks every live object of the process (about 50 ms on a 2-core box), and the objects
those passes keep alive trigger one collection after another: building the narrow GPT's records
took twice as long, a statistics compare 0.15 to 0.25 s depending on how many it hit. Paused, the
collector runs once, when it is switched back on, over what was made.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused meanwhile (restored on exit, also on an error)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
