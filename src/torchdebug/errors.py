"""The exceptions torchdebug raises on purpose.

One base class so callers can catch everything of ours; bad arguments still raise the builtin
``ValueError``/``TypeError`` (``ConfigError`` is a ``ValueError``).
"""

from __future__ import annotations


class TorchDebugError(Exception):
    """Base class of torchdebug's own errors."""


class ConfigError(TorchDebugError, ValueError):
    """A configuration key or value is invalid; the message names the key and what is allowed."""


class MissingExtraError(TorchDebugError, ImportError):
    """An optional dependency is not installed; the message names the extra (the CLI prints it as a
    usage error, Python code can catch it as an ``ImportError``)."""


class TorchVersionError(TorchDebugError, ImportError):
    """The running torch is older than a torchdebug feature needs; the message names both versions."""


class DumpError(TorchDebugError):
    """A dump folder is missing, unwritable, truncated beyond repair or not a dump at all."""


class AnomalyError(TorchDebugError):
    """The flight recorder fired with ``on_anomaly="raise"``; ``event`` holds what it found
    (:class:`~torchdebug.monitor.MonitorEvent`)."""

    def __init__(self, event: object) -> None:
        super().__init__(str(event))
        self.event = event
