"""The tables packed into a compare page, read back in Python as ``compare.js`` reads them."""

from __future__ import annotations

import base64
import gzip
import json
import re
from typing import Any

import numpy as np

_DTYPES = {"u8": "<u1", "u16": "<u2", "u32": "<u4", "i32": "<i4", "f64": "<f8"}


def unpack_text(text: str) -> dict[str, dict[str, list[Any]]]:
    """``report.packed.pack``'s output as table -> column -> values (string columns as strings)."""
    raw = gzip.decompress(base64.b64decode(text))
    size = int.from_bytes(raw[:4], "little")
    header = json.loads(raw[4 : 4 + size])
    offset = 4 + size
    tables = {}
    for name, spec in header["tables"].items():
        columns: dict[str, list[Any]] = {}
        for column, type_, is_text in spec["columns"]:
            dtype = np.dtype(_DTYPES[type_])
            end = offset + spec["length"] * dtype.itemsize
            planes = np.frombuffer(raw[offset:end], dtype=np.uint8).reshape(dtype.itemsize, spec["length"])
            values = np.ascontiguousarray(planes.T).view(dtype).ravel().tolist()
            columns[column] = [header["strings"][v] for v in values] if is_text else values
            offset = end
        tables[name] = columns
    return tables


def unpack(html: str) -> dict[str, dict[str, list[Any]]]:
    """The packed tables of a compare page (``rows`` and ``dots``)."""
    match = re.search(r'<script type="application/octet-stream" id="packed">([^<]*)</script>', html)
    assert match is not None, "no packed rows in the page"
    return unpack_text(match.group(1))
