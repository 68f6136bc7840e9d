"""``seed_all``: make two runs of the same program comparable op by op (as ptdbg's ``seed_all``)."""

from __future__ import annotations

import os
import random

import torch


def seed_all(seed: int = 1234, deterministic: bool = False, remove_dropout: bool = False) -> None:
    """Seed Python, NumPy (if installed) and torch on every device.

    Args:
        seed: the seed for every generator.
        deterministic: also ask torch for deterministic algorithms (``warn_only``: ops without a
            deterministic kernel warn instead of raising) and set the cuBLAS workspace variable.
        remove_dropout: make every dropout a no-op (``p`` forced to 0) so runs on different devices
            see the same activations. Affects ``torch.nn.functional.dropout`` variants process-wide.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed: got {seed!r}, expected an integer in [0, 2**32)")
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import numpy as np  # optional: seeded only when installed
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CPU and every accelerator generator
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if remove_dropout:
        _disable_dropout()


def _disable_dropout() -> None:
    """Force ``p=0`` in the functional dropouts every ``nn.Dropout*`` module calls."""
    import torch.nn.functional as F

    for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
        original = getattr(F, name, None)
        if original is None or getattr(original, "_torchdebug_no_dropout", False):
            continue

        def no_dropout(input, p=0.5, training=True, inplace=False, _original=original):  # noqa: A002
            return _original(input, 0.0, training, inplace)

        no_dropout._torchdebug_no_dropout = True  # type: ignore[attr-defined]  # our mark on the replacement
        setattr(F, name, no_dropout)
