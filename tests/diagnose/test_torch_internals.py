"""Every private torch symbol diagnose wraps still exists: a torch upgrade fails here first."""

from __future__ import annotations

from torchdebug.diagnose import _torch_internals


def test_every_wrapped_symbol_is_importable() -> None:
    for name in _torch_internals.__all__:
        assert getattr(_torch_internals, name) is not None, name


def test_relu_testing_backends_exist() -> None:
    for name in ("relu_accuracy_error_TESTING_ONLY", "relu_compile_error_TESTING_ONLY", "relu_runtime_error_TESTING_ONLY"):
        assert callable(_torch_internals.lookup_backend(name))
