"""Ctypes binding of ``records.c``: a batch of records encoded as JSON lines in C.

Encoding is on the capturing thread's critical path (a training step writes thousands of records);
in C it costs a fraction of the Python encoder's time. The C code writes the common cases itself
and hands every other case to Python helpers that ``torchdebug.store.record_json`` passes in, so
the output is the Python encoder's, byte for byte (``tests/store`` checks it). ``None`` when the
library cannot be built here (no compiler or no Python headers): callers encode in Python.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import Any

from torchdebug.native.build import load_library

Encoder = Callable[[Sequence[Any], tuple[Any, ...]], str]


@functools.cache
def encoder() -> Encoder | None:
    """``encode(records, (quote, dumps, field names, statistic keys)) -> str``, or ``None``."""
    library = load_library("records", python_api=True)
    if library is None:
        return None
    encode = library.td_encode_records
    encode.argtypes = (ctypes.py_object, ctypes.py_object)
    encode.restype = ctypes.py_object
    return encode
