"""Where a rank's main thread is, and whether it has moved: what tells a slow rank from a
stuck one.

A rank computing (a training loop, an evaluation) runs through ever other Python bytecode:
its stack changes between any two looks a few milliseconds apart. A rank blocked in one
call that will not return (an MPI barrier its peers never reach, a lock, a queue) shows
the very same stack for as long as it is blocked. ``MainThreadWatch.sample`` looks at the
main thread's stack and remembers when it last changed; the liveness responder samples it
between questions and reports ``still_s`` and ``where``.

How it looks: no frame object of the main thread is followed from another thread. On
Python 3.11, walking ``f_back`` from a frame of ``sys._current_frames()`` while that thread
runs on can crash the interpreter (a segmentation fault seen once in this project's tests,
the responder in this walk while the main thread formatted its own stack; profilers that
sample threads this way report the same on 3.11.5-3.11.12). So the whole stack is read by
``faulthandler.dump_traceback``, which reads the interpreter's frames in C under the
interpreter lock and creates no frame object, into an anonymous file (``main_thread_stack``:
file, line and function per frame). That costs about 0.4 ms for 40 frames, so the whole
stack is read every ``FULL_STACK_EVERY_S``; every sample reads only the innermost frame's
code and instruction (``sys._current_frames``, nothing followed).

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
import faulthandler
import linecache
import os
import re
import sys
import sysconfig
import tempfile
import threading
import time
from types import FrameType
from typing import List, NamedTuple, Optional, Tuple

MAX_DEPTH = 64
FULL_STACK_EVERY_S = 0.25
# Where the interpreter offers the interpreter lock between bytecodes other than after a
# call: a function's (or a resumed generator's) entry and a loop's back edge (before 3.11,
# JUMP_ABSOLUTE).
_HANDOVER_OPCODES = frozenset(dis.opmap[name] for name in ("RESUME", "JUMP_BACKWARD",
                                                          "JUMP_ABSOLUTE")
                              if name in dis.opmap)
_LIBRARY_DIRS = tuple(sorted({os.path.realpath(p) for key in ("stdlib", "platstdlib",
                                                              "purelib", "platlib")
                              if (p := sysconfig.get_paths().get(key))}))
_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME_LINE = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')


class Place(NamedTuple):
    """One frame of a stack as ``faulthandler`` prints it (line 0: not known)."""
    filename: str
    line: int
    function: str


def main_thread_stack() -> Tuple[Place, ...]:
    """The main thread's stack, innermost frame first, at most ``MAX_DEPTH`` frames; empty
    when the main thread has ended. Safe from any thread (see the module's docstring)."""
    with tempfile.TemporaryFile() as scratch:
        return _read_stack(scratch, threading.main_thread().ident)


def _read_stack(dump_file, ident: Optional[int]) -> Tuple[Place, ...]:
    dump_file.seek(0)
    dump_file.truncate()
    faulthandler.dump_traceback(dump_file.fileno(), all_threads=True)
    dump_file.seek(0)
    text = os.read(dump_file.fileno(), 1 << 20).decode("utf-8", "replace")
    return _parse_thread(text, ident)


def _parse_thread(text: str, ident: Optional[int]) -> Tuple[Place, ...]:
    """The frames ``faulthandler`` printed for thread ``ident``."""
    places: List[Place] = []
    inside = False
    for line in text.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            if inside:
                break
            inside = ident is not None and int(header.group(1), 16) == ident
            continue
        frame = _FRAME_LINE.match(line) if inside else None
        if frame and len(places) < MAX_DEPTH:
            number = frame.group(2)
            places.append(Place(frame.group(1), int(number) if number.isdigit() else 0,
                                frame.group(3)))
    return tuple(places)


def running_bytecode(frame: Optional[FrameType]) -> bool:
    """Whether the innermost ``frame`` stands at a loop's back edge or a function's entry,
    where the main thread is seen only while it executes bytecode (never while blocked)."""
    if frame is None:
        return False
    code, offset = frame.f_code.co_code, frame.f_lasti
    # f_lasti is None for a frame of the import machinery (seen while a rank imports)
    return offset is not None and 0 <= offset < len(code) and code[offset] in _HANDOVER_OPCODES


def describe(stack: Tuple[Place, ...]) -> str:
    """``file:line in function: `source line``` of the innermost frame of ``stack``, and of
    the innermost frame of the user's code when the innermost one is in a library."""
    if not stack:
        return "nowhere (the main thread has ended)"
    where = _place_text(stack[0])
    caller = next((place for place in stack if not _in_library(place.filename)), None)
    if caller is not None and caller is not stack[0]:
        where += f", called from {_place_text(caller)}"
    return where


def _place_text(place: Place) -> str:
    line = linecache.getline(place.filename, place.line).strip() if place.line else ""
    text = f"{os.path.basename(place.filename)}:{place.line or '?'} in {place.function}"
    return f"{text}: `{line}`" if line else text


def _in_library(filename: str) -> bool:
    path = os.path.realpath(filename)
    return path.startswith(_LIBRARY_DIRS) or filename.startswith("<")


class MainThreadWatch:
    """Samples the main thread's stack from another thread and tells how long it has been
    still. ``sample()`` must be called often (the responder does, every few tens of ms);
    ``sample`` and ``where`` may be called from any threads."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._ident = threading.main_thread().ident
        self._innermost: Tuple = ()
        self._stack: Tuple[Place, ...] = ()
        self._stack_read_at = -float("inf")
        self._moved_at = clock()
        self._dump_lock = threading.Lock()
        self._dump_file = None

    def _innermost_position(self) -> Tuple[Tuple, bool]:
        """The innermost frame's (code, instruction) and ``running_bytecode`` for it; no
        frame is followed, and none is kept."""
        frame = sys._current_frames().get(self._ident)
        if frame is None:
            return (), False
        return (id(frame.f_code), frame.f_lasti), running_bytecode(frame)

    def _read_main_stack(self) -> Tuple[Place, ...]:
        with self._dump_lock:
            if self._dump_file is None:
                self._dump_file = tempfile.TemporaryFile()
            return _read_stack(self._dump_file, self._ident)

    def sample(self) -> None:
        """Look at the main thread now: a different innermost position than last time, one
        executing bytecode (``running_bytecode``), or a different stack than the last read
        of the whole stack (every ``FULL_STACK_EVERY_S``), moved."""
        now = self._clock()
        innermost, running = self._innermost_position()
        moved = running or innermost != self._innermost
        self._innermost = innermost
        if now - self._stack_read_at >= FULL_STACK_EVERY_S:
            stack = self._read_main_stack()
            moved = moved or stack != self._stack
            self._stack, self._stack_read_at = stack, now
        if moved:
            self._moved_at = now

    def still_s(self) -> float:
        """Seconds since the main thread's stack last changed (as of the last ``sample``)."""
        return self._clock() - self._moved_at

    def where(self) -> str:
        """Where the main thread is now (``describe``)."""
        return describe(self._read_main_stack())
