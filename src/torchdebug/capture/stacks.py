"""Call stacks of captured ops: user frames only, deduplicated by content.

Frames inside torch and torchdebug are dropped; what is left is where the user's code called the
op. Each distinct stack gets a stable id (a hash of its text, identical across runs of the same
program) so records carry a short reference and the rank folder stores each stack once.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import sys
from types import CodeType, FrameType

import torch

_SKIP_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(__file__)) + os.sep,  # the torchdebug package
)


def format_frame(filename: str, lineno: int, function: str) -> str:
    """``File "f.py", line 3, in fn: source`` (the form the report and ``show`` print)."""
    line = linecache.getline(filename, lineno).strip()
    text = f'File "{filename}", line {lineno}, in {function}'
    return f"{text}: {line}" if line else text


class StackRecorder:
    """Captures the user part of the current Python stack, cached per distinct stack."""

    def __init__(self) -> None:
        self._is_user: dict[CodeType, bool] = {}
        self._stacks: dict[tuple, tuple[str, list[str], str]] = {}

    def _user_frames(self, frame: FrameType | None) -> tuple:
        key = []
        is_user = self._is_user
        while frame is not None:
            code = frame.f_code
            user = is_user.get(code)
            if user is None:
                user = is_user[code] = not code.co_filename.startswith(_SKIP_DIRS)
            if user:
                key.append((code, frame.f_lineno))
            frame = frame.f_back
        return tuple(key)

    def capture(self) -> tuple[str, list[str], str] | None:
        """``(stack_id, frames outermost first, innermost source)`` or ``None`` without user frames."""
        key = self._user_frames(sys._getframe(1))
        if not key:
            return None
        found = self._stacks.get(key)
        if found is None:
            frames = [format_frame(c.co_filename, line, c.co_name) for c, line in reversed(key)]
            stack_id = hashlib.sha1("\n".join(frames).encode()).hexdigest()[:12]
            inner_code, inner_line = key[0]
            source = f"{inner_code.co_filename}:{inner_line} in {inner_code.co_name}"
            found = self._stacks[key] = (stack_id, frames, source)
        return found
