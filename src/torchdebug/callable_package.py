"""Packages that share their name with their main function (``torchdebug.compare``, ``torchdebug.diagnose``).

``torchdebug.compare(a, b)`` is the function, but once any submodule (``torchdebug.compare._config``)
is imported, Python binds the attribute ``torchdebug.compare`` to the package itself. Making the
package callable keeps both spellings working whatever was imported before.

Such a package exports its names lazily (:func:`lazy_exports`): its config module is imported by
the command line's help, which must not load torch through the package's ``__init__``.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Callable, Mapping

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any


def make_callable(package: str, function: str) -> None:
    """Calling module ``package`` calls its attribute ``function`` (looked up at the call, so it may be lazy)."""

    class CallablePackage(types.ModuleType):
        __doc__ = sys.modules[package].__doc__

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self, function)(*args, **kwargs)

    sys.modules[package].__class__ = CallablePackage


def lazy_exports(package: str, exports: Mapping[str, str], renamed: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``exports`` (name -> defining module)
    is imported at its first use and kept; an old name in ``renamed`` (old -> new) gives the new
    name's value with a ``FutureWarning``."""

    def __getattr__(name: str) -> Any:
        if renamed and name in renamed:
            warnings.warn(f"{package}.{name} is deprecated; use {renamed[name]}", FutureWarning, stacklevel=2)
            return __getattr__(renamed[name])
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
