"""Call stacks of captured ops: user frames only, deduplicated by content.

Frames inside torch and torchdebug are dropped; what is left is where the user's code called the
op. Each distinct stack gets a stable id (a hash of its text, identical across runs of the same
program) so records carry a short reference and the rank folder stores each stack once.
"""

from __future__ import annotations

import hashlib
import inspect
import linecache
import os
import re
import sys
from collections.abc import Sequence
from types import FrameType

import torch

SKIP_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(__file__)) + os.sep,  # the torchdebug package
)
"""Frames in files under these folders are torch's or torchdebug's, never the user's."""

TRACE_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
"""One frame line of a Python traceback text (``node.meta["stack_trace"]``, :func:`format_frame`)."""


_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
"""Code flags of frames that can be suspended and resumed by a different caller."""


def stack_id(frames: Sequence[str]) -> str:
    """The stable id of a stack: a hash of its formatted frames, the same in every run."""
    return hashlib.sha1("\n".join(frames).encode()).hexdigest()[:12]


def is_user_file(filename: str) -> bool:
    """Whether frames in ``filename`` are the user's (not torch's, not torchdebug's)."""
    return not filename.startswith(SKIP_DIRS)


def describe_stack(key: tuple[tuple[str, str, int], ...]) -> tuple[str, list[str], str]:
    """``(stack_id, frames outermost first, innermost source)`` of user frames given innermost first
    as ``(file, function, line)``: what a record's ``stack`` and ``source`` hold."""
    frames = [format_frame(filename, line, function) for filename, function, line in reversed(key)]
    inner_file, inner_function, inner_line = key[0]
    return stack_id(frames), frames, f"{inner_file}:{inner_line} in {inner_function}"


def format_frame(filename: str, lineno: int, function: str) -> str:
    """``File "f.py", line 3, in fn: source`` (the form the report and ``show`` print)."""
    line = linecache.getline(filename, lineno).strip()
    text = f'File "{filename}", line {lineno}, in {function}'
    return f"{text}: {line}" if line else text


class StackRecorder:
    """Captures the user part of the current Python stack, cached per distinct stack.

    Caches are keyed by file names and ``(file, function, line)`` rather than code objects: a code
    object's hash is recomputed from its constants and names at every lookup (about 0.3 µs), while a
    string keeps its hash, and the formatted frames depend on nothing else.
    """

    def __init__(self) -> None:
        self._is_user: dict[str, bool] = {}
        self._stacks: dict[tuple, tuple[str, list[str], str]] = {}
        self._last: tuple[FrameType, int, tuple[str, list[str], str], tuple] | None = None
        """The innermost user frame of the last capture, its line, what was captured and its key.
        While that frame runs, its callers wait at their lines: at the same line the stack is the
        same (ops of one line, and every op of an optimizer step inside torch), at another line only
        the innermost frame's entry of the key changes (the next lines of one ``forward``), so the
        callers are not walked again. Holding the frame keeps its identity from being reused;
        :meth:`clear` lets it go."""

    def _user(self, filename: str) -> bool:
        user = self._is_user[filename] = is_user_file(filename)
        return user

    def _user_frames(self, frame: FrameType | None) -> tuple:
        is_user = self._is_user
        key = []
        while frame is not None:
            code = frame.f_code
            filename = code.co_filename
            user = is_user.get(filename)
            if user is None:
                user = self._user(filename)
            if user:
                key.append((filename, code.co_name, frame.f_lineno))
            frame = frame.f_back
        return tuple(key)

    def capture(self) -> tuple[str, list[str], str] | None:
        """``(stack_id, frames outermost first, innermost source)`` or ``None`` without user frames."""
        is_user = self._is_user
        frame = sys._getframe(1)
        while frame is not None:  # up to the innermost user frame (inlined: it runs for every op)
            filename = frame.f_code.co_filename
            user = is_user.get(filename)
            if user is None:
                user = self._user(filename)
            if user:
                break
            frame = frame.f_back
        if frame is None:
            return None
        line = frame.f_lineno
        last = self._last
        if last is not None and last[0] is frame:
            if last[1] == line:
                return last[2]
            key = ((last[3][0][0], last[3][0][1], line), *last[3][1:])
        else:
            key = self._user_frames(frame)
        found = self._stacks.get(key)
        if found is None:
            found = self._stacks[key] = describe_stack(key)
        if not frame.f_code.co_flags & _RESUMABLE:
            self._last = (frame, line, found, key)
        return found

    def clear(self) -> None:
        """Forget the last frame (call when capture stops, so the frame can be freed)."""
        self._last = None
