"""Rank processes that outlive mpiexec: ``ripplesrun`` kills them and says so.

mpiexec normally ends after every rank it started. When it ends first (it gave up on a
rank that was frozen when the job was aborted, or ``ripplesrun`` stopped it), such a rank
is left behind, blocked for good in a call whose peers are gone, holding its memory and
devices. Open MPI 5's table of started ranks (``--output-proctable``) names each rank's
host and process id; the ranks of this host that are still alive once mpiexec has ended
are killed. Only a process below mpiexec when the table was read counts, and it is
identified by its id and its start time (``/proc``), so that an id reused by another
process is never touched. Linux only: elsewhere nothing is found.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
from typing import Dict, List, Optional

from ripples.core.processes import parent_of, start_ticks

PROCTABLE_ENTRY = re.compile(rb"^\(rank, host, exe, pid\) = \((\d+), ([^,\s]+), [^\n]*, "
                             rb"(\d+)\)$", re.M)


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``ancestor`` is above process ``pid`` now."""
    while pid > 1:
        parent = parent_of(pid)
        if parent is None:
            return False
        pid = parent
        if pid == ancestor:
            return True
    return False


def is_this_host(host: str) -> bool:
    names = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost"}
    return host in names or host.split(".")[0] in names


class LocalRanks:
    """The ranks of this host seen in the table of started ranks of the mpiexec whose
    process id is ``launcher`` (None: none is followed)."""

    def __init__(self, launcher: Optional[int] = None):
        self._launcher = launcher
        self._started: Dict[int, Optional[int]] = {}  # pid -> start ticks when first seen
        self._ranks: Dict[int, int] = {}  # pid -> rank

    def read(self, output: bytes) -> None:
        """Take in the table's lines found in ``output`` (lines seen before are skipped)."""
        for match in PROCTABLE_ENTRY.finditer(output):
            pid = int(match.group(3))
            if pid in self._started or not is_this_host(match.group(2).decode(errors="replace")):
                continue
            if self._launcher is None or not descends_from(pid, self._launcher):
                self._started[pid] = None  # not a process of this launch: never touched
                continue
            self._started[pid] = start_ticks(pid)
            self._ranks[pid] = int(match.group(1))

    def end_leftovers(self, grace_s: float = 0.0) -> List[str]:
        """Kill (SIGKILL) the ranks still alive ``grace_s`` seconds from now; returns "rank R
        (pid P)" for each. The grace lets ranks that mpiexec signalled as it ended (Ctrl-C,
        an abort) finish exiting: a large process takes a moment to free its memory."""
        deadline = time.monotonic() + grace_s
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = []
        for pid in self._alive():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                ended.append(f"rank {self._ranks[pid]} (pid {pid})")
        return ended

    def _alive(self) -> List[int]:
        return [pid for pid, started in self._started.items()
                if started is not None and start_ticks(pid) == started]
