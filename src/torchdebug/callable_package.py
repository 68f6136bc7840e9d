"""Packages that share their name with their main function (``torchdebug.compare``, ``torchdebug.diagnose``).

``torchdebug.compare(a, b)`` is the function, but once any submodule (``torchdebug.compare.config``)
is imported, Python binds the attribute ``torchdebug.compare`` to the package itself. Making the
package callable keeps both spellings working whatever was imported before.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any


def make_callable(package: str, function: Callable[..., Any]) -> None:
    """Calling module ``package`` calls ``function``."""

    class CallablePackage(types.ModuleType):
        __doc__ = sys.modules[package].__doc__

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

    sys.modules[package].__class__ = CallablePackage
