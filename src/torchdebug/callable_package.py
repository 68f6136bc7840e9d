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
from collections.abc import Callable, Collection, Mapping

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


def lazy_exports(package: str, exports: Mapping[str, str], submodules: Collection[str] = ()) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``exports`` (name -> the module that
    defines it) and each submodule named in ``submodules`` is imported at its first use and kept.
    Every package of torchdebug that exports lazily uses it, so importing one loads no torch."""

    def __getattr__(name: str) -> Any:
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
