"""Where a rank's main thread is, and whether it has moved: what tells a slow rank from a
stuck one.

A rank computing (a training loop, an evaluation) runs through ever other Python bytecode:
its stack changes between any two looks a few milliseconds apart. A rank blocked in one
call that will not return (an MPI barrier its peers never reach, a lock, a queue) shows
the very same stack for as long as it is blocked. ``MainThreadWatch.sample`` looks at the
main thread's stack (``sys._current_frames``) and remembers when it last changed; the
liveness responder samples it between questions and reports ``still_s`` and ``where``.

A tight loop that calls no Python function (``for i in r: x += i``, ``sum(x * 2 for x in
r)``) may show the very same stack at every look too: another thread sees the main thread
only where it hands over the interpreter lock, in such a loop always the loop's back edge
or the generator's resumption. Those places are not calls: the main thread is seen there
only while it executes bytecode (``running_bytecode``), so a sample there counts as moved.
A thread blocked in a call is seen at the call instruction.

A single long call (one ``time.sleep(600)``, one native kernel running for minutes) shows
a still stack. A training step, an evaluation or a data loader calls through many Python
frames and moves. Hence ``Config.stall_shutdown_s`` is minutes by default, and 0 turns the
check off.
"""
from __future__ import annotations

import dis
import linecache
import os
import sys
import sysconfig
import threading
import time
from types import FrameType
from typing import Optional, Tuple

MAX_DEPTH = 64
# Where the interpreter offers the interpreter lock between bytecodes other than after a
# call: a function's (or a resumed generator's) entry and a loop's back edge (before 3.11,
# JUMP_ABSOLUTE).
_HANDOVER_OPCODES = frozenset(dis.opmap[name] for name in ("RESUME", "JUMP_BACKWARD",
                                                          "JUMP_ABSOLUTE")
                              if name in dis.opmap)
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


def running_bytecode(frame: Optional[FrameType]) -> bool:
    """Whether the innermost ``frame`` stands at a loop's back edge or a function's entry,
    where the main thread is seen only while it executes bytecode (never while blocked)."""
    if frame is None:
        return False
    code, offset = frame.f_code.co_code, frame.f_lasti
    # f_lasti is None for a frame of the import machinery (seen while a rank imports)
    return offset is not None and 0 <= offset < len(code) and code[offset] in _HANDOVER_OPCODES


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
        """Look at the main thread's stack now: a different stack than last time, or one
        executing bytecode (``running_bytecode``), moved."""
        frame = self._frame()
        signature = stack_signature(frame)
        if signature != self._signature or running_bytecode(frame):
            self._signature = signature
            self._moved_at = self._clock()

    def still_s(self) -> float:
        """Seconds since the main thread's stack last changed (as of the last ``sample``)."""
        return self._clock() - self._moved_at

    def where(self) -> str:
        """Where the main thread is now (``describe``)."""
        return describe(self._frame())
