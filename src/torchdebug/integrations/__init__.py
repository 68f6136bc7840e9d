"""Callbacks that dump training steps from the trainers of other libraries (optional extras).

- ``torchdebug.integrations.lightning.TorchDebugCallback``: PyTorch Lightning
  (``pip install 'torchdebug[lightning]'``).
- ``torchdebug.integrations.transformers.TorchDebugCallback``: the Hugging Face ``Trainer``
  (``pip install 'torchdebug[transformers]'``).

Import the submodule you need; this package imports neither library.
"""

__all__: list[str] = []  # import the submodule you need
