"""The exceptions torchdebug raises on purpose.

One base class so callers can catch everything of ours; bad arguments still raise the builtin
``ValueError``/``TypeError`` (``ConfigError`` is a ``ValueError``).
"""

from __future__ import annotations


class TorchDebugError(Exception):
    """Base class of torchdebug's own errors."""


class ConfigError(TorchDebugError, ValueError):
    """A configuration key or value is invalid; the message names the key and what is allowed."""


class DumpError(TorchDebugError):
    """A dump folder is missing, unwritable, truncated beyond repair or not a dump at all."""
