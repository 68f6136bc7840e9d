"""Arrays handed to native calls through ctypes: the address of an array's memory, and ctypes array
types made once."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

__all__ = ["c_array", "data_address"]


def data_address(values: np.ndarray) -> int:
    """The address of the first element of ``values``, as ``values.ctypes.data`` gives it: through a
    ctypes view of its buffer (0.4 µs) rather than the object the ``ctypes`` attribute makes (1.9 µs,
    about 10k instructions: a capture's stop hands a few dozen arrays to native code); the attribute
    where there is no writable, contiguous buffer to view (a read-only, empty or strided array)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(values))  # type: ignore[arg-type]  # (numpy's stubs name no buffer protocol)
    except (TypeError, ValueError, BufferError):
        return values.ctypes.data


@functools.cache
def c_array(item: type, length: int) -> type[ctypes.Array]:
    """``item * length``, made once: ctypes keeps the array types it made only through weak
    references, so one made again after the garbage collector freed it costs 8 µs (about 51k
    instructions; a capture's stop made seven a step) where a held one costs nothing."""
    return item * length  # type: ignore[operator,return-value]  # (a ctypes type times a length: an array type)
