"""Small C kernels for the hot paths of capture, built on first use and loaded through ctypes.

They need no torch headers, so building one takes a fraction of a second with the system C
compiler; when there is none (or ``TORCHDEBUG_NATIVE=0``), callers fall back to torch ops.
"""

__all__: list[str] = []  # its modules are its doors (docs/api.md)
