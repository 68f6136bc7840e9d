"""The one place torchdebug touches torch's private or version-dependent API.

Each module wraps one torch subsystem and is imported only by the features that need it, so
``import torchdebug.capture`` never loads inductor:

- :mod:`~torchdebug._torch.autograd`: the running autograd node and sequence numbers, version
  counters, a callback when the running backward ends.
- :mod:`~torchdebug._torch.amp`: a ``GradScaler``'s scale tensor, whether it unscaled an optimizer,
  and a fresh state for a replay that unscales again.
- :mod:`~torchdebug._torch.dispatch`: ``TorchDispatchMode``, op overloads and their schemas.
- :mod:`~torchdebug._torch.global_hooks`: global module hooks next to ``torch.compile(module)``, one
  function per torch behaviour they work around; :mod:`~torchdebug._torch.nn`: module wrappers.
- :mod:`~torchdebug._torch.forward_hooks`: a forward hook run after a module's own, placed as its call starts.
- :mod:`~torchdebug._torch.checkpoint`: activation checkpointing's recomputation and bookkeeping ops.
- :mod:`~torchdebug._torch.pytree`: the tensors of nested outputs.
- :mod:`~torchdebug._torch.subclasses`: wrapper subclasses (DTensor, FSDP2 parameters, float8
  weights) read through their plain inner tensors.
- :mod:`~torchdebug._torch.fsdp`: the FSDP2 parameter group issuing a collective, and the pass it
  runs it for.
- :mod:`~torchdebug._torch.funcol`: functional collectives (DTensor's): ``AsyncCollectiveTensor``,
  waiting for a result, the count of works not yet waited for.
- :mod:`~torchdebug._torch.dynamo`: Dynamo, AOT autograd, compile caches, debug folder, structured trace.
- :mod:`~torchdebug._torch.inductor`: inductor's entry points, config keys, custom-pass slots and
  the per-pass observer.
- :mod:`~torchdebug._torch.symbolic`: symbolic sizes (``SymInt`` expressions, traced values) of
  graphs compiled with dynamic shapes, evaluated for the sizes that ran.
- :mod:`~torchdebug._torch.guards`: the Dynamo frame of the compile in progress.
- :mod:`~torchdebug._torch.frames`: the Python frame a compiled graph runs under, and the module
  instance (and the outermost compiled module) it holds.

Every behaviour that differs between the torch versions we support is listed in
:data:`VERSION_DIFFERENCES`, with the version that changed it and the function that handles it;
code elsewhere never compares torch versions. ``tests/test_torch_seam.py`` runs each seam.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch
from torch.torch_version import TorchVersion

from torchdebug.errors import TorchVersionError

MINIMUM_TORCH = "2.11"
"""The oldest torch the test suite passes on (CI runs it on 2.11.0, 2.13.0 and 2.14.1)."""

TESTED_TORCH = ("2.11.0", "2.13.0", "2.14.1")
"""The torch releases CI runs the suite on (docs/architecture.md's version table)."""

TORCH_VERSION = TorchVersion(re.match(r"\d+(\.\d+)*", torch.__version__).group())  # type: ignore[union-attr]
"""The running torch's release, without local or pre-release tags: a 2.13 nightly counts as 2.13."""


class VersionDifference(NamedTuple):
    """One behaviour that changed between torch releases we support."""

    since: str
    """The first torch release with the new behaviour."""
    what: str
    handled_by: str
    """The function here that hides the difference."""


VERSION_DIFFERENCES = (
    VersionDifference(
        "2.13",
        "inductor's custom-pass config slots (post_grad_custom_pre_pass, post_grad_custom_post_pass, "
        "joint_custom_pre_pass, joint_custom_post_pass) accept a list of passes; torch 2.11 and 2.12 "
        "call the slot's value, so it holds one callable",
        "torchdebug._torch.inductor.custom_pass_patch",
    ),
)


def at_least(version: str) -> bool:
    """Whether the running torch is release ``version`` (``"2.13"``) or newer."""
    return TORCH_VERSION >= version


def require(feature: str, version: str = MINIMUM_TORCH) -> None:
    """Raise :class:`TorchVersionError`, one line naming both versions, when torch is older than ``version``.

    ``feature`` says what needs it (``"eager capture (autograd internals)"``).
    """
    if not at_least(version):
        raise TorchVersionError(
            f"torchdebug needs torch >= {version} for {feature}, found {torch.__version__}; "
            f"upgrade torch (tested: {', '.join(TESTED_TORCH)})"
        )
