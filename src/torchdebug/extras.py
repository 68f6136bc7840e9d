"""Optional dependencies (the extras in ``pyproject.toml``), imported only by the features that use them.

``import torchdebug`` never imports pandas, pyarrow, lightning or transformers: each feature calls
:func:`import_extra` when it runs (or when its module is imported), and a missing package raises
:class:`MissingExtraError`, one line naming the extra that installs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from torchdebug.errors import MissingExtraError

__all__ = ["MissingExtraError", "import_extra"]


def import_extra(module: str, extra: str, feature: str) -> ModuleType:
    """``module``, or a :class:`MissingExtraError` saying ``feature`` needs ``pip install 'torchdebug[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f"{feature} needs {module.partition('.')[0]}: pip install 'torchdebug[{extra}]' ({error})"
        ) from None
