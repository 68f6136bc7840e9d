"""The one place torchdebug touches torch's private or version-dependent API.

Each module wraps one torch subsystem (autograd, amp, dispatch, module hooks, checkpointing, pytree,
subclasses, FSDP2, functional collectives, Dynamo, inductor, symbolic sizes, guards, frames) and is
imported only by the features that need it, so ``import torchdebug.capture`` never loads inductor.
Every behaviour that differs between the torch versions we support is listed in
:data:`VERSION_DIFFERENCES`; code elsewhere never compares torch versions. The rules and the modules:
docs/architecture.md, "The torch seam"; ``tests/test_torch_seam.py`` runs each seam.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import torch
from torch.torch_version import TorchVersion

from torchdebug.errors import TorchVersionError

MINIMUM_TORCH = "2.11"
"""The oldest torch the test suite passes on (CI runs it on 2.11.0, 2.13.0 and 2.14.1)."""

TESTED_TORCH = ("2.11.0", "2.13.0", "2.14.1")
"""The torch releases CI runs the suite on (docs/architecture.md's version table)."""

TORCH_VERSION = TorchVersion(re.match(r"\d+(\.\d+)*", torch.__version__).group())  # type: ignore[union-attr]  # a torch version starts with digits
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
    VersionDifference(
        "2.14",
        "an operator made by torch.library.custom_op dispatches through its Python object (PyObject "
        "dispatch), skipping the C++ dispatcher's call, so no at::RecordFunction callback sees it",
        "torchdebug._torch.custom_ops.DispatcherCalls",
    ),
)


def at_least(version: str) -> bool:
    """Whether the running torch is release ``version`` (``"2.13"``) or newer."""
    return _at_least(TORCH_VERSION, version)


@functools.cache
def _at_least(release: str, version: str) -> bool:
    """``release >= version`` as versions, asked once a pair (``TorchVersion`` parses both sides at
    each comparison, 25 µs; a capture asks at each step's start)."""
    return TorchVersion(release) >= version


def require(feature: str, version: str = MINIMUM_TORCH) -> None:
    """Raise :class:`TorchVersionError`, one line naming both versions, when torch is older than ``version``.

    ``feature`` says what needs it (``"eager capture (autograd internals)"``).
    """
    if not at_least(version):
        raise TorchVersionError(
            f"torchdebug needs torch >= {version} for {feature}, found {torch.__version__}; "
            f"upgrade torch (tested: {', '.join(TESTED_TORCH)})"
        )
