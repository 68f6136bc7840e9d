"""Optional dependencies (the extras in ``pyproject.toml``), imported only by the features that use them.

``import torchdebug`` never imports pandas, pyarrow, lightning or transformers: each feature calls
:func:`import_extra` when it runs (or when its module is imported), and a missing package raises one
``ImportError`` line naming the extra that installs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def import_extra(module: str, extra: str, feature: str) -> ModuleType:
    """``module``, or an ``ImportError`` saying ``feature`` needs ``pip install 'torchdebug[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{feature} needs {module.partition('.')[0]}: pip install 'torchdebug[{extra}]' ({error})") from None
