"""torchdebug's version, in a module that imports nothing (the package and the manifests read it)."""

__version__ = "0.1.0"
