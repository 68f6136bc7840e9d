"""Python's cyclic garbage collector paused while many acyclic objects are made.

Reading a dump builds a record per slot (itself, its dicts and lists) and a comparison hundreds of
thousands of rows and metrics, almost none of them in a reference cycle. With torch imported, a full
collection walks every live object of the process (about 50 ms on a 2-core box), and the objects
those passes keep alive trigger one collection after another: building the narrow GPT's records
took twice as long, a statistics compare 0.15 to 0.25 s depending on how many it hit.

Paused, everything made meanwhile sits in the youngest generation, and the first collection after
the collector is switched back on would walk all of it (a third of a second after a 256-layer
compare, 4 % of it). Instead, on the way out, it joins the oldest generation without a pass:
``gc.freeze()`` then ``gc.unfreeze()`` move every tracked object there (Python's documented
effect), so the next full collection looks at it once, as it looks at every long-lived object.
That is done only where nothing was frozen before: objects a program froze (before forking
workers, say) stay frozen.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused meanwhile (restored on exit, also on an error); what was
    made meanwhile joins the oldest generation on the way out (module docstring)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
