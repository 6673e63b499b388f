"""Where a rank's main thread is, and whether it has moved: what tells a slow rank from a
stuck one.

A rank computing (a training loop, an evaluation) runs through ever other Python bytecode:
its stack changes between any two looks a few milliseconds apart. A rank blocked in one
call that will not return (an MPI barrier its peers never reach, a lock, a queue) shows
the very same stack for as long as it is blocked. ``MainThreadWatch.sample`` looks at the
main thread's stack (``sys._current_frames``) and remembers when it last changed; the
liveness responder samples it between questions and reports ``still_s`` and ``where``.

A single long call (one ``time.sleep(600)``, one native kernel running for minutes) also
shows a still stack, and so may a tight loop that calls no Python function (``while True:
x += 1``): another thread sees the main thread only where it hands over the interpreter
lock, which in such a loop can be the same instruction every time. A training step, an
evaluation or a data loader calls through many Python frames and moves. Hence
``Config.stall_shutdown_s`` is minutes by default, and 0 turns the check off.
"""
from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
import time
from types import FrameType
from typing import Optional, Tuple

MAX_DEPTH = 64
_LIBRARY_DIRS = tuple(sorted({os.path.realpath(p) for key in ("stdlib", "platstdlib",
                                                              "purelib", "platlib")
                              if (p := sysconfig.get_paths().get(key))}))


def stack_signature(frame: Optional[FrameType]) -> Tuple[Tuple[int, int], ...]:
    """The position of every frame of a stack (code object and last instruction), up to
    ``MAX_DEPTH`` frames from the innermost: equal signatures mean it has not moved."""
    positions = []
    while frame is not None and len(positions) < MAX_DEPTH:
        positions.append((id(frame.f_code), frame.f_lasti))
        frame = frame.f_back
    return tuple(positions)


def describe(frame: Optional[FrameType]) -> str:
    """``file:line in function: `source line``` of the innermost frame, and of the
    innermost frame of the user's code when the innermost one is in a library."""
    if frame is None:
        return "nowhere (the main thread has ended)"
    where = _frame_text(frame)
    caller = frame
    while caller is not None and _in_library(caller.f_code.co_filename):
        caller = caller.f_back
    if caller is not None and caller is not frame:
        where += f", called from {_frame_text(caller)}"
    return where


def _frame_text(frame: FrameType) -> str:
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    text = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
    return f"{text}: `{line}`" if line else text


def _in_library(filename: str) -> bool:
    path = os.path.realpath(filename)
    return path.startswith(_LIBRARY_DIRS) or filename.startswith("<")


class MainThreadWatch:
    """Samples the main thread's stack from another thread and tells how long it has been
    still. ``sample()`` must be called often (the responder does, every few tens of ms)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._ident = threading.main_thread().ident
        self._signature: Tuple = ()
        self._moved_at = clock()

    def _frame(self) -> Optional[FrameType]:
        return sys._current_frames().get(self._ident)

    def sample(self) -> None:
        """Look at the main thread's stack now; a different stack than last time moved."""
        signature = stack_signature(self._frame())
        if signature != self._signature:
            self._signature = signature
            self._moved_at = self._clock()

    def still_s(self) -> float:
        """Seconds since the main thread's stack last changed (as of the last ``sample``)."""
        return self._clock() - self._moved_at

    def where(self) -> str:
        """Where the main thread is now (``describe``)."""
        return describe(self._frame())
