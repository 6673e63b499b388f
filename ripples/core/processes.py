"""Processes of this machine as ``/proc`` shows them (Linux; elsewhere nothing is found).

A process is named by its id and its start time, so that an id reused by another process
never passes for it. Two ``sample`` looks tell a process that runs (it used CPU time
between them, or is ready to) from one that cannot (stopped by a signal, exited) or does
not (blocked): what lets a rank tell a peer that is silent because it holds the
interpreter lock in a long call, or is starved of CPU, from one that is frozen or gone.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import List, NamedTuple, Optional

# /proc/PID/stat fields after the command name: 0 is the state (field 3 of proc(5)).
_STATE, _PARENT, _USER_TICKS, _SYSTEM_TICKS, _START_TICKS = 0, 1, 11, 12, 19
_CANNOT_RUN = frozenset("ZXxTt")  # zombie, dead, stopped (SIGSTOP), stopped by a tracer


class ProcessId(NamedTuple):
    """A process, named so that another machine, another container on the same machine
    (its own process ids) or a reused id never passes for it."""

    host: str
    pid: int
    start: Optional[int]  # clock ticks since boot; None where /proc cannot tell
    namespace: str = ""   # the process-id namespace it was seen from


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def proc_stat(pid: int) -> Optional[List[str]]:
    """The fields of ``/proc/PID/stat`` after the command name (state first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot), or None if there is none."""
    fields = proc_stat(pid)
    if fields is None or fields[_STATE] == "Z":  # none, or exited and not yet reaped
        return None
    return int(fields[_START_TICKS])


def parent_of(pid: int) -> Optional[int]:
    """The process id of ``pid``'s parent, or None if there is no process ``pid``."""
    fields = proc_stat(pid)
    return None if fields is None else int(fields[_PARENT])


def this_process() -> ProcessId:
    """This process's name, as other processes of this machine can check it."""
    return ProcessId(socket.gethostname(), os.getpid(), start_ticks(os.getpid()),
                     _pid_namespace())


def _fields_of(process: ProcessId) -> Optional[List[str]]:
    """``proc_stat`` of ``process`` if it is this machine's and still the very process
    (its id not reused); ``[]`` where it is gone; None where it is another machine's or
    unknown."""
    if process.start is None or process.host != socket.gethostname() \
            or process.namespace != _pid_namespace():
        return None
    fields = proc_stat(process.pid)
    if fields is None or int(fields[_START_TICKS]) != process.start:
        return []
    return fields


class Sample(NamedTuple):
    """One look at a process that can run: the CPU time it has used (user and system clock
    ticks) and whether it is ready to run at that moment (state R)."""

    ticks: int
    ready: bool


def sample(process: ProcessId) -> Optional[Sample]:
    """A look at ``process`` while it is this machine's and can run; None when it is
    another machine's, gone, a zombie, stopped by a signal, or unknown."""
    fields = _fields_of(process)
    if not fields or fields[_STATE] in _CANNOT_RUN:
        return None
    return Sample(int(fields[_USER_TICKS]) + int(fields[_SYSTEM_TICKS]), fields[_STATE] == "R")


def has_run(before: Optional[Sample], after: Optional[Sample]) -> bool:
    """Whether a process used CPU time between two looks, or was ready to run at the later
    one (waiting for a core on a busy machine counts as running); False where either look
    found nothing."""
    return before is not None and after is not None and (after.ticks > before.ticks
                                                         or after.ready)


def condition(process: ProcessId) -> Optional[str]:
    """What ``/proc`` says of ``process`` in words (``"gone"``, ``"exited"``, ``"stopped by
    SIGSTOP or a tracer"``, ``"running"``, ``"alive, not running"``) where it is this
    machine's; None where it is another machine's or unknown."""
    fields = _fields_of(process)
    if fields is None:
        return None
    if not fields:
        return "gone"
    state = fields[_STATE]
    if state in "Tt":
        return "stopped by SIGSTOP or a tracer"
    if state in "ZXx":
        return "exited"
    return "running" if state == "R" else "alive, not running"
