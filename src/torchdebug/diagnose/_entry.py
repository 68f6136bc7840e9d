"""``path/to/script.py:function`` (or ``package.module:function``): what the command line diagnoses.

The function takes no arguments and returns ``(model_or_fn, example_inputs)``; ``example_inputs`` is
a tuple or list of positional inputs, or a single tensor. The script is imported under its own
name (its ``if __name__ == "__main__":`` block does not run) with its folder on ``sys.path``, so it
can import its neighbours; the user's training script needs no edit beyond that one function.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def load_entry(spec: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Import ``spec`` and call it; return the program and its inputs."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"diagnose: entry {spec!r} must look like path/to/script.py:make_model_and_inputs")
    module = _import(target)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"diagnose: {target} has no function {name!r}; define it to return (model, example_inputs)")
    made = factory()
    if not (isinstance(made, (tuple, list)) and len(made) == 2 and callable(made[0])):
        raise TypeError(f"diagnose: {spec} must return (model_or_fn, example_inputs), got {type(made).__name__}")
    program, inputs = made
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    return program, inputs


def _import(target: str) -> Any:
    path = Path(target)
    if target.endswith(".py"):
        if not path.is_file():
            raise FileNotFoundError(f"diagnose: no script at {target}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"diagnose: {target} cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # so the script's classes pickle and deepcopy by name
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(target)
